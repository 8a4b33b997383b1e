/// @file catalog_table.cpp
/// @brief `catalog_table PAGE [--write]`: the catalog's table (`catalog::markdown_table()`) in the
///        page between its markers, checked (exit 1 on drift, naming the target that rewrites
///        it) or rewritten with `--write` (the `catalog_docs` target). The page shows the default
///        build's rows: a build with fewer `ATTNSTATE_CUDA_HEAD_DIMS` skips (exit 77).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <type_traits>

#include "catalog/catalog.hpp"
#include "common/compiled.hpp"

namespace {

constexpr const char* kBegin =
    "<!-- catalog-table: begin (the catalog_docs target writes it) -->\n";
constexpr const char* kEnd = "<!-- catalog-table: end -->\n";
constexpr int kSkip = 77;  // ctest's SKIP_RETURN_CODE

}  // namespace

int main(int argc, char** argv) {
  namespace catalog = attnstate::catalog;
  namespace compiled = attnstate::compiled;
  const bool write = argc == 3 && std::string(argv[2]) == "--write";
  if (argc != 2 && !write) {
    std::cerr << "usage: catalog_table PAGE [--write]\n";
    return 2;
  }
  if (!std::is_same_v<compiled::BuildHeadDims, compiled::SupportedHeadDims>) {
    std::cout << "catalog_table: the page shows the default ATTNSTATE_CUDA_HEAD_DIMS; this build "
                 "has fewer head dims (skipped)\n";
    return kSkip;
  }
  std::ifstream in(argv[1]);
  if (!in.good()) {
    std::cerr << "catalog_table: cannot read " << argv[1] << "\n";
    return 1;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string page = ss.str();
  const std::size_t begin = page.find(kBegin);
  const std::size_t end = begin == std::string::npos ? begin : page.find(kEnd, begin);
  if (end == std::string::npos) {
    std::cerr << "catalog_table: " << argv[1] << ": expected the markers " << kBegin << " and "
              << kEnd;
    return 1;
  }
  const std::size_t from = begin + std::string(kBegin).size();
  const std::string table = catalog::markdown_table();
  if (page.compare(from, end - from, table) == 0) return 0;
  if (!write) {
    std::cerr << "catalog_table: " << argv[1] << ": the table differs from the catalog's; "
              << "rewrite it with `cmake --build <build> --target catalog_docs`\n";
    return 1;
  }
  std::ofstream out(argv[1]);
  out << page.substr(0, from) << table << page.substr(end);
  if (!out.good()) {
    std::cerr << "catalog_table: cannot write " << argv[1] << "\n";
    return 1;
  }
  std::cout << "catalog_table: rewrote the table of " << argv[1] << "\n";
  return 0;
}
