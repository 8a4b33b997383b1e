/// @file bench_util.hpp
/// @brief Host helpers shared by the CPU and GPU benchmarks: the median of timings and the CSV
///        file written at the end of a run.
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace bench_util {

/// Median of `v` (the upper one of an even count).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Opens `path` for writing and writes `header` (the column line, newline included); on failure
/// says "cannot write <path>" on stderr and returns nullptr.
inline FILE* open_csv(const std::string& path, const char* header) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return nullptr;
  }
  std::fputs(header, f);
  return f;
}

}  // namespace bench_util
