// The CUDA sampler's cluster kernel (sample_rows_kernel), for the rows the segment path leaves:
// one thread-block cluster of kClusterBlocks blocks samples one row. Each block copies its slice of
// the logits into shared memory once, and every later pass reads shared memory; the blocks
// combine their partial results through distributed shared memory and cluster barriers.
//
// The cluster kernel, per row (sampling_math.h defines every number):
//  1. load + row statistics: largest rank (argmax, lowest id), smallest key, NaN flag;
//  2. greedy rows stop at the argmax; NaN rows stop with kNanLogitsToken;
//  3. candidates (sample_from_candidates): one histogram pass over distance bins (how far below
//     the max a token's weight exponent lies) finds the bin that holds the k-th token (top_k) or,
//     without a top-k cut, the top-p crossing; the tokens up to that bin, usually a few dozen,
//     are gathered into block 0, which sorts them by rank and applies top_k, top_p, min_p and the
//     draw exactly. Whole passes cost ~0.13 us per instruction per logit, so everything after the
//     first pass works on the candidates alone.
//  4. rows whose candidates do not fit (crowded bins: many equal logits, no top-k or top-p cut)
//     take the whole-row path (sample_whole_row): radix selections for the top-k and top-p cuts
//     (select_cut) and the draw (find_first_reaching) over all logits.
// Both paths return the token of sample_row(); all sums are of integers, so the order in which
// threads add them does not change the token.

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/sampler_paths.h"
#include "backend/cuda/sampler_rows.cuh"
#include "backend/cuda/warp_reduce.cuh"
#include "util/error.h"

