/// @file cascade_levels.cpp
/// @brief Cascade levels from a page table: a trie over the requests' (page id, tokens) keys
///        gives the request order, the longest common prefixes of neighbours in that order give
///        the tree of shared prefixes, which is cut into levels.
#include "attnstate/core/cascade_levels.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "attnstate/core/checked.hpp"
#include "attnstate/core/error.hpp"
#include "attnstate/core/merge_math.hpp"
#include "common/validate.hpp"

namespace attnstate {
namespace {

using detail::throw_argument;

constexpr const char* kBuild = "attnstate::build_cascade_levels";
constexpr std::int64_t kMaxInt32 = std::numeric_limits<std::int32_t>::max();
constexpr std::int64_t kMaxBatch = std::int64_t{1}
                                   << 30;  // a level's segments (check_cascade_levels)

std::string str(std::int64_t v) { return std::to_string(v); }

/// The checked page table: request `b` has `len(b)` tokens in `pages(b)` pages.
struct Table {
  const PagedKvCache& kv;
  std::int64_t ps;

  std::int64_t len(std::int64_t b) const { return kv.seq_lens[b]; }
  std::int64_t pages(std::int64_t b) const { return len(b) / ps + (len(b) % ps != 0); }
  std::int32_t page(std::int64_t b, std::int64_t d) const {
    return kv.block_table != nullptr ? kv.block_table[b * kv.block_table_stride + d]
                                     : kv.page_indices[kv.page_indptr[b] + d];
  }
  /// Tokens of pages `[a, e)` of request `b` (its last page may be partial).
  std::int64_t tokens(std::int64_t b, std::int64_t a, std::int64_t e) const {
    return std::min(len(b), e * ps) - std::min(len(b), a * ps);
  }
  /// The trie key of page `d` of request `b`: the page id and the tokens the request holds in
  /// it (`ps < 2^31`, so the two fit in 63 bits).
  std::int64_t key(std::int64_t b, std::int64_t d) const {
    return (std::int64_t{page(b, d)} << 32) | tokens(b, d, d + 1);
  }
  /// Keys of `a` and `c` equal from the start (the longest common prefix, in pages).
  std::int64_t common_prefix(std::int64_t a, std::int64_t c) const {
    const std::int64_t n = std::min(pages(a), pages(c));
    std::int64_t d = 0;
    while (d < n && key(a, d) == key(c, d)) ++d;
    return d;
  }
};

void check_options(const CascadeLevelsOptions& o) {
  if (o.min_shared_tokens < 0)
    throw_argument(kBuild, "options.min_shared_tokens", ">= 0", str(o.min_shared_tokens));
  if (o.max_levels < 1 || o.max_levels > kMaxCascadeLevels)
    throw_argument(kBuild, "options.max_levels", "1.." + str(kMaxCascadeLevels), str(o.max_levels));
  if (o.q_len < 1 || o.q_len > kMaxCascadeQueryLen)
    throw_argument(kBuild, "options.q_len", "1.." + str(kMaxCascadeQueryLen), str(o.q_len));
}

/// Checks the scalar fields and pointers of the table.
void check_table_fields(const PagedKvCache& kv) {
  detail::check_space(kBuild, "table.space", kv.space, MemorySpace::kHost);
  if (kv.page_size < 1 || kv.page_size > kMaxInt32)
    throw_argument(kBuild, "table.page_size", "1..2^31 - 1", str(kv.page_size));
  detail::check_min(kBuild, "table.num_pages", kv.num_pages, 0);
  detail::check_min(kBuild, "table.batch", kv.batch, 0);
  if (kv.batch > kMaxBatch)
    throw_argument(kBuild, "table.batch", "at most 2^30 requests (the segments of a level)",
                   str(kv.batch));
  if (kv.batch == 0) return;
  detail::check_not_null(kBuild, "table.seq_lens", kv.seq_lens);
  const bool csr = kv.page_indptr != nullptr || kv.page_indices != nullptr;
  const bool bt = kv.block_table != nullptr;
  if (csr == bt)
    throw_argument(kBuild, "table.block_table", "exactly one of a CSR table and a block table",
                   csr ? "both" : "neither");
  if (csr) {
    detail::check_not_null(kBuild, "table.page_indptr", kv.page_indptr);
    detail::check_not_null(kBuild, "table.page_indices", kv.page_indices);
  } else {
    detail::check_min(kBuild, "table.block_table_stride", kv.block_table_stride, 0);
    std::int64_t bytes = 0;
    if (!checked_mul(kv.batch, kv.block_table_stride, &bytes) || !checked_mul(bytes, 4, &bytes))
      throw_argument(kBuild, "table.block_table_stride",
                     "batch * block_table_stride within 2^62 bytes",
                     str(kv.block_table_stride) + " (with batch " + str(kv.batch) + ")");
  }
  detail::check_aligned(kBuild, "table.seq_lens", kv.seq_lens, sizeof(std::int32_t));
  detail::check_aligned(kBuild, "table.page_indptr", kv.page_indptr, sizeof(std::int32_t));
  detail::check_aligned(kBuild, "table.page_indices", kv.page_indices, sizeof(std::int32_t));
  detail::check_aligned(kBuild, "table.block_table", kv.block_table, sizeof(std::int32_t));
}

/// Checks the contents of the table: offsets, lengths against the pages and `q_len`, page ids
/// inside the pool, the total of pages within the levels' int32 offsets. Returns the tokens.
std::int64_t check_table_contents(const Table& t, std::int64_t q_len) {
  const PagedKvCache& kv = t.kv;
  if (kv.block_table == nullptr) {
    if (kv.page_indptr[0] != 0)
      throw_argument(kBuild, "table.page_indptr[0]", "0", str(kv.page_indptr[0]));
    for (std::int64_t b = 0; b < kv.batch; ++b)
      if (kv.page_indptr[b + 1] < kv.page_indptr[b])
        throw_argument(kBuild, ("table.page_indptr[" + str(b + 1) + "]").c_str(),
                       ">= page_indptr[" + str(b) + "] = " + str(kv.page_indptr[b]),
                       str(kv.page_indptr[b + 1]));
  }
  std::int64_t total_pages = 0, total_tokens = 0;
  for (std::int64_t b = 0; b < kv.batch; ++b) {
    const std::int64_t len = t.len(b);
    const std::string name = "table.seq_lens[" + str(b) + "]";
    if (len < 0) throw_argument(kBuild, name.c_str(), ">= 0", str(len));
    const std::int64_t have = kv.block_table != nullptr
                                  ? kv.block_table_stride
                                  : std::int64_t{kv.page_indptr[b + 1]} - kv.page_indptr[b];
    const std::int64_t need = t.pages(b);
    if (need > have)
      throw_argument(kBuild, name.c_str(),
                     "at most the request's " + str(have) + " pages of " + str(t.ps) + " tokens",
                     str(len));
    if (len < q_len - 1)
      throw_argument(kBuild, name.c_str(),
                     ">= options.q_len - 1 = " + str(q_len - 1) +
                         " (the remainder of a causal cascade holds the new tokens)",
                     str(len));
    for (std::int64_t d = 0; d < need; ++d) {
      const std::int64_t id = t.page(b, d);
      if (id < 0 || id >= kv.num_pages) {
        const std::string at = kv.block_table != nullptr
                                   ? "table.block_table[" + str(b * kv.block_table_stride + d) + "]"
                                   : "table.page_indices[" + str(kv.page_indptr[b] + d) + "]";
        throw_argument(kBuild, at.c_str(),
                       "a page id in [0, num_pages = " + str(kv.num_pages) + ")", str(id));
      }
    }
    total_pages += need;  // at most 2^30 requests of fewer than 2^31 pages: no overflow
    total_tokens += len;
  }
  if (total_pages > kMaxInt32)
    throw_argument(kBuild, "table.seq_lens",
                   "at most 2^31 - 1 pages in all (the levels' page offsets are int32)",
                   str(total_pages) + " pages");
  return total_tokens;
}

/// A node of the trie over the requests' keys: its children in the order they were first
/// reached (so by their smallest request index), and either the request ending here (a leaf)
/// or the request whose keys from `tail_depth` on hang below it unexpanded (no other request
/// has reached it yet).
struct TrieNode {
  std::int64_t first = -1, last = -1, next = -1;
  std::int64_t end_request = -1;
  std::int64_t tail_request = -1, tail_depth = 0;
};

struct TrieKey {
  std::int64_t parent, key;
  bool operator==(const TrieKey& o) const { return parent == o.parent && key == o.key; }
};

struct TrieKeyHash {
  std::size_t operator()(const TrieKey& k) const {
    std::uint64_t x = static_cast<std::uint64_t>(k.parent) * 0x9E3779B97F4A7C15ull ^
                      static_cast<std::uint64_t>(k.key);
    x ^= x >> 31;  // splitmix64's finaliser
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return static_cast<std::size_t>(x);
  }
};

/// The request order: the trie's depth-first order. A request's path is expanded only as far
/// as an earlier request shares it (plus one node), so the trie holds `O(batch + shared pages)`
/// nodes.
class Trie {
 public:
  explicit Trie(const Table& t) : t_(t) {
    nodes_.emplace_back();  // the root
    map_.reserve(static_cast<std::size_t>(2 * t.kv.batch));
    for (std::int64_t b = 0; b < t.kv.batch; ++b) insert(b);
  }

