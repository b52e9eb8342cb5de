// KV memory for many sequences of one model, in pages (docs/DESIGN.md §7): one arena of equal-sized
// pages in backend memory; a page holds one layer's K and V rows of a few positions, and each
// sequence names its pages in a table per layer (KvCache). A sequence holds pages for the
// positions it stored (a sliding layer only those its window still reads), so its memory follows
// its length.
//
// Pages are reference counted and shared through a prefix cache: a page whose positions are all
// written is registered under its layer, its index and a hash of every token up to its end, so a
// sequence starting with the same tokens (a chat's next turn, a common system prompt) takes the
// page instead of computing it again; live sequences share such pages, and the pages of finished
// sequences stay cached until a page is needed and none is free (least recently released first).
//
// Two ways to hold memory: a session reserves the most pages its max_seq_len can take (acquire),
// so it never meets a full pool mid-generation; a scheduler's sequences reserve nothing (start):
// the scheduler admits by the pages they need now and preempts (swap_out, swap_in) when running
// sequences outgrow the pool. Single-threaded, like the engine that owns it.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/kv_types.h"

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
// Layer l's rows are of type layer_dtypes[l] (layer_kv_dtypes). A forward stores at most
// config.max_prefill_chunk(max_seq_len) positions of a sequence.
KvPageLayout kv_page_layout(const ModelConfig& config, std::span<const DType> layer_dtypes, int64_t max_seq_len);

// Bytes of the most pages one sequence of max_seq_len positions holds.
size_t kv_sequence_bytes(const ModelConfig& config, std::span<const DType> layer_dtypes, int64_t max_seq_len);

// A 128-bit hash of a token prefix (two independent 64-bit lanes): the identity of a cached page's
// contents. Two different prefixes share one with odds of about n² / 2¹²⁹ for n cached pages.
struct PrefixHash {
  uint64_t a = 0, b = 0;
  bool operator==(const PrefixHash&) const = default;
};

// The pages one sequence holds: per table slot, the page and the logical page (position / page
// positions) it holds, -1 where none; the table in backend memory, uploaded when it changed.
struct SequencePages {
  Tensor table;                  // I32 [table_entries, 1]
  std::vector<int32_t> page, logical;
  std::vector<int64_t> freed_below;      // per layer: no logical page below this is held
  std::vector<int64_t> registered_below;  // per layer: logical pages below this are in the cache
  std::vector<int64_t> held_in_layer;
  int64_t held = 0;
  bool changed = false;
};

// What a sequence holds: its pages, its caches (one per layer, KvCache views of the pool's pages
// through its tables), the tokens whose K/V they hold and the hashes of their prefixes (one per
// KvPool::hash_unit tokens).
struct SequenceState {
  SequencePages pages;
  std::vector<KvCache> caches;
  std::vector<int32_t> tokens;
  std::vector<PrefixHash> prefix_hashes;
  int64_t max_seq_len = 0;
};

// One live sequence's state. Destroying it gives its pages back to the pool (those whose positions
// are all written stay cached for prefix reuse).
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
  size_t reserved_bytes() const { return reserved_; }  // what acquire reserved; 0 from start
  int64_t pages_held() const { return state_.pages.held; }

  // After a forward wrote the K/V of `tokens` at the next positions.
  void append(std::span<const int32_t> tokens) {
    state_.tokens.insert(state_.tokens.end(), tokens.begin(), tokens.end());
  }
  // Keeps only the first n tokens; the pages of later positions go back to the pool, and a page
  // holding both kinds becomes this sequence's own (copied when shared) before it is rewritten.
  void truncate(int64_t n);
  // Gives the pages back to the pool now (as the destructor does); the handle is then empty.
  void give_back();

 private:
  friend class KvPool;
  KvPool* pool_ = nullptr;
  SequenceState state_;
  size_t reserved_ = 0;
};

// A preempted sequence's caches, copied to host memory (KvPool::swap_out): its pages' bytes in
// table-slot order and what else its state needs, all host data: it holds nothing of the pool, so
// each swap_in of it makes a sequence of its own.
struct SwappedSequence {
  int64_t max_seq_len = 0;
  std::vector<int32_t> tokens;
  std::vector<PrefixHash> prefix_hashes;
  std::vector<int64_t> freed_below;  // per layer, as SequencePages::freed_below
  std::vector<int32_t> slots;        // the table slots that held a page, and their logical pages
  std::vector<int32_t> logical;
  std::vector<std::byte> bytes;  // page_bytes per slot
  int64_t pages() const { return int64_t(slots.size()); }
  int64_t position() const { return int64_t(tokens.size()); }
};

