// Decode attention (one query token), split-K "flash decoding". Block (kv head, split) scores the
// split's keys for every query head of the GQA group (one warp each, one key per lane) from K/V
// tiles staged with cp.async by all of its threads, and writes each head's softmax state. The
// last block of a kv head to finish merges the splits' states in split order (so the result does
// not depend on arrival order) and then stores the token's K/V: every split has read the ring row
// it overwrites by then. One launch per layer.
#include <algorithm>
#include <cfloat>

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/pdl.cuh"

namespace g4 {

namespace {

constexpr int kTileKeys = 32;  // keys staged per step, one per lane
constexpr int kDimChunks = kMaxAttentionHeadDim / 256;  // 8 output dims per lane per 256-dim chunk
constexpr int kMinWarps = 4;    // staging wants more threads than a small GQA group has warps
constexpr int kMaxSplits = 256;  // the merge holds every split's (m, l) in a warp's registers

struct DecodeSmem {
  int ld;
  size_t k, v, q, weights, total;
  __host__ __device__ DecodeSmem(int D, int group, int splits) : ld(D + 8) {
    k = 0;
    v = k + size_t(kTileKeys) * ld * 2;
    q = v + size_t(kTileKeys) * ld * 2;
    weights = q + size_t(group) * D * 4;
    total = weights + size_t(group) * splits * 4;
  }
};

// Starts copying the K and V rows of keys [kb, min(kb + kTileKeys, last + 1)) into shared rows of
// `ld` elements (cp_async_wait_all completes it). Key kp is the fresh token's row when kp == pos,
// else cache slot kp % capacity; a tile's keys lie within one window (or the flat cache), so its
// slots wrap at most once and one 64-bit modulo serves the whole tile.
__device__ void stage_tile(const AttentionLaunch& a, int64_t kb, int64_t last, int64_t pos, int kvh, bf16* ks,
                           bf16* vs, int ld) {
  const int vecs = a.head_dim / 8;
  const int keys = int(min(int64_t(kTileKeys), last + 1 - kb));
  const int64_t first_slot = kb % a.capacity, head_offset = int64_t(kvh) * a.head_dim;
  for (int i = threadIdx.x; i < keys * vecs; i += blockDim.x) {
    const int j = i / vecs, c = (i - j * vecs) * 8;
    const bool fresh = kb + j >= pos;
    int64_t slot = first_slot + j;
    if (slot >= a.capacity) slot -= a.capacity;
    const int64_t offset = (fresh ? 0 : slot * a.kv_stride) + head_offset + c;
    cp_async16(shared_addr(ks + j * ld + c), (fresh ? a.k_new : a.k_cache) + offset, true);
    cp_async16(shared_addr(vs + j * ld + c), (fresh ? a.v_new : a.v_cache) + offset, true);
  }
}

// One warp's pass over a staged tile of keys [kb, min(kb + kTileKeys, end)): lane j scores key j
// against q, then the online softmax update of m, l and acc (8 output dims per 256-dim chunk).
__device__ void score_tile(int64_t kb, int64_t end, const DecodeSmem& lay, const bf16* ks, const bf16* vs,
                           const float* q, float& m, float& l, float (&acc)[kDimChunks][8], int D) {
  const int lane = threadIdx.x & 31;
  const bool valid = kb + lane < end;
  float s = -FLT_MAX;
  if (valid) {
    s = 0.0f;
    const bf16* krow = ks + lane * lay.ld;
    for (int c = 0; c < D; c += 8) {
      float kf[8];
      unpack8(*reinterpret_cast<const uint4*>(krow + c), kf);
#pragma unroll
      for (int j = 0; j < 8; ++j) s = fmaf(q[c + j], kf[j], s);
    }
  }
  const float m_new = fmaxf(m, warp_max(s));
  const float p = valid ? __expf(s - m_new) : 0.0f;
  const float alpha = __expf(m - m_new);
  l = l * alpha + warp_sum(p);
  m = m_new;
#pragma unroll
  for (int c = 0; c < kDimChunks; ++c)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[c][j] *= alpha;
  const int keys = int(min(int64_t(kTileKeys), end - kb));
  for (int j = 0; j < keys; ++j) {
    const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
    for (int c = 0; c < kDimChunks; ++c) {
      const int d = c * 256 + lane * 8;
      if (d < D) {
        float vf[8];
        unpack8(*reinterpret_cast<const uint4*>(vs + j * lay.ld + d), vf);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[c][i] = fmaf(pj, vf[i], acc[c][i]);
      }
    }
  }
}

// Warp `warp` (< group) scores keys [begin, end) for query head kvh * group + warp; leaves its
// running max, sum and unnormalised output (lane's 8 dims per 256-dim chunk) in m, l, acc.
__device__ void attend_split(const AttentionLaunch& a, int64_t begin, int64_t end, int64_t pos, int kvh,
                             const DecodeSmem& lay, uint8_t* smem, float& m, float& l, float (&acc)[kDimChunks][8]) {
  const int D = a.head_dim, group = a.heads / a.kv_heads, warp = threadIdx.x >> 5;
  bf16* ks = reinterpret_cast<bf16*>(smem + lay.k);
  bf16* vs = reinterpret_cast<bf16*>(smem + lay.v);
  float* qs = reinterpret_cast<float*>(smem + lay.q);
  stage_tile(a, begin, end - 1, pos, kvh, ks, vs, lay.ld);  // in flight while q is read
  for (int i = threadIdx.x; i < group * D; i += blockDim.x)
    qs[i] = __bfloat162float(a.q[int64_t(kvh) * group * D + i]) * a.scale;
  const float* q = qs + warp * D;
  for (int64_t kb = begin; kb < end; kb += kTileKeys) {
    cp_async_wait_all();
    __syncthreads();  // the tile (and qs) visible to every warp
    if (warp < group) score_tile(kb, end, lay, ks, vs, q, m, l, acc, D);
    __syncthreads();  // the tile consumed
    if (kb + kTileKeys < end) stage_tile(a, kb + kTileKeys, end - 1, pos, kvh, ks, vs, lay.ld);
  }
}

// The last block of kv head kvh: out = sum_s w_s * acc_s over the non-empty splits with
// w_s = exp(m_s - m) / sum_s' l_s' exp(m_s' - m), then the token's K/V row goes into the cache.
__device__ void merge_splits(const AttentionLaunch& a, const float* partials, int max_splits, int splits, int kvh,
                             float* weights) {
  const int D = a.head_dim, group = a.heads / a.kv_heads, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warp < group) {  // one pass over the splits' (m, l): lane holds splits lane + 32j
    const float* part = partials + int64_t(kvh * group + warp) * max_splits * (D + 2);
    float ms[kMaxSplits / 32], ls[kMaxSplits / 32], m = -FLT_MAX;
#pragma unroll
    for (int j = 0; j < kMaxSplits / 32; ++j) {
      const int s = lane + 32 * j;
      ms[j] = s < splits ? __ldcg(part + s * (D + 2)) : -FLT_MAX;
      ls[j] = s < splits ? __ldcg(part + s * (D + 2) + 1) : 0.0f;
      m = fmaxf(m, ms[j]);
    }
    m = warp_max(m);
    float l = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxSplits / 32; ++j) l += ls[j] * __expf(ms[j] - m);
    l = warp_sum(l);
#pragma unroll
    for (int j = 0; j < kMaxSplits / 32; ++j)
      if (lane + 32 * j < splits) weights[warp * splits + lane + 32 * j] = __expf(ms[j] - m) / l;
  }
  __syncthreads();
  constexpr int kLoadsInFlight = 8;  // the sum over splits is latency-bound: independent partial sums
  for (int i = threadIdx.x; i < group * D; i += blockDim.x) {
    const int g = i / D, d = i % D;
    const float* part = partials + int64_t(kvh * group + g) * max_splits * (D + 2) + 2 + d;
    const float* w = weights + g * splits;
    float o[kLoadsInFlight] = {};
    int s = 0;
    for (; s + kLoadsInFlight <= splits; s += kLoadsInFlight)
#pragma unroll
      for (int u = 0; u < kLoadsInFlight; ++u) o[u] = fmaf(w[s + u], __ldcg(part + (s + u) * (D + 2)), o[u]);
    for (; s < splits; ++s) o[0] = fmaf(w[s], __ldcg(part + s * (D + 2)), o[0]);
    float sum = 0.0f;
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) sum += o[u];
    a.out[int64_t(kvh * group + g) * D + d] = __float2bfloat16(sum);
  }
  const int64_t slot = a.positions[0] % a.capacity;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    a.k_cache[slot * a.kv_stride + int64_t(kvh) * D + d] = a.k_new[int64_t(kvh) * D + d];
    a.v_cache[slot * a.kv_stride + int64_t(kvh) * D + d] = a.v_new[int64_t(kvh) * D + d];
  }
}