  std::vector<std::int32_t> order() const {
    std::vector<std::int32_t> out;
    out.reserve(static_cast<std::size_t>(t_.kv.batch));
    std::vector<std::int64_t> stack;
    if (nodes_[0].first >= 0) stack.push_back(nodes_[0].first);
    while (!stack.empty()) {  // preorder; a node's siblings wait below its subtree
      const TrieNode& n = nodes_[stack.back()];
      stack.pop_back();
      if (n.end_request >= 0) out.push_back(static_cast<std::int32_t>(n.end_request));
      if (n.tail_request >= 0) out.push_back(static_cast<std::int32_t>(n.tail_request));
      if (n.next >= 0) stack.push_back(n.next);
      if (n.first >= 0) stack.push_back(n.first);
    }
    return out;
  }

 private:
  std::int64_t add_child(std::int64_t parent) {
    const std::int64_t c = static_cast<std::int64_t>(nodes_.size());
    nodes_.emplace_back();
    TrieNode& p = nodes_[parent];
    if (p.last >= 0) {
      nodes_[p.last].next = c;
    } else {
      p.first = c;
    }
    p.last = c;
    return c;
  }
  /// A child of `x` at depth `d` for page `d` of request `b`, holding the rest of `b` unexpanded.
  void add_path(std::int64_t x, std::int64_t b, std::int64_t d) {
    const std::int64_t c = add_child(x);
    map_.emplace(TrieKey{x, t_.key(b, d)}, c);
    if (d + 1 == t_.pages(b)) {
      nodes_[add_child(c)].end_request = b;
    } else {
      nodes_[c].tail_request = b;
      nodes_[c].tail_depth = d + 1;
    }
  }
  void insert(std::int64_t b) {
    const std::int64_t n = t_.pages(b);
    std::int64_t x = 0;
    for (std::int64_t d = 0;; ++d) {
      if (nodes_[x].tail_request >= 0) {  // b reaches x: expand the earlier request's tail first
        const std::int64_t r = nodes_[x].tail_request;
        nodes_[x].tail_request = -1;
        add_path(x, r, nodes_[x].tail_depth);
      }
      if (d == n) {
        nodes_[add_child(x)].end_request = b;
        return;
      }
      const auto it = map_.find(TrieKey{x, t_.key(b, d)});
      if (it == map_.end()) {
        add_path(x, b, d);
        return;
      }
      x = it->second;
    }
  }

