// Attention of a chunk of queries over the cached positions plus the chunk's own keys (causal,
// optionally a sliding window), then the chunk's K/V are stored in the ring or flat cache.
// Key position kp lives in the chunk (row kp - pos0 of k_new) when kp >= pos0, else in cache row
// kp % capacity. pos0 is read from device memory, so a captured graph replays at new positions.
#include <mma.h>

#include <algorithm>
#include <cfloat>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace g4 {

namespace {

constexpr int kMaxHeadDim = 512;
constexpr int kKeyTile = 32;  // keys staged in shared memory per step (one per lane in decode)

__device__ inline const bf16* key_row(const AttentionLaunch& a, const bf16* fresh, const bf16* cached, int64_t kp,
                                      int64_t pos0, int kvh) {
  const bf16* base = kp >= pos0 ? fresh + (kp - pos0) * a.kv_stride : cached + (kp % a.capacity) * a.kv_stride;
  return base + int64_t(kvh) * a.head_dim;
}

// First visible key position of a query at position p.
__device__ inline int64_t first_key(int64_t p, int window) { return window ? max(int64_t(0), p - window + 1) : 0; }

// Copies rows [kb, kb + kKeyTile) of K and V (zeros past `last`) into shared memory rows of `ld` elements.
__device__ void stage_keys(const AttentionLaunch& a, int64_t kb, int64_t last, int64_t pos0, int kvh, bf16* ks,
                           bf16* vs, int ld) {
  const int vecs = a.head_dim / 8;
  for (int i = threadIdx.x; i < kKeyTile * vecs; i += blockDim.x) {
    const int j = i / vecs, c = (i % vecs) * 8;
    const int64_t kp = kb + j;
    uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
    if (kp <= last) {
      kv = *reinterpret_cast<const uint4*>(key_row(a, a.k_new, a.k_cache, kp, pos0, kvh) + c);
      vv = *reinterpret_cast<const uint4*>(key_row(a, a.v_new, a.v_cache, kp, pos0, kvh) + c);
    }
    *reinterpret_cast<uint4*>(ks + j * ld + c) = kv;
    *reinterpret_cast<uint4*>(vs + j * ld + c) = vv;
  }
}

// ---------------------------------------------------------------- decode (T == 1)
// Block (kv head, split): one warp per query head of the GQA group, sharing each staged K/V tile.
// Lane j scores key j of a tile; each lane accumulates 8 output dims per 256-dim chunk.
constexpr int kDimChunks = kMaxHeadDim / 256;

__global__ void decode_split_kernel(AttentionLaunch a, float* partials, int max_splits, int64_t split_keys) {
  extern __shared__ __align__(16) uint8_t decode_smem[];
  const int D = a.head_dim, ld = D + 8, group = a.heads / a.kv_heads;
  const int kvh = blockIdx.x, split = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int h = kvh * group + warp;
  bf16* ks = reinterpret_cast<bf16*>(decode_smem);
  bf16* vs = ks + kKeyTile * ld;
  float* qs = reinterpret_cast<float*>(vs + kKeyTile * ld) + warp * D;

  const int64_t pos = a.positions[0];
  const int64_t begin = first_key(pos, a.window) + split * split_keys;
  const int64_t end = min(begin + split_keys, pos + 1);  // exclusive
  float* part = partials + (int64_t(h) * max_splits + split) * (D + 2);
  if (begin >= end) {
    if (lane == 0) part[0] = -FLT_MAX, part[1] = 0.0f;
    return;
  }
  for (int d = lane; d < D; d += 32) qs[d] = __bfloat162float(a.q[int64_t(h) * D + d]) * a.scale;

  float m = -FLT_MAX, l = 0.0f, acc[kDimChunks][8] = {};
  for (int64_t kb = begin; kb < end; kb += kKeyTile) {
    __syncthreads();  // previous tile fully consumed (and qs written, on the first pass)
    stage_keys(a, kb, end - 1, pos, kvh, ks, vs, ld);
    __syncthreads();
    float s = -FLT_MAX;
    if (kb + lane < end) {
      s = 0.0f;
      const bf16* krow = ks + lane * ld;
      for (int c = 0; c < D; c += 8) {
        float kf[8];
        unpack8(*reinterpret_cast<const uint4*>(krow + c), kf);
#pragma unroll
        for (int j = 0; j < 8; ++j) s = fmaf(qs[c + j], kf[j], s);
      }
    }
    const float m_new = fmaxf(m, warp_max(s));
    const float p = kb + lane < end ? __expf(s - m_new) : 0.0f;
    const float alpha = __expf(m - m_new);
    l = l * alpha + warp_sum(p);
    m = m_new;
#pragma unroll
    for (int c = 0; c < kDimChunks; ++c)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[c][j] *= alpha;
    const int keys = int(min(int64_t(kKeyTile), end - kb));
    for (int j = 0; j < keys; ++j) {
      const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
      for (int c = 0; c < kDimChunks; ++c) {
        const int d = c * 256 + lane * 8;
        if (d < D) {
          float vf[8];
          unpack8(*reinterpret_cast<const uint4*>(vs + j * ld + d), vf);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[c][i] = fmaf(pj, vf[i], acc[c][i]);
        }
      }
    }
  }
  if (lane == 0) part[0] = m, part[1] = l;
#pragma unroll
  for (int c = 0; c < kDimChunks; ++c) {
    const int d = c * 256 + lane * 8;
    if (d < D)
#pragma unroll
      for (int i = 0; i < 8; ++i) part[2 + d + i] = acc[c][i];
  }
}

// Block per query head: merges the splits' softmax states, then the group's first head stores the
// new K/V row (every split has read the older ring entries by now).
__global__ void decode_combine_kernel(AttentionLaunch a, const float* partials, int max_splits, int splits) {
  const int D = a.head_dim, h = blockIdx.x, group = a.heads / a.kv_heads;
  const float* part = partials + int64_t(h) * max_splits * (D + 2);
  float m = -FLT_MAX;
  for (int s = 0; s < splits; ++s)
    if (part[s * (D + 2) + 1] > 0.0f) m = fmaxf(m, part[s * (D + 2)]);
  float l = 0.0f;
  for (int s = 0; s < splits; ++s) {
    const float* p = part + s * (D + 2);
    if (p[1] > 0.0f) l += p[1] * __expf(p[0] - m);
  }
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float o = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float* p = part + s * (D + 2);
      if (p[1] > 0.0f) o += p[2 + d] * __expf(p[0] - m);
    }
    a.out[int64_t(h) * D + d] = __float2bfloat16(o / l);
  }
  if (h % group == 0) {
    const int kvh = h / group;
    const int64_t slot = a.positions[0] % a.capacity;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
      a.k_cache[slot * a.kv_stride + int64_t(kvh) * D + d] = a.k_new[int64_t(kvh) * D + d];
      a.v_cache[slot * a.kv_stride + int64_t(kvh) * D + d] = a.v_new[int64_t(kvh) * D + d];
    }
  }
}

