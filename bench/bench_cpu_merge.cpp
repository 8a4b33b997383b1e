/// @file bench_cpu_merge.cpp
/// @brief CPU benchmark: `cpu::merge_states` over >= 1 GiB of input states against this
///        machine's multi-threaded memcpy bandwidth measured in the same run.
///
/// Usage: `bench_cpu_merge [--quick] [--csv <path>] [--threads <n>]` (default: all hardware
/// threads; memcpy and the merges use the same pool). Each case runs once to warm up, then is
/// timed `repeats` times, each timed run of the merge right after a timed memcpy of the same
/// input size (so both see the same machine load); medians are reported, and the fraction is
/// median merge GB/s over median memcpy GB/s of that case. GB/s counts bytes read plus bytes
/// written (o and lse of every input and of the output); memcpy counts the bytes it reads and
/// writes. The inputs (>= 1 GiB) are far larger than any cache, so every run streams from memory.
/// A multi-threaded streaming sum over the f32 input gives a second, read-only reference: the
/// merge reads S states for every state it writes, so its ceiling is the read bandwidth.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/state_view.hpp"
#include "attnstate/cpu/merge.hpp"
#include "bench_util.hpp"
#include "cpu/parallel.hpp"  // the backend's own pool, so memcpy uses the same threads

namespace {

using namespace attnstate;
using Clock = std::chrono::steady_clock;
using bench_util::median;

constexpr std::int64_t kStates = 8, kHeads = 32, kHeadDim = 128;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

struct Row {
  std::string name, din, dout, layout;
  std::int64_t tokens;
  double bytes, median_s, gbps, fraction;
};

template <class F>
double time_once(F&& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// Fills `n` elements of dtype `dt` in parallel (first touch spreads pages over the threads).
void fill(void* p, DType dt, std::int64_t n, float lo, float hi, std::uint32_t seed) {
  cpu::detail::parallel_for(0, n, 1 << 16, [&](std::int64_t b, std::int64_t e) {
    std::uint32_t x = seed ^ static_cast<std::uint32_t>(b * 2654435761u);
    dispatch_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      T* q = static_cast<T*>(p);
      for (std::int64_t i = b; i < e; ++i) {
        x = x * 1664525u + 1013904223u;
        q[i] = from_float<T>(lo + (hi - lo) * static_cast<float>(x >> 8) * (1.f / 16777216.f));
      }
    });
  });
}