  const Table& t_;
  std::vector<TrieNode> nodes_;
  std::unordered_map<TrieKey, std::int64_t, TrieKeyHash> map_;
};

/// A shared prefix: the positions `[lb, rb]` (at least two) agree on their first `lcp` pages and
/// no wider range does (an lcp-interval of the neighbours' common prefixes).
struct Shared {
  std::int64_t lb, rb, lcp, parent;  // parent -1: the forest's root
};

/// The tree of shared prefixes of the ordered requests from the common prefixes of neighbours
/// (`lcp[i]`: positions `i - 1` and `i`, `lcp[0]` unused), parents before children, and for every
/// position its deepest shared prefix (-1: none).
struct SharedTree {
  std::vector<Shared> nodes;
  std::vector<std::int64_t> deepest;

  explicit SharedTree(const std::vector<std::int64_t>& lcp) {
    const std::int64_t n = static_cast<std::int64_t>(lcp.size());
    deepest.assign(static_cast<std::size_t>(n), -1);
    std::vector<Shared> done;             // finished, children before parents
    std::vector<std::int64_t> stack{-1};  // open prefixes by index into `open`, -1 the root
    std::vector<Shared> open;
    std::vector<std::int64_t> boundary(static_cast<std::size_t>(n + 1), -1);
    std::vector<std::int64_t> final_index;  // open index -> index into done
    const auto top_lcp = [&] { return stack.back() < 0 ? 0 : open[stack.back()].lcp; };
    for (std::int64_t i = 1; i <= n; ++i) {
      const std::int64_t v = i < n ? lcp[i] : 0;
      std::int64_t lb = i - 1, last = -1;
      while (v < top_lcp()) {
        last = stack.back();
        stack.pop_back();
        open[last].rb = i - 1;
        lb = open[last].lb;
        final_index[last] = static_cast<std::int64_t>(done.size());
        done.push_back(open[last]);
        if (v <= top_lcp()) {
          done.back().parent = stack.back();  // an open index, or -1; mapped below
          last = -1;
        }
      }
      if (v > top_lcp()) {
        open.push_back(Shared{lb, -1, v, stack.back()});
        final_index.push_back(-1);
        if (last >= 0) done[final_index[last]].parent = static_cast<std::int64_t>(open.size()) - 1;
        stack.push_back(static_cast<std::int64_t>(open.size()) - 1);
      }
      boundary[i] = v > 0 ? stack.back() : -1;
    }
    // parents (open indices) to indices of `nodes`, which lists `done` reversed: parents first
    const std::int64_t m = static_cast<std::int64_t>(done.size());
    nodes.resize(static_cast<std::size_t>(m));
    for (std::int64_t k = 0; k < m; ++k) {
      Shared s = done[m - 1 - k];
      s.parent = s.parent < 0 ? -1 : m - 1 - final_index[s.parent];
      nodes[k] = s;
    }
    for (std::int64_t i = 0; i < n; ++i) {  // the deeper of the prefixes on either side
      const std::int64_t a = i >= 1 ? boundary[i] : -1, c = i + 1 < n ? boundary[i + 1] : -1;
      const std::int64_t pick = a < 0 ? c : (c < 0 || open[a].lcp >= open[c].lcp ? a : c);
      deepest[i] = pick < 0 ? -1 : m - 1 - final_index[pick];
    }
  }
};

/// Which shared prefixes become segments, and where each ends (in pages): a node is kept when
/// it holds enough tokens and lies within the shared levels; a node's segment starts where its
/// nearest kept ancestor's ends.
struct Cut {
  const Table& t;
  const SharedTree& tree;
  const std::vector<std::int32_t>& order;
  std::int64_t min_tokens;
  std::vector<char> kept;
  std::vector<std::int64_t> end, anc;  // anc: nearest kept proper ancestor after the first pass