namespace g4 {

namespace {

namespace cg = cooperative_groups;

constexpr int kClusterBlocks = 8;
constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kExchangeSlots = 16;     // cluster exchanges per row (at most 10 are used)
// Candidates block 0 sorts itself (a power of two): bounds top_k for the candidate path.
constexpr int kCandidateCapacity = 2048;

// Logits per block: a multiple of 4 so that every slice starts 16-byte aligned when rows are.
int64_t slice_length(int64_t vocab) {
  const int64_t per_block = (vocab + kClusterBlocks - 1) / kClusterBlocks;
  return (per_block + 3) / 4 * 4;
}

struct SharedState {
  // Radix histograms, double-buffered: other blocks may still read the previous round's.
  uint64_t bins[2][kBins];
  uint64_t exchange[kExchangeSlots];     // one value per exchange, read by the other blocks
  uint64_t gathered[kClusterBlocks];     // the cluster's values of the current exchange
  uint64_t scratch[kWarps + 1];          // block reductions and scans
  uint64_t selected[3];                  // select_cut: chosen bin, weight above it, its weight
  uint64_t found;                        // find_first_reaching: the id this block found
  int candidate_count;                   // candidates this block has gathered
};

// Dynamic shared memory after the logits slice: the candidate path's arrays.
struct CandidateStorage {
  uint64_t* weight_bins;   // [kBins] weight per distance bin (this block's logits)
  uint64_t* candidates;    // [kCandidateCapacity] this block's candidate ranks; in block 0 later
                           // the weights of the sorted candidates
  uint64_t* merged;        // [kCandidateCapacity] block 0: the cluster's candidates, sorted
  uint32_t* count_bins;    // [kBins] tokens per distance bin (this block's logits)
};

size_t candidate_storage_bytes() {
  return size_t(kBins) * (sizeof(uint64_t) + sizeof(uint32_t)) + 2 * size_t(kCandidateCapacity) * sizeof(uint64_t);
}

__device__ CandidateStorage carve_candidate_storage(void* base) {
  uint64_t* words = static_cast<uint64_t*>(base);
  return {words, words + kBins, words + kBins + kCandidateCapacity,
          reinterpret_cast<uint32_t*>(words + kBins + 2 * kCandidateCapacity)};
}

// One row as seen by one block; every thread holds a copy.
struct RowContext {
  SharedState& shared;
  const float* values;  // this block's slice, in shared memory
  int count;            // logits in the slice
  uint32_t first_id;    // id of values[0]
  float z_max;
  float inv_temperature;
  uint32_t min_key, max_key;
  int next_slot = 0;
  int round = 0;
};

// Publishes thread 0's `value` to the cluster and fills shared.gathered with every block's value.
__device__ void cluster_gather(RowContext& row, uint64_t value) {
  cg::cluster_group cluster = cg::this_cluster();
  const int slot = row.next_slot++;
  if (threadIdx.x == 0) row.shared.exchange[slot] = value;
  cluster.sync();
  if (threadIdx.x < kClusterBlocks) {
    row.shared.gathered[threadIdx.x] = *cluster.map_shared_rank(&row.shared.exchange[slot], threadIdx.x);
  }
  __syncthreads();
}

__device__ uint64_t gathered_sum(const RowContext& row, int blocks) {
  uint64_t sum = 0;
  for (int b = 0; b < blocks; ++b) sum += row.shared.gathered[b];
  return sum;
}

template <class Fn>
__device__ void for_each_logit(const RowContext& row, Fn fn) {
  for (int i = threadIdx.x; i < row.count; i += kThreads) fn(row.values[i], row.first_id + i);
}

// The lowest id whose cumulative measure (ids ascending, over the whole row) reaches
// target_of(total measure of the row). measure(z, id) -> uint64_t.
template <class Measure, class TargetOf>
__device__ uint32_t find_first_reaching(RowContext& row, Measure measure, TargetOf target_of) {
  uint64_t local = 0;
  for_each_logit(row, [&](float z, uint32_t id) { local += measure(z, id); });
  const uint64_t block_total = block_reduce<kThreads, false>(local, row.shared.scratch);
  cluster_gather(row, block_total);
  const int rank = int(cg::this_cluster().block_rank());
  const uint64_t target = target_of(gathered_sum(row, kClusterBlocks));
  const uint64_t before = gathered_sum(row, rank);

  uint64_t found = kNoToken;
  if (before < target && target <= before + block_total) {  // the same for the whole block
    // Thread t owns the segment [t*segment, (t+1)*segment) of the slice; warp w measures the 32
    // segments of its threads together (lanes read consecutive logits: no bank conflicts).
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int segment = 32 * ((row.count + 32 * kThreads - 1) / (32 * kThreads));
    uint64_t mine = 0;
    for (int j = 0; j < 32; ++j) {
      const int start = (warp * 32 + j) * segment;
      uint64_t part = 0;
      for (int i = start + lane; i < start + segment && i < row.count; i += 32) {
        part += measure(row.values[i], row.first_id + i);
      }
      part = warp_reduce<SumOp>(part);
      if (lane == j) mine = part;
    }
    const uint64_t local_target = target - before;
    uint64_t cumulative = block_exclusive_scan<kThreads>(mine, row.shared.scratch);
    if (cumulative < local_target && local_target <= cumulative + mine) {
      const int start = threadIdx.x * segment;
      for (int i = start; i < start + segment && i < row.count; ++i) {
        cumulative += measure(row.values[i], row.first_id + i);
        if (cumulative >= local_target) {
          row.shared.found = row.first_id + i;
          break;
        }
      }
    }
    __syncthreads();
    found = row.shared.found;
  }
  cluster_gather(row, found);
  uint64_t result = kNoToken;
  for (int b = 0; b < kClusterBlocks; ++b) result = min(result, row.shared.gathered[b]);
  return uint32_t(result);
}

// The measures of a thread's two bins (2 * threadIdx.x and the next) summed over the cluster's
// histograms, which must be published (cluster barrier) first.
struct BinPair {
  int first_bin;
  uint64_t measure[2];
  __device__ uint64_t sum() const { return measure[0] + measure[1]; }
};

template <class Count>
__device__ BinPair cluster_bin_pair(const Count* bins) {
  static_assert(2 * kThreads == kBins, "each thread owns two bins");
  cg::cluster_group cluster = cg::this_cluster();
  BinPair pair{2 * int(threadIdx.x), {0, 0}};
  for (int b = 0; b < kClusterBlocks; ++b) {
    const Count* remote = cluster.map_shared_rank(bins, b);
    pair.measure[0] += remote[pair.first_bin];
    pair.measure[1] += remote[pair.first_bin + 1];
  }
  return pair;
}

// When the cumulative measure crosses `target` within the pair (`before` = the measure ahead of
// it), the thread records the crossing bin, the measure ahead of that bin and the bin's measure
// in shared.selected[0..2]; exactly one thread of the block does.
__device__ inline void select_crossing(SharedState& shared, const BinPair& pair, uint64_t before, uint64_t target) {
  for (int i = 0; i < 2; ++i) {
    if (before < target && target <= before + pair.measure[i]) {
      shared.selected[0] = pair.first_bin + i, shared.selected[1] = before, shared.selected[2] = pair.measure[i];
      return;
    }
    before += pair.measure[i];
  }
}

// The rank at which the cumulative measure of the row's tokens, in rank order, first reaches
// `target` (<= total measure). Measure: 1 per token (kWeighted = false) or its weight.
// Radix selection on the logit key: each round histograms the keys of the current range
// [lo, hi] into kBins bins (bin = (hi - key) >> shift, so bin 0 holds the highest keys), finds the
// bin where the cumulative measure crosses the target and narrows the range to it; three rounds
// reach a single key. Equal keys are then ordered by id.
template <bool kWeighted>
__device__ uint64_t select_cut(RowContext& row, uint64_t target) {
  cg::cluster_group cluster = cg::this_cluster();
  SharedState& shared = row.shared;
  const int lane = threadIdx.x % 32;
  auto measure_of = [&](float z) -> uint64_t {
    return kWeighted ? token_weight(z, row.z_max, row.inv_temperature) : 1;
  };
  uint32_t lo = row.min_key, hi = row.max_key;
  uint64_t above = 0, group_measure = 0;
  bool group_known = false;
  while (lo < hi) {
    const int shift = max(0, 32 - __clz(int(hi - lo)) - kBinBits);
    uint64_t* bins = shared.bins[row.round++ & 1];
    for (int b = threadIdx.x; b < kBins; b += kThreads) bins[b] = 0;
    __syncthreads();
    for (int base = 0; base < row.count; base += kThreads) {  // whole warps, for __match_any_sync
      const int i = base + threadIdx.x;
      int bin = -1;
      uint64_t measure = 0;
      if (i < row.count) {
        const float z = row.values[i];
        const uint32_t key = logit_key(z);
        if (key >= lo && key <= hi) {
          bin = int((hi - key) >> shift);
          measure = measure_of(z);
        }
      }
      if (kWeighted) {
        if (measure != 0) atomicAdd(reinterpret_cast<unsigned long long*>(&bins[bin]), measure);
      } else {
        // Logits crowd into few bins: one atomic per group of lanes with the same bin.
        const unsigned peers = __match_any_sync(0xFFFFFFFFu, bin);
        if (bin >= 0 && lane == __ffs(peers) - 1) {
          atomicAdd(reinterpret_cast<unsigned long long*>(&bins[bin]), uint64_t(__popc(peers)));
        }
      }
    }
    cluster.sync();
    const BinPair pair = cluster_bin_pair(bins);
    select_crossing(shared, pair, above + block_exclusive_scan<kThreads>(pair.sum(), shared.scratch), target);
    __syncthreads();
    const uint32_t bin = uint32_t(shared.selected[0]);
    above = shared.selected[1];
    group_measure = shared.selected[2];
    group_known = true;
    const int64_t bin_lowest = int64_t(hi) - (int64_t(bin + 1) << shift) + 1;
    hi -= bin << shift;
    lo = uint32_t(max(int64_t(lo), bin_lowest));
  }
  // All tokens of key lo weigh the same: the cut is the n-th of them in id order.
  const uint32_t key = lo;
  const uint64_t unit = measure_of(key_logit(key));
  const uint64_t needed = (target - above + unit - 1) / unit;
  if (group_known && needed * unit == group_measure) return rank_of(key, 0xFFFFFFFFu);
  const uint32_t id = find_first_reaching(
      row, [key](float z, uint32_t) -> uint64_t { return logit_key(z) == key; },
      [needed](uint64_t) { return needed; });
  return rank_of(key, id);
}

// The rank cut of top_k and then top_p over the whole row (a row with finite logits and
// temperature > 0): the tokens ranked at or above it, with min_p's floor, are the kept set.
__device__ uint64_t whole_row_cut(RowContext& row, const SamplingParams& params, int64_t vocab) {
  uint64_t cut = kKeepAllRanks;
  if (params.top_k > 0 && params.top_k < vocab) cut = select_cut<false>(row, uint64_t(params.top_k));
  if (params.top_p < 1.0f) {
    uint64_t local = 0;
    for_each_logit(row, [&](float z, uint32_t id) {
      if (rank_of(logit_key(z), id) >= cut) local += token_weight(z, row.z_max, row.inv_temperature);
    });
    cluster_gather(row, block_reduce<kThreads, false>(local, row.shared.scratch));
    const uint64_t top_k_weight = gathered_sum(row, kClusterBlocks);
    cut = select_cut<true>(row, top_p_target(params.top_p, top_k_weight));
  }
  return cut;
}

// The kept set's description without its total (kept_weight reads no total).
__device__ KeptSet kept_set_of(const RowContext& row, const SamplingParams& params, uint64_t cut) {
  return KeptSet{cut, min_p_floor(params.min_p), 0, row.z_max, row.inv_temperature};
}

// Step 4 of the file comment: the whole-row cut, then the draw over the whole row.
__device__ uint32_t sample_whole_row(RowContext& row, const SamplingParams& params, int64_t vocab) {
  const KeptSet kept = kept_set_of(row, params, whole_row_cut(row, params, vocab));
  return find_first_reaching(
      row, [=](float z, uint32_t id) -> uint64_t { return kept_weight(kept, z, id); },
      [seed = params.seed](uint64_t kept_weight) { return draw_target(seed, kept_weight); });
}

__device__ int distance_bin(const RowContext& row, float z) { return distance_bin(z, row.z_max, row.inv_temperature); }

// Fills this block's histogram over distance bins with 1 per token (Count = uint32_t) or its
// weight (uint64_t). Each block's array is read by the others after the next cluster barrier.
template <class Count>
__device__ void fill_distance_histogram(const RowContext& row, Count* bins) {
  for (int b = threadIdx.x; b < kBins; b += kThreads) bins[b] = 0;
  __syncthreads();
  for_each_logit(row, [&](float z, uint32_t) {
    const int bin = distance_bin(row, z);
    if (bin == kOutsideGap) return;
    if constexpr (sizeof(Count) == sizeof(uint32_t)) {
      atomicAdd(&bins[bin], 1u);
    } else {
      atomicAdd(reinterpret_cast<unsigned long long*>(&bins[bin]), token_weight(z, row.z_max, row.inv_temperature));
    }
  });
}

struct BinCrossing {
  int bin;         // first bin at which the cumulative measure reaches the target; kBins if none
  uint64_t total;  // the cluster's measure over all bins
};

// Sums the cluster's histograms (`bins` at the same shared address in every block) and finds the
// bin where the cumulative measure, bin 0 first, reaches target_of(total). Starts with the cluster
// barrier that publishes the histograms; every block computes the same answer.
template <class Count, class TargetOf>
__device__ BinCrossing cluster_bin_crossing(SharedState& shared, const Count* bins, TargetOf target_of) {
  cg::this_cluster().sync();
  const BinPair pair = cluster_bin_pair(bins);
  const uint64_t total = block_reduce<kThreads, false>(pair.sum(), shared.scratch);
  if (threadIdx.x == 0) shared.selected[0] = kBins;
  select_crossing(shared, pair, block_exclusive_scan<kThreads>(pair.sum(), shared.scratch), target_of(total));
  __syncthreads();
  return {int(shared.selected[0]), total};
}

// Appends the ranks of this block's tokens in bins 0..last_bin to storage.candidates (at most
// kCandidateCapacity are stored; shared.candidate_count counts all).
__device__ void gather_candidates(RowContext& row, const CandidateStorage& storage, int last_bin) {
  const int lane = threadIdx.x % 32;
  for (int base = 0; base < row.count; base += kThreads) {  // whole warps, for the ballot
    const int i = base + threadIdx.x;
    const float z = i < row.count ? row.values[i] : 0.0f;
    const bool take = i < row.count && distance_bin(row, z) <= last_bin;
    const unsigned takers = __ballot_sync(0xFFFFFFFFu, take);
    if (takers == 0) continue;
    int first_slot = 0;
    if (lane == 0) first_slot = atomicAdd(&row.shared.candidate_count, __popc(takers));
    const int slot = __shfl_sync(0xFFFFFFFFu, first_slot, 0) + __popc(takers & ((1u << lane) - 1));
    if (take && slot < kCandidateCapacity) storage.candidates[slot] = rank_of(logit_key(z), row.first_id + i);
  }
}

// Step 3 of the file comment. Returns false, in every block, when the row needs the whole-row
// path; otherwise block 0 gets the token in *token (the other blocks' is unset).
__device__ bool sample_from_candidates(RowContext& row, const CandidateStorage& storage, const SamplingParams& params,
                                       int64_t vocab, uint32_t* token) {
  SharedState& shared = row.shared;
  if (threadIdx.x == 0) shared.candidate_count = 0;  // published by the histogram's barriers

  // The candidates are the tokens of distance bins 0..last_bin; all tokens ranked above the last
  // one kept by top_k (top_k_cuts) or by top_p (otherwise) are among them.
  const bool top_k_active = params.top_k > 0 && params.top_k < vocab;
  const uint64_t top_k = uint64_t(params.top_k);
  bool top_k_cuts = false;
  int last_bin = kBins - 1;
  if (top_k_active) {
    fill_distance_histogram(row, storage.count_bins);
    const BinCrossing crossing = cluster_bin_crossing(shared, storage.count_bins, [&](uint64_t) { return top_k; });
    // With no more than k tokens inside the gap, the top-k set holds every token of weight > 0.
    top_k_cuts = crossing.total > top_k;
    if (top_k_cuts) last_bin = crossing.bin;
  }
  bool weight_known = false;  // the top-k set's weight Q_k from the histogram
  uint64_t top_k_weight = 0;
  if (!top_k_cuts) {
    if (params.top_p >= 1.0f) return false;  // no cut narrows the candidates
    fill_distance_histogram(row, storage.weight_bins);
    const BinCrossing crossing = cluster_bin_crossing(
        shared, storage.weight_bins, [&](uint64_t total) { return top_p_target(params.top_p, total); });
    last_bin = crossing.bin;
    weight_known = true;
    top_k_weight = crossing.total;
  }

  gather_candidates(row, storage, last_bin);
  __syncthreads();
  cluster_gather(row, uint64_t(shared.candidate_count));
  const int count = int(gathered_sum(row, kClusterBlocks));
  if (count > kCandidateCapacity) return false;
  if (cg::this_cluster().block_rank() != 0) return true;  // the kernel's last barrier keeps the lists

  // Block 0: merge the cluster's candidates and sort them by rank, highest first.
  uint64_t* ranks = storage.merged;
  int offset = 0;
  for (int b = 0; b < kClusterBlocks; ++b) {
    const uint64_t* list = cg::this_cluster().map_shared_rank(storage.candidates, b);
    const int listed = int(shared.gathered[b]);
    for (int j = threadIdx.x; j < listed; j += kThreads) ranks[offset + j] = list[j];
    offset += listed;
  }
  const int sorted_count = next_power_of_two(count);
  for (int j = count + threadIdx.x; j < sorted_count; j += kThreads) ranks[j] = 0;  // below every rank
  sort_descending<kThreads>(ranks, sorted_count);

  // top_k keeps the first k; their weights, Q_k and the top_p cut; then min_p and the draw.
  const int top_k_count = top_k_cuts ? int(top_k) : count;
  uint64_t* weights = storage.candidates;  // block 0's own list is merged already
  weigh_ranks<kThreads>(ranks, weights, top_k_count, row.z_max, row.inv_temperature);
  int kept_count = top_k_count;
  if (params.top_p < 1.0f) {
    kept_count = top_p_keep<kThreads>(shared, weights, top_k_count, params.top_p, weight_known, top_k_weight);
  }
  *token = draw_kept<kThreads>(shared, ranks, weights, kept_count, params);
  return true;
}

// Steps 3–5 of the file comment for a row with finite logits and temperature > 0.
__device__ uint32_t sample_filtered(RowContext& row, const CandidateStorage& storage, const SamplingParams& params,
                                    int64_t vocab) {
  uint32_t token = 0;
  if (sample_from_candidates(row, storage, params, vocab, &token)) return token;
  return sample_whole_row(row, params, vocab);
}

struct RowExtremes {
  uint64_t best_rank;  // the argmax's rank (largest logit, lowest id)
  bool has_nan;
};

// Copies this block's slice of the row at `source` into shared memory (slice_storage, row.values)
// once and finds the row's extremes over the cluster; fills row's slice, key range, z_max and
// inverse temperature (for params).
__device__ RowExtremes load_row(RowContext& row, const float* row_source, int slice, int64_t vocab,
                                const SamplingParams& params, float4* slice_storage) {
  float* values = reinterpret_cast<float*>(slice_storage);  // row.values
  const int block = int(cg::this_cluster().block_rank());
  const int64_t first = int64_t(block) * slice;
  const int count = int(max(int64_t(0), min(int64_t(slice), vocab - first)));
  const float* source = row_source + first;
  uint64_t best_rank = 0, inverted_min_key = 0;  // max of ~key = min key; NaN in bit 32
  auto observe = [&](float z, int i) {
    const uint32_t key = logit_key(z);
    best_rank = max(best_rank, rank_of(key, uint32_t(first + i)));
    inverted_min_key = max(inverted_min_key, uint64_t(~key) | (uint64_t(z != z) << 32));
  };
  if (count % 4 == 0 && reinterpret_cast<uintptr_t>(source) % 16 == 0) {
#pragma unroll 4
    for (int i4 = threadIdx.x; i4 < count / 4; i4 += kThreads) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(source) + i4);
      slice_storage[i4] = v;
      observe(v.x, 4 * i4), observe(v.y, 4 * i4 + 1), observe(v.z, 4 * i4 + 2), observe(v.w, 4 * i4 + 3);
    }
  } else {
    for (int i = threadIdx.x; i < count; i += kThreads) {
      const float z = __ldg(source + i);
      values[i] = z;
      observe(z, i);
    }
  }
  row.count = count;
  row.first_id = uint32_t(first);
  cluster_gather(row, block_reduce<kThreads, true>(best_rank, row.shared.scratch));
  for (int b = 0; b < kClusterBlocks; ++b) best_rank = max(best_rank, row.shared.gathered[b]);
  cluster_gather(row, block_reduce<kThreads, true>(inverted_min_key, row.shared.scratch));
  for (int b = 0; b < kClusterBlocks; ++b) inverted_min_key = max(inverted_min_key, row.shared.gathered[b]);
  row.max_key = uint32_t(best_rank >> 32);
  row.min_key = ~uint32_t(inverted_min_key);
  row.z_max = key_logit(row.max_key);
  row.inv_temperature = inverse_temperature(params.temperature);
  return {best_rank, (inverted_min_key >> 32) != 0};
}

