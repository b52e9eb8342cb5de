// The CUDA sampler's segment path (docs/DESIGN.md §4): rows spread over the whole GPU, one block
// per segment of a row; takes every greedy and NaN row and every row with a top-k or top-p cut
// whose candidates provably decide the token (rows with a small top-k cut in larger batches in
// the first kernel's one read, "collected rows"); the rest it lists for the cluster kernel.
//
// segment_extremes_kernel: block (s, r) reads segment s of row r and writes its largest rank,
//   smallest key and NaN flag; for a collected row (collects_candidates) also its warps' best
//   ranks, and the row's last block samples the row from them (finish_collected_row).
// sample_segments_kernel: block (s, r) combines row r's extremes (z_max), reads segment s again
//   and appends the segment's best tokens (a prefix of its ranking by distance bins) to row r's
//   candidate list, with the highest rank it left out ("boundary") and, without a top-k cut, the
//   segment's total weight. The row's last block to finish samples from the candidate list when
//   the list provably holds every token the answer depends on (sample_listed); otherwise it
//   hands the row to the cluster kernel (sample_rows_kernel), which is exact for every row.
// Three launches per batch of up to kChunkRows rows, whatever the parameters.

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/sampler_paths.h"
#include "backend/cuda/sampler_rows.cuh"
#include "backend/cuda/warp_reduce.cuh"
#include "util/error.h"