  Cut(const Table& tb, const SharedTree& tr, const std::vector<std::int32_t>& ord,
      const CascadeLevelsOptions& o)
      : t(tb), tree(tr), order(ord), min_tokens(o.min_shared_tokens) {
    const std::size_t m = tree.nodes.size();
    kept.assign(m, 0);
    end.assign(m, 0);
    anc.assign(m, -1);
    std::vector<int> depth(m, 0);
    for (std::size_t u = 0; u < m; ++u) {  // parents first
      const Shared& s = tree.nodes[u];
      end[u] = s.lcp;
      const std::int64_t p = s.parent;
      anc[u] = p < 0 ? -1 : (kept[p] ? p : anc[p]);
      depth[u] = anc[u] < 0 ? 0 : depth[anc[u]] + 1;
      kept[u] = depth[u] < o.max_levels - 1 && tokens(u) >= min_tokens;
    }
  }

  /// The nearest kept node at or above `u` (-1: none).
  std::int64_t kept_at_or_above(std::int64_t u) const {
    while (u >= 0 && !kept[u]) u = anc[u];
    return u;
  }
  /// First page of `u`'s segment: the end of its nearest kept ancestor.
  std::int64_t start(std::int64_t u) const {
    const std::int64_t a = kept_at_or_above(anc[u]);
    return a < 0 ? 0 : end[a];
  }
  std::int64_t rep(std::int64_t u) const { return order[tree.nodes[u].lb]; }
  std::int64_t tokens(std::int64_t u) const { return t.tokens(rep(u), start(u), end[u]); }
  /// First page of the remainder of position `i`.
  std::int64_t remainder_start(std::int64_t i) const {
    const std::int64_t u = kept_at_or_above(tree.deepest[i]);
    return u < 0 ? 0 : end[u];
  }

