/// @file parallel.hpp
/// @brief A small persistent thread pool and `parallel_for` for the CPU backend (internal).
///
/// `parallel_for(begin, end, grain, f)` calls `f(b, e)` on disjoint chunks `[b, e)` that cover
/// `[begin, end)`, each at least `grain` long (except possibly the last), on the pool's workers
/// and the calling thread. Ranges of at most `grain` items, a pool of one thread, and calls made
/// from inside a worker (nested) or while another thread uses the pool run inline on the caller.
/// Which thread runs a chunk never changes what the chunk computes, so results are independent
/// of scheduling. An exception thrown by `f` is rethrown on the caller (the first one).
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

namespace attnstate {
namespace cpu {
namespace detail {

/// Type-erased chunk function: `fn(ctx, chunk_begin, chunk_end)`.
using ChunkFn = void (*)(void* ctx, std::int64_t begin, std::int64_t end);

/// Runs `fn(ctx, b, e)` over chunks of `[begin, end)` on the pool (see `parallel_for`).
void parallel_for_impl(std::int64_t begin, std::int64_t end, std::int64_t grain, ChunkFn fn,
                       void* ctx);

/// Number of threads (workers plus the caller) `parallel_for` uses.
int pool_threads();

/// Calls `f(b, e)` over disjoint chunks covering `[begin, end)`, in parallel.
/// @param begin, end  the range of items.
/// @param grain       minimum items per chunk (>= 1); ranges of at most `grain` run inline.
/// @param f           callable `void(std::int64_t b, std::int64_t e)`.
template <class F>
void parallel_for(std::int64_t begin, std::int64_t end, std::int64_t grain, F&& f) {
  if (end <= begin) return;
  if (grain < 1) grain = 1;
  if (end - begin <= grain) {
    f(begin, end);
    return;
  }
  using Fn = std::remove_reference_t<F>;
  parallel_for_impl(
      begin, end, grain,
      [](void* ctx, std::int64_t b, std::int64_t e) { (*static_cast<Fn*>(ctx))(b, e); },
      const_cast<void*>(static_cast<const void*>(&f)));
}

}  // namespace detail
}  // namespace cpu
}  // namespace attnstate
