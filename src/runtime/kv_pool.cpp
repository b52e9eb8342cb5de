#include "runtime/kv_pool.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "util/error.h"

namespace g4 {

namespace {

// The widest layer's page holds this many positions: pages of ~0.5 MiB for the 31B, small enough
// that a short chat wastes little, large enough that a table lookup serves many rows.
constexpr int64_t kWidestPagePositions = 32;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t layer_cols(const LayerConfig& l, DType dtype) { return kv_cache_cols(dtype, l.kv_heads, l.head_dim); }
size_t layer_row_bytes(const LayerConfig& l, DType dtype) { return row_bytes(dtype, layer_cols(l, dtype)); }

// Every page and every row in it starts 16-byte aligned (the CUDA kernels' vector loads).
constexpr size_t kPageAlignment = 16;

uint64_t mix64(uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

PrefixHash extended(PrefixHash h, std::span<const int32_t> tokens) {
  for (int32_t t : tokens) {
    const uint64_t v = uint64_t(uint32_t(t));
    h.a = mix64(h.a ^ (v + 0x9e3779b97f4a7c15ull));
    h.b = mix64(h.b + v * 0xd6e8feb86659fd93ull + 0x632be59bd9b4e019ull);
  }
  return h;
}

constexpr PrefixHash kEmptyPrefix{0x243f6a8885a308d3ull, 0x13198a2e03707344ull};

// Appends to `hashes` (those of the first units of `tokens`) the hash of every further whole unit.
void extend_hashes(std::vector<PrefixHash>& hashes, std::span<const int32_t> tokens, size_t unit) {
  for (size_t k = hashes.size(); (k + 1) * unit <= tokens.size(); ++k)
    hashes.push_back(extended(k ? hashes[k - 1] : kEmptyPrefix, tokens.subspan(k * unit, unit)));
}

}  // namespace

KvPageLayout kv_page_layout(const ModelConfig& c, std::span<const DType> layer_dtypes, int64_t max_seq_len) {
  G4_ASSERT(layer_dtypes.size() == c.layers.size(), "kv_page_layout: one KV type per layer");
  const int64_t max_chunk = c.max_prefill_chunk(max_seq_len);
  KvPageLayout layout;
  size_t widest = 0, unit = kPageAlignment;
  for (size_t i = 0; i < c.layers.size(); ++i) {
    widest = std::max(widest, layer_row_bytes(c.layers[i], layer_dtypes[i]));
    unit = std::lcm(unit, layer_row_bytes(c.layers[i], layer_dtypes[i]));
  }
  // Whole rows of every layer, K and V of at least kWidestPagePositions positions of the widest.
  layout.page_bytes = size_t(ceil_div(int64_t(2 * kWidestPagePositions * widest), int64_t(unit))) * unit;
  for (size_t i = 0; i < c.layers.size(); ++i) {
    const LayerConfig& l = c.layers[i];
    const int64_t stride = int64_t(layout.page_bytes / layer_row_bytes(l, layer_dtypes[i])), positions = stride / 2;
    // A sliding layer's ring holds the pages a forward touches: the window before its first
    // position and the positions it stores (docs/DESIGN.md §7).
    const int64_t flat = ceil_div(max_seq_len, positions);
    const int64_t slots = l.sliding ? std::min(flat, ceil_div(c.sliding_window + max_chunk, positions) + 1) : flat;
    layout.page_positions.push_back(positions);
    layout.page_stride.push_back(stride);
    layout.slots.push_back(slots);
    layout.table_offset.push_back(layout.table_entries);
    layout.table_entries += slots;
  }
  return layout;
}

size_t kv_sequence_bytes(const ModelConfig& config, std::span<const DType> layer_dtypes, int64_t max_seq_len) {
  return kv_page_layout(config, layer_dtypes, max_seq_len).sequence_bytes();
}

// ---- KvSequence ----

KvSequence& KvSequence::operator=(KvSequence&& other) noexcept {
  if (this == &other) return *this;
  give_back();
  pool_ = std::exchange(other.pool_, nullptr);
  state_ = std::move(other.state_);
  reserved_ = std::exchange(other.reserved_, 0);
  return *this;
}

void KvSequence::give_back() {
  if (!pool_) return;
  KvPool* pool = std::exchange(pool_, nullptr);
  pool->reserved_ -= std::exchange(reserved_, 0);
  pool->take_back(state_);
}

void KvSequence::truncate(int64_t n) {
  if (pool_) pool_->truncate(state_, n);
}

// ---- KvPool: layout, pages, the prefix cache ----

KvPool::KvPool(const ModelConfig& config, Backend& backend, size_t budget_bytes, KvTypes types)
    : config_(config),
      backend_(backend),
      types_(types),
      layer_dtypes_(layer_kv_dtypes(config, types, backend.activation_dtype())),
      budget_(budget_bytes) {
  for (DType t : layer_dtypes_)
    G4_REQUIRE(kUnsupported, backend.runs_kv_dtype(t),
               "the " + backend.name() + " backend has no attention over " + dtype_name(t) + " KV caches");
  int64_t gcd = 0;
  for (int64_t b : layout(1).page_positions) {
    gcd = std::gcd(gcd, b);
    share_unit_ = std::lcm(share_unit_, b);
  }
  hash_unit_ = std::max<int64_t>(1, gcd);
}

KvPool::~KvPool() = default;

const KvPageLayout& KvPool::layout(int64_t max_seq_len) const {
  for (const auto& [n, layout] : layouts_)
    if (n == max_seq_len) return layout;
  return layouts_.emplace_back(max_seq_len, kv_page_layout(config_, layer_dtypes_, max_seq_len)).second;
}

size_t KvPool::sequence_bytes(int64_t max_seq_len) const { return layout(max_seq_len).sequence_bytes(); }

int64_t KvPool::pages_for_positions(int64_t max_seq_len, int64_t positions) const {
  const KvPageLayout& l = layout(max_seq_len);
  int64_t pages = 0;
  for (size_t i = 0; i < l.slots.size(); ++i) pages += std::min(l.slots[i], ceil_div(positions, l.page_positions[i]));
  return pages;
}

void KvPool::allocate_pages(size_t available, int64_t max_seq_len) {
  G4_ASSERT(arena_.empty() && pages_total_ == 0, "the KV pool's pages are allocated once");
  const size_t page = page_bytes();
  budget_ = std::min(budget_, available);
  G4_REQUIRE(kResourceExhausted, budget_ >= sequence_bytes(max_seq_len),
             "out of KV memory: the KV pool would have " + std::to_string(budget_) +
                 " bytes (its budget, at most what the device has free after the weights and the forward's "
                 "workspaces), less than one sequence's " +
                 std::to_string(sequence_bytes(max_seq_len)) + " bytes at max_seq_len " + std::to_string(max_seq_len) +
                 " (lower --max_seq_len)");
  if (page == 0) return;  // no layers
  pages_total_ = int64_t(budget_ / page);
  budget_ = size_t(pages_total_) * page;
  arena_ = backend_.alloc(DType::I32, pages_total_, int64_t(page / 4));  // pages of whole, aligned words
  const KvPageLayout& l = layout(max_seq_len);
  for (size_t i = 0; i < config_.layers.size(); ++i) {
    Tensor k = arena_;
    k.dtype = layer_dtypes_[i];
    k = k.reshaped(pages_total_ * l.page_stride[i], layer_cols(config_.layers[i], layer_dtypes_[i]));
    layer_rows_.emplace_back(k, k.rows_view(l.page_positions[i], k.rows - l.page_positions[i]));
  }
  pages_.assign(size_t(pages_total_), PageInfo{});
  free_pages_.resize(size_t(pages_total_));
  std::iota(free_pages_.rbegin(), free_pages_.rend(), 0);  // page 0 is taken first
}

Tensor KvPool::page_bytes_view(int32_t page) const { return arena_.rows_view(page, 1); }

int32_t KvPool::take_page() {
  if (free_pages_.empty() && !evictable_.empty()) uncache(evictable_.back());
  G4_REQUIRE(kResourceExhausted, !free_pages_.empty(),
             "out of KV memory: all " + std::to_string(pages_total_) + " pages of " + std::to_string(page_bytes()) +
                 " bytes are held by live sequences");
  const int32_t page = free_pages_.back();
  free_pages_.pop_back();
  return page;
}

void KvPool::hold(int32_t page) {
  PageInfo& p = pages_[size_t(page)];
  if (p.refs == 0 && p.cached) evictable_.erase(p.evictable);
  if (++p.refs == 2) ++shared_pages_;
}

void KvPool::release(int32_t page) {
  PageInfo& p = pages_[size_t(page)];
  G4_ASSERT(p.refs > 0, "a KV page given back more often than it was taken");
  if (p.refs-- == 2) --shared_pages_;
  if (p.refs > 0) return;
  if (p.cached) {
    evictable_.push_front(page);
    p.evictable = evictable_.begin();
  } else {
    free_pages_.push_back(page);
  }
}

void KvPool::uncache(int32_t page) {
  PageInfo& p = pages_[size_t(page)];
  if (!p.cached) return;
  cache_.erase(p.key);
  p.cached = false;
  if (p.refs > 0) return;
  evictable_.erase(p.evictable);
  free_pages_.push_back(page);
}

void KvPool::set_slot(SequencePages& pages, size_t slot, int64_t layer, int32_t page, int64_t logical) {
  hold(page);
  pages.page[slot] = page;
  pages.logical[slot] = int32_t(logical);
  ++pages.held;
  ++pages.held_in_layer[size_t(layer)];
  pages.changed = true;
}

void KvPool::clear_slot(SequencePages& pages, size_t slot, int64_t layer) {
  release(pages.page[slot]);
  pages.page[slot] = pages.logical[slot] = -1;
  --pages.held;
  --pages.held_in_layer[size_t(layer)];
  pages.changed = true;
}

void KvPool::upload_table(SequencePages& pages) {
  if (!pages.changed) return;
  backend_.upload(pages.page.data(), pages.table.rows_view(0, int64_t(pages.page.size())));
  pages.changed = false;
}

std::vector<PrefixHash> KvPool::prefix_hashes(std::span<const int32_t> tokens) const {
  std::vector<PrefixHash> hashes;
  extend_hashes(hashes, tokens, size_t(hash_unit_));
  return hashes;
}

void KvPool::hash_tokens(SequenceState& s) const { extend_hashes(s.prefix_hashes, s.tokens, size_t(hash_unit_)); }

int32_t KvPool::cached_page(int64_t layer, int64_t j, int64_t page_positions, std::span<const PrefixHash> hashes) const {
  const size_t at = size_t((j + 1) * page_positions / hash_unit_) - 1;
  if (at >= hashes.size()) return -1;
  const auto found = cache_.find(PageKey{layer, j, hashes[at]});
  return found == cache_.end() ? -1 : found->second;
}

int64_t KvPool::first_read_page(int64_t layer, int64_t p, int64_t page_positions) const {
  return config_.layers[size_t(layer)].sliding ? std::max<int64_t>(0, p - config_.sliding_window + 1) / page_positions
                                               : 0;
}

// Registers the pages whose positions are all written and that no cache entry names yet (a page
// whose key another page already has stays this sequence's alone).
void KvPool::register_written(SequenceState& s) {
  hash_tokens(s);
  const KvPageLayout& l = layout(s.max_seq_len);
  const int64_t n = int64_t(s.tokens.size());
  SequencePages& pages = s.pages;
  for (size_t i = 0; i < config_.layers.size(); ++i) {
    const int64_t B = l.page_positions[i], S = l.slots[i], end = n / B;
    for (int64_t j = std::max(pages.registered_below[i], pages.freed_below[i]); j < end; ++j) {
      const size_t slot = size_t(l.table_offset[i] + j % S);
      if (pages.logical[slot] != j) continue;
      PageInfo& info = pages_[size_t(pages.page[slot])];
      if (info.cached) continue;
      const PageKey key{int64_t(i), j, s.prefix_hashes[size_t((j + 1) * B / hash_unit_) - 1]};
      if (cache_.emplace(key, pages.page[slot]).second) info.cached = true, info.key = key;
    }
    pages.registered_below[i] = std::max(pages.registered_below[i], end);
  }
}

bool KvPool::prefix_is_cached(int64_t max_seq_len, int64_t p, std::span<const PrefixHash> hashes) const {
  const KvPageLayout& l = layout(max_seq_len);
  for (size_t i = 0; i < config_.layers.size(); ++i) {
    const int64_t B = l.page_positions[i];
    for (int64_t j = p / B - 1; j >= first_read_page(int64_t(i), p, B); --j)  // the last page first: misses end early
      if (cached_page(int64_t(i), j, B, hashes) < 0) return false;
  }
  return true;
}

int64_t KvPool::cached_prefix(int64_t max_seq_len, std::span<const int32_t> prompt) const {
  if (prompt.size() < 2 || cache_.empty()) return 0;
  const int64_t longest = (int64_t(prompt.size()) - 1) / share_unit_ * share_unit_;
  const std::vector<PrefixHash> hashes = prefix_hashes(prompt.first(size_t(longest)));
  for (int64_t p = longest; p > 0; p -= share_unit_)
    if (prefix_is_cached(max_seq_len, p, hashes)) return p;
  return 0;
}

SequenceState KvPool::blank(int64_t max_seq_len) {
  const KvPageLayout& l = layout(max_seq_len);
  SequenceState s;
  s.max_seq_len = max_seq_len;
  const auto table = std::find_if(free_tables_.begin(), free_tables_.end(),
                                  [&](const Tensor& t) { return t.rows == l.table_entries; });
  if (table != free_tables_.end()) {
    s.pages.table = std::move(*table);
    free_tables_.erase(table);
  } else {
    s.pages.table = backend_.alloc(DType::I32, std::max<int64_t>(1, l.table_entries), 1);
  }
  s.pages.page.assign(size_t(l.table_entries), -1);
  s.pages.logical.assign(size_t(l.table_entries), -1);
  s.pages.freed_below.assign(config_.layers.size(), 0);
  s.pages.registered_below.assign(config_.layers.size(), 0);
  s.pages.held_in_layer.assign(config_.layers.size(), 0);
  s.pages.changed = true;
  for (size_t i = 0; i < config_.layers.size(); ++i)
    s.caches.push_back(KvCache{layer_rows_[i].first, layer_rows_[i].second,
                               s.pages.table.rows_view(l.table_offset[i], l.slots[i]), l.page_positions[i],
                               l.page_stride[i]});
  return s;
}

SequenceState KvPool::with_cached_prefix(int64_t max_seq_len, std::span<const int32_t> prompt) {
  SequenceState s = blank(max_seq_len);
  const int64_t p = cached_prefix(max_seq_len, prompt);
  if (p == 0) return s;
  const KvPageLayout& l = layout(max_seq_len);
  s.tokens.assign(prompt.begin(), prompt.begin() + p);
  hash_tokens(s);
  for (size_t i = 0; i < config_.layers.size(); ++i) {
    const int64_t B = l.page_positions[i], first = first_read_page(int64_t(i), p, B);
    for (int64_t j = first; j < p / B; ++j)
      set_slot(s.pages, size_t(l.table_offset[i] + j % l.slots[i]), int64_t(i),
               cached_page(int64_t(i), j, B, s.prefix_hashes), j);
    s.pages.freed_below[i] = first;
    s.pages.registered_below[i] = p / B;
  }
  return s;
}

KvSequence KvPool::live(SequenceState&& state, size_t reserved) {
  G4_ASSERT(pages_total_ > 0 || page_bytes() == 0, "the KV pool's pages are not allocated");
  KvSequence s;
  s.pool_ = this;
  s.state_ = std::move(state);
  s.reserved_ = reserved;
  reserved_ += reserved;
  return s;
}

KvSequence KvPool::acquire(int64_t max_seq_len, std::span<const int32_t> prompt) {
  G4_CHECK(max_seq_len >= 1, "KV caches need max_seq_len >= 1, got " + std::to_string(max_seq_len));
  const size_t need = sequence_bytes(max_seq_len);
  G4_REQUIRE(kResourceExhausted, need <= budget_,
             "out of KV memory: " + std::to_string(need) + " bytes requested (a sequence of " +
                 std::to_string(max_seq_len) + " positions), more than the whole budget of " + std::to_string(budget_) +
                 " bytes");
  G4_REQUIRE(kResourceExhausted, reserved_ + need <= budget_,
             "out of KV memory: " + std::to_string(need) + " bytes requested, " + std::to_string(reserved_) + " of " +
                 std::to_string(budget_) + " reserved by live sessions (end a session, or raise the KV budget)");
  return live(with_cached_prefix(max_seq_len, prompt), need);
}

KvSequence KvPool::start(int64_t max_seq_len, std::span<const int32_t> prompt) {
  G4_CHECK(max_seq_len >= 1, "KV caches need max_seq_len >= 1, got " + std::to_string(max_seq_len));
  return live(with_cached_prefix(max_seq_len, prompt), 0);
}

// ---- KvPool: what sequences need, and preparing a forward ----

namespace {

// Logical pages of [from, end) not held, when only the page holding `from` can be held already.
int64_t new_pages(const SequencePages& pages, int64_t offset, int64_t B, int64_t S, int64_t from, int64_t end) {
  if (end <= from) return 0;
  const int64_t first = from / B, count = ceil_div(end, B) - first;
  return count - (pages.logical[size_t(offset + first % S)] == first ? 1 : 0);
}

}  // namespace

int64_t KvPool::pages_to_start(int64_t max_seq_len, std::span<const int32_t> prompt, int64_t end) const {
  const KvPageLayout& l = layout(max_seq_len);
  const int64_t p = cached_prefix(max_seq_len, prompt);
  const std::vector<PrefixHash> hashes = prefix_hashes(prompt.first(size_t(p)));
  int64_t pages = 0;
  for (size_t i = 0; i < config_.layers.size(); ++i) {
    const int64_t B = l.page_positions[i], first = first_read_page(int64_t(i), p, B);
    pages += std::min(l.slots[i], ceil_div(end, B) - first) - (p / B - first);
    for (int64_t j = first; j < p / B; ++j)  // cached pages no live sequence holds leave the available ones
      if (pages_[size_t(cached_page(int64_t(i), j, B, hashes))].refs == 0) ++pages;
  }
  return pages;
}

int64_t KvPool::pages_to_reach(const KvSequence& sequence, int64_t end) const {
  const SequenceState& s = sequence.state_;
  const KvPageLayout& l = layout(s.max_seq_len);
  int64_t pages = 0;
  for (size_t i = 0; i < config_.layers.size(); ++i) {
    const int64_t n = new_pages(s.pages, l.table_offset[i], l.page_positions[i], l.slots[i], sequence.position(), end);
    pages += config_.layers[i].sliding ? std::min(n, std::max<int64_t>(0, l.slots[i] - s.pages.held_in_layer[i])) : n;
  }
  return pages;
}

int64_t KvPool::pages_for_forward(const KvSequence& sequence, int64_t count) const {
  const SequenceState& s = sequence.state_;
  const KvPageLayout& l = layout(s.max_seq_len);
  int64_t pages = 0;
  for (size_t i = 0; i < config_.layers.size(); ++i)
    pages += new_pages(s.pages, l.table_offset[i], l.page_positions[i], l.slots[i], sequence.position(),
                       sequence.position() + count);
  return pages;
}

void KvPool::release_unread(KvSequence& sequence) {
  SequencePages& pages = sequence.state_.pages;
  const KvPageLayout& l = layout(sequence.max_seq_len());
  for (size_t i = 0; i < config_.layers.size(); ++i) {
    if (!config_.layers[i].sliding) continue;
    const int64_t B = l.page_positions[i], S = l.slots[i];
    // Pages wholly before the window of the next query are read no more.
    const int64_t keep_from = std::max<int64_t>(0, sequence.position() - config_.sliding_window + 1) / B;
    for (int64_t j = pages.freed_below[i]; j < keep_from; ++j) {
      const size_t slot = size_t(l.table_offset[i] + j % S);
      if (pages.logical[slot] == j) clear_slot(pages, slot, int64_t(i));
    }
    pages.freed_below[i] = std::max(pages.freed_below[i], keep_from);
  }
}

void KvPool::prepare(KvSequence& sequence, int64_t count) {
  G4_ASSERT(!sequence.empty() && count >= 1, "prepare: a live sequence and at least one position");
  SequenceState& s = sequence.state_;
  register_written(s);  // before release_unread: a page leaving the window stays cached
  release_unread(sequence);
  const KvPageLayout& l = layout(s.max_seq_len);
  const int64_t from = sequence.position(), end = from + count;
  for (size_t i = 0; i < config_.layers.size(); ++i) {
    const int64_t B = l.page_positions[i], S = l.slots[i];
    for (int64_t j = from / B; j <= (end - 1) / B; ++j) {
      const size_t slot = size_t(l.table_offset[i] + j % S);
      if (s.pages.logical[slot] == j) continue;
      if (s.pages.page[slot] >= 0) clear_slot(s.pages, slot, int64_t(i));
      set_slot(s.pages, slot, int64_t(i), take_page(), j);
    }
  }
  upload_table(s.pages);
}

// ---- KvPool: truncation, preemption, giving back ----

void KvPool::own_slot(SequencePages& pages, size_t slot) {
  const int32_t page = pages.page[slot];
  PageInfo& info = pages_[size_t(page)];
  if (info.refs == 1) return uncache(page);  // its contents are about to change
  // Shared: this sequence gets a copy (rare: a truncation into a page another sequence reads).
  const int32_t copy = take_page();
  std::vector<std::byte> bytes(page_bytes());
  backend_.download(page_bytes_view(page), bytes.data());
  backend_.upload(bytes.data(), page_bytes_view(copy));
  release(page);
  hold(copy);
  pages.page[slot] = copy;
  pages.changed = true;
}

void KvPool::truncate(SequenceState& s, int64_t n) {
  if (n >= int64_t(s.tokens.size())) return;
  s.tokens.resize(size_t(n));
  s.prefix_hashes.resize(std::min(s.prefix_hashes.size(), size_t(n / hash_unit_)));
  const KvPageLayout& l = layout(s.max_seq_len);
  for (size_t i = 0; i < config_.layers.size(); ++i) {
    const int64_t B = l.page_positions[i];
    for (int64_t slot = l.table_offset[i]; slot < l.table_offset[i] + l.slots[i]; ++slot) {
      const int64_t j = s.pages.logical[size_t(slot)];
      if (j < 0 || (j + 1) * B <= n) continue;
      if (j * B >= n) {
        clear_slot(s.pages, size_t(slot), int64_t(i));
      } else {
        own_slot(s.pages, size_t(slot));
      }
    }
    s.pages.registered_below[i] = std::min(s.pages.registered_below[i], n / B);
  }
}

SwappedSequence KvPool::swap_out(KvSequence&& sequence) {
  G4_ASSERT(!sequence.empty() && sequence.reserved_ == 0, "only a scheduled sequence is swapped out");
  SequenceState state = std::move(sequence.state_);
  sequence.pool_ = nullptr;
  register_written(state);  // its written pages stay cached for others while it waits
  SwappedSequence out;
  SequencePages& pages = state.pages;
  const KvPageLayout& l = layout(state.max_seq_len);
  std::vector<int32_t> held;  // the arena's rows, in slot order
  for (size_t i = 0; i < config_.layers.size(); ++i)
    for (int64_t slot = l.table_offset[i]; slot < l.table_offset[i] + l.slots[i]; ++slot) {
      if (pages.page[size_t(slot)] < 0) continue;
      held.push_back(pages.page[size_t(slot)]);
      out.slots.push_back(int32_t(slot));
      out.logical.push_back(pages.logical[size_t(slot)]);
    }
  out.bytes.resize(held.size() * page_bytes());
  backend_.download_rows(arena_, held, out.bytes.data());
  out.max_seq_len = state.max_seq_len;
  out.tokens = std::move(state.tokens);
  out.prefix_hashes = std::move(state.prefix_hashes);
  out.freed_below = pages.freed_below;
  take_back(state);  // the pages (registered above) and the table go back to the pool
  return out;
}

KvSequence KvPool::swap_in(const SwappedSequence& swapped) {
  SequenceState s = blank(swapped.max_seq_len);  // fresh pages, none cached, under a table of its own
  s.tokens = swapped.tokens;
  s.prefix_hashes = swapped.prefix_hashes;
  s.pages.freed_below = swapped.freed_below;
  const KvPageLayout& l = layout(s.max_seq_len);
  std::vector<int32_t> taken(swapped.slots.size());
  size_t layer = 0;
  for (size_t k = 0; k < swapped.slots.size(); ++k) {
    while (swapped.slots[k] >= l.table_offset[layer] + l.slots[layer]) ++layer;
    taken[k] = take_page();
    set_slot(s.pages, size_t(swapped.slots[k]), int64_t(layer), taken[k], swapped.logical[k]);
  }
  backend_.upload_rows(swapped.bytes.data(), taken, arena_);
  return live(std::move(s), 0);
}

void KvPool::take_back(SequenceState& s) {
  register_written(s);
  const KvPageLayout& l = layout(s.max_seq_len);
  for (size_t i = 0; i < config_.layers.size(); ++i)
    for (int64_t slot = l.table_offset[i]; slot < l.table_offset[i] + l.slots[i]; ++slot)
      if (s.pages.page[size_t(slot)] >= 0) clear_slot(s.pages, size_t(slot), int64_t(i));
  if (!s.pages.table.empty()) free_tables_.push_back(std::move(s.pages.table));
  s = SequenceState{};
}

void KvPool::drop_cached() {
  for (size_t page = 0; page < pages_.size(); ++page) uncache(int32_t(page));
}

int64_t KvPool::usable_prefix(const SequenceState& state, std::span<const int32_t> prompt) const {
  const auto [end, _] = std::mismatch(state.tokens.begin(), state.tokens.end(), prompt.begin(), prompt.end());
  const int64_t p = std::min(int64_t(end - state.tokens.begin()), int64_t(prompt.size()) - 1);
  if (p <= 0) return 0;
  // A query at p reads the window before it in every sliding layer; full layers hold every
  // position the sequence stored.
  const KvPageLayout& l = layout(state.max_seq_len);
  for (size_t i = 0; i < config_.layers.size(); ++i) {
    if (!config_.layers[i].sliding) continue;
    const int64_t B = l.page_positions[i], S = l.slots[i];
    for (int64_t j = first_read_page(int64_t(i), p, B); j <= (p - 1) / B; ++j)
      if (state.pages.logical[size_t(l.table_offset[i] + j % S)] != j) return 0;
  }
  return p;
}

int64_t KvPool::usable_prefix(const KvSequence& sequence, std::span<const int32_t> prompt) const {
  return sequence.empty() ? 0 : usable_prefix(sequence.state_, prompt);
}

}  // namespace g4
