// KV memory for many sequences of one model (docs/DESIGN.md §7): each sequence's caches come from a
// pool with a byte budget, and the caches of finished sequences stay behind, keyed by their
// tokens, so that a new sequence starting with those tokens (a chat's next turn) takes them over
// and prefills only the rest. Single-threaded, like the engine that owns it.
#pragma once
#include <algorithm>
#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"

namespace g4 {

class KvPool;

// Bytes of one sequence's caches at max_seq_len positions, activations in `dtype`.
size_t kv_sequence_bytes(const ModelConfig& config, DType dtype, int64_t max_seq_len);

// One sequence's KV caches (one per layer: a ring of min(2 * window, max_seq_len) positions for
// sliding layers, max_seq_len positions for full layers) and the tokens whose K/V they hold.
// Destroying it gives the caches back to the pool, which keeps them (with their tokens) for prefix
// reuse; forget() first drops the tokens, and the memory is then freed at once.
class KvSequence {
 public:
  KvSequence() = default;
  KvSequence(KvSequence&& other) noexcept { *this = std::move(other); }
  KvSequence& operator=(KvSequence&& other) noexcept;
  KvSequence(const KvSequence&) = delete;
  KvSequence& operator=(const KvSequence&) = delete;
  ~KvSequence() { give_back(); }

  bool empty() const { return pool_ == nullptr; }
  std::vector<KvCache>& caches() { return caches_; }
  const std::vector<KvCache>& caches() const { return caches_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  int64_t position() const { return int64_t(tokens_.size()); }
  int64_t max_seq_len() const { return max_seq_len_; }
  size_t bytes() const { return bytes_; }

  // After a forward wrote the K/V of `tokens` at the next positions.
  void append(std::span<const int32_t> tokens) { tokens_.insert(tokens_.end(), tokens.begin(), tokens.end()); }
  // Keeps only the first n tokens (the later positions are rewritten before anything reads them).
  void truncate(int64_t n) { tokens_.resize(std::min(tokens_.size(), size_t(n))); }
  // Forgets every token: the caches are then blank storage, and freed when given back.
  void forget() { tokens_.clear(); }
  // Gives the caches back to the pool now (as the destructor does); the handle is then empty.
  void give_back();

 private:
  friend class KvPool;
  KvPool* pool_ = nullptr;
  std::vector<KvCache> caches_;
  std::vector<int32_t> tokens_;
  int64_t max_seq_len_ = 0;
  size_t bytes_ = 0;
};

class KvPool {
 public:
  // budget_bytes bounds the caches of live sequences and kept prefixes together.
  KvPool(const ModelConfig& config, Backend& backend, size_t budget_bytes);
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;
  ~KvPool();

  // Bytes of one sequence's caches at max_seq_len positions.
  size_t sequence_bytes(int64_t max_seq_len) const;
  size_t budget_bytes() const { return budget_; }
  // Lowers the budget to at most `bytes` (what the device can still hold); throws
  // Error(kResourceExhausted) naming the bytes when that is less than one sequence of max_seq_len.
  void limit_budget(size_t bytes, int64_t max_seq_len);
  size_t bytes_in_use() const { return in_use_; }  // held by live sequences
  size_t bytes_kept() const { return kept_; }      // held by kept prefixes (reclaimable)
  size_t kept_sequences() const { return kept_list_.size(); }

  // Caches for a sequence of max_seq_len positions that is to hold `prompt`. When a kept sequence
  // of the same max_seq_len holds a usable prefix of it (usable_prefix), the longest such is taken
  // over, its tokens cut to that prefix; otherwise the caches are new (or recycled storage). Kept
  // prefixes are evicted, least recently used first, when the budget needs their space. Throws
  // "out of KV memory: N bytes requested, M of B in use" when live sequences leave no room.
  KvSequence acquire(int64_t max_seq_len, std::span<const int32_t> prompt = {});
  // As acquire, but nothing (instead of the error) when live sequences leave no room.
  std::optional<KvSequence> try_acquire(int64_t max_seq_len, std::span<const int32_t> prompt = {});

  // Frees every kept prefix. On a backend whose prefill is not invariant to its chunking (CUDA,
  // docs/DESIGN.md §7) a reused prefix is a different chunking, so a run that must not depend on
  // the sequences before it starts from an empty pool.
  void drop_kept();

  // The longest usable prefix of `prompt` that a kept sequence of max_seq_len positions holds.
  int64_t best_kept_prefix(int64_t max_seq_len, std::span<const int32_t> prompt) const;

  // How many leading tokens of `prompt` a sequence holding `cached` can keep (docs/DESIGN.md §7):
  // the common prefix, less the prompt's last token (its logits are needed), and 0 unless every
  // sliding layer's ring still holds the window before it: cached.size() - p <= sliding_window.
  int64_t usable_prefix(std::span<const int32_t> cached, std::span<const int32_t> prompt) const;

 private:
  friend class KvSequence;
  struct Kept {
    std::vector<KvCache> caches;
    std::vector<int32_t> tokens;
    int64_t max_seq_len = 0;
    size_t bytes = 0;
  };
  std::vector<KvCache> allocate(int64_t max_seq_len);
  // The kept sequence with the longest usable prefix of `prompt` (end() and 0 when none).
  std::list<Kept>::const_iterator best_kept(int64_t max_seq_len, std::span<const int32_t> prompt,
                                            int64_t* prefix) const;
  void take_back(KvSequence& sequence);
  std::optional<KvSequence> handle(Kept&& kept);

  const ModelConfig& config_;
  Backend& backend_;
  size_t budget_ = 0, in_use_ = 0, kept_ = 0;
  bool has_sliding_layers_ = false;
  std::list<Kept> kept_list_;  // most recently used first
};

}  // namespace g4
