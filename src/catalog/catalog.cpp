/// @file catalog/catalog.cpp
/// @brief The catalog's names, lists and messages (the rows are constexpr, in catalog.hpp).
#include "catalog/catalog.hpp"

#include <algorithm>
#include <string>
#include <vector>

namespace attnstate {
namespace catalog {
namespace {

/// "a, b or c" of `items` ("none" when empty).
std::string or_list(const std::vector<std::string>& items) {
  std::string s;
  for (std::size_t i = 0; i < items.size(); ++i)
    s += std::string(i == 0 ? "" : i + 1 == items.size() ? " or " : ", ") + items[i];
  return items.empty() ? "none" : s;
}

std::string needs_string(Needs n) {
  static const char* const names[] = {"wgmma (sm_90a)",
                                      "tensor maps",
                                      "a page size with a bulk-copy box",
                                      "one split per request",
                                      "a pool a tensor map describes",
                                      "16-byte aligned query rows",
                                      "page sizes of whole key tiles",
                                      "rows of whole chunks in vector-aligned views",
                                      "rows of 2^k threads of its chunks",
                                      "an output that aliases no input",
                                      "a block of work per SM",
                                      "its shared memory on the device",
                                      "rows of more than one chunk"};
  std::string s;
  for (int b = 0; b < static_cast<int>(sizeof(names) / sizeof(names[0])); ++b)
    if ((n & (1u << b)) != 0) s += std::string(s.empty() ? "" : ", ") + names[b];
  return s.empty() ? "-" : s;
}

}  // namespace

const char* to_string(Family f) {
  switch (f) {
    case Family::kDecodeSplit:
      return "split-KV decode";
    case Family::kDecodeStream:
      return "streamed decode";
    case Family::kCascadeMma:
      return "cascade level (mma.sync)";
    case Family::kCascadeWgmma:
      return "cascade level (wgmma)";
    case Family::kCascadeWs:
      return "cascade level (warp-specialised)";
    case Family::kCascadeMerge:
      return "cascade merge";
    case Family::kMergePair:
      return "pairwise merge";
    case Family::kMergePairWhole:
      return "pairwise merge (whole rows)";
    case Family::kMergePairStream:
      return "pairwise merge (whole rows, streamed inputs)";
    case Family::kMergeStack:
      return "n-ary merge";
    case Family::kMergeFew:
      return "n-ary merge (few states)";
    case Family::kMergeRing:
      return "n-ary merge (ring)";
    case Family::kMergeOdd:
      return "n-ary merge (odd rows)";
    case Family::kMergeRagged:
      return "ragged merge";
    case Family::kMergeRebase:
      return "rebase";
    case Family::kMergeMarkEmpty:
      return "mark empty rows";
    case Family::kMlaDecode:
      return "MLA decode";
    case Family::kMlaCascade:
      return "MLA cascade level";
    case Family::kMlaDecodeWs:
      return "MLA decode (wgmma, warp-specialised)";
    case Family::kMlaDecodeNarrow:
      return "MLA decode (wgmma, narrow: at most 32 rows)";
    case Family::kMlaDecodeNarrow2:
      return "MLA decode (wgmma, narrow, two CTAs per SM: at most 32 rows)";
    case Family::kMlaDecodeWsBalanced:
      return "MLA decode (wgmma, warp-specialised, balanced consumers)";
  }
  return "unknown family";
}

std::string variants_string(Variants v) {
  static const char* const names[] = {"window", "soft cap", "sinks", "prior states"};
  std::string s;
  for (int b = 0; b < 4; ++b)
    if ((v & (1u << b)) != 0) s += std::string(s.empty() ? "" : ", ") + names[b];
  return s.empty() ? "plain" : s;
}

std::string dtypes_string(DTypeMask m) {
  std::vector<std::string> items;
  for (int d = 0; d < 5; ++d)
    if ((m & (1u << d)) != 0) items.push_back(attnstate::to_string(static_cast<DType>(d)));
  return or_list(items);
}

std::vector<int> head_dims(Query q) {
  q.head_dim = 0;
  std::vector<int> dims;
  for (const Row& r : kRows)
    if (matches(r, q) && std::find(dims.begin(), dims.end(), r.head_dim) == dims.end())
      dims.push_back(r.head_dim);
  std::sort(dims.begin(), dims.end());
  return dims;
}

std::string head_dims_string(const Query& q) {
  std::vector<std::string> items;
  for (int d : head_dims(q)) items.push_back(d == 0 ? std::string("any") : std::to_string(d));
  return or_list(items);
}

DTypeMask dtypes(const Query& q, bool kv) {
  DTypeMask m = 0;
  for (const Row& r : kRows)
    if (matches(r, q)) m = static_cast<DTypeMask>(m | mask(kv ? r.kv : r.q));
  return m;
}

std::string not_supported_message(const Query& q) {
  // What the family holds, narrowed step by step to what the request fixed (its head dim, its
  // dtypes), so the message names the nearest compiled kernels.
  Query family;
  family.family = q.family;
  std::string s = std::string("a compiled ") + to_string(q.family) + " kernel (head dims " +
                  head_dims_string(family);
  Query at_dim = family;
  at_dim.head_dim = q.head_dim;
  if (q.head_dim != 0 && compiled(at_dim)) {
    s += "; at head dim " + std::to_string(q.head_dim) + ": queries " +
         dtypes_string(dtypes(at_dim, false)) + ", K/V " + dtypes_string(dtypes(at_dim, true));
    Query at_dtypes = at_dim;
    at_dtypes.q = q.q;
    at_dtypes.kv = q.kv;
    if (compiled(at_dtypes)) {
      // the variant sets of the instances at those dtypes ("sinks, prior states" and "window,
      // soft cap, sinks": no instance takes a window with prior states)
      std::vector<Variants> sets;
      for (const Row& r : kRows)
        if (matches(r, at_dtypes) && std::find(sets.begin(), sets.end(), r.variants) == sets.end())
          sets.push_back(r.variants);
      std::vector<std::string> items;
      for (Variants v : sets) items.push_back("{" + variants_string(v) + "}");
      s += "; instances taking " + or_list(items);
    }
  }
  if (q.variants != kPlain) s += "; asked: " + variants_string(q.variants);
  return s + ")";
}

namespace {

std::string out_string(DTypeMask m) {
  std::string out;
  for (int d = 0; d < 5; ++d)
    if ((m & (1u << d)) != 0)
      out += std::string(out.empty() ? "" : ", ") + attnstate::to_string(static_cast<DType>(d));
  return out;
}

std::string count_string(int n) { return n > 0 ? std::to_string(n) : "-"; }

/// The merges' rows: their own columns (no tile of keys, variants or depth; chunks and states).
std::string merge_table() {
  std::string t =
      "| family | head dim | in (a) | b | out | chunks per thread | states | threads per CTA | "
      "needs | fallback |\n|---|---|---|---|---|---|---|---|---|---|\n";
  for (const Row& r : kRows) {
    if (!is_merge(r.family)) continue;
    t += std::string("| ") + to_string(r.family) + " | " +
         (r.head_dim > 0 ? std::to_string(r.head_dim) : "any") + " | " + attnstate::to_string(r.q) +
         " | " + attnstate::to_string(r.kv) + " | " + out_string(r.out) + " | " +
         count_string(r.chunks) + " | " +
         (r.states > 0 ? "1 to " + std::to_string(r.states) : std::string("any")) + " | " +
         std::to_string(r.tile_rows) + " | " + needs_string(r.needs) + " | " +
         (r.fallback == r.family ? std::string("-") : to_string(r.fallback)) + " |\n";
  }
  return t;
}

}  // namespace

std::string markdown_table() {
  std::string t =
      "| family | head dim | q | K/V | out | variants | stages | tile (rows × keys) | CTAs per SM "
      "| "
      "needs | fallback |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const Row& r : kRows) {
    if (is_merge(r.family)) continue;
    const std::string out = out_string(r.out);
    t += std::string("| ") + to_string(r.family) + " | " + std::to_string(r.head_dim) + " | " +
         attnstate::to_string(r.q) + " | " + attnstate::to_string(r.kv) + " | " + out + " | " +
         variants_string(r.variants) + " | " + (r.stages > 0 ? std::to_string(r.stages) : "-") +
         " | " + std::to_string(r.tile_rows) + " × " +
         (r.tile_keys > 0 ? std::to_string(r.tile_keys) : "-") + " | " +
         (r.ctas_per_sm > 0 ? std::to_string(r.ctas_per_sm) : "-") + " | " + needs_string(r.needs) +
         " | " + (r.fallback == r.family ? std::string("-") : to_string(r.fallback)) + " |\n";
  }
  return t + "\nThe merges:\n\n" + merge_table();
}

}  // namespace catalog
}  // namespace attnstate
