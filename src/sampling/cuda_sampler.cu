// The fused CUDA sampler. One thread-block cluster of kClusterBlocks blocks samples one row: each
// block copies its slice of the logits into shared memory once, and every later pass reads shared
// memory; the blocks combine their partial results through distributed shared memory and cluster
// barriers. No pass sorts: cuts in the ranking are found by radix selection on the logit keys.
//
// Per row (sampling_math.h defines every number):
//  1. load + row statistics: largest rank (argmax, lowest id), smallest key, NaN flag;
//  2. greedy rows stop at the argmax; NaN rows stop with token 0 and the status bit;
//  3. top_k: the rank of the k-th token (select_cut, counting tokens);
//  4. Q_k, the weight of the top-k set; top_p: the rank where the weight reaches
//     ceil(top_p * Q_k) (select_cut, weighing tokens);
//  5. the draw: the lowest id whose cumulative kept weight (cut and min_p applied) reaches
//     draw_target(seed, kept weight) (find_first_reaching).
// All sums are of integers, so the order in which threads add them does not change the token.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <string>

#include "sampling/cuda_sampler.h"
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
constexpr int kExchangeSlots = 16;     // cluster exchanges per row (at most 9 are used)
constexpr uint64_t kNoToken = ~uint64_t(0);

void check_cuda(cudaError_t err, const char* what) {
  G4_CHECK(err == cudaSuccess, std::string("CUDA sampler: ") + what + ": " + cudaGetErrorString(err));
}

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
};

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

__device__ uint64_t warp_sum(uint64_t v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
  return v;
}

__device__ uint64_t warp_max(uint64_t v) {
  for (int offset = 16; offset > 0; offset /= 2) v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
  return v;
}

__device__ uint64_t warp_inclusive_scan(uint64_t v) {
  const int lane = threadIdx.x % 32;
  for (int offset = 1; offset < 32; offset *= 2) {
    const uint64_t other = __shfl_up_sync(0xFFFFFFFFu, v, offset);
    if (lane >= offset) v += other;
  }
  return v;
}

template <bool kMax>
__device__ uint64_t block_reduce(uint64_t v, uint64_t* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // the previous user of scratch is done
  v = kMax ? warp_max(v) : warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    uint64_t x = scratch[lane];
    x = kMax ? warp_max(x) : warp_sum(x);
    if (lane == 0) scratch[kWarps] = x;
  }
  __syncthreads();
  return scratch[kWarps];
}