namespace g4 {

namespace {

constexpr int kSegmentThreads = 256;
constexpr int kSegmentWarps = kSegmentThreads / 32;
constexpr int kSegmentVectors = 8;                          // float4 registers per thread
constexpr int kLineVectors = 8;                             // a line: 32 logits, 128 bytes
constexpr int kLineFloats = 4 * kLineVectors;
constexpr int kMaxSegmentLines = kSegmentThreads * kSegmentVectors / kLineVectors;  // 256 lines, 8192 logits
constexpr int kMaxSegmentsPerRow = 64;       // more would only lengthen the candidate lists
constexpr int64_t kTargetBlocks = 2048;      // blocks per launch worth aiming for (132 SMs)
constexpr int kRowCandidates = 8192;         // a row's candidate list in global memory
constexpr int kSortCapacity = 2048;          // candidates the finishing block sorts
constexpr int kListTarget = 1024;            // a row's list without a large top-k: ~ this long
constexpr int kMinQuota = 16;                // tokens a segment offers at least
constexpr uint32_t kUnproven = 0xFFFFFFFFu;  // no id: the candidates do not decide the token
static_assert(kBins % kSegmentThreads == 0 && kSortCapacity <= kRowCandidates && kSortCapacity <= kBins,
              "segment path sizes (the weights of the sorted candidates reuse the bins)");

// Segments per row: enough blocks to fill the GPU (batch 1: 64 segments of 4096 logits; batch 64:
// 32 of 8192), few enough that the candidate lists stay short, at most one per line and at least
// as many as fit the lines into the tiles. Segment s holds the lines s, s + S, s + 2S, ... of the
// row, so that tokens of neighbouring ids (a script, the digits) spread over all segments.
int segments_per_row(int64_t vocab, int64_t rows) {
  const int64_t lines = ceil_div(vocab, kLineFloats);
  const int64_t wanted = std::clamp<int64_t>(kTargetBlocks / rows, 1, kMaxSegmentsPerRow);
  return int(std::max(ceil_div(lines, kMaxSegmentLines), std::min(wanted, lines)));
}

// The most segments segments_per_row gives any vocabulary up to max_vocab.
int64_t max_segments(int64_t max_vocab) {
  return std::max<int64_t>(kMaxSegmentsPerRow, ceil_div(ceil_div(max_vocab, kLineFloats), kMaxSegmentLines));
}

struct SegmentExtremes {
  uint64_t best_rank;         // largest rank (the argmax)
  uint64_t inverted_min_key;  // ~(smallest key), NaN flag in bit 32
};

// Per row, zeroed by segment_extremes_kernel, filled by sample_segments_kernel's blocks.
struct RowScratch {
  unsigned long long boundary;      // highest rank of a token inside the gap that is not listed
  unsigned long long total_weight;  // the row's weight (rows without a top-k cut)
  unsigned int candidates;          // tokens appended (the list keeps kRowCandidates)
  unsigned int arrived;             // blocks done
  unsigned int collected;           // segment_extremes_kernel wrote the row's token
};

// Per row, for the rows segment_extremes_kernel decides; every call leaves it zero.
struct CollectScratch {
  unsigned long long boundary;  // highest rank of a token no warp listed
  unsigned int arrived;         // blocks done
};

struct SegmentWorkspace {  // device arrays, kChunkRows rows
  SegmentExtremes* extremes;  // [rows][segments]
  RowScratch* rows;
  uint64_t* candidates;       // [rows][kRowCandidates] ranks
  int* fallback_rows;         // rows for the cluster kernel
  int* fallback_count;
  CollectScratch* collect;
};

// The segment and row of a segment kernel's block: block (s, r) takes segment s of row r, or,
// `reversed`, segment S-1-s of row R-1-r. Blocks start roughly in index order, so the second
// kernel, reversed, first reads what the first kernel read last, which L2 (50 MB) still holds
// when a batch's logits (64 MB at batch 64) do not fit.
struct SegmentTask {
  const float* logits;
  int64_t row_stride, vocab;
  bool reversed;
  __device__ int segment() const { return reversed ? int(gridDim.x - 1 - blockIdx.x) : int(blockIdx.x); }
  __device__ int row_index() const { return reversed ? int(gridDim.y - 1 - blockIdx.y) : int(blockIdx.y); }
  __device__ const float* row() const { return logits + int64_t(row_index()) * row_stride; }
};

struct SegmentShared {
  uint64_t scratch[kSegmentWarps + 1];
  uint64_t found;
  uint64_t boundary;         // finish_collected_row: the row's bound on unlisted ranks
  int count;                 // tokens staged (list_segment_tokens), then kept (sample_listed)
  unsigned list_offset;      // where this block's staged tokens go in the row's list
  int last;                  // this block finishes the row
};

// A segment in registers: the block's vector q = t + j kSegmentThreads (thread t, register j) is
// vector q % 8 of the segment's line q / 8, so that a warp's load reads four whole lines.
struct SegmentTile {
  float4 v[kSegmentVectors];
};

// The id of component c of this thread's vector j in segment s (ids below 2^23 fit an int).
__device__ int tile_id(int s, int j, int c) {
  const int q = int(threadIdx.x) + j * kSegmentThreads;
  return (q / kLineVectors * int(gridDim.x) + s) * kLineFloats + 4 * (q % kLineVectors) + c;
}

__device__ float tile_value(const float4& v, int c) { return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w; }

__device__ void load_tile(const SegmentTask& task, SegmentTile& tile) {
  const float* row = task.row();
  const int segment = task.segment();
  const bool aligned = reinterpret_cast<uintptr_t>(row) % 16 == 0;
#pragma unroll
  for (int j = 0; j < kSegmentVectors; ++j) {
    const int first = tile_id(segment, j, 0);
    if (aligned && first + 4 <= task.vocab) {
      tile.v[j] = __ldg(reinterpret_cast<const float4*>(row + first));
    } else {
      float e[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) e[c] = first + c < task.vocab ? __ldg(row + first + c) : 0.0f;
      tile.v[j] = make_float4(e[0], e[1], e[2], e[3]);
    }
  }
}

// fn(z, id, id < vocab) for every slot of the tile, in every thread the same number of times
// (whole warps, for ballots).
template <class Fn>
__device__ void for_each_slot(const SegmentTile& tile, const SegmentTask& task, Fn fn) {
  const int segment = task.segment();
#pragma unroll
  for (int j = 0; j < kSegmentVectors; ++j) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int id = tile_id(segment, j, c);
      fn(tile_value(tile.v[j], c), uint32_t(id), id < task.vocab);
    }
  }
}

enum class RowKind { kNan, kGreedy, kCollected, kCandidates, kWholeRow };

// A row as every block of sample_segments_kernel sees it.
struct SegmentRow {
  RowKind kind;
  uint32_t argmax;
  float z_max, inv_temperature;
  bool top_k_active;
};

__device__ bool top_k_active(const SamplingParams& p, int64_t vocab) { return p.top_k > 0 && p.top_k < vocab; }

// Rows whose kept set a prefix of the ranking bounds (a top-k or top-p cut) take the candidates;
// the others (no cut, or only min_p) need every token and take the cluster kernel.
__device__ bool cut_by_rank(const SamplingParams& p, int64_t vocab) {
  return !is_greedy(p) && (top_k_active(p, vocab) || p.top_p < 1.0f);
}

