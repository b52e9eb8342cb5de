#include "runtime/kv_pool.h"

#include <algorithm>
#include <utility>

#include "util/error.h"

namespace g4 {

KvSequence& KvSequence::operator=(KvSequence&& other) noexcept {
  if (this == &other) return *this;
  give_back();
  pool_ = std::exchange(other.pool_, nullptr);
  caches_ = std::move(other.caches_);
  tokens_ = std::move(other.tokens_);
  max_seq_len_ = other.max_seq_len_;
  bytes_ = other.bytes_;
  return *this;
}

void KvSequence::give_back() {
  if (!pool_) return;
  std::exchange(pool_, nullptr)->take_back(*this);
  caches_.clear();
  tokens_.clear();
}

KvPool::KvPool(const ModelConfig& config, Backend& backend, size_t budget_bytes)
    : config_(config), backend_(backend), budget_(budget_bytes) {
  has_sliding_layers_ = std::any_of(config.layers.begin(), config.layers.end(), [](const auto& l) { return l.sliding; });
}

KvPool::~KvPool() = default;

void KvPool::limit_budget(size_t bytes, int64_t max_seq_len) {
  budget_ = std::min(budget_, bytes);
  G4_REQUIRE(kResourceExhausted, budget_ >= sequence_bytes(max_seq_len),
             "out of KV memory: " + std::to_string(bytes) + " bytes are free for KV caches after the weights and the " +
                 "forward's workspaces, less than one sequence's " + std::to_string(sequence_bytes(max_seq_len)) +
                 " bytes at max_seq_len " + std::to_string(max_seq_len) + " (lower --max_seq_len)");
}

// Sliding layers keep a ring of two windows (a prefill chunk of up to 2 * window positions still
// finds the window before each of its queries); full layers every position up to max_seq_len.
static int64_t cache_positions(const ModelConfig& c, const LayerConfig& l, int64_t max_seq_len) {
  return l.sliding ? std::min<int64_t>(2 * int64_t(c.sliding_window), max_seq_len) : max_seq_len;
}

size_t kv_sequence_bytes(const ModelConfig& config, DType dtype, int64_t max_seq_len) {
  size_t bytes = 0;
  for (const LayerConfig& l : config.layers)
    bytes += 2 * size_t(cache_positions(config, l, max_seq_len)) * row_bytes(dtype, int64_t(l.kv_heads) * l.head_dim);
  return bytes;
}

size_t KvPool::sequence_bytes(int64_t max_seq_len) const {
  return kv_sequence_bytes(config_, backend_.activation_dtype(), max_seq_len);
}

std::vector<KvCache> KvPool::allocate(int64_t max_seq_len) {
  std::vector<KvCache> caches;
  const DType a = backend_.activation_dtype();
  for (const LayerConfig& l : config_.layers) {
    KvCache cache;
    cache.capacity = cache_positions(config_, l, max_seq_len);
    cache.k = backend_.alloc(a, cache.capacity, int64_t(l.kv_heads) * l.head_dim);
    cache.v = backend_.alloc(a, cache.capacity, int64_t(l.kv_heads) * l.head_dim);
    caches.push_back(std::move(cache));
  }
  return caches;
}

int64_t KvPool::usable_prefix(std::span<const int32_t> cached, std::span<const int32_t> prompt) const {
  const auto [end, _] = std::mismatch(cached.begin(), cached.end(), prompt.begin(), prompt.end());
  const int64_t common = end - cached.begin();
  const int64_t p = std::min(common, int64_t(prompt.size()) - 1);
  if (p <= 0) return 0;
  // Continuing at p reads positions [p - window + 1, p) back from the ring of 2 * window slots; a
  // position q there is intact unless a later cached position q + 2 * window overwrote it.
  if (has_sliding_layers_ && int64_t(cached.size()) - p > config_.sliding_window) return 0;
  return p;
}

std::list<KvPool::Kept>::const_iterator KvPool::best_kept(int64_t max_seq_len, std::span<const int32_t> prompt,
                                                         int64_t* prefix) const {
  auto best = kept_list_.cend();
  *prefix = 0;
  for (auto it = kept_list_.cbegin(); it != kept_list_.cend(); ++it) {
    if (it->max_seq_len != max_seq_len) continue;
    const int64_t p = usable_prefix(it->tokens, prompt);
    if (p > *prefix) best = it, *prefix = p;
  }
  return best;
}

int64_t KvPool::best_kept_prefix(int64_t max_seq_len, std::span<const int32_t> prompt) const {
  int64_t prefix = 0;
  best_kept(max_seq_len, prompt, &prefix);
  return prefix;
}

std::optional<KvSequence> KvPool::handle(Kept&& kept) {
  KvSequence s;
  s.pool_ = this;
  s.caches_ = std::move(kept.caches);
  s.tokens_ = std::move(kept.tokens);
  s.max_seq_len_ = kept.max_seq_len;
  s.bytes_ = kept.bytes;
  in_use_ += kept.bytes;
  return s;
}

std::optional<KvSequence> KvPool::try_acquire(int64_t max_seq_len, std::span<const int32_t> prompt) {
  G4_CHECK(max_seq_len >= 1, "KV caches need max_seq_len >= 1, got " + std::to_string(max_seq_len));
  const size_t need = sequence_bytes(max_seq_len);
  G4_CHECK(need <= budget_, "out of KV memory: " + std::to_string(need) + " bytes requested (a sequence of " +
                                std::to_string(max_seq_len) + " positions), more than the whole budget of " +
                                std::to_string(budget_) + " bytes");
  int64_t best_prefix = 0;
  const auto found = best_kept(max_seq_len, prompt, &best_prefix);
  if (found != kept_list_.end()) {
    const auto best = std::next(kept_list_.begin(), std::distance(kept_list_.cbegin(), found));
    Kept kept = std::move(*best);
    kept_list_.erase(best);
    kept_ -= kept.bytes;
    kept.tokens.resize(size_t(best_prefix));
    return handle(std::move(kept));
  }
  if (in_use_ + need > budget_) return std::nullopt;
  // Evict the least recently used prefixes until the new caches fit; one of the same shape is
  // recycled as it is (its stale contents are never read: a sequence reads only positions it wrote).
  while (in_use_ + kept_ + need > budget_) {
    Kept kept = std::move(kept_list_.back());
    kept_list_.pop_back();
    kept_ -= kept.bytes;
    if (kept.max_seq_len == max_seq_len) {
      kept.tokens.clear();
      return handle(std::move(kept));
    }
  }
  return handle(Kept{allocate(max_seq_len), {}, max_seq_len, need});
}

KvSequence KvPool::acquire(int64_t max_seq_len, std::span<const int32_t> prompt) {
  std::optional<KvSequence> s = try_acquire(max_seq_len, prompt);
  if (!s)
    throw Error(ErrorKind::kResourceExhausted, "out of KV memory: " + std::to_string(sequence_bytes(max_seq_len)) + " bytes requested, " +
                std::to_string(in_use_) + " of " + std::to_string(budget_) +
                " in use by live sequences (end a session, or raise the KV budget)");
  return std::move(*s);
}

void KvPool::drop_kept() {
  kept_list_.clear();  // the caches' memory goes with their tensors
  kept_ = 0;
}

void KvPool::take_back(KvSequence& s) {
  in_use_ -= s.bytes_;
  if (s.tokens_.empty()) return;  // nothing worth keeping: the caches are freed with the handle
  kept_list_.push_front(Kept{std::move(s.caches_), std::move(s.tokens_), s.max_seq_len_, s.bytes_});
  kept_ += s.bytes_;
}

}  // namespace g4