  /// Moves trailing pages of the segments above each remainder shorter than `need` tokens into
  /// it (ends only move up the tree and nodes are only dropped, so every remainder only grows
  /// and one pass over the positions suffices).
  void make_room(std::int64_t need) {
    const std::int64_t n = static_cast<std::int64_t>(order.size());
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t b = order[i];
      std::int64_t u = kept_at_or_above(tree.deepest[i]);
      while (u >= 0 && t.tokens(b, end[u], t.pages(b)) < need) {
        --end[u];
        if (end[u] <= start(u) || tokens(u) < min_tokens) {
          kept[u] = 0;
          u = kept_at_or_above(anc[u]);
        }
      }
    }
  }
};

/// Appends a segment of pages `[a, e)` of request `b` (`b < 0`: an empty segment) serving
/// `requests` positions.
void push_segment(CascadeLevels::Arrays& lv, const Table& t, std::int64_t b, std::int64_t a,
                  std::int64_t e, std::int64_t requests) {
  lv.request_indptr.push_back(static_cast<std::int32_t>(lv.request_indptr.back() + requests));
  std::int64_t len = 0;
  if (b >= 0) {
    for (std::int64_t d = a; d < e; ++d) lv.page_indices.push_back(t.page(b, d));
    len = t.tokens(b, a, e);
  }
  lv.page_indptr.push_back(static_cast<std::int32_t>(lv.page_indices.size()));
  lv.seg_lens.push_back(static_cast<std::int32_t>(len));
}

CascadeLevels::Arrays empty_arrays() {
  CascadeLevels::Arrays a;
  a.request_indptr.push_back(0);
  a.page_indptr.push_back(0);
  return a;
}

/// The shared level of the kept nodes `nodes` (disjoint, by first position): their segments,
/// and empty segments for the positions between them, each serving at most as many positions
/// as the level's largest shared segment (so they change no choice a plan makes from the rows
/// of a level's segments).
CascadeLevels::Arrays shared_level(const Cut& cut, const std::vector<std::int64_t>& nodes,
                                   std::int64_t batch) {
  CascadeLevels::Arrays lv = empty_arrays();
  std::int64_t widest = 1;
  for (const std::int64_t u : nodes)
    widest = std::max(widest, cut.tree.nodes[u].rb - cut.tree.nodes[u].lb + 1);
  std::int64_t pos = 0;
  const auto gap = [&](std::int64_t until) {
    for (; pos < until; pos += std::min(widest, until - pos))
      push_segment(lv, cut.t, -1, 0, 0, std::min(widest, until - pos));
  };
  for (const std::int64_t u : nodes) {
    const Shared& s = cut.tree.nodes[u];
    gap(s.lb);
    push_segment(lv, cut.t, cut.rep(u), cut.start(u), cut.end[u], s.rb - s.lb + 1);
    pos = s.rb + 1;
  }
  gap(batch);
  return lv;
}

}  // namespace