// Rows with a small top-k cut in batches of more than kMaxUncollectedRows rows:
// segment_extremes_kernel lists every warp's kCollectedPerWarp best tokens as it reads the row, and
// the row's last block samples from them (finish_collected_row), so sample_segments_kernel need not
// read the row again. Fewer rows keep the two-kernel path (the collected version gained nothing
// there, docs/PERF.md).
constexpr int kCollectedPerWarp = 8;
constexpr int kCollectedPerSegment = kCollectedPerWarp * kSegmentWarps;
constexpr int kMaxCollectedTopK = 128;
constexpr unsigned kMaxUncollectedRows = 8;

// Both segment kernels ask it with the same launch shape (gridDim.y: the rows of the chunk).
__device__ bool collects_candidates(const SamplingParams& p, int64_t vocab, int segments) {
  return gridDim.y > kMaxUncollectedRows && !is_greedy(p) && top_k_active(p, vocab) &&
         p.top_k <= kMaxCollectedTopK && segments * kCollectedPerSegment <= kRowCandidates;
}

__device__ SegmentRow combine_extremes(const SegmentExtremes* extremes, int segments, const SamplingParams& p,
                                       int64_t vocab, SegmentShared& shared) {
  uint64_t best_rank = 0, inverted_min_key = 0;
  for (int s = threadIdx.x; s < segments; s += kSegmentThreads) {  // written by other blocks: past L1
    best_rank = max(best_rank, uint64_t(__ldcg(reinterpret_cast<const unsigned long long*>(&extremes[s].best_rank))));
    inverted_min_key = max(inverted_min_key, uint64_t(__ldcg(reinterpret_cast<const unsigned long long*>(
                                                 &extremes[s].inverted_min_key))));
  }
  best_rank = block_reduce<kSegmentThreads, true>(best_rank, shared.scratch);
  inverted_min_key = block_reduce<kSegmentThreads, true>(inverted_min_key, shared.scratch);
  SegmentRow row{};
  row.kind = (inverted_min_key >> 32) != 0              ? RowKind::kNan
             : is_greedy(p)                             ? RowKind::kGreedy
             : collects_candidates(p, vocab, segments)  ? RowKind::kCollected
             : cut_by_rank(p, vocab)                    ? RowKind::kCandidates
                                                        : RowKind::kWholeRow;
  row.argmax = rank_id(best_rank);
  row.z_max = key_logit(uint32_t(best_rank >> 32));
  const bool samples = row.kind == RowKind::kCandidates || row.kind == RowKind::kCollected;
  row.inv_temperature = samples ? inverse_temperature(p.temperature) : 0.0f;
  row.top_k_active = top_k_active(p, vocab);
  return row;
}

// How many tokens a segment offers: at least its share of a kListTarget-long list (and kMinQuota);
// with a top-k cut, its best k, capped at the larger of that and twice its share of k, so the row's
// best k are listed unless more than that many fall into one segment.
__device__ uint64_t segment_quota(const SegmentRow& row, const SamplingParams& p, int segments) {
  const uint64_t floor = uint64_t(max(kMinQuota, kListTarget / segments));
  if (!row.top_k_active) return floor;
  const uint64_t share = 2 * uint64_t((p.top_k + segments - 1) / segments);
  return min(uint64_t(p.top_k), max(floor, share));
}

// Appends this segment's tokens of distance bins 0..last (as many as fit) to the row's list, and
// raises the row's boundary to the highest rank of a token inside the gap that it leaves out. The
// tokens are staged in shared memory (`stage`, kStageCapacity), so that the block reserves its
// place in the list with one global atomic.
constexpr int kStageCapacity = kBins + kSortCapacity;  // the dynamic shared words, as ranks

