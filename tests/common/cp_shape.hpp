// A context-parallel merge shape in one call (core/context_parallel.hpp), for the CPU simulation's
// and the NCCL run's tests.
#pragma once

#include <cstdint>

#include "attnstate/core/context_parallel.hpp"

namespace attnstate_test {

inline attnstate::CpMergeShape cp_shape(int world_size, int rank, std::int64_t tokens,
                                        std::int64_t heads, std::int64_t head_dim,
                                        attnstate::DType dtype, attnstate::DType out_dtype,
                                        attnstate::LseBase wire_base, attnstate::CpAlgorithm algo,
                                        attnstate::CpOutput output) {
  attnstate::CpMergeShape s;
  s.world_size = world_size;
  s.rank = rank;
  s.tokens = tokens;
  s.heads = heads;
  s.head_dim = head_dim;
  s.dtype = dtype;
  s.out_dtype = out_dtype;
  s.wire_base = wire_base;
  s.algorithm = algo;
  s.output = output;
  return s;
}

}  // namespace attnstate_test