CascadeLevels::CascadeLevels() {
  Arrays a = empty_arrays();
  a.request_indptr.push_back(0);
  a.page_indptr.push_back(0);
  a.seg_lens.push_back(0);
  arrays_.push_back(std::move(a));
  refresh_views();
}

CascadeLevels::CascadeLevels(const CascadeLevels& other)
    : batch_(other.batch_),
      page_size_(other.page_size_),
      keys_total_(other.keys_total_),
      arrays_(other.arrays_),
      order_(other.order_) {
  refresh_views();
}

CascadeLevels& CascadeLevels::operator=(const CascadeLevels& other) {
  if (this != &other) {
    batch_ = other.batch_;
    page_size_ = other.page_size_;
    keys_total_ = other.keys_total_;
    arrays_ = other.arrays_;
    order_ = other.order_;
    refresh_views();
  }
  return *this;
}

void CascadeLevels::refresh_views() {
  views_.clear();
  for (const Arrays& a : arrays_) {
    CascadeLevel v;
    v.num_segments = static_cast<std::int64_t>(a.seg_lens.size());
    v.request_indptr = a.request_indptr.data();
    v.page_indptr = a.page_indptr.data();
    v.page_indices = a.page_indices.empty() ? nullptr : a.page_indices.data();
    v.seg_lens = a.seg_lens.data();
    views_.push_back(v);
  }
}

const CascadeLevels::Arrays& CascadeLevels::arrays(int level) const {
  if (level < 0 || level >= num_levels())
    throw_argument("attnstate::CascadeLevels::arrays", "level",
                   "0..num_levels() - 1 = " + str(num_levels() - 1), str(level));
  return arrays_[static_cast<std::size_t>(level)];
}

bool CascadeLevels::identity_order() const {
  for (std::size_t i = 0; i < order_.size(); ++i)
    if (order_[i] != static_cast<std::int32_t>(i)) return false;
  return true;
}

std::int64_t CascadeLevels::keys_read() const {
  std::int64_t n = 0;
  for (const Arrays& a : arrays_)
    for (std::size_t s = 0; s < a.seg_lens.size(); ++s)
      if (a.request_indptr[s + 1] > a.request_indptr[s]) n += a.seg_lens[s];
  return n;
}

