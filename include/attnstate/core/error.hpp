/// @file error.hpp
/// @brief The library's one error policy: `attnstate::Error` carrying a typed `Status`.
#pragma once

#include <stdexcept>
#include <string>

namespace attnstate {

/// Category of a failure reported by the library.
enum class Status {
  kSuccess = 0,      ///< No error.
  kInvalidArgument,  ///< An argument violates the documented contract (shape, stride, null, range).
  kNotSupported,     ///< A valid request outside the compiled set (head_dim, dtype, layout).
  kWorkspaceTooSmall,  ///< A caller-provided workspace is smaller than required.
  kCudaError,          ///< A CUDA runtime call or kernel launch failed.
  kInternal,           ///< A broken internal invariant (a library bug).
  kResourceExhausted,  ///< The system refused a resource (e.g. a worker thread could not start).
};

/// Name of a status code ("invalid_argument", ...).
inline const char* to_string(Status s) {
  switch (s) {
    case Status::kSuccess:
      return "success";
    case Status::kInvalidArgument:
      return "invalid_argument";
    case Status::kNotSupported:
      return "not_supported";
    case Status::kWorkspaceTooSmall:
      return "workspace_too_small";
    case Status::kCudaError:
      return "cuda_error";
    case Status::kInternal:
      return "internal";
    case Status::kResourceExhausted:
      return "resource_exhausted";
  }
  return "unknown";
}

/// The exception every public entry point throws on failure.
///
/// Host functions validate their arguments before touching memory; on a violation they throw
/// `Error` with `status()` set and a message of the form
/// `"<function>: argument '<name>': expected <what>, got <value>"`.
class Error : public std::runtime_error {
 public:
  /// An error of category `status` with a human-readable `message`.
  Error(Status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  /// The category of the failure.
  Status status() const noexcept { return status_; }

 private:
  Status status_;
};

namespace detail {

[[noreturn]] inline void throw_argument(const char* func, const char* arg,
                                        const std::string& expected, const std::string& got,
                                        Status status = Status::kInvalidArgument) {
  std::string msg = std::string(func) + ": argument '" + arg + "': expected " + expected;
  msg += ", got " + got;
  throw Error(status, msg);
}

}  // namespace detail
}  // namespace attnstate

/// Throws `attnstate::Error(kInvalidArgument)` naming `arg` unless `cond` holds.
#define ATTNSTATE_CHECK_ARG(cond, func, arg, expected, got)                             \
  do {                                                                                  \
    if (!(cond)) ::attnstate::detail::throw_argument((func), (arg), (expected), (got)); \
  } while (0)