__device__ void list_segment_tokens(const SegmentTile& tile, const SegmentTask& task, const SegmentRow& row, int last_bin,
                                    RowScratch& scratch, uint64_t* list, SegmentShared& shared, uint64_t* stage) {
  const int lane = threadIdx.x % 32;
  uint64_t boundary = 0;
  if (threadIdx.x == 0) shared.count = 0;
  __syncthreads();
  for_each_slot(tile, task, [&](float z, uint32_t id, bool valid) {
    const int bin = valid ? distance_bin(z, row.z_max, row.inv_temperature) : kOutsideGap;
    const bool take = bin <= last_bin;
    const unsigned takers = __ballot_sync(0xFFFFFFFFu, take);
    int slot = kStageCapacity;
    if (takers != 0) {
      const int leader = __ffs(takers) - 1;
      int first_slot = 0;
      if (lane == leader) first_slot = atomicAdd(&shared.count, __popc(takers));
      slot = __shfl_sync(0xFFFFFFFFu, first_slot, leader) + __popc(takers & ((1u << lane) - 1));
    }
    const uint64_t rank = rank_of(logit_key(z), id);
    if (take && slot < kStageCapacity) {
      stage[slot] = rank;
    } else if (bin != kOutsideGap) {
      boundary = max(boundary, rank);
    }
  });
  __syncthreads();
  const int staged = min(shared.count, kStageCapacity);
  if (threadIdx.x == 0) shared.list_offset = atomicAdd(&scratch.candidates, unsigned(staged));
  __syncthreads();
  for (int i = threadIdx.x; i < staged; i += kSegmentThreads) {
    const unsigned slot = shared.list_offset + unsigned(i);
    if (slot < unsigned(kRowCandidates)) {
      list[slot] = stage[i];
    } else {
      boundary = max(boundary, stage[i]);
    }
  }
  boundary = block_reduce<kSegmentThreads, true>(boundary, shared.scratch);
  if (threadIdx.x == 0 && boundary != 0) atomicMax(&scratch.boundary, boundary);
}

// sample_segments_kernel's work on one segment of a candidate row. `words`: the dynamic shared
// memory (count bins, then the staged tokens).
__device__ void offer_segment(const SegmentTile& tile, const SegmentTask& task, const SegmentRow& row, const SamplingParams& p,
                              int segments, RowScratch& scratch, uint64_t* list, SegmentShared& shared,
                              uint64_t* words) {
  uint32_t* count_bins = reinterpret_cast<uint32_t*>(words);
  for (int b = threadIdx.x; b < kBins; b += kSegmentThreads) count_bins[b] = 0;
  __syncthreads();
  uint64_t weight = 0;  // the segment's share of the row's weight, needed without a top-k cut
  for_each_slot(tile, task, [&](float z, uint32_t, bool valid) {
    const int bin = valid ? distance_bin(z, row.z_max, row.inv_temperature) : kOutsideGap;
    if (bin == kOutsideGap) return;
    atomicAdd(&count_bins[bin], 1u);
    if (!row.top_k_active) weight += token_weight(z, row.z_max, row.inv_temperature);
  });
  if (!row.top_k_active) {
    weight = block_reduce<kSegmentThreads, false>(weight, shared.scratch);
    if (threadIdx.x == 0 && weight != 0) atomicAdd(&scratch.total_weight, weight);
  }
  __syncthreads();
  const uint64_t quota = segment_quota(row, p, segments);
  const int crossing = block_first_reaching<kSegmentThreads>(
      shared, kBins, [&](int b) -> uint64_t { return count_bins[b]; }, [&](uint64_t) { return quota; });
  list_segment_tokens(tile, task, row, crossing < 0 ? kBins - 1 : crossing, scratch, list, shared, words);
}

// True in every thread of the row's last block to finish (which then reads what the others wrote).
// The count wraps to 0 at the last arrival.
__device__ bool arrive_last(unsigned int& arrived, int segments, SegmentShared& shared) {
  __threadfence();  // this thread's list entries and atomics before the arrival
  __syncthreads();
  if (threadIdx.x == 0) shared.last = atomicInc(&arrived, unsigned(segments - 1)) == unsigned(segments - 1);
  __syncthreads();
  if (shared.last) __threadfence();
  return shared.last;
}

// fn(rank) for every rank of a row's list (written by other blocks: read past L1), each thread's
// kLoads ranks loaded before any is used: one memory latency per 2 048 ranks, not one per 256 (the
// list is read twice while the rest of the GPU waits for the row, docs/PERF.md).
template <class Fn>
__device__ void for_each_listed(const uint64_t* list, int listed, Fn fn) {
  constexpr int kLoads = 8;
  for (int first = 0; first < listed; first += kLoads * kSegmentThreads) {
    uint64_t ranks[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int i = first + u * kSegmentThreads + int(threadIdx.x);
      ranks[u] = i < listed ? __ldcg(reinterpret_cast<const unsigned long long*>(list + i)) : 0;
    }
#pragma unroll
    for (int u = 0; u < kLoads; ++u)
      if (first + u * kSegmentThreads + int(threadIdx.x) < listed) fn(ranks[u]);
  }
}