/// 2 MiB-aligned, uninitialised byte buffer; on Linux backed by transparent huge pages where the
/// system allows (every buffer of the run alike, memcpy's included).
struct Buffer {
  explicit Buffer(std::size_t n) : size(n) {
    constexpr std::size_t kAlign = std::size_t{2} << 20;
    const std::size_t bytes = (n + kAlign - 1) / kAlign * kAlign;
    ptr = std::aligned_alloc(kAlign, bytes);
    if (ptr == nullptr) throw std::bad_alloc();
#if defined(__linux__)
    madvise(ptr, bytes, MADV_HUGEPAGE);
#endif
  }
  ~Buffer() { std::free(ptr); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* data() { return ptr; }
  std::size_t size;
  void* ptr = nullptr;
};

/// Multi-threaded memcpy of `bytes` on the backend's pool, 1 MiB per task.
void parallel_memcpy(void* dst, const void* src, std::size_t bytes) {
  const std::int64_t chunk = std::int64_t{1} << 20;
  const std::int64_t chunks = static_cast<std::int64_t>((bytes + chunk - 1) / chunk);
  cpu::detail::parallel_for(0, chunks, 1, [&](std::int64_t b, std::int64_t e) {
    const std::size_t off = static_cast<std::size_t>(b * chunk);
    const std::size_t end = std::min(bytes, static_cast<std::size_t>(e * chunk));
    std::memcpy(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off, end - off);
  });
}

/// Multi-threaded streaming read of `n` floats (a sum), the read-only bandwidth reference.
float parallel_read(const float* p, std::int64_t n) {
  const std::int64_t chunk = std::int64_t{1} << 18;
  const std::int64_t chunks = (n + chunk - 1) / chunk;
  std::vector<float> partial(static_cast<std::size_t>(chunks));
  cpu::detail::parallel_for(0, chunks, 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t c = b; c < e; ++c) {
      float acc[16] = {};
      const std::int64_t end = std::min(n, (c + 1) * chunk);
      std::int64_t i = c * chunk;
      for (; i + 16 <= end; i += 16)
        for (int k = 0; k < 16; ++k) acc[k] += p[i + k];
      for (; i < end; ++i) acc[0] += p[i];
      float sum = 0.f;
      for (float a : acc) sum += a;
      partial[static_cast<std::size_t>(c)] = sum;
    }
  });
  float total = 0.f;
  for (float x : partial) total += x;
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  const char* csv = nullptr;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a == "--csv" && i + 1 < argc) {
      csv = argv[++i];
    } else if (a == "--threads" && i + 1 < argc) {
      cpu::set_num_threads(std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--csv <path>] [--threads <n>]\n", argv[0]);
      return 2;
    }
  }
  const int repeats = quick ? 3 : 7;
  // 1 GiB of f32 input o: tokens x 8 x 32 x 128 x 4 B = tokens x 128 KiB.
  const std::int64_t tokens = 8192;
  const std::int64_t in_elems = tokens * kStates * kHeads * kHeadDim;
  const std::int64_t in_rows = tokens * kStates * kHeads;
  const std::int64_t out_elems = tokens * kHeads * kHeadDim;

  Buffer in_o(static_cast<std::size_t>(in_elems) * 4),
      out_o(static_cast<std::size_t>(out_elems) * 4);
  std::vector<float> in_lse(static_cast<std::size_t>(in_rows)), out_lse(tokens * kHeads);
  fill(in_lse.data(), DType::kF32, in_rows, -8.f, 8.f, 7u);
  fill(out_o.data(), DType::kF32, out_elems, 0.f, 0.f, 1u);

  std::printf(
      "bench_cpu_merge: merge_states, S=%lld heads=%lld head_dim=%lld, %d threads, "
      "median of %d\n",
      static_cast<long long>(kStates), static_cast<long long>(kHeads),
      static_cast<long long>(kHeadDim), cpu::num_threads(), repeats);

  std::vector<Row> rows;
  // The memcpy runs copy the input buffer into a buffer of the same size (read + write).
  fill(in_o.data(), DType::kF32, in_elems, -1.f, 1.f, 3u);
  Buffer copy_dst(in_o.size);
  fill(copy_dst.data(), DType::kF32, in_elems, 0.f, 0.f, 1u);
  const double copy_bytes = 2.0 * static_cast<double>(in_o.size);
  std::vector<double> all_copy_s;
  volatile float sink = 0.f;
  std::vector<double> read_s;
  sink = sink + parallel_read(static_cast<const float*>(in_o.data()), in_elems);  // warm-up
  for (int i = 0; i < repeats; ++i) {
    read_s.push_back(time_once(
        [&] { sink = sink + parallel_read(static_cast<const float*>(in_o.data()), in_elems); }));
  }

  struct Case {
    DType din, dout;
    StackOrder order;
    std::int64_t tokens;
  };
  std::vector<Case> cases = {{DType::kF32, DType::kF32, StackOrder::kTokensMajor, tokens}};
  if (!quick) {
    cases.push_back({DType::kF32, DType::kF32, StackOrder::kStatesMajor, tokens});
    cases.push_back({DType::kBF16, DType::kBF16, StackOrder::kTokensMajor, 2 * tokens});
    cases.push_back({DType::kBF16, DType::kF32, StackOrder::kStatesMajor, 2 * tokens});
    cases.push_back({DType::kF16, DType::kF16, StackOrder::kTokensMajor, 2 * tokens});
  }
  std::vector<Row> merge_rows;
  for (const Case& c : cases) {
    // 16-bit inputs use twice the tokens so the input stays 1 GiB; lse and out are resized.
    const std::int64_t t = c.tokens;
    const std::int64_t n_in = t * kStates * kHeads * kHeadDim;
    if (static_cast<std::size_t>(n_in) * size_of(c.din) > in_o.size) return 1;
    std::vector<float> lse_in(static_cast<std::size_t>(t * kStates * kHeads));
    std::vector<float> lse_out(static_cast<std::size_t>(t * kHeads));
    Buffer o_out(static_cast<std::size_t>(t * kHeads * kHeadDim) * size_of(c.dout));
    fill(lse_in.data(), DType::kF32, static_cast<std::int64_t>(lse_in.size()), -8.f, 8.f, 5u);
    fill(in_o.data(), c.din, n_in, -1.f, 1.f, 9u);
    fill(o_out.data(), c.dout, t * kHeads * kHeadDim, 0.f, 0.f, 1u);
    const ConstStateStackView st = make_state_stack(in_o.data(), c.din, lse_in.data(), c.order, t,
                                                    kStates, kHeads, kHeadDim, LseBase::kNatural);
    const StateView out =
        make_state_view(o_out.data(), c.dout, lse_out.data(), t, kHeads, kHeadDim, LseBase::kBase2);
    const auto copy = [&] { parallel_memcpy(copy_dst.data(), in_o.data(), in_o.size); };
    const auto merge = [&] { cpu::merge_states(st, out); };
    copy();  // warm-up
    merge();
    std::vector<double> copy_s, merge_s;
    for (int i = 0; i < repeats; ++i) {
      copy_s.push_back(time_once(copy));
      merge_s.push_back(time_once(merge));
    }
    all_copy_s.insert(all_copy_s.end(), copy_s.begin(), copy_s.end());
    const double bytes = static_cast<double>(n_in) * size_of(c.din) + lse_in.size() * 4.0 +
                         static_cast<double>(t * kHeads * kHeadDim) * size_of(c.dout) +
                         lse_out.size() * 4.0;
    const double s = median(merge_s);
    const double gbps = bytes / s / 1e9;
    const double copy_gbps = copy_bytes / median(copy_s) / 1e9;
    merge_rows.push_back({"merge_states", to_string(c.din), to_string(c.dout),
                          c.order == StackOrder::kTokensMajor ? "[T,S,H,D]" : "[S,T,H,D]", t, bytes,
                          s, gbps, gbps / copy_gbps});
  }
  const double copy_s = median(all_copy_s);
  rows.push_back(
      {"memcpy", "-", "-", "-", tokens, copy_bytes, copy_s, copy_bytes / copy_s / 1e9, 1.0});
  const double read_bytes = static_cast<double>(in_o.size);
  const double read_gbps = read_bytes / median(read_s) / 1e9;
  rows.push_back({"read (sum)", "f32", "-", "-", tokens, read_bytes, median(read_s), read_gbps,
                  read_gbps / (copy_bytes / copy_s / 1e9)});
  rows.insert(rows.end(), merge_rows.begin(), merge_rows.end());

  std::printf("%-13s %-5s %-5s %-10s %7s %7s %10s %8s %11s %9s %7s\n", "case", "in", "out",
              "layout", "tokens", "GiB", "median ms", "GB/s", "memcpy GB/s", "% memcpy", "% read");
  for (const Row& r : rows) {
    std::printf("%-13s %-5s %-5s %-10s %7lld %7.3f %10.2f %8.2f %11.2f %8.1f%% %6.1f%%\n",
                r.name.c_str(), r.din.c_str(), r.dout.c_str(), r.layout.c_str(),
                static_cast<long long>(r.tokens), r.bytes / kGiB, r.median_s * 1e3, r.gbps,
                r.gbps / r.fraction, 100.0 * r.fraction, 100.0 * r.gbps / read_gbps);
  }
  std::printf(
      "GB/s = (bytes read + bytes written) / median time; memcpy GB/s: the memcpy runs "
      "interleaved with that case; %% read: against the read-only stream (sum).\n");
  bool ok = true;
  for (const Row& r : merge_rows) ok = ok && r.fraction >= 0.7;
  std::printf("target: merge_states >= 70%% of memcpy (every row): %s\n", ok ? "met" : "NOT met");

  if (csv) {
    FILE* f = bench_util::open_csv(
        csv,
        "case,dtype_in,dtype_out,layout,tokens,states,heads,head_dim,threads,bytes,"
        "median_s,gbps,memcpy_gbps,fraction_of_memcpy,fraction_of_read\n");
    if (!f) return 1;
    for (const Row& r : rows) {
      std::fprintf(f, "%s,%s,%s,%s,%lld,%lld,%lld,%lld,%d,%.0f,%.6e,%.3f,%.3f,%.4f,%.4f\n",
                   r.name.c_str(), r.din.c_str(), r.dout.c_str(), r.layout.c_str(),
                   static_cast<long long>(r.tokens), static_cast<long long>(kStates),
                   static_cast<long long>(kHeads), static_cast<long long>(kHeadDim),
                   cpu::num_threads(), r.bytes, r.median_s, r.gbps, r.gbps / r.fraction, r.fraction,
                   r.gbps / read_gbps);
    }
    std::fclose(f);
  }
  return 0;
}
