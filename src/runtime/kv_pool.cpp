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

size_t layer_row_bytes(const LayerConfig& l, DType dtype) { return row_bytes(dtype, int64_t(l.kv_heads) * l.head_dim); }

}  // namespace

KvPageLayout kv_page_layout(const ModelConfig& c, DType dtype, int64_t max_seq_len) {
  const int64_t max_chunk = c.max_prefill_chunk(max_seq_len);
  KvPageLayout layout;
  size_t widest = 0, unit = 1;
  for (const LayerConfig& l : c.layers) {
    widest = std::max(widest, layer_row_bytes(l, dtype));
    unit = std::lcm(unit, layer_row_bytes(l, dtype));
  }
  // Whole rows of every layer, K and V of at least kWidestPagePositions positions of the widest.
  layout.page_bytes = size_t(ceil_div(int64_t(2 * kWidestPagePositions * widest), int64_t(unit))) * unit;
  for (const LayerConfig& l : c.layers) {
    const int64_t stride = int64_t(layout.page_bytes / layer_row_bytes(l, dtype)), positions = stride / 2;
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

size_t kv_sequence_bytes(const ModelConfig& config, DType dtype, int64_t max_seq_len) {
  return kv_page_layout(config, dtype, max_seq_len).sequence_bytes();
}

KvSequence& KvSequence::operator=(KvSequence&& other) noexcept {
  if (this == &other) return *this;
  give_back();
  pool_ = std::exchange(other.pool_, nullptr);
  state_ = std::move(other.state_);
  bytes_ = other.bytes_;
  return *this;
}

void KvSequence::give_back() {
  if (!pool_) return;
  std::exchange(pool_, nullptr)->take_back(*this);
  state_ = SequenceState{};
}

KvPool::KvPool(const ModelConfig& config, Backend& backend, size_t budget_bytes)
    : config_(config), backend_(backend), budget_(budget_bytes) {}

KvPool::~KvPool() = default;

const KvPageLayout& KvPool::layout(int64_t max_seq_len) const {
  for (const auto& [n, layout] : layouts_)
    if (n == max_seq_len) return layout;
  return layouts_.emplace_back(max_seq_len, kv_page_layout(config_, backend_.activation_dtype(), max_seq_len)).second;
}

size_t KvPool::sequence_bytes(int64_t max_seq_len) const {
  return layout(max_seq_len).sequence_bytes();
}

void KvPool::allocate_pages(size_t available, int64_t max_seq_len) {
  G4_ASSERT(arena_.empty() && pages_total_ == 0, "the KV pool's pages are allocated once");
  const size_t page = page_bytes();
  budget_ = std::min(budget_, available);
  G4_REQUIRE(kResourceExhausted, budget_ >= sequence_bytes(max_seq_len),
             "out of KV memory: " + std::to_string(available) + " bytes are free for KV caches after the weights and " +
                 "the forward's workspaces, less than one sequence's " + std::to_string(sequence_bytes(max_seq_len)) +
                 " bytes at max_seq_len " + std::to_string(max_seq_len) + " (lower --max_seq_len)");
  if (page == 0) return;  // no layers
  pages_total_ = int64_t(budget_ / page);
  budget_ = size_t(pages_total_) * page;
  const DType dtype = backend_.activation_dtype();
  arena_ = backend_.alloc(dtype, pages_total_, int64_t(page / row_bytes(dtype, 1)));
  const KvPageLayout& l = layout(max_seq_len);
  for (size_t i = 0; i < config_.layers.size(); ++i) {
    const LayerConfig& lc = config_.layers[i];
    Tensor k = arena_.reshaped(pages_total_ * l.page_stride[i], int64_t(lc.kv_heads) * lc.head_dim);
    layer_rows_.emplace_back(k, k.rows_view(l.page_positions[i], k.rows - l.page_positions[i]));
  }
  free_pages_.resize(size_t(pages_total_));
  std::iota(free_pages_.rbegin(), free_pages_.rend(), 0);  // page 0 is taken first
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
  s.pages.changed = true;
  for (size_t i = 0; i < config_.layers.size(); ++i)
    s.caches.push_back(KvCache{layer_rows_[i].first, layer_rows_[i].second,
                               s.pages.table.rows_view(l.table_offset[i], l.slots[i]), l.page_positions[i],
                               l.page_stride[i]});
  return s;
}

KvSequence KvPool::live(SequenceState&& state) {
  KvSequence s;
  s.pool_ = this;
  s.bytes_ = sequence_bytes(state.max_seq_len);
  s.state_ = std::move(state);
  in_use_ += s.bytes_;
  return s;
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
    const int64_t B = l.page_positions[i], S = l.slots[i], first = std::max<int64_t>(0, p - config_.sliding_window + 1);
    for (int64_t j = first / B; j <= (p - 1) / B; ++j)
      if (state.pages.logical[size_t(l.table_offset[i] + j % S)] != j) return 0;
  }
  return p;
}

int64_t KvPool::usable_prefix(const KvSequence& sequence, std::span<const int32_t> prompt) const {
  return sequence.empty() ? 0 : usable_prefix(sequence.state_, prompt);
}

std::list<SequenceState>::const_iterator KvPool::best_kept(int64_t max_seq_len, std::span<const int32_t> prompt,
                                                           int64_t* prefix) const {
  auto best = kept_list_.cend();
  *prefix = 0;
  for (auto it = kept_list_.cbegin(); it != kept_list_.cend(); ++it) {
    if (it->max_seq_len != max_seq_len) continue;
    const int64_t p = usable_prefix(*it, prompt);
    if (p > *prefix) best = it, *prefix = p;
  }
  return best;
}

int64_t KvPool::best_kept_prefix(int64_t max_seq_len, std::span<const int32_t> prompt) const {
  int64_t prefix = 0;
  best_kept(max_seq_len, prompt, &prefix);
  return prefix;
}

std::optional<KvSequence> KvPool::try_acquire(int64_t max_seq_len, std::span<const int32_t> prompt) {
  G4_CHECK(max_seq_len >= 1, "KV caches need max_seq_len >= 1, got " + std::to_string(max_seq_len));
  const size_t need = sequence_bytes(max_seq_len);
  G4_CHECK(need <= budget_, "out of KV memory: " + std::to_string(need) + " bytes requested (a sequence of " +
                                std::to_string(max_seq_len) + " positions), more than the whole budget of " +
                                std::to_string(budget_) + " bytes");
  G4_ASSERT(pages_total_ > 0 || page_bytes() == 0, "the KV pool's pages are not allocated");
  if (in_use_ + need > budget_) return std::nullopt;
  int64_t best_prefix = 0;
  const auto found = best_kept(max_seq_len, prompt, &best_prefix);
  if (found == kept_list_.end()) return live(blank(max_seq_len));
  const auto best = std::next(kept_list_.begin(), std::distance(kept_list_.cbegin(), found));
  SequenceState state = std::move(*best);
  kept_list_.erase(best);
  kept_pages_ -= state.pages.held;
  state.tokens.resize(size_t(best_prefix));
  return live(std::move(state));
}

KvSequence KvPool::acquire(int64_t max_seq_len, std::span<const int32_t> prompt) {
  std::optional<KvSequence> s = try_acquire(max_seq_len, prompt);
  if (!s)
    throw Error(ErrorKind::kResourceExhausted, "out of KV memory: " + std::to_string(sequence_bytes(max_seq_len)) +
                                                   " bytes requested, " + std::to_string(in_use_) + " of " +
                                                   std::to_string(budget_) +
                                                   " reserved by live sequences (end a session, or raise the KV budget)");
  return std::move(*s);
}

int32_t KvPool::take_page() {
  // Live sequences reserve their most pages, so the kept prefixes free enough.
  while (free_pages_.empty()) {
    G4_ASSERT(!kept_list_.empty(), "the KV pool has no page left for a live sequence");
    kept_pages_ -= kept_list_.back().pages.held;
    release(kept_list_.back());
    kept_list_.pop_back();
  }
  const int32_t page = free_pages_.back();
  free_pages_.pop_back();
  return page;
}

void KvPool::free_slot(SequencePages& pages, size_t slot) {
  free_pages_.push_back(pages.page[slot]);
  pages.page[slot] = pages.logical[slot] = -1;
  --pages.held;
  pages.changed = true;
}

void KvPool::prepare(KvSequence& sequence, int64_t count) {
  G4_ASSERT(!sequence.empty() && count >= 1, "prepare: a live sequence and at least one position");
  SequencePages& pages = sequence.state_.pages;
  const KvPageLayout& l = layout(sequence.max_seq_len());
  const int64_t from = sequence.position(), end = from + count, window = config_.sliding_window;
  for (size_t i = 0; i < config_.layers.size(); ++i) {
    const int64_t B = l.page_positions[i], S = l.slots[i], offset = l.table_offset[i];
    if (config_.layers[i].sliding) {
      // Pages wholly before the window of the forward's first query are read no more.
      const int64_t keep_from = std::max<int64_t>(0, from - window + 1) / B;
      for (int64_t j = pages.freed_below[i]; j < keep_from; ++j)
        if (pages.logical[size_t(offset + j % S)] == j) free_slot(pages, size_t(offset + j % S));
      pages.freed_below[i] = std::max(pages.freed_below[i], keep_from);
    }
    for (int64_t j = from / B; j <= (end - 1) / B; ++j) {
      const size_t slot = size_t(offset + j % S);
      if (pages.logical[slot] == j) continue;
      if (pages.page[slot] >= 0) free_slot(pages, slot);
      pages.page[slot] = take_page();
      pages.logical[slot] = int32_t(j);
      ++pages.held;
      pages.changed = true;
    }
  }
  if (!pages.changed) return;
  backend_.upload(pages.page.data(), pages.table.rows_view(0, int64_t(pages.page.size())));
  pages.changed = false;
}

void KvPool::release(SequenceState& state) {
  for (size_t slot = 0; slot < state.pages.page.size(); ++slot)
    if (state.pages.page[slot] >= 0) free_pages_.push_back(state.pages.page[slot]);
  if (!state.pages.table.empty()) free_tables_.push_back(std::move(state.pages.table));
  state = SequenceState{};
}

void KvPool::drop_kept() {
  for (SequenceState& kept : kept_list_) release(kept);
  kept_list_.clear();
  kept_pages_ = 0;
}

void KvPool::take_back(KvSequence& s) {
  in_use_ -= s.bytes_;
  if (s.state_.tokens.empty()) return release(s.state_);  // nothing worth keeping
  kept_pages_ += s.state_.pages.held;
  kept_list_.push_front(std::move(s.state_));
}

}  // namespace g4