// The finishing block of a candidate row: the token, or kUnproven when the listed candidates do not
// decide it. `words`: kBins + kSortCapacity values of dynamic shared memory.
//
// Why the answer is exact when it is given: every token ranked above the boundary is listed (the
// boundary is the highest rank of an unlisted token inside the gap; tokens beyond the gap weigh 0
// and rank below all inside it). The top-k set, the top-p crossing and so the kept set are taken
// only when they lie above the boundary, and then they are exactly the CPU's; the weights, Q and
// the draw are those of sampling_math.h, computed by the same helpers as the cluster kernel.
__device__ uint32_t sample_listed(const SegmentRow& row, const SamplingParams& p, const uint64_t* list, int listed,
                                  uint64_t boundary, uint64_t row_weight, SegmentShared& shared, uint64_t* words) {
  uint64_t* bins = words;  // later the weights
  uint64_t* ranks = words + kBins;
  auto bin_of = [&](uint64_t rank) { return distance_bin(key_logit(uint32_t(rank >> 32)), row.z_max, row.inv_temperature); };

  // Narrow the list to its bins up to the one where the count reaches k (top-k cut) or the weight
  // reaches the top-p target: every token at or above the cut is in them.
  for (int b = threadIdx.x; b < kBins; b += kSegmentThreads) bins[b] = 0;
  if (threadIdx.x == 0) shared.count = 0;
  __syncthreads();
  // Listed ranks at or below the boundary (and empty entries, 0) can be in no proven answer, and
  // tokens beyond the gap weigh 0: both are skipped.
  for_each_listed(list, listed, [&](uint64_t rank) {
    const int bin = bin_of(rank);
    if (rank <= boundary || bin == kOutsideGap) return;
    const uint64_t measure =
        row.top_k_active ? 1 : token_weight(key_logit(uint32_t(rank >> 32)), row.z_max, row.inv_temperature);
    atomicAdd(reinterpret_cast<unsigned long long*>(&bins[bin]), measure);
  });
  __syncthreads();
  const uint64_t target = row.top_k_active ? uint64_t(p.top_k) : top_p_target(p.top_p, row_weight);
  const int crossing = block_first_reaching<kSegmentThreads>(
      shared, kBins, [&](int b) { return bins[b]; }, [&](uint64_t) { return target; });
  const int last_bin = crossing < 0 ? kBins - 1 : crossing;
  for_each_listed(list, listed, [&](uint64_t rank) {
    if (rank <= boundary || bin_of(rank) > last_bin) return;
    const int slot = atomicAdd(&shared.count, 1);
    if (slot < kSortCapacity) ranks[slot] = rank;
  });
  __syncthreads();
  const int count = shared.count;
  if (count > kSortCapacity) return kUnproven;
  const int padded = next_power_of_two(count);
  for (int j = count + threadIdx.x; j < padded; j += kSegmentThreads) ranks[j] = 0;  // below every rank
  sort_descending<kSegmentThreads>(ranks, padded);

  int top_k_count = count;
  if (row.top_k_active) {
    const int k = p.top_k;
    if (boundary != 0 && (count < k || ranks[k - 1] <= boundary)) return kUnproven;
    top_k_count = min(count, k);  // fewer only when every token inside the gap is listed
  }
  uint64_t* weights = bins;
  weigh_ranks<kSegmentThreads>(ranks, weights, top_k_count, row.z_max, row.inv_temperature);
  int kept = top_k_count;
  if (p.top_p < 1.0f) {
    kept = top_p_keep<kSegmentThreads>(shared, weights, top_k_count, p.top_p, !row.top_k_active, row_weight);
    if (kept == 0) return kUnproven;
    if (!row.top_k_active && boundary != 0 && ranks[kept - 1] <= boundary) return kUnproven;
  }
  return draw_kept<kSegmentThreads>(shared, ranks, weights, kept, p);
}

// What a finished row writes: its token (and the next seed), or its index for the cluster kernel.
struct RowOutput {
  SamplingParams* params;
  int64_t* tokens;
  bool advance_seed;
};