__global__ void decode_attention_kernel(AttentionLaunch a, float* partials, unsigned* arrivals, int max_splits,
                                        int64_t split_keys) {
  pdl_launch_dependents();
  extern __shared__ __align__(16) uint8_t decode_smem[];
  const int D = a.head_dim, group = a.heads / a.kv_heads, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int kvh = blockIdx.x, split = blockIdx.y, splits = gridDim.y;
  const DecodeSmem lay(D, group, splits);
  pdl_wait();
  const int64_t pos = a.positions[0], first = first_key(pos, a.window);
  const int64_t begin = first + split * split_keys, end = min(begin + split_keys, pos + 1);
  float m = -FLT_MAX, l = 0.0f, acc[kDimChunks][8] = {};
  if (begin < end) attend_split(a, begin, end, pos, kvh, lay, decode_smem, m, l, acc);
  if (warp < group) {  // empty splits too (l = 0); the merge reads only the non-empty ones
    float* part = partials + (int64_t(kvh * group + warp) * max_splits + split) * (D + 2);
    if (lane == 0) part[0] = m, part[1] = l;
#pragma unroll
    for (int c = 0; c < kDimChunks; ++c) {
      const int d = c * 256 + lane * 8;
      if (d < D)
#pragma unroll
        for (int i = 0; i < 8; ++i) part[2 + d + i] = acc[c][i];
    }
  }
  // Arrival count (threadFenceReduction pattern): our partials are visible before we count.
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(arrivals + kvh, 1u) == unsigned(splits - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int used = int(min(int64_t(splits), (pos + split_keys - first) / split_keys));  // non-empty splits
  merge_splits(a, partials, max_splits, used, kvh, reinterpret_cast<float*>(decode_smem + lay.weights));
  if (threadIdx.x == 0) arrivals[kvh] = 0;  // ready for the next layer's launch
}

}  // namespace

void launch_decode_attention(const AttentionLaunch& a, float* partials, unsigned* arrivals, int max_splits,
                             cudaStream_t stream) {
  check_attention_shape(a);
  G4_CHECK(max_splits <= kMaxSplits, "decode attention: at most 256 splits");
  // Keys a query can see span at most the window (ring) or the capacity (flat cache).
  const int64_t span = a.window ? a.window : a.capacity;
  const int64_t split_keys = std::max<int64_t>(kTileKeys, ceil_div(ceil_div(span, max_splits), kTileKeys) * kTileKeys);
  const int splits = int(ceil_div(span, split_keys));
  const int group = a.heads / a.kv_heads;
  const DecodeSmem lay(a.head_dim, group, splits);
  G4_CUDA(cudaFuncSetAttribute(decode_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(lay.total)));
  launch_pdl("decode_attention_kernel", decode_attention_kernel, dim3(unsigned(a.kv_heads), unsigned(splits)),
             32 * std::max(group, kMinWarps), lay.total, stream, a, partials, arrivals, max_splits, split_keys);
}

}  // namespace g4