CascadeLevels build_cascade_levels(const PagedKvCache& table, const CascadeLevelsOptions& options) {
  check_options(options);
  check_table_fields(table);
  const Table t{table, table.page_size};
  CascadeLevels out;
  out.page_size_ = table.page_size;
  if (table.batch == 0) return out;
  out.keys_total_ = check_table_contents(t, options.q_len);
  out.batch_ = table.batch;
  out.order_ = Trie(t).order();

  const std::int64_t batch = table.batch;
  std::vector<std::int64_t> lcp(static_cast<std::size_t>(batch), 0);
  for (std::int64_t i = 1; i < batch; ++i)
    lcp[i] = t.common_prefix(out.order_[i - 1], out.order_[i]);
  const SharedTree tree(lcp);
  Cut cut(t, tree, out.order_, options);
  if (options.q_len > 1) cut.make_room(options.q_len - 1);

  // the kept nodes by depth (count of kept ancestors), each depth by first position
  std::vector<std::vector<std::int64_t>> by_depth;
  std::vector<int> depth(tree.nodes.size(), 0);
  for (std::size_t u = 0; u < tree.nodes.size(); ++u) {
    if (!cut.kept[u]) continue;
    const std::int64_t a = cut.kept_at_or_above(cut.anc[u]);
    depth[u] = a < 0 ? 0 : depth[a] + 1;
    if (by_depth.size() <= static_cast<std::size_t>(depth[u])) by_depth.resize(depth[u] + 1);
    by_depth[depth[u]].push_back(static_cast<std::int64_t>(u));
  }
  out.arrays_.clear();
  for (std::vector<std::int64_t>& nodes : by_depth) {
    std::sort(nodes.begin(), nodes.end(),
              [&](std::int64_t a, std::int64_t c) { return tree.nodes[a].lb < tree.nodes[c].lb; });
    out.arrays_.push_back(shared_level(cut, nodes, batch));
  }
  CascadeLevels::Arrays own = empty_arrays();
  for (std::int64_t i = 0; i < batch; ++i) {
    const std::int64_t b = out.order_[i];
    push_segment(own, t, b, cut.remainder_start(i), t.pages(b), 1);
  }
  out.arrays_.push_back(std::move(own));
  out.refresh_views();
  return out;
}

std::string to_string(const CascadeLevels& levels) {
  std::string s = "cascade levels: batch " + str(levels.batch()) + ", page_size " +
                  str(levels.page_size()) + ", " + str(levels.num_levels()) + " level" +
                  (levels.num_levels() == 1 ? "" : "s") + ", order ";
  std::int64_t moved = 0;
  for (std::size_t i = 0; i < levels.order().size(); ++i)
    moved += levels.order()[i] != static_cast<std::int32_t>(i);
  s += moved == 0 ? "identity" : "permuted (" + str(moved) + " moved)";
  s += ", keys read " + str(levels.keys_read()) + " of " + str(levels.keys_total());
  const auto range = [](std::int64_t lo, std::int64_t hi) {
    return lo == hi ? str(lo) : str(lo) + ".." + str(hi);
  };
  for (int l = 0; l < levels.num_levels(); ++l) {
    const CascadeLevels::Arrays& a = levels.arrays(l);
    const bool own = l == levels.num_levels() - 1;
    std::int64_t segs = 0, empty = 0, tokens = 0;
    std::int64_t rmin = std::numeric_limits<std::int64_t>::max(), rmax = 0;
    std::int64_t tmin = std::numeric_limits<std::int64_t>::max(), tmax = 0;
    for (std::size_t k = 0; k < a.seg_lens.size(); ++k) {
      const std::int64_t r = a.request_indptr[k + 1] - a.request_indptr[k], len = a.seg_lens[k];
      if (!own && len == 0) {
        ++empty;
        continue;
      }
      ++segs;
      tokens += len;
      rmin = std::min(rmin, r);
      rmax = std::max(rmax, r);
      tmin = std::min(tmin, len);
      tmax = std::max(tmax, len);
    }
    s += "; level " + str(l) + (own ? " (own): " : ": ") + str(segs) + (own ? "" : " shared");
    if (segs > 0) {
      s += " (";
      if (!own) s += range(rmin, rmax) + " requests, ";
      s += range(tmin, tmax) + " tokens";
      if (own || segs > 1) s += ", " + str(tokens) + " in all";
      s += ")";
    }
    if (empty > 0) s += ", " + str(empty) + " empty";
  }
  return s;
}