// What the cluster kernel reads and writes besides the row index (device pointers).
struct ClusterTask {
  const float* logits;
  int64_t row_stride, vocab;
  int slice;
  SamplingParams* params;
  int64_t* tokens;
  bool advance_seed;
};

// One row, by the whole cluster; ends with a cluster barrier, so the cluster can go on to another
// row with the same shared memory. Not inlined: inlined into the kernel's loop over rows it spilled
// ~100 bytes per thread under the 64-register budget of 1024-thread blocks; called, it spills none.
__device__ __noinline__ void sample_row_in_cluster(const ClusterTask& task, int64_t row_index, SharedState& shared,
                                      float4* slice_storage) {
  cg::cluster_group cluster = cg::this_cluster();
  const int block = int(cluster.block_rank());
  const SamplingParams p = task.params[row_index];

  RowContext row{shared, reinterpret_cast<float*>(slice_storage), 0, 0};
  const RowExtremes extremes = load_row(row, task.logits + row_index * task.row_stride, task.slice, task.vocab, p,
                                        slice_storage);
  int64_t token;
  if (extremes.has_nan) {
    token = kNanLogitsToken;
  } else if (is_greedy(p)) {
    token = rank_id(extremes.best_rank);
  } else {
    token = sample_filtered(row, carve_candidate_storage(slice_storage + task.slice / 4), p, task.vocab);
  }
  cluster.sync();  // no block may exit or go on while another reads its shared memory
  if (block == 0 && threadIdx.x == 0) {
    task.tokens[row_index] = token;
    if (task.advance_seed) task.params[row_index].seed = p.seed + 1;
  }
}