__device__ void finish_row(const SegmentRow& row, const SamplingParams& p, int row_index, const RowOutput& out,
                           const SegmentWorkspace& ws, SegmentShared& shared, uint64_t* words) {
  int64_t token = kUnproven;
  if (row.kind == RowKind::kNan) token = kNanLogitsToken;
  if (row.kind == RowKind::kGreedy) token = row.argmax;
  if (row.kind == RowKind::kCandidates) {
    const RowScratch& scratch = ws.rows[row_index];
    token = sample_listed(row, p, ws.candidates + int64_t(row_index) * kRowCandidates,
                          int(min(__ldcg(&scratch.candidates), unsigned(kRowCandidates))), __ldcg(&scratch.boundary),
                          __ldcg(&scratch.total_weight), shared, words);
  }
  if (threadIdx.x != 0) return;
  // A collected row's token is written already when segment_extremes_kernel found it.
  const bool written = row.kind == RowKind::kCollected && __ldcg(&ws.rows[row_index].collected) != 0;
  if (token == kUnproven && !written) {
    ws.fallback_rows[atomicAdd(ws.fallback_count, 1)] = row_index;
    return;
  }
  if (!written) out.tokens[row_index] = token;
  if (out.advance_seed) out.params[row_index].seed = p.seed + 1;
}

size_t segment_shared_bytes() { return size_t(kBins + kSortCapacity) * sizeof(uint64_t); }

// ---- The first segment kernel, and the rows it decides itself ----

// A lane's three best tokens (logit keys, best first, and their slots j * 4 + c in the tile) and
// the largest key of the rest of its tile (0: none; a key is 0 only for a NaN, whose row draws the NaN
// token). Three, so that a row's best k (up to kMaxCollectedTopK) are rarely more than a lane holds
// (16-32 of the row's 2^18 tokens). A lane offers its tokens in id order, so a later token with an
// equal key ranks lower: it moves up only past strictly smaller keys.
struct LaneBest {
  uint32_t key[3] = {0, 0, 0};
  int slot[3] = {0, 0, 0};
  uint32_t rest_key = 0;
  __device__ void offer(uint32_t k, int s) {
    const bool above = k > key[2];
    rest_key = max(rest_key, above ? key[2] : k);
    if (above) key[2] = k, slot[2] = s;
#pragma unroll
    for (int i = 1; i >= 0; --i) {  // one step of insertion: key[i + 1] may now exceed key[i]
      const bool swap = key[i + 1] > key[i];
      const uint32_t high = swap ? key[i + 1] : key[i], low = swap ? key[i] : key[i + 1];
      const int high_slot = swap ? slot[i + 1] : slot[i], low_slot = swap ? slot[i] : slot[i + 1];
      key[i] = high, key[i + 1] = low, slot[i] = high_slot, slot[i + 1] = low_slot;
    }
  }
};

// Lists the warp's kCollectedPerWarp best ranks at `slots` (0 where it has fewer tokens), taking
// each lane's in order, and returns a bound on the ranks of the warp's tokens it did not list: each
// lane's next (its next best, or the best of its rest at the highest rank its key allows).
__device__ uint64_t list_warp_best(const LaneBest& lane, const uint64_t (&ranks)[3], uint64_t* slots) {
  int taken = 0;
  uint64_t next = ranks[0];
#pragma unroll
  for (int i = 0; i < kCollectedPerWarp; ++i) {
    const uint64_t best = warp_reduce<MaxOp>(next);
    if (threadIdx.x % 32 == 0) slots[i] = best;
    if (next == best && best != 0) {  // ranks are unique: one lane's
      ++taken;
      next = taken == 1 ? ranks[1] : taken == 2 ? ranks[2] : 0;
    }
  }
  const uint64_t rest = lane.rest_key != 0 ? rank_of(lane.rest_key, 0) : 0;
  return warp_reduce<MaxOp>(max(next, rest));
}