class KvPool {
 public:
  // budget_bytes bounds the pages (live and cached), whose rows are of `types`. No page exists
  // before allocate_pages. Throws Error(kUnsupported) for a type the backend's attention does not
  // read, Error(kInvalidArgument) for one a layer's head dim cannot take.
  KvPool(const ModelConfig& config, Backend& backend, size_t budget_bytes, KvTypes types = {});
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;
  ~KvPool();

  // Bytes of the most pages one sequence of max_seq_len positions holds (what acquire reserves).
  size_t sequence_bytes(int64_t max_seq_len) const;
  // The most pages a sequence of a max_seq_len context holds while it reaches `positions`.
  int64_t pages_for_positions(int64_t max_seq_len, int64_t positions) const;
  size_t page_bytes() const { return layout(1).page_bytes; }
  // The types asked for, each layer's row type (KvCache::k.dtype), and what a position costs by
  // layer kind.
  KvTypes types() const { return types_; }
  const std::vector<DType>& layer_dtypes() const { return layer_dtypes_; }
  KvBytesPerToken bytes_per_token() const { return kv_bytes_per_token(config_, layer_dtypes_); }
  size_t budget_bytes() const { return budget_; }
  // Lowers the budget to at most `available` bytes (what the device can still hold), whole pages,
  // and allocates the pages. Throws Error(kResourceExhausted) naming the bytes when that is less
  // than one sequence of max_seq_len.
  void allocate_pages(size_t available, int64_t max_seq_len);

  int64_t pages_total() const { return pages_total_; }
  int64_t pages_free() const { return int64_t(free_pages_.size()); }      // holding nothing
  int64_t pages_cached() const { return int64_t(evictable_.size()); }     // cached, held by none
  int64_t pages_available() const { return pages_free() + pages_cached(); }
  int64_t pages_in_use() const { return pages_total_ - pages_available(); }  // held by live sequences
  int64_t pages_shared() const { return shared_pages_; }                  // held by two or more
  size_t bytes_in_use() const { return size_t(pages_in_use()) * page_bytes(); }
  size_t bytes_cached() const { return size_t(pages_cached()) * page_bytes(); }
  size_t bytes_reserved() const { return reserved_; }  // by sessions (acquire)

  // Caches for a session of max_seq_len positions that is to hold `prompt`, reserving its most
  // pages; it starts with the longest cached prefix of the prompt (cached_prefix). Throws
  // Error(kResourceExhausted) "out of KV memory: N bytes requested, M of B reserved" when the
  // reservations of live sessions leave no room.
  KvSequence acquire(int64_t max_seq_len, std::span<const int32_t> prompt = {});
  // Caches for a scheduled sequence that is to hold `prompt`, reserving nothing: it starts with the
  // longest cached prefix of the prompt, and takes pages as it grows (the scheduler admits it only
  // when they are there: pages_to_start).
  KvSequence start(int64_t max_seq_len, std::span<const int32_t> prompt);

  // The longest prefix of `prompt` whose pages are cached (a multiple of share_unit(), short of
  // the prompt's last token, whose logits are needed): what acquire and start begin with.
  int64_t cached_prefix(int64_t max_seq_len, std::span<const int32_t> prompt) const;
  // Pages of the available ones a sequence started for `prompt` takes to hold its first `end`
  // positions (the cached pages no live sequence holds count; a shared live page does not).
  int64_t pages_to_start(int64_t max_seq_len, std::span<const int32_t> prompt, int64_t end) const;
  // At most how many more pages `sequence` takes to hold positions up to `end` (a sliding layer
  // at most its ring).
  int64_t pages_to_reach(const KvSequence& sequence, int64_t end) const;
  // The pages prepare(sequence, count) takes, once release_unread(sequence) has run.
  int64_t pages_for_forward(const KvSequence& sequence, int64_t count) const;
  // Positions share granularity: the common multiple of every layer's page positions.
  int64_t share_unit() const { return share_unit_; }

  // Frees a sliding layer's pages that lie wholly before the window of the sequence's next query.
  void release_unread(KvSequence& sequence);
  // Makes `sequence` hold the pages that a forward storing `count` tokens at its next positions
  // writes and reads (release_unread, then a page for each new page of positions), registers its
  // pages whose positions are all written in the prefix cache, and uploads its tables when they
  // changed. Cached pages no sequence holds are reused, least recently released first, when no page
  // is free; Error(kResourceExhausted) when every page is held.
  void prepare(KvSequence& sequence, int64_t count);

  // Copies `sequence`'s pages to host memory and gives them back (preemption); swap_in takes pages
  // again (pages_available() >= swapped.pages()) and restores them: the same bits at the same
  // positions, so the sequence goes on as if never interrupted. A swapped-out sequence holds no
  // backend memory (its table goes back to the pool too).
  SwappedSequence swap_out(KvSequence&& sequence);
  KvSequence swap_in(const SwappedSequence& swapped);

