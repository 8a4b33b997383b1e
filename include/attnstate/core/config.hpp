/// @file config.hpp
/// @brief Compiler portability macros shared by host and device code.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
/// Marks a function callable from host and device code (`__host__ __device__` under nvcc).
#define ATTNSTATE_HOST_DEVICE __host__ __device__ __forceinline__
/// Marks a device-only helper.
#define ATTNSTATE_DEVICE __device__ __forceinline__
#else
#define ATTNSTATE_HOST_DEVICE inline
#define ATTNSTATE_DEVICE inline
#endif

/// True while compiling device code (the nvcc device pass).
#if defined(__CUDA_ARCH__)
#define ATTNSTATE_DEVICE_PASS 1
#else
#define ATTNSTATE_DEVICE_PASS 0
#endif

/// Library version, also exported through the CMake package version file.
#define ATTNSTATE_VERSION_MAJOR 0
#define ATTNSTATE_VERSION_MINOR 1
#define ATTNSTATE_VERSION_PATCH 0