// The last block of a collected row. Every token ranked above the row's bound (the highest rank any
// warp may have left unlisted) is listed, so sample_listed's proof holds as for sample_segments_kernel's
// lists; when it gives no token, the row is left to sample_segments_kernel, which hands it to the
// cluster kernel. `words`: segment_shared_bytes().
__device__ void finish_collected_row(const SamplingParams& p, int row_index, int segments, int64_t vocab,
                                     const RowOutput& out, const SegmentWorkspace& ws, SegmentShared& shared,
                                     uint64_t* words) {
  if (threadIdx.x == 0) shared.boundary = atomicExch(&ws.collect[row_index].boundary, 0ull);  // zero for the next call
  // (combine_extremes' barriers publish it.)
  const SegmentRow row = combine_extremes(ws.extremes + int64_t(row_index) * segments, segments, p, vocab, shared);
  if (row.kind != RowKind::kCollected) return;  // NaN: sample_segments_kernel writes the NaN token
  // sample_listed's boundary is the highest unlisted rank inside the gap: 0 when every unlisted token
  // ranks below one beyond it.
  uint64_t boundary = shared.boundary;
  if (distance_bin(key_logit(uint32_t(boundary >> 32)), row.z_max, row.inv_temperature) == kOutsideGap) boundary = 0;
  const uint32_t token = sample_listed(row, p, ws.candidates + int64_t(row_index) * kRowCandidates,
                                       segments * kCollectedPerSegment, boundary, 0, shared, words);
  if (threadIdx.x == 0 && token != kUnproven) {
    out.tokens[row_index] = token;
    ws.rows[row_index].collected = 1;
  }
}

// Block (s, r): segment s of row r's largest rank, smallest key and NaN flag; for a collected row
// also its warps' best ranks and the row's bound, and the row's last block samples it.
__global__ void __launch_bounds__(kSegmentThreads, 4) segment_extremes_kernel(SegmentTask task, RowOutput out,
                                                                          SegmentWorkspace ws) {
  pdl_launch_dependents();  // sample_segments_kernel may load its logits meanwhile
  extern __shared__ uint64_t collect_words[];
  __shared__ SegmentShared shared;
  SegmentTile tile;
  load_tile(task, tile);
  const int segment = task.segment(), row_index = task.row_index(), segments = int(gridDim.x);
  const SamplingParams p = out.params[row_index];
  const bool collect = collects_candidates(p, task.vocab, segments);
  uint64_t best_rank = 0, inverted_min_key = 0;
  if (collect) {
    LaneBest lane;
    uint32_t min_key = 0xFFFFFFFFu;
    bool nan = false;
    auto offer_tile = [&](auto checked) {  // checked: some of the thread's ids may lie past the vocab
#pragma unroll
      for (int j = 0; j < kSegmentVectors; ++j) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const float z = tile_value(tile.v[j], c);
          if (decltype(checked)::value && tile_id(segment, j, c) >= task.vocab) continue;
          const uint32_t key = logit_key(z);
          min_key = min(min_key, key);
          nan |= z != z;
          lane.offer(key, 4 * j + c);
        }
      }
    };
    if (tile_id(segment, kSegmentVectors - 1, 3) < task.vocab)  // the thread's last id is its largest
      offer_tile(std::false_type{});
    else
      offer_tile(std::true_type{});
    uint64_t ranks[3];
#pragma unroll
    for (int i = 0; i < 3; ++i) {
      const uint32_t id = uint32_t(tile_id(segment, lane.slot[i] / 4, lane.slot[i] % 4));
      ranks[i] = lane.key[i] != 0 ? rank_of(lane.key[i], id) : 0;
    }
    best_rank = ranks[0];
    inverted_min_key = uint64_t(~min_key) | (uint64_t(nan) << 32);
    const int warp = int(threadIdx.x) / 32;
    uint64_t* slots = ws.candidates + int64_t(row_index) * kRowCandidates +
                      (segment * kSegmentWarps + warp) * kCollectedPerWarp;
    const uint64_t unlisted = list_warp_best(lane, ranks, slots);
    if (threadIdx.x % 32 == 0 && unlisted != 0) {
      atomicMax(&ws.collect[row_index].boundary, static_cast<unsigned long long>(unlisted));
    }
  } else {
    for_each_slot(tile, task, [&](float z, uint32_t id, bool valid) {
      if (!valid) return;
      const uint32_t key = logit_key(z);
      best_rank = max(best_rank, rank_of(key, id));
      inverted_min_key = max(inverted_min_key, uint64_t(~key) | (uint64_t(z != z) << 32));
    });
  }
  best_rank = block_reduce<kSegmentThreads, true>(best_rank, shared.scratch);
  inverted_min_key = block_reduce<kSegmentThreads, true>(inverted_min_key, shared.scratch);
  if (threadIdx.x == 0) {
    ws.extremes[row_index * segments + segment] = {best_rank, inverted_min_key};
    if (segment == 0) ws.rows[row_index] = RowScratch{};
    if (segment == 0 && row_index == 0) *ws.fallback_count = 0;
  }
  if (!collect || !arrive_last(ws.collect[row_index].arrived, segments, shared)) return;
  finish_collected_row(p, row_index, segments, task.vocab, out, ws, shared, collect_words);
}