  // Empties the prefix cache: no page is found by its tokens from now on (live sequences keep
  // their pages). On a backend whose prefill is not invariant to its chunking (CUDA,
  // docs/DESIGN.md §7) a reused prefix is a different chunking, so a run that must not depend on
  // the sequences before it starts from an empty cache.
  void drop_cached();

  // How many leading tokens of `prompt` `sequence` can keep (docs/DESIGN.md §7): the common
  // prefix p of its tokens and the prompt, less the prompt's last token (its logits are needed),
  // and 0 unless it still holds the pages of every position a query at p reads: the window before
  // p in every sliding layer.
  int64_t usable_prefix(const KvSequence& sequence, std::span<const int32_t> prompt) const;

 private:
  friend class KvSequence;
  struct PageKey {
    int64_t layer = 0, page = 0;
    PrefixHash prefix;
    bool operator==(const PageKey&) const = default;
  };
  struct PageKeyHash {
    size_t operator()(const PageKey& k) const { return size_t(k.prefix.a ^ uint64_t(k.layer * 1000003 + k.page)); }
  };
  struct PageInfo {
    int32_t refs = 0;
    bool cached = false;  // registered under `key`
    PageKey key;
    std::list<int32_t>::iterator evictable;  // while cached and refs == 0
  };

  const KvPageLayout& layout(int64_t max_seq_len) const;
  SequenceState blank(int64_t max_seq_len);
  KvSequence live(SequenceState&& state, size_t reserved);
  // Makes a sequence whose first `prefix` tokens of `prompt` are the cached pages.
  SequenceState with_cached_prefix(int64_t max_seq_len, std::span<const int32_t> prompt);
  // Extends state.prefix_hashes over the whole hash units of its tokens.
  void hash_tokens(SequenceState& state) const;
  // The hash of every prefix of `tokens` that ends on a hash unit: hash k covers the first
  // (k + 1) · hash_unit_ tokens.
  std::vector<PrefixHash> prefix_hashes(std::span<const int32_t> tokens) const;
  // The cached page of layer l's logical page j under `hashes`, -1 if none.
  int32_t cached_page(int64_t layer, int64_t j, int64_t page_positions, std::span<const PrefixHash> hashes) const;
  // The logical pages of layer l a query at p reads below p: [first, p / B).
  int64_t first_read_page(int64_t layer, int64_t p, int64_t page_positions) const;
  bool prefix_is_cached(int64_t max_seq_len, int64_t p, std::span<const PrefixHash> hashes) const;
  int64_t usable_prefix(const SequenceState& state, std::span<const int32_t> prompt) const;

  // A page for a sequence: a free one, else the least recently released cached one.
  int32_t take_page();
  void hold(int32_t page);     // one more holder
  void release(int32_t page);  // one holder less: freed, or left cached, at zero
  void set_slot(SequencePages& pages, size_t slot, int64_t layer, int32_t page, int64_t logical);
  void clear_slot(SequencePages& pages, size_t slot, int64_t layer);
  void uncache(int32_t page);
  void register_written(SequenceState& state);
  void upload_table(SequencePages& pages);
  // Gives `state`'s pages back, registering its written ones first, and recycles its table.
  void take_back(SequenceState& state);
  void truncate(SequenceState& state, int64_t n);
  // Makes slot `slot` hold a page of its own that no cache entry names (a copy when shared).
  void own_slot(SequencePages& pages, size_t slot);
  Tensor page_bytes_view(int32_t page) const;

  const ModelConfig& config_;
  Backend& backend_;
  KvTypes types_;
  std::vector<DType> layer_dtypes_;
  size_t budget_ = 0, reserved_ = 0;
  int64_t pages_total_ = 0, shared_pages_ = 0;
  int64_t hash_unit_ = 1, share_unit_ = 1;  // gcd and lcm of the layers' page positions
  mutable std::list<std::pair<int64_t, KvPageLayout>> layouts_;  // by max_seq_len
  Tensor arena_;                        // the pages, page_bytes each
  std::vector<std::pair<Tensor, Tensor>> layer_rows_;  // per layer: the arena as its K and V rows
  std::vector<PageInfo> pages_;
  std::vector<int32_t> free_pages_;
  std::list<int32_t> evictable_;        // cached pages no sequence holds, most recently released first
  std::unordered_map<PageKey, int32_t, PageKeyHash> cache_;
  std::vector<Tensor> free_tables_;     // tables of released sequences, for reuse
};

}  // namespace g4