// Exclusive prefix sum over the threads of the block, in thread order.
__device__ uint64_t block_exclusive_scan(uint64_t v, uint64_t* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  const uint64_t inclusive = warp_inclusive_scan(v);
  if (lane == 31) scratch[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const uint64_t total = scratch[lane];
    scratch[lane] = warp_inclusive_scan(total) - total;
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
  const uint64_t block_total = block_reduce<false>(local, row.shared.scratch);
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
      part = warp_sum(part);
      if (lane == j) mine = part;
    }
    const uint64_t local_target = target - before;
    uint64_t cumulative = block_exclusive_scan(mine, row.shared.scratch);
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
    const int first_bin = 2 * threadIdx.x;
    uint64_t measure0 = 0, measure1 = 0;
    for (int b = 0; b < kClusterBlocks; ++b) {
      const uint64_t* remote = cluster.map_shared_rank(bins, b);
      measure0 += remote[first_bin];
      measure1 += remote[first_bin + 1];
    }
    const uint64_t before = above + block_exclusive_scan(measure0 + measure1, shared.scratch);
    if (before < target && target <= before + measure0) {
      shared.selected[0] = first_bin, shared.selected[1] = before, shared.selected[2] = measure0;
    } else if (before + measure0 < target && target <= before + measure0 + measure1) {
      shared.selected[0] = first_bin + 1, shared.selected[1] = before + measure0, shared.selected[2] = measure1;
    }
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

// Steps 3–5 of the file comment for a row with finite logits and temperature > 0.
__device__ uint32_t sample_filtered(RowContext& row, const SamplingParams& params, int64_t vocab) {
  uint64_t cut = kKeepAllRanks;
  if (params.top_k > 0 && params.top_k < vocab) cut = select_cut<false>(row, uint64_t(params.top_k));

  if (params.top_p < 1.0f) {
    uint64_t local = 0;
    for_each_logit(row, [&](float z, uint32_t id) {
      if (rank_of(logit_key(z), id) >= cut) local += token_weight(z, row.z_max, row.inv_temperature);
    });
    cluster_gather(row, block_reduce<false>(local, row.shared.scratch));
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

__global__ void __cluster_dims__(kClusterBlocks, 1, 1) __launch_bounds__(kThreads, 1)
    sample_rows_kernel(const float* __restrict__ logits, int64_t row_stride, int64_t vocab, int slice,
                       SamplingParams* params, int64_t* tokens, int* status, bool advance_seed) {
  extern __shared__ float4 slice_storage[];
  __shared__ SharedState shared;
  cg::cluster_group cluster = cg::this_cluster();
  const int block = int(cluster.block_rank());
  const int64_t row_index = blockIdx.y;
  const SamplingParams p = params[row_index];

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
  cluster_gather(row, block_reduce<true>(best_rank, shared.scratch));
  for (int b = 0; b < kClusterBlocks; ++b) best_rank = max(best_rank, shared.gathered[b]);
  cluster_gather(row, block_reduce<true>(inverted_min_key, shared.scratch));
  for (int b = 0; b < kClusterBlocks; ++b) inverted_min_key = max(inverted_min_key, shared.gathered[b]);

  const bool has_nan = (inverted_min_key >> 32) != 0;
  uint32_t token;
  if (has_nan) {
    token = 0;
    if (block == 0 && threadIdx.x == 0) atomicOr(status, kSampleStatusNanLogits);
  } else if (is_greedy(p)) {
    token = rank_id(best_rank);
  } else {
    row.max_key = uint32_t(best_rank >> 32);
    row.min_key = ~uint32_t(inverted_min_key);
    row.z_max = key_logit(row.max_key);
    row.inv_temperature = inverse_temperature(p.temperature);
    token = sample_filtered(row, p, vocab);
  }
  cluster.sync();  // no block may exit while another reads its shared memory
  if (block == 0 && threadIdx.x == 0) {
    tokens[row_index] = token;
    if (advance_seed) params[row_index].seed = p.seed + 1;
  }
}

size_t dynamic_shared_bytes(int64_t vocab) { return size_t(slice_length(vocab)) * sizeof(float); }

}  // namespace

CudaSampler::CudaSampler(int64_t max_vocab) : max_vocab_(max_vocab) {
  G4_CHECK(max_vocab >= 1 && max_vocab <= kMaxVocab, "CUDA sampler: vocab size " + std::to_string(max_vocab) + " out of range");
  int device = 0, optin_bytes = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&optin_bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "shared memory limit");
  cudaFuncAttributes attributes{};
  check_cuda(cudaFuncGetAttributes(&attributes, sample_rows_kernel), "kernel attributes");
  const size_t needed = dynamic_shared_bytes(max_vocab);
  G4_CHECK(needed + attributes.sharedSizeBytes <= size_t(optin_bytes),
           "CUDA sampler: a row of " + std::to_string(max_vocab) + " logits does not fit in one cluster's shared memory");
  check_cuda(cudaFuncSetAttribute(sample_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(needed)),
             "raise the kernel's shared memory limit");
  check_cuda(cudaMalloc(&status_, sizeof(int)), "allocate the status word");
  check_cuda(cudaMemset(status_, 0, sizeof(int)), "clear the status word");
}

CudaSampler::~CudaSampler() { cudaFree(status_); }

void CudaSampler::sample(const CudaSampleBatch& batch, CUstream_st* stream) const {
  G4_CHECK(batch.vocab >= 1 && batch.vocab <= max_vocab_,
           "CUDA sampler: vocab " + std::to_string(batch.vocab) + " exceeds the prepared " + std::to_string(max_vocab_));
  G4_CHECK(batch.rows >= 1 && batch.rows <= 65535, "CUDA sampler: batch of " + std::to_string(batch.rows) + " rows out of range");
  const dim3 grid(kClusterBlocks, unsigned(batch.rows));
  sample_rows_kernel<<<grid, kThreads, dynamic_shared_bytes(batch.vocab), stream>>>(
      batch.logits, batch.logits_row_stride, batch.vocab, int(slice_length(batch.vocab)), batch.params,
      batch.tokens, status_, batch.advance_seed);
  check_cuda(cudaGetLastError(), "launch");
}

void CudaSampler::check_status(CUstream_st* stream) {
  int status = 0;
  check_cuda(cudaMemcpyAsync(&status, status_, sizeof(int), cudaMemcpyDeviceToHost, stream), "read the status word");
  check_cuda(cudaStreamSynchronize(stream), "synchronize");
  if (status != 0) {
    check_cuda(cudaMemsetAsync(status_, 0, sizeof(int), stream), "clear the status word");
    check_cuda(cudaStreamSynchronize(stream), "synchronize");
  }
  G4_CHECK((status & kSampleStatusNanLogits) == 0, "model produced NaN logits");
}

}  // namespace g4