// ---------------------------------------------------------------- prefill (T > 1)
// Block (16-query tile, head), 4 warps, bf16 tensor cores (WMMA) with float32 accumulation.
// Per key tile: S = Q·K^T (warp w: key half w&1, every other 16-dim step from w>>1, two partial
// sums), online softmax by 8 threads per row, O (float32 in shared memory) = O*alpha + P·V with
// warp w owning every fourth 16-column block of O. Scores never leave shared memory.
constexpr int kQueryTile = 16;
constexpr int kPrefillThreads = 128;
constexpr int kScoreLd = kKeyTile + 4;
constexpr int kProbLd = kKeyTile + 8;

struct PrefillSmem {
  int ld_kv, ld_o;
  size_t q, k, v, s, p, o, rows, total;
  explicit __host__ __device__ PrefillSmem(int D) : ld_kv(D + 8), ld_o(D + 4) {
    q = 0;
    k = q + size_t(kQueryTile) * ld_kv * 2;
    v = k + size_t(kKeyTile) * ld_kv * 2;
    s = v + size_t(kKeyTile) * ld_kv * 2;
    p = s + size_t(2) * kQueryTile * kScoreLd * 4;
    o = p + size_t(kQueryTile) * kProbLd * 2;
    rows = o + size_t(kQueryTile) * ld_o * 4;
    total = rows + size_t(2) * kQueryTile * 4;
  }
};