// Launched with PDL after segment_extremes_kernel. Before pdl_wait it reads only the logits and the
// parameters: segment_extremes_kernel was launched without PDL, so whatever wrote them (the forward,
// the previous sampling call's seed update) finished before it started, and this kernel cannot
// start before it did. It lets the cluster kernel launch at once: that one waits (pdl_wait) before
// it reads the rows left to it, and all of this kernel's blocks are running by then, so its
// clusters take no SM that this kernel still needs.
// Four blocks per SM (64 registers, no spills); three (80 registers) would hide the loads with a
// quarter fewer warps.
__global__ void __launch_bounds__(kSegmentThreads, 4)
    sample_segments_kernel(SegmentTask task, RowOutput out, SegmentWorkspace ws) {
  pdl_launch_dependents();
  extern __shared__ uint64_t segment_words[];
  __shared__ SegmentShared shared;
  const int row_index = task.row_index(), segments = int(gridDim.x);
  const SamplingParams p = out.params[row_index];
  // Greedy and unfiltered rows need no pass here: the block of segment 0 alone finishes them.
  const bool scans = cut_by_rank(p, task.vocab) && !collects_candidates(p, task.vocab, segments);
  if (!scans && task.segment() != 0) return;
  SegmentTile tile;
  if (scans) load_tile(task, tile);
  pdl_wait();

  const SegmentRow row = combine_extremes(ws.extremes + int64_t(row_index) * segments, segments, p, task.vocab, shared);
  RowScratch& scratch = ws.rows[row_index];
  if (row.kind == RowKind::kCandidates) {
    offer_segment(tile, task, row, p, segments, scratch,
                  ws.candidates + int64_t(row_index) * kRowCandidates, shared, segment_words);
  }
  if (scans && !arrive_last(scratch.arrived, segments, shared)) return;
  finish_row(row, p, row_index, out, ws, shared, segment_words);
}

}  // namespace

SegmentWorkspaceBytes segment_workspace_bytes(int64_t max_vocab) {
  return {size_t(kChunkRows * max_segments(max_vocab)) * sizeof(SegmentExtremes), size_t(kChunkRows) * sizeof(RowScratch),
          size_t(kChunkRows) * kRowCandidates * sizeof(uint64_t), size_t(kChunkRows + 1) * sizeof(int),
          size_t(kChunkRows) * sizeof(CollectScratch)};
}

Pdl launch_segment_kernels(const CudaSampleBatch& batch, const SegmentBuffers& buffers, cudaStream_t stream) {
  const int segments = segments_per_row(batch.vocab, batch.rows);
  const SegmentWorkspace ws{static_cast<SegmentExtremes*>(buffers.extremes), static_cast<RowScratch*>(buffers.row_scratch),
                            static_cast<uint64_t*>(buffers.candidates), buffers.fallback + 1, buffers.fallback,
                            static_cast<CollectScratch*>(buffers.collect)};
  const dim3 grid(unsigned(segments), unsigned(batch.rows));
  const RowOutput out{batch.params, batch.tokens, batch.advance_seed};
  // Only collected rows' last blocks use the shared words (collects_candidates: more than
  // kMaxUncollectedRows rows).
  const size_t collect_bytes = batch.rows > int64_t(kMaxUncollectedRows) ? segment_shared_bytes() : 0;
  launch_kernel("segment_extremes_kernel", segment_extremes_kernel, grid, kSegmentThreads, collect_bytes, stream,
                Pdl::kOff, SegmentTask{batch.logits, batch.logits_row_stride, batch.vocab, false}, out, ws);
  // PDL on streams g4 creates; the legacy default stream (nullptr) keeps plain stream order.
  const Pdl pdl = stream != nullptr ? Pdl::kOn : Pdl::kOff;
  launch_kernel("sample_segments_kernel", sample_segments_kernel, grid, kSegmentThreads, segment_shared_bytes(), stream,
                pdl, SegmentTask{batch.logits, batch.logits_row_stride, batch.vocab, true}, out, ws);
  return pdl;
}

}  // namespace g4
