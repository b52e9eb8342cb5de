// Row primitives shared by the CUDA sampler's two kernel families (sampler_cluster.cu,
// sampler_segments.cu): block-wide reductions and scans, distance bins, the bitonic sort and the
// last steps once a row's best tokens are listed by rank. Internal linkage: each sampler
// translation unit gets its own copy (device code is compiled per translation unit).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/warp_reduce.cuh"
#include "sampling/sampling_math.h"
#include "sampling/sampling_params.h"

namespace g4 {

namespace {

using namespace sampling;

constexpr int kBinBits = 11;           // radix digit: 2048 bins, two per thread
constexpr int kBins = 1 << kBinBits;
// Distance bins span the gap within which tokens carry weight; tokens beyond it are outside.
constexpr int kOutsideGap = kBins;
constexpr float kDistanceBinsPerUnit = float(kBins) / kMaxLogGap;
// A draw key packs a kept token as (kMaxVocab - 1 - id) << kDrawIdShift | weight, so that sorting
// keys in descending order puts the kept tokens in id order.
constexpr int kDrawIdShift = kWeightBits + 1;
static_assert((uint64_t(kMaxVocab - 1) >> (64 - kDrawIdShift)) == 0, "draw keys must hold every id");
constexpr uint64_t kDrawWeightMask = (uint64_t(1) << kDrawIdShift) - 1;
constexpr uint64_t kNoToken = ~uint64_t(0);

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

}  // namespace

}  // namespace g4
