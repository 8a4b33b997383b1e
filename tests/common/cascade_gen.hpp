/// @file cascade_gen.hpp
/// @brief RapidCheck generator of random cascade problems: 1 to 3 levels whose segments are
///        shared by random runs of consecutive requests (0 to many), random lengths (empty ones
///        and page edges included), dtypes, GQA groups, query lengths, page sizes and layouts.
#pragma once

#include <rapidcheck.h>

#include <cstdint>
#include <vector>

#include "cascade_case.hpp"
#include "compiled_dims.hpp"

namespace attnstate_test {

/// Random segments covering `batch` requests: runs of 1..batch requests (and sometimes a
/// segment serving nobody), each with a length in [0, max_len].
inline rc::Gen<std::vector<SegmentSpec>> gen_level(int batch, int max_len) {
  return rc::gen::exec([batch, max_len] {
    std::vector<SegmentSpec> segs;
    int left = batch;
    while (left > 0) {
      const int n = *rc::gen::inRange(1, left + 1);
      const bool edge = *rc::gen::arbitrary<bool>();
      const int len = edge ? *rc::gen::element(0, 1, 15, 16, 17, 63, 64, 65)
                           : *rc::gen::inRange(0, max_len + 1);
      segs.push_back(SegmentSpec{n, len});
      left -= n;
      if (*rc::gen::inRange(0, 8) == 0) segs.push_back(SegmentSpec{0, *rc::gen::inRange(0, 40)});
    }
    return segs;
  });
}

/// A random cascade problem spec (small enough for the double reference).
inline rc::Gen<CaseSpec> gen_case_spec(int max_batch, int max_len) {
  return rc::gen::exec([max_batch, max_len] {
    CaseSpec s;
    s.seed = *rc::gen::arbitrary<std::uint32_t>();
    const int batch = *rc::gen::inRange(1, max_batch + 1);
    const int num_levels = *rc::gen::inRange(1, 4);
    s.heads_kv = *rc::gen::inRange(1, 3);
    s.heads_q = s.heads_kv * *rc::gen::element(1, 4, 8);
    s.head_dim = *rc::gen::elementOf(attnstate_test::cascade_head_dims());
    s.dtype = *rc::gen::element(attnstate::DType::kF16, attnstate::DType::kBF16);
    s.page_size = *rc::gen::element(1, 5, 16, 16, 32);
    s.layout = *rc::gen::element(attnstate::KvLayout::kNHD, attnstate::KvLayout::kHND);
    s.placement = *rc::gen::element(0, 1, 2);  // shuffled, in order, in order with breaks
    s.q_len = *rc::gen::element(1, 1, 2, 4, 8);
    s.causal = *rc::gen::arbitrary<bool>();
    s.q_amp = *rc::gen::element(0.5f, 1.f, 4.f);
    for (int l = 0; l < num_levels; ++l) s.levels.push_back(*gen_level(batch, max_len));
    // causal: the last level must hold the new tokens of every request
    if (s.causal && s.q_len > 1)
      for (SegmentSpec& seg : s.levels.back())
        if (seg.len < s.q_len - 1) seg.len = s.q_len - 1 + seg.len;
    return s;
  });
}

}  // namespace attnstate_test
