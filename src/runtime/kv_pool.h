// KV memory for many sequences of one model, in pages (docs/DESIGN.md §7): one arena of equal-sized
// pages in backend memory; a page holds one layer's K and V rows of a few positions, and each
// sequence names its pages in a table per layer (KvCache). A sequence holds pages for the
// positions it stored (a sliding layer only those its window still reads), so its memory follows
// its length. Admission reserves a sequence's most pages (its max_seq_len), so that a live
// sequence always finds the pages of its next positions. The pages of finished sequences stay
// behind, keyed by their tokens, so that a new sequence starting with those tokens (a chat's next
// turn) takes them over and prefills only the rest; they are freed, least recently used first,
// when a live sequence needs their pages. Single-threaded, like the engine that owns it.
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

// How the pool's pages hold the layers of sequences of max_seq_len positions: every page has
// page_bytes; layer l's page holds the K then the V rows of page_positions[l] positions
// (page_stride[l] rows of that layer's width), and a sequence's table for layer l has slots[l]
// entries at table_offset[l] (a sliding layer's ring holds the window and the largest chunk).
struct KvPageLayout {
  size_t page_bytes = 0;
  std::vector<int64_t> page_positions, page_stride, slots, table_offset;
  int64_t table_entries = 0;  // slots of every layer
  // The most a sequence holds: a page for every slot.
  size_t sequence_bytes() const { return size_t(table_entries) * page_bytes; }
};
// A forward stores at most config.max_prefill_chunk(max_seq_len) positions of a sequence.
KvPageLayout kv_page_layout(const ModelConfig& config, DType dtype, int64_t max_seq_len);

// Bytes of the most pages one sequence of max_seq_len positions holds.
size_t kv_sequence_bytes(const ModelConfig& config, DType dtype, int64_t max_seq_len);

// The pages one sequence holds: per table slot, the page and the logical page (position / page
// positions) it holds, -1 where none; the table in backend memory, uploaded when it changed.
struct SequencePages {
  Tensor table;                  // I32 [table_entries, 1]
  std::vector<int32_t> page, logical;
  std::vector<int64_t> freed_below;  // per layer: no logical page below this is held
  int64_t held = 0;
  bool changed = false;
};

// What a sequence holds: its pages, its caches (one per layer, KvCache views of the pool's pages
// through its tables) and the tokens whose K/V they hold.
struct SequenceState {
  SequencePages pages;
  std::vector<KvCache> caches;
  std::vector<int32_t> tokens;
  int64_t max_seq_len = 0;
};

// One live sequence's state. Destroying it gives the pages back to the pool, which keeps them
// (with their tokens) for prefix reuse; forget() first drops the tokens, and the pages are then
// freed at once.
class KvSequence {
 public:
  KvSequence() = default;
  KvSequence(KvSequence&& other) noexcept { *this = std::move(other); }
  KvSequence& operator=(KvSequence&& other) noexcept;
  KvSequence(const KvSequence&) = delete;
  KvSequence& operator=(const KvSequence&) = delete;
  ~KvSequence() { give_back(); }

  bool empty() const { return pool_ == nullptr; }
  const std::vector<KvCache>& caches() const { return state_.caches; }
  const std::vector<int32_t>& tokens() const { return state_.tokens; }
  int64_t position() const { return int64_t(state_.tokens.size()); }
  int64_t max_seq_len() const { return state_.max_seq_len; }
  size_t bytes() const { return bytes_; }  // reserved: the most its pages can take
  int64_t pages_held() const { return state_.pages.held; }

  // After a forward wrote the K/V of `tokens` at the next positions.
  void append(std::span<const int32_t> tokens) {
    state_.tokens.insert(state_.tokens.end(), tokens.begin(), tokens.end());
  }
  // Keeps only the first n tokens (the later positions are rewritten before anything reads them).
  void truncate(int64_t n) { state_.tokens.resize(std::min(state_.tokens.size(), size_t(n))); }
  // Forgets every token: the pages are then blank storage, and freed when given back.
  void forget() { state_.tokens.clear(); }
  // Gives the pages back to the pool now (as the destructor does); the handle is then empty.
  void give_back();

 private:
  friend class KvPool;
  KvPool* pool_ = nullptr;
  SequenceState state_;
  size_t bytes_ = 0;
};

