/// @file bits_table.hpp
/// @brief Support of the bitwise-regression test: FNV-1a hashes of output bytes, a seeded
///        generator of test values, and the committed tables of recorded hashes (one per GPU).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "attnstate/core/dtype.hpp"

namespace attnstate_test {

/// FNV-1a (64 bits) of `n` bytes, continuing from `h`.
inline std::uint64_t fnv1a(const void* data, std::size_t n,
                           std::uint64_t h = 14695981039346656037ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

/// A fixed-seed generator (splitmix64) whose sequence does not depend on the standard library,
/// so the recorded inputs are the same with any compiler.
class BitsRng {
 public:
  explicit BitsRng(std::uint64_t seed) : s_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform in [lo, hi).
  float uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>((next() >> 40) * (1.0 / 16777216.0));
  }
  /// Uniform in [0, n).
  std::int64_t below(std::int64_t n) { return static_cast<std::int64_t>(next() % n); }

 private:
  std::uint64_t s_;
};

/// Raw storage of `n` values of `dt`, uniform in [lo, hi).
inline std::vector<unsigned char> random_values(BitsRng& rng, attnstate::DType dt, std::int64_t n,
                                                float lo = -1.f, float hi = 1.f) {
  std::vector<unsigned char> raw(static_cast<std::size_t>(n) * attnstate::size_of(dt));
  for (std::int64_t i = 0; i < n; ++i) {
    const float x = rng.uniform(lo, hi);
    if (dt == attnstate::DType::kF32) {
      std::memcpy(&raw[4 * i], &x, 4);
    } else if (dt == attnstate::DType::kF16) {
      const auto h = attnstate::from_float<attnstate::half_t>(x);
      std::memcpy(&raw[2 * i], &h, 2);
    } else {
      const auto h = attnstate::from_float<attnstate::bfloat16_t>(x);
      std::memcpy(&raw[2 * i], &h, 2);
    }
  }
  return raw;
}

/// The recorded hashes: every `output_bits*.txt` of the test's folder (`ATTNSTATE_BITS_DIR`), one
/// per GPU it was recorded on, each a `# device` line naming that GPU and then `name hash`
/// lines; the table of the current GPU applies. With the environment variable
/// `ATTNSTATE_OUTPUT_BITS_WRITE=<file>` set, the test appends its hashes to that file (writing
/// the device line first when the file is new) instead of comparing them;
/// `ATTNSTATE_OUTPUT_BITS_TABLE=<file>` compares with that table alone.
class BitsTable {
 public:
  static BitsTable& get() {
    static BitsTable t;
    return t;
  }
  /// The device line of the current GPU.
  static std::string device_line(const std::string& name, int major, int minor, int sms) {
    return "# device " + name + " | sm_" + std::to_string(major) + std::to_string(minor) +
           " | sms " + std::to_string(sms);
  }
  /// True when writing a table rather than comparing with one.
  bool writing() const { return !write_path_.empty(); }
  /// Empty when a recorded table applies to this GPU, else why not.
  std::string mismatch(const std::string& device) const {
    if (writing()) return {};
    if (tables_.empty()) return "no recorded table at " + source_;
    if (tables_.count(device) == 0) {
      std::string seen;
      for (const auto& t : tables_) seen += (seen.empty() ? "'" : ", '") + t.first + "'";
      return "no table recorded on '" + device + "' at " + source_ + " (recorded: " + seen + ")";
    }
    return {};
  }
  /// Records (writing) or checks the hash of case `name`.
  void check(const std::string& name, std::uint64_t hash, const std::string& device) {
    char hex[32];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
    if (writing()) {
      std::ifstream probe(write_path_);
      const bool fresh = !probe.good() || probe.peek() == std::ifstream::traits_type::eof();
      probe.close();
      std::ofstream out(write_path_, std::ios::app);
      if (fresh) out << device << "\n";
      out << name << " " << hex << "\n";
      return;
    }
    const auto& recorded = tables_.at(device);
    const auto it = recorded.find(name);
    if (it == recorded.end()) {
      ADD_FAILURE() << name << ": no recorded bits (hash " << hex << ")";
      return;
    }
    EXPECT_EQ(it->second, hex) << name << ": output bits differ from the recorded ones";
  }

 private:
  BitsTable() {
    if (const char* w = std::getenv("ATTNSTATE_OUTPUT_BITS_WRITE")) write_path_ = w;
    std::vector<std::string> paths;
    if (const char* t = std::getenv("ATTNSTATE_OUTPUT_BITS_TABLE")) {
      source_ = t;
      paths.push_back(t);
    } else {
      std::error_code ec;
      for (const auto& e : std::filesystem::directory_iterator(source_, ec)) {
        const std::string f = e.path().filename().string();
        if (f.rfind("output_bits", 0) == 0 && e.path().extension() == ".txt")
          paths.push_back(e.path().string());
      }
    }
    for (const std::string& path : paths) read(path);
  }
  /// Adds the table at `path` under its device line.
  void read(const std::string& path) {
    std::ifstream in(path);
    std::string line, device;
    std::map<std::string, std::string> recorded;
    while (std::getline(in, line)) {
      if (line.rfind("# device ", 0) == 0) {
        device = line;
      } else if (!line.empty() && line[0] != '#') {
        std::istringstream ls(line);
        std::string name, hex;
        if (ls >> name >> hex) recorded[name] = hex;
      }
    }
    if (!device.empty()) tables_[device] = std::move(recorded);
  }
  std::string write_path_;
  std::string source_ = ATTNSTATE_BITS_DIR;
  std::map<std::string, std::map<std::string, std::string>> tables_;  ///< By device line.
};

}  // namespace attnstate_test