__global__ __launch_bounds__(kPrefillThreads) void prefill_attention_kernel(AttentionLaunch a) {
  using namespace nvcuda;
  extern __shared__ __align__(128) uint8_t prefill_smem[];
  const int D = a.head_dim, group = a.heads / a.kv_heads;
  const PrefillSmem lay(D);
  bf16* qs = reinterpret_cast<bf16*>(prefill_smem + lay.q);
  bf16* ks = reinterpret_cast<bf16*>(prefill_smem + lay.k);
  bf16* vs = reinterpret_cast<bf16*>(prefill_smem + lay.v);
  float* ss = reinterpret_cast<float*>(prefill_smem + lay.s);
  bf16* ps = reinterpret_cast<bf16*>(prefill_smem + lay.p);
  float* os = reinterpret_cast<float*>(prefill_smem + lay.o);
  float* row_m = reinterpret_cast<float*>(prefill_smem + lay.rows);
  float* row_l = row_m + kQueryTile;

  const int h = blockIdx.y, kvh = h / group, warp = threadIdx.x >> 5;
  const int64_t t0 = int64_t(blockIdx.x) * kQueryTile;
  const int64_t rows = min(int64_t(kQueryTile), a.T - t0);
  const int64_t pos0 = a.positions[0];
  const int vecs = D / 8;
  for (int i = threadIdx.x; i < kQueryTile * vecs; i += blockDim.x) {
    const int r = i / vecs, c = (i % vecs) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < rows) v = *reinterpret_cast<const uint4*>(a.q + (t0 + r) * a.q_stride + int64_t(h) * D + c);
    *reinterpret_cast<uint4*>(qs + r * lay.ld_kv + c) = v;
  }
  for (int i = threadIdx.x; i < kQueryTile * D; i += blockDim.x) os[(i / D) * lay.ld_o + i % D] = 0.0f;
  if (threadIdx.x < kQueryTile) row_m[threadIdx.x] = -FLT_MAX, row_l[threadIdx.x] = 0.0f;

  const int64_t last = pos0 + t0 + rows - 1;
  const int r = threadIdx.x / 8, sub = threadIdx.x % 8;  // softmax: 8 threads per query row
  const int64_t p_row = pos0 + t0 + r;
  for (int64_t kb = first_key(pos0 + t0, a.window); kb <= last; kb += kKeyTile) {
    __syncthreads();
    stage_keys(a, kb, last, pos0, kvh, ks, vs, lay.ld_kv);
    __syncthreads();
    {  // S partial sums
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> s;
      wmma::fill_fragment(s, 0.0f);
      const int n = (warp & 1) * 16;
      for (int k = (warp >> 1) * 16; k < D; k += 32) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> qf;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> kf;
        wmma::load_matrix_sync(qf, qs + k, lay.ld_kv);
        wmma::load_matrix_sync(kf, ks + n * lay.ld_kv + k, lay.ld_kv);
        wmma::mma_sync(s, qf, kf, s);
      }
      wmma::store_matrix_sync(ss + (warp >> 1) * kQueryTile * kScoreLd + n, s, kScoreLd, wmma::mem_row_major);
    }
    __syncthreads();
    {  // online softmax of row r over this tile's 32 keys; 4 keys per thread
      float sv[4], mx = -FLT_MAX;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int c = sub * 4 + i;
        const int64_t kp = kb + c;
        const bool visible = r < rows && kp <= p_row && kp >= first_key(p_row, a.window);
        sv[i] = visible ? (ss[r * kScoreLd + c] + ss[kQueryTile * kScoreLd + r * kScoreLd + c]) * a.scale : -FLT_MAX;
        mx = fmaxf(mx, sv[i]);
      }
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_old = row_m[r], m_new = fmaxf(m_old, mx);
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float pv = sv[i] > -FLT_MAX ? __expf(sv[i] - m_new) : 0.0f;
        sum += pv;
        ps[r * kProbLd + sub * 4 + i] = __float2bfloat16(pv);
      }
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      const float alpha = __expf(m_old - m_new);
      for (int d = sub; d < D; d += 8) os[r * lay.ld_o + d] *= alpha;
      __syncwarp();
      if (sub == 0) row_m[r] = m_new, row_l[r] = row_l[r] * alpha + sum;
    }
    __syncthreads();
    for (int n = warp * 16; n < D; n += 64) {  // O += P·V
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> o;
      wmma::load_matrix_sync(o, os + n, lay.ld_o, wmma::mem_row_major);
#pragma unroll
      for (int k = 0; k < kKeyTile; k += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> pf;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> vf;
        wmma::load_matrix_sync(pf, ps + k, kProbLd);
        wmma::load_matrix_sync(vf, vs + k * lay.ld_kv + n, lay.ld_kv);
        wmma::mma_sync(o, pf, vf, o);
      }
      wmma::store_matrix_sync(os + n, o, lay.ld_o, wmma::mem_row_major);
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < rows * D; i += blockDim.x) {
    const int rr = i / D, d = i % D;
    a.out[(t0 + rr) * a.out_stride + int64_t(h) * D + d] = __float2bfloat16(os[rr * lay.ld_o + d] / row_l[rr]);
  }
}