class KvPool {
 public:
  // budget_bytes bounds the pages of live sequences and kept prefixes together. No page exists
  // before allocate_pages.
  KvPool(const ModelConfig& config, Backend& backend, size_t budget_bytes);
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;
  ~KvPool();

  // Bytes of the most pages one sequence of max_seq_len positions holds (what admission reserves).
  size_t sequence_bytes(int64_t max_seq_len) const;
  size_t page_bytes() const { return layout(1).page_bytes; }
  size_t budget_bytes() const { return budget_; }
  // Lowers the budget to at most `available` bytes (what the device can still hold), whole pages,
  // and allocates the pages. Throws Error(kResourceExhausted) naming the bytes when that is less
  // than one sequence of max_seq_len.
  void allocate_pages(size_t available, int64_t max_seq_len);
  size_t bytes_in_use() const { return in_use_; }  // reserved by live sequences
  size_t bytes_kept() const { return size_t(kept_pages_) * page_bytes(); }  // held by kept prefixes
  size_t kept_sequences() const { return kept_list_.size(); }
  int64_t pages_total() const { return pages_total_; }
  int64_t pages_free() const { return int64_t(free_pages_.size()); }

  // Caches for a sequence of max_seq_len positions that is to hold `prompt`. When a kept sequence
  // of the same max_seq_len holds a usable prefix of it (usable_prefix), the longest such is taken
  // over, its tokens cut to that prefix; otherwise the sequence starts empty. Throws "out of KV
  // memory: N bytes requested, M of B reserved" when live sequences leave no room.
  KvSequence acquire(int64_t max_seq_len, std::span<const int32_t> prompt = {});
  // As acquire, but nothing (instead of the error) when live sequences leave no room.
  std::optional<KvSequence> try_acquire(int64_t max_seq_len, std::span<const int32_t> prompt = {});

  // Makes `sequence` hold the pages that a forward storing `count` tokens at its next positions
  // writes and reads, freeing a sliding layer's pages its window has left, and uploads its tables
  // when they changed. Kept prefixes are freed when the free pages do not suffice.
  void prepare(KvSequence& sequence, int64_t count);

  // Frees every kept prefix. On a backend whose prefill is not invariant to its chunking (CUDA,
  // docs/DESIGN.md §7) a reused prefix is a different chunking, so a run that must not depend on
  // the sequences before it starts from an empty pool.
  void drop_kept();

  // The longest usable prefix of `prompt` that a kept sequence of max_seq_len positions holds.
  int64_t best_kept_prefix(int64_t max_seq_len, std::span<const int32_t> prompt) const;

  // How many leading tokens of `prompt` `sequence` can keep (docs/DESIGN.md §7): the common
  // prefix p of its tokens and the prompt, less the prompt's last token (its logits are needed),
  // and 0 unless it still holds the pages of every position a query at p reads: the window before
  // p in every sliding layer.
  int64_t usable_prefix(const KvSequence& sequence, std::span<const int32_t> prompt) const;

 private:
  friend class KvSequence;
  const KvPageLayout& layout(int64_t max_seq_len) const;
  SequenceState blank(int64_t max_seq_len);
  KvSequence live(SequenceState&& state);
  std::list<SequenceState>::const_iterator best_kept(int64_t max_seq_len, std::span<const int32_t> prompt,
                                                     int64_t* prefix) const;
  int64_t usable_prefix(const SequenceState& state, std::span<const int32_t> prompt) const;
  // A page for `sequence`, freeing kept prefixes (least recently used first) when none is free.
  int32_t take_page();
  void free_slot(SequencePages& pages, size_t slot);
  void release(SequenceState& state);  // frees its pages and recycles its table
  void take_back(KvSequence& sequence);

  const ModelConfig& config_;
  Backend& backend_;
  size_t budget_ = 0, in_use_ = 0;
  int64_t kept_pages_ = 0, pages_total_ = 0;
  mutable std::list<std::pair<int64_t, KvPageLayout>> layouts_;  // by max_seq_len
  Tensor arena_;                        // the pages, page_bytes each
  std::vector<std::pair<Tensor, Tensor>> layer_rows_;  // per layer: the arena as its K and V rows
  std::vector<int32_t> free_pages_;
  std::vector<Tensor> free_tables_;     // tables of released sequences, for reuse
  std::list<SequenceState> kept_list_;  // most recently used first
};

}  // namespace g4