// The rows that the segment kernels left to it (row_list[0, *row_count)), one cluster per row in
// turn: the path that is exact for every row (docs/DESIGN.md §4).
__global__ void __cluster_dims__(kClusterBlocks, 1, 1) __launch_bounds__(kThreads, 1)
    sample_rows_kernel(ClusterTask task, const int* row_list, const int* row_count) {
  extern __shared__ float4 slice_storage[];
  __shared__ SharedState shared;
  pdl_launch_dependents();
  pdl_wait();                   // the list is sample_segments_kernel's
#pragma unroll 1
  for (int j = blockIdx.y; j < *row_count; j += gridDim.y) {  // the same count in every block of a cluster
    sample_row_in_cluster(task, row_list[j], shared, slice_storage);
  }
}

// What the describe kernel reads and writes (device pointers).
struct DescribeTask {
  const float* logits;
  int64_t row_stride, vocab, rows;
  int slice;
  const SamplingParams* params;
  RowDistribution* out;
};

// One row's distribution, by the whole cluster (the whole-row cut: exact for every row).
__device__ __noinline__ void describe_row_in_cluster(const DescribeTask& task, int64_t row_index, SharedState& shared,
                                                     float4* slice_storage) {
  const SamplingParams p = task.params[row_index];
  RowContext row{shared, reinterpret_cast<float*>(slice_storage), 0, 0};
  const RowExtremes extremes = load_row(row, task.logits + row_index * task.row_stride, task.slice, task.vocab, p,
                                        slice_storage);
  RowDistribution d;
  d.best_rank = extremes.best_rank;
  d.has_nan = extremes.has_nan;
  if (!extremes.has_nan && !is_greedy(p)) {
    d.kept = kept_set_of(row, p, whole_row_cut(row, p, task.vocab));
    uint64_t local = 0;
    for_each_logit(row, [&](float z, uint32_t id) { local += kept_weight(d.kept, z, id); });
    cluster_gather(row, block_reduce<kThreads, false>(local, shared.scratch));
    d.kept.total = gathered_sum(row, kClusterBlocks);
  }
  cg::this_cluster().sync();  // no block may go on while another reads its shared memory
  if (cg::this_cluster().block_rank() == 0 && threadIdx.x == 0) task.out[row_index] = d;
}