ConstTensorView gather_queries(const CascadeLevels& levels, const ConstTensorView& q, void* dst,
                               std::int64_t dst_bytes) {
  constexpr const char* kFn = "attnstate::gather_queries";
  detail::check_tensor(kFn, "q", q, 4, MemorySpace::kHost);
  if (q.shape[0] != levels.batch())
    throw_argument(kFn, "q.shape[0]", "levels.batch() = " + str(levels.batch()), str(q.shape[0]));
  const std::int64_t q_bytes = detail::check_tensor_span(kFn, "q", q);
  const std::int64_t elem = static_cast<std::int64_t>(size_of(q.dtype));
  const std::int64_t need = q.numel() * elem;  // q's span fits in 2^62 bytes, so does this
  if (need > 0) {
    detail::check_not_null(kFn, "dst", dst);
    if (dst_bytes < need)
      throw_argument(kFn, "dst_bytes", ">= " + str(need) + " (the queries' bytes)", str(dst_bytes));
    detail::check_aligned(kFn, "dst", dst, size_of(q.dtype));
    if (detail::ranges_overlap(dst, need, q.data, q_bytes))
      throw_argument(kFn, "dst", "memory disjoint from q", "an overlap");
  }
  const std::int64_t q_len = q.shape[1], heads = q.shape[2], D = q.shape[3];
  const auto* src = static_cast<const unsigned char*>(q.data);
  auto* out = static_cast<unsigned char*>(dst);
  for (std::int64_t i = 0; i < q.shape[0]; ++i)
    for (std::int64_t t = 0; t < q_len; ++t)
      for (std::int64_t h = 0; h < heads; ++h) {
        const std::int64_t from =
            levels.order()[i] * q.stride[0] + t * q.stride[1] + h * q.stride[2];
        const std::int64_t to = ((i * q_len + t) * heads + h) * D;
        std::memcpy(out + to * elem, src + from * elem, static_cast<std::size_t>(D * elem));
      }
  return make_tensor_view(dst, q.dtype, {q.shape[0], q_len, heads, D});
}

void scatter_state(const CascadeLevels& levels, const ConstStateView& src, StateView dst) {
  constexpr const char* kFn = "attnstate::scatter_state";
  detail::check_state(kFn, "src", src, MemorySpace::kHost, /*fp8=*/true);
  detail::check_output_state(kFn, "dst", dst, MemorySpace::kHost, /*fp8=*/true);
  detail::check_same_shape(kFn, "src", src, "dst", dst);
  const std::int64_t batch = levels.batch();
  if (batch == 0 ? src.tokens != 0 : src.tokens % batch != 0)
    throw_argument(kFn, "src.tokens",
                   "a multiple of levels.batch() = " + str(batch) + " (batch * q_len)",
                   str(src.tokens));
  if (dst.dtype != src.dtype)
    throw_argument(kFn, "dst.dtype", std::string(to_string(src.dtype)) + " (as src.dtype)",
                   to_string(dst.dtype));
  if (dst.o_scale != src.o_scale)
    throw_argument(kFn, "dst.o_scale", std::to_string(src.o_scale) + " (as src.o_scale)",
                   std::to_string(dst.o_scale));
  detail::check_disjoint(kFn, "dst", dst, "src", src.o, detail::o_bytes(src), src.lse,
                         detail::lse_bytes(src));
  if (batch == 0) return;
  const std::int64_t q_len = src.tokens / batch;
  const std::int64_t elem = static_cast<std::int64_t>(size_of(src.dtype));
  const auto* so = static_cast<const unsigned char*>(src.o);
  auto* dout = static_cast<unsigned char*>(dst.o);
  for (std::int64_t i = 0; i < batch; ++i)
    for (std::int64_t t = 0; t < q_len; ++t) {
      const std::int64_t from = i * q_len + t, to = levels.order()[i] * q_len + t;
      for (std::int64_t h = 0; h < src.heads; ++h) {
        std::memcpy(dout + dst.o_offset(to, h) * elem, so + src.o_offset(from, h) * elem,
                    static_cast<std::size_t>(src.head_dim * elem));
        dst.lse[dst.lse_offset(to, h)] =
            math::convert_lse(src.lse[src.lse_offset(from, h)], src.base, dst.base);
      }
    }
}

}  // namespace attnstate
