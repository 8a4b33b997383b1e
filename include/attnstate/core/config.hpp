/// @file config.hpp
/// @brief Compiler portability macros shared by host and device code.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define ATTNSTATE_HOST_DEVICE __host__ __device__ __forceinline__
#define ATTNSTATE_DEVICE __device__ __forceinline__
#else
/// Marks a function callable from host and device code (`__host__ __device__` under nvcc,
/// `inline` otherwise): the numerics core compiles with plain g++ and inside kernels.
#define ATTNSTATE_HOST_DEVICE inline
/// Marks a device-only helper (`__device__` under nvcc, `inline` otherwise).
#define ATTNSTATE_DEVICE inline
#endif

/// True while compiling device code (the nvcc device pass).
#if defined(__CUDA_ARCH__)
#define ATTNSTATE_DEVICE_PASS 1
#else
#define ATTNSTATE_DEVICE_PASS 0
#endif

/// Library major version (also in the CMake package version file).
#define ATTNSTATE_VERSION_MAJOR 0
/// Library minor version.
#define ATTNSTATE_VERSION_MINOR 1
/// Library patch version.
#define ATTNSTATE_VERSION_PATCH 0
