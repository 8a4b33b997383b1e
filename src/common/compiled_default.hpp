/// @file compiled_default.hpp
/// @brief The default of `ATTNSTATE_CUDA_HEAD_DIMS` (every head dim), read by
///        `src/common/compiled.hpp` when the build's generated header is not on the include path
///        (a translation unit compiled alone, as `scripts/cubin-diff.sh` does).
#pragma once

#include <utility>

namespace attnstate {
namespace compiled {

/// The head dims of the default `ATTNSTATE_CUDA_HEAD_DIMS`.
using BuildHeadDims = std::integer_sequence<int, 64, 128, 256, 512>;

}  // namespace compiled
}  // namespace attnstate
