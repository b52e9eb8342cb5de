// The CUDA sampler (docs/DESIGN.md §4). Two paths, both returning sample_row()'s token:
//  * the segment path (below, "The segment path"): rows spread over the whole GPU, one block per
//    segment of a row; takes every greedy and NaN row and every row with a top-k or top-p cut
//    whose candidates provably decide the token (rows with a small top-k cut in larger batches in
//    the first kernel's one read, "collected rows");
//  * the cluster kernel (sample_rows_kernel), for the rows the segment path leaves: one
//    thread-block cluster of kClusterBlocks blocks samples one row. Each block copies its slice of
//    the logits into shared memory once, and every later pass reads shared memory; the blocks
//    combine their partial results through distributed shared memory and cluster barriers.
// Nothing sorts the vocabulary.
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
#include "backend/cuda/warp_reduce.cuh"
#include "backend/cuda/cuda_sampler.h"
#include "sampling/sampling_math.h"
#include "util/error.h"

namespace g4 {

namespace {

namespace cg = cooperative_groups;
using namespace sampling;

constexpr int kClusterBlocks = 8;
constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kBinBits = 11;           // radix digit: 2048 bins, two per thread
constexpr int kBins = 1 << kBinBits;
constexpr int kExchangeSlots = 16;     // cluster exchanges per row (at most 10 are used)
// Candidates block 0 sorts itself (a power of two): bounds top_k for the candidate path.
constexpr int kCandidateCapacity = 2048;
// Distance bins span the gap within which tokens carry weight; tokens beyond it are outside.
constexpr int kOutsideGap = kBins;
constexpr float kDistanceBinsPerUnit = float(kBins) / kMaxLogGap;
// A draw key packs a kept token as (kMaxVocab - 1 - id) << kDrawIdShift | weight, so that sorting
// keys in descending order puts the kept tokens in id order.
constexpr int kDrawIdShift = kWeightBits + 1;
static_assert((uint64_t(kMaxVocab - 1) >> (64 - kDrawIdShift)) == 0, "draw keys must hold every id");
constexpr uint64_t kDrawWeightMask = (uint64_t(1) << kDrawIdShift) - 1;
constexpr uint64_t kNoToken = ~uint64_t(0);

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

__device__ uint64_t warp_inclusive_scan(uint64_t v) {
  const int lane = threadIdx.x % 32;
  for (int offset = 1; offset < 32; offset *= 2) {
    const uint64_t other = __shfl_up_sync(0xFFFFFFFFu, v, offset);
    if (lane >= offset) v += other;
  }
  return v;
}

// Block-wide helpers, for the cluster kernel's blocks (kThreads) and the segment kernels' (kSegmentThreads).
// `scratch` holds kBlock / 32 + 1 values.
template <int kBlock, bool kMax>
__device__ uint64_t block_reduce(uint64_t v, uint64_t* scratch) {
  constexpr int kBlockWarps = kBlock / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // the previous user of scratch is done
  v = kMax ? warp_reduce<MaxOp>(v) : warp_reduce<SumOp>(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    uint64_t x = lane < kBlockWarps ? scratch[lane] : 0;
    x = kMax ? warp_reduce<MaxOp>(x) : warp_reduce<SumOp>(x);
    if (lane == 0) scratch[kBlockWarps] = x;
  }
  __syncthreads();
  return scratch[kBlockWarps];
}

// Exclusive prefix sum over the threads of the block, in thread order.
template <int kBlock>
__device__ uint64_t block_exclusive_scan(uint64_t v, uint64_t* scratch) {
  constexpr int kBlockWarps = kBlock / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  const uint64_t inclusive = warp_inclusive_scan(v);
  if (lane == 31) scratch[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const uint64_t total = lane < kBlockWarps ? scratch[lane] : 0;
    const uint64_t before = warp_inclusive_scan(total) - total;
    if (lane < kBlockWarps) scratch[lane] = before;
  }
  __syncthreads();
  return scratch[warp] + inclusive - v;
}

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

// Step 4 of the file comment (a row with finite logits and temperature > 0): the top_k cut, Q_k,
// the top_p cut and the draw, each over the whole row.
__device__ uint32_t sample_whole_row(RowContext& row, const SamplingParams& params, int64_t vocab) {
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

  const uint64_t weight_floor = min_p_floor(params.min_p);
  const float z_max = row.z_max, inv_temperature = row.inv_temperature;
  return find_first_reaching(
      row,
      [=](float z, uint32_t id) -> uint64_t {
        if (rank_of(logit_key(z), id) < cut) return 0;
        const uint64_t weight = token_weight(z, z_max, inv_temperature);
        return weight >= weight_floor ? weight : 0;
      },
      [seed = params.seed](uint64_t kept_weight) { return draw_target(seed, kept_weight); });
}

// The distance bin of logit z: floor(-d * kDistanceBinsPerUnit) for its weight exponent
// d = (z - z_max) / T (sampling_math.h's expression) within the gap, kOutsideGap beyond it (weight
// 0). Every float step is monotone, so the bin never increases with z: bins 0..b hold the
// highest-ranked tokens, and tokens of equal logits share a bin. Bins spread the tokens that carry
// weight evenly, where the top key bits of close logits agree.
__device__ int distance_bin(float z, float z_max, float inv_temperature) {
  if (z == z_max) return 0;  // also z_max = +inf, where d would be NaN
  const float d = (z - z_max) * inv_temperature;
  if (!(d >= -kMaxLogGap)) return kOutsideGap;
  return min(kBins - 1, int(-d * kDistanceBinsPerUnit));
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

__device__ void sync_sorting_threads(int threads) {
  if (threads == 32) {
    __syncwarp();
  } else {
    asm volatile("bar.sync 1, %0;" ::"r"(threads) : "memory");  // barrier 0 is __syncthreads'
  }
}

// Sorts values[0, count) in descending order (count a power of two) by a bitonic network. Only as
// many threads as the network has pairs take part, so that small sorts synchronise one or two
// warps rather than the block. All threads of the block must call it.
template <int kBlock>
__device__ void sort_descending(uint64_t* values, int count) {
  __syncthreads();
  const int threads = min(kBlock, max(32, count / 2));
  if (int(threadIdx.x) < threads) {
    for (int size = 2; size <= count; size *= 2) {
      for (int stride = size / 2; stride > 0; stride /= 2) {
        for (int pair = threadIdx.x; pair < count / 2; pair += threads) {
          const int i = 2 * pair - (pair & (stride - 1));  // the lower index has the stride bit clear
          const bool descending = (i & size) == 0;
          const uint64_t a = values[i], b = values[i + stride];
          if ((a < b) == descending) values[i] = b, values[i + stride] = a;
        }
        sync_sorting_threads(threads);
      }
    }
  }
  __syncthreads();
}

// The first index of [0, count) at which the running sum of value_at(index) reaches
// target_of(sum of all count values), or -1 when the sum stays below it; block-wide, the same
// answer in every thread. State: SharedState or SegmentShared (scratch and found).
template <int kBlock, class State, class ValueAt, class TargetOf>
__device__ int block_first_reaching(State& shared, int count, ValueAt value_at, TargetOf target_of) {
  const int per_thread = (count + kBlock - 1) / kBlock;
  const int begin = min(count, int(threadIdx.x) * per_thread), end = min(count, begin + per_thread);
  uint64_t mine = 0;
  for (int i = begin; i < end; ++i) mine += value_at(i);
  const uint64_t target = target_of(block_reduce<kBlock, false>(mine, shared.scratch));
  // Every thread has read the previous call's answer: block_reduce's first barrier is behind it.
  if (threadIdx.x == 0) shared.found = kNoToken;
  uint64_t cumulative = block_exclusive_scan<kBlock>(mine, shared.scratch);
  if (cumulative < target && target <= cumulative + mine) {
    for (int i = begin; i < end; ++i) {
      cumulative += value_at(i);
      if (cumulative >= target) {
        shared.found = uint64_t(i);
        break;
      }
    }
  }
  __syncthreads();
  return shared.found == kNoToken ? -1 : int(shared.found);
}

__device__ int next_power_of_two(int n) { return n <= 1 ? 1 : 1 << (32 - __clz(n - 1)); }

// The last steps, once a row's best tokens are listed by rank, highest first: the cluster kernel's
// block 0 and a segment kernel's finishing block both run them (docs/DESIGN.md §4).

// weights[j] = the weight of the token of ranks[j], for j < count.
template <int kBlock>
__device__ void weigh_ranks(const uint64_t* ranks, uint64_t* weights, int count, float z_max, float inv_temperature) {
  for (int j = threadIdx.x; j < count; j += kBlock) {
    weights[j] = token_weight(key_logit(uint32_t(ranks[j] >> 32)), z_max, inv_temperature);
  }
  __syncthreads();
}

// How many of the ranked weights[0, count) top_p keeps: 1 + the first index at which their
// cumulative weight reaches top_p_target(top_p, Q), Q = `total` when total_known, else their sum;
// 0 when they never reach it (possible only with a given total).
template <int kBlock, class State>
__device__ int top_p_keep(State& shared, const uint64_t* weights, int count, float top_p, bool total_known,
                          uint64_t total) {
  return 1 + block_first_reaching<kBlock>(shared, count, [&](int j) { return weights[j]; }, [&](uint64_t sum) {
           return top_p_target(top_p, total_known ? total : sum);
         });
}

// min_p over the kept ranks[0, kept), then the draw among the survivors in id order; returns the
// drawn id. Overwrites ranks with draw keys, up to next_power_of_two(kept).
template <int kBlock, class State>
__device__ uint32_t draw_kept(State& shared, uint64_t* ranks, const uint64_t* weights, int kept,
                              const SamplingParams& params) {
  const uint64_t weight_floor = min_p_floor(params.min_p);
  const int draw_count = next_power_of_two(kept);
  uint64_t* draw_keys = ranks;
  for (int j = threadIdx.x; j < draw_count; j += kBlock) {
    uint64_t key = 0;
    if (j < kept && weights[j] >= weight_floor && weights[j] > 0) {
      key = (uint64_t(kMaxVocab - 1 - rank_id(ranks[j])) << kDrawIdShift) | weights[j];
    }
    draw_keys[j] = key;  // the same thread read ranks[j]
  }
  sort_descending<kBlock>(draw_keys, draw_count);
  const int drawn = block_first_reaching<kBlock>(
      shared, kept, [&](int j) { return draw_keys[j] & kDrawWeightMask; },
      [&](uint64_t kept_weight) { return draw_target(params.seed, kept_weight); });
  return uint32_t(kMaxVocab - 1 - int64_t(draw_keys[drawn] >> kDrawIdShift));
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
  const float* logits = task.logits;
  const int64_t row_stride = task.row_stride, vocab = task.vocab;
  const int slice = task.slice;
  cg::cluster_group cluster = cg::this_cluster();
  const int block = int(cluster.block_rank());
  const SamplingParams p = task.params[row_index];

  const int64_t first = int64_t(block) * slice;
  const int count = int(max(int64_t(0), min(int64_t(slice), vocab - first)));
  float* values = reinterpret_cast<float*>(slice_storage);
  const float* source = logits + row_index * row_stride + first;

  // Load the slice once; meanwhile: largest rank, smallest key, NaN.
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
  RowContext row{shared, values, count, uint32_t(first)};
  cluster_gather(row, block_reduce<kThreads, true>(best_rank, shared.scratch));
  for (int b = 0; b < kClusterBlocks; ++b) best_rank = max(best_rank, shared.gathered[b]);
  cluster_gather(row, block_reduce<kThreads, true>(inverted_min_key, shared.scratch));
  for (int b = 0; b < kClusterBlocks; ++b) inverted_min_key = max(inverted_min_key, shared.gathered[b]);

  const bool has_nan = (inverted_min_key >> 32) != 0;
  int64_t token;
  if (has_nan) {
    token = kNanLogitsToken;
  } else if (is_greedy(p)) {
    token = rank_id(best_rank);
  } else {
    row.max_key = uint32_t(best_rank >> 32);
    row.min_key = ~uint32_t(inverted_min_key);
    row.z_max = key_logit(row.max_key);
    row.inv_temperature = inverse_temperature(p.temperature);
    token = sample_filtered(row, carve_candidate_storage(slice_storage + slice / 4), p, vocab);
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

// The logits slice (a multiple of 16 bytes), then the candidate path's arrays.
size_t dynamic_shared_bytes(int64_t vocab) {
  return size_t(slice_length(vocab)) * sizeof(float) + candidate_storage_bytes();
}


// ---- The segment path (docs/DESIGN.md §4): rows spread over the whole GPU ----
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
constexpr int kSegmentThreads = 256;
constexpr int kSegmentWarps = kSegmentThreads / 32;
constexpr int kSegmentVectors = 8;                          // float4 registers per thread
constexpr int kLineVectors = 8;                             // a line: 32 logits, 128 bytes
constexpr int kLineFloats = 4 * kLineVectors;
constexpr int kMaxSegmentLines = kSegmentThreads * kSegmentVectors / kLineVectors;  // 256 lines, 8192 logits
constexpr int kMaxSegmentsPerRow = 64;       // more would only lengthen the candidate lists
constexpr int64_t kTargetBlocks = 2048;      // blocks per launch worth aiming for (132 SMs)
constexpr int64_t kChunkRows = 128;          // rows per set of launches (workspace rows)
constexpr int kRowCandidates = 8192;         // a row's candidate list in global memory
constexpr int kSortCapacity = 2048;          // candidates the finishing block sorts
constexpr int kListTarget = 1024;            // a row's list without a large top-k: ~ this long
constexpr int kMinQuota = 16;                // tokens a segment offers at least
constexpr int kFallbackClusters = 16;        // clusters of the cluster kernel (16 fit at once)
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

CudaSampler::CudaSampler(int64_t max_vocab) : max_vocab_(max_vocab) {
  G4_CHECK(max_vocab >= 1 && max_vocab <= kMaxVocab, "CUDA sampler: vocab size " + std::to_string(max_vocab) + " out of range");
  int device = 0, optin_bytes = 0;
  G4_CUDA(cudaGetDevice(&device));
  G4_CUDA(cudaDeviceGetAttribute(&optin_bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  cudaFuncAttributes attributes{};
  G4_CUDA(cudaFuncGetAttributes(&attributes, sample_rows_kernel));
  const size_t needed = dynamic_shared_bytes(max_vocab);
  G4_CHECK(needed + attributes.sharedSizeBytes <= size_t(optin_bytes),
           "CUDA sampler: a row of " + std::to_string(max_vocab) + " logits does not fit in one cluster's shared memory");
  // launch_kernel raises the kernel's shared memory limit when a launch needs it.
  // The segment path's workspace, reused by every call (segment_extremes_kernel clears what it must).
  extremes_ = DeviceBuffer(size_t(kChunkRows * max_segments(max_vocab)) * sizeof(SegmentExtremes));
  row_scratch_ = DeviceBuffer(size_t(kChunkRows) * sizeof(RowScratch));
  candidates_ = DeviceBuffer(size_t(kChunkRows) * kRowCandidates * sizeof(uint64_t));
  fallback_ = DeviceBuffer(size_t(kChunkRows + 1) * sizeof(int));
  collect_ = DeviceBuffer(size_t(kChunkRows) * sizeof(CollectScratch));
  G4_CUDA(cudaMemset(collect_.data(), 0, collect_.bytes()));  // the kernels leave it zero from here on
}

CudaSampler::~CudaSampler() = default;

void CudaSampler::sample(const CudaSampleBatch& batch, CUstream_st* stream) const {
  G4_CHECK(batch.vocab >= 1 && batch.vocab <= max_vocab_,
           "CUDA sampler: vocab " + std::to_string(batch.vocab) + " exceeds the prepared " + std::to_string(max_vocab_));
  G4_CHECK(batch.rows >= 1 && batch.rows <= 65535, "CUDA sampler: batch of " + std::to_string(batch.rows) + " rows out of range");
  for (int64_t first = 0; first < batch.rows; first += kChunkRows) {
    CudaSampleBatch chunk = batch;
    chunk.rows = std::min(kChunkRows, batch.rows - first);
    chunk.logits += first * batch.logits_row_stride;
    chunk.params += first;
    chunk.tokens += first;
    sample_chunk(chunk, stream);
  }
}

// Up to kChunkRows rows: the two segment kernels, then the cluster kernel for the rows they leave.
void CudaSampler::sample_chunk(const CudaSampleBatch& batch, CUstream_st* stream) const {
  const int segments = segments_per_row(batch.vocab, batch.rows);
  const SegmentWorkspace ws{extremes_.as<SegmentExtremes>(), row_scratch_.as<RowScratch>(), candidates_.as<uint64_t>(),
                            fallback_.as<int>() + 1, fallback_.as<int>(), collect_.as<CollectScratch>()};
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
  const ClusterTask cluster_task{batch.logits, batch.logits_row_stride, batch.vocab, int(slice_length(batch.vocab)),
                                 batch.params, batch.tokens, batch.advance_seed};
  const dim3 clusters(kClusterBlocks, unsigned(std::min<int64_t>(batch.rows, kFallbackClusters)));
  launch_kernel("sample_rows_kernel", sample_rows_kernel, clusters, kThreads, dynamic_shared_bytes(batch.vocab), stream,
                pdl, cluster_task, ws.fallback_rows, ws.fallback_count);
}

int64_t CudaSampler::cluster_kernel_rows(CUstream_st* stream) const {
  int count = 0;
  G4_CUDA(cudaMemcpyAsync(&count, fallback_.data(), sizeof(int), cudaMemcpyDeviceToHost, stream));
  G4_CUDA(cudaStreamSynchronize(stream));
  return count;
}

}  // namespace g4