__global__ void __cluster_dims__(kClusterBlocks, 1, 1) __launch_bounds__(kThreads, 1)
    describe_rows_kernel(DescribeTask task) {
  extern __shared__ float4 slice_storage[];
  __shared__ SharedState shared;
  pdl_launch_dependents();
  pdl_wait();
#pragma unroll 1
  for (int64_t r = blockIdx.y; r < task.rows; r += gridDim.y) describe_row_in_cluster(task, r, shared, slice_storage);
}

// The logits slice (a multiple of 16 bytes), then the candidate path's arrays.
size_t dynamic_shared_bytes(int64_t vocab) {
  return size_t(slice_length(vocab)) * sizeof(float) + candidate_storage_bytes();
}

}  // namespace

void check_cluster_kernel_fits(int64_t max_vocab) {
  int device = 0, optin_bytes = 0;
  G4_CUDA(cudaGetDevice(&device));
  G4_CUDA(cudaDeviceGetAttribute(&optin_bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  cudaFuncAttributes attributes{};
  G4_CUDA(cudaFuncGetAttributes(&attributes, sample_rows_kernel));
  const size_t needed = dynamic_shared_bytes(max_vocab);
  G4_CHECK(needed + attributes.sharedSizeBytes <= size_t(optin_bytes),
           "CUDA sampler: a row of " + std::to_string(max_vocab) + " logits does not fit in one cluster's shared memory");
}

void launch_cluster_kernel(const CudaSampleBatch& batch, const int* row_list, const int* row_count, Pdl pdl,
                           cudaStream_t stream) {
  const ClusterTask cluster_task{batch.logits, batch.logits_row_stride, batch.vocab, int(slice_length(batch.vocab)),
                                 batch.params, batch.tokens, batch.advance_seed};
  const dim3 clusters(kClusterBlocks, unsigned(std::min<int64_t>(batch.rows, kFallbackClusters)));
  launch_kernel("sample_rows_kernel", sample_rows_kernel, clusters, kThreads, dynamic_shared_bytes(batch.vocab), stream,
                pdl, cluster_task, row_list, row_count);
}

void launch_describe_kernel(const CudaSampleBatch& batch, RowDistribution* out, cudaStream_t stream) {
  const DescribeTask task{batch.logits, batch.logits_row_stride, batch.vocab, batch.rows, int(slice_length(batch.vocab)),
                          batch.params, out};
  const dim3 clusters(kClusterBlocks, unsigned(std::min<int64_t>(batch.rows, kFallbackClusters)));
  launch_kernel("describe_rows_kernel", describe_rows_kernel, clusters, kThreads,
                size_t(slice_length(batch.vocab)) * sizeof(float), stream, Pdl::kOff, task);
}

}  // namespace g4