// Stores the chunk's K/V rows (the last `capacity` of them) at their slots.
__global__ void store_kv_kernel(AttentionLaunch a) {
  const int64_t cols = int64_t(a.kv_heads) * a.head_dim;
  const int64_t first = max(int64_t(0), a.T - a.capacity), pos0 = a.positions[0];
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (a.T - first) * cols;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = first + i / cols, c = i % cols, slot = (pos0 + t) % a.capacity;
    a.k_cache[slot * a.kv_stride + c] = a.k_new[t * a.kv_stride + c];
    a.v_cache[slot * a.kv_stride + c] = a.v_new[t * a.kv_stride + c];
  }
}

void check_shape(const AttentionLaunch& a) {
  G4_CHECK(a.head_dim % 16 == 0 && a.head_dim <= kMaxHeadDim,
           "cuda attention: head_dim must be a multiple of 16 and at most 512");
  G4_CHECK(a.kv_heads > 0 && a.heads % a.kv_heads == 0 && a.heads / a.kv_heads <= 32,
           "cuda attention: query heads must be a multiple (at most 32x) of kv heads");
  G4_CHECK(a.window == 0 || a.capacity >= a.window, "attention: ring cache smaller than the sliding window");
}

}  // namespace

void launch_decode_attention(const AttentionLaunch& a, float* partials, int max_splits, cudaStream_t stream) {
  check_shape(a);
  // Keys a query can see span at most the window (ring) or the capacity (flat cache).
  const int64_t span = a.window ? a.window : a.capacity;
  const int64_t split_keys = std::max<int64_t>(64, ceil_div(ceil_div(span, max_splits), kKeyTile) * kKeyTile);
  const int splits = int(ceil_div(span, split_keys));
  const int group = a.heads / a.kv_heads;
  const size_t smem = size_t(2) * kKeyTile * (a.head_dim + 8) * 2 + size_t(group) * a.head_dim * 4;
  G4_CUDA(cudaFuncSetAttribute(decode_split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  decode_split_kernel<<<dim3(unsigned(a.kv_heads), unsigned(splits)), group * 32, smem, stream>>>(a, partials,
                                                                                                 max_splits, split_keys);
  G4_CUDA_LAUNCHED(decode_split_kernel);
  decode_combine_kernel<<<unsigned(a.heads), 128, 0, stream>>>(a, partials, max_splits, splits);
  G4_CUDA_LAUNCHED(decode_combine_kernel);
}

void launch_prefill_attention(const AttentionLaunch& a, cudaStream_t stream) {
  check_shape(a);
  const PrefillSmem lay(a.head_dim);
  G4_CUDA(cudaFuncSetAttribute(prefill_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(lay.total)));
  prefill_attention_kernel<<<dim3(unsigned(ceil_div(a.T, kQueryTile)), unsigned(a.heads)), kPrefillThreads, lay.total,
                             stream>>>(a);
  G4_CUDA_LAUNCHED(prefill_attention_kernel);
  const int64_t n = std::min(a.T, a.capacity) * a.kv_heads * a.head_dim;
  store_kv_kernel<<<unsigned(std::min<int64_t>(ceil_div(n, 256), 4096)), 256, 0, stream>>>(a);
  G4_CUDA_LAUNCHED(store_kv_kernel);
}

}  // namespace g4
