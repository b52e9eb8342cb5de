// Decode attention (one query token), split-K "flash decoding" in two launches. The split
// kernel's block (kv head, split) scores the split's keys for every query head of the GQA group
// (one warp each, one key per lane) from K/V tiles staged with cp.async by all of its threads, and
// writes each head's softmax state (m, l) and unnormalised output. It can fold in the head norms
// (AttentionLaunch::norm_inputs): each block norms its group's queries itself, and the block whose
// split holds the new token norms that token's K/V, which it also stores in the cache (no split
// reads that slot: a ring is at least a window long). The merge kernel's block (query head, 128
// output dims) sums the splits in a fixed order, so the result does not depend on which split
// finished first; it is spread over many blocks because a global layer's partials (8 heads x 512
// dims x up to 256 splits per kv head) are too many for one block to read quickly. Both grids have
// a third dimension, the sequences of a decode batch: block z works on sequence z alone, with
// sequence_launch's arguments, exactly as a launch of that sequence by itself would.
#include <algorithm>
#include <cfloat>

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/head_norm.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/quantized_planes.cuh"
#include "backend/cuda/warp_reduce.cuh"

namespace g4 {

namespace {

constexpr int kTileKeys = 32;  // keys staged per step, one per lane
constexpr int kDimChunks = kMaxAttentionHeadDim / 256;  // 8 output dims per lane per 256-dim chunk
constexpr int kMinWarps = 4;    // staging wants more threads than a small GQA group has warps
constexpr int kMaxSplits = 256;  // the merge holds every split's (m, l) in a warp's registers
constexpr int kDotAccumulators = 4;  // independent partial sums of a q·k dot product
// Merge block: kMergeColumns threads own 4 output dims each; kMergeLanes of them share a column,
// each summing every kMergeLanes-th split with kMergeLoads loads in flight.
constexpr int kMergeColumns = 32, kMergeLanes = 8, kMergeLoads = 8;
constexpr int kMergeDims = 4 * kMergeColumns;

// Where the split kernel leaves each (query head, split)'s softmax state for the merge.
struct SplitPartials {
  float* acc;  // [heads][max_splits][head_dim] unnormalised outputs
  float2* ml;  // [heads][max_splits] running max m and sum l
  int max_splits;
  int64_t split_keys;
};

// Sequence z's arguments: row z of the batch's query, new K/V, output and positions, and its caches.
__device__ inline AttentionLaunch sequence_launch(const AttentionLaunch& batch, const DecodeCaches& caches, int z) {
  AttentionLaunch a = batch;
  a.q += z * batch.q_stride;
  a.k_new += z * batch.kv_stride;
  a.v_new += z * batch.kv_stride;
  a.out += z * batch.out_stride;
  a.positions += z;
  a.k_cache = caches.k[z];
  a.v_cache = caches.v[z];
  return a;
}

// Sequence z's slice of the partials (each sequence's is laid out as one sequence's alone).
__device__ inline SplitPartials sequence_partials(const SplitPartials& batch, const AttentionLaunch& a, int z) {
  const int64_t floats = int64_t(a.heads) * batch.max_splits * (a.head_dim + 2);
  SplitPartials p = batch;
  p.acc += z * floats;
  p.ml = reinterpret_cast<float2*>(reinterpret_cast<float*>(batch.ml) + z * floats);
  return p;
}

struct DecodeSmem {
  int ld;
  size_t k, v, q, fresh_k, fresh_v, total;
  __host__ __device__ DecodeSmem(int D, int group) : ld(D + 8) {
    k = 0;
    v = k + size_t(kTileKeys) * ld * 2;
    q = v + size_t(kTileKeys) * ld * 2;
    fresh_k = q + size_t(group) * D * 4;
    fresh_v = fresh_k + size_t(D) * 2;
    total = fresh_v + size_t(D) * 2;
  }
};

// Starts copying the K and V rows of keys [kb, min(kb + kTileKeys, last + 1)) into shared rows of
// `ld` elements (cp_async_wait_all completes it), all but the new token's (key pos), which
// place_fresh_row copies in. Key kp < pos is cache slot kp % capacity; a tile's keys lie within
// one window (or the flat cache), so its slots wrap at most once and one 64-bit modulo serves the
// whole tile.
__device__ void stage_tile(const AttentionLaunch& a, int64_t kb, int64_t last, int64_t pos, int kvh, bf16* ks,
                           bf16* vs, int ld) {
  const int vecs = a.head_dim / 8;
  const int keys = int(min(int64_t(kTileKeys), last + 1 - kb));
  const int64_t first_slot = kb % a.capacity, head_offset = int64_t(kvh) * a.head_dim;
  for (int i = threadIdx.x; i < keys * vecs; i += blockDim.x) {
    const int j = i / vecs, c = (i - j * vecs) * 8;
    if (kb + j >= pos) continue;
    int64_t slot = first_slot + j;
    if (slot >= a.capacity) slot -= a.capacity;
    const int64_t offset = slot * a.kv_stride + head_offset + c;
    cp_async16(shared_addr(ks + j * ld + c), a.k_cache + offset, true);
    cp_async16(shared_addr(vs + j * ld + c), a.v_cache + offset, true);
  }
}

// Writes four values at element i of a shared and a global bf16 row.
struct SharedAndGlobalSink {
  bf16 *shared, *global;
  __device__ void operator()(int64_t i, const float (&v)[4]) const {
    store_bf16x4(shared + i, v);
    store_bf16x4(global + i, v);
  }
};

// The new token's K and V rows of kv head kvh (normed first when a.norm_inputs) into fresh_k /
// fresh_v and into cache slot pos % capacity.
__device__ void make_fresh_row(const AttentionLaunch& a, int64_t pos, int kvh, bf16* fresh_k, bf16* fresh_v) {
  const int D = a.head_dim, warps = blockDim.x >> 5, warp = threadIdx.x >> 5;
  const int64_t head_offset = int64_t(kvh) * D, cache_row = (pos % a.capacity) * a.kv_stride + head_offset;
  if (!a.norm_inputs) {
    for (int c = 8 * threadIdx.x; c < D; c += 8 * blockDim.x) {
      const uint4 k = *reinterpret_cast<const uint4*>(a.k_new + head_offset + c);
      const uint4 v = *reinterpret_cast<const uint4*>(a.v_new + head_offset + c);
      *reinterpret_cast<uint4*>(fresh_k + c) = k;
      *reinterpret_cast<uint4*>(fresh_v + c) = v;
      *reinterpret_cast<uint4*>(a.k_cache + cache_row + c) = k;
      *reinterpret_cast<uint4*>(a.v_cache + cache_row + c) = v;
    }
    return;
  }
  if (warp < warps - 2) return;
  const bool is_k = warp == warps - 1;
  HeadRow<kHeadNormMaxAccesses> raw;
  load_head_row((is_k ? a.k_new : a.v_new) + head_offset, D / 2, raw);
  if (!is_k) {
    norm_head_row(raw, D / 2, nullptr, a.norm_eps, static_cast<const RopeLane<kHeadNormMaxAccesses>*>(nullptr),
                  SharedAndGlobalSink{fresh_v, a.v_cache + cache_row}, NoSink{});
    return;
  }
  RopeLane<kHeadNormMaxAccesses> rope;
  rope_lane(a.inv_freq, D / 2, float(pos), rope);
  norm_head_row(raw, D / 2, a.k_norm_weight, a.norm_eps, &rope, SharedAndGlobalSink{fresh_k, a.k_cache + cache_row},
                NoSink{});
}

// Copies the new token's rows into the staged tile when the tile [kb, kb + kTileKeys) holds pos.
__device__ void place_fresh_row(int64_t kb, int64_t pos, int D, int ld, const bf16* fresh_k, const bf16* fresh_v,
                                bf16* ks, bf16* vs) {
  if (pos < kb || pos >= kb + kTileKeys) return;
  const int j = int(pos - kb);
  for (int c = 8 * threadIdx.x; c < D; c += 8 * blockDim.x) {
    *reinterpret_cast<uint4*>(ks + j * ld + c) = *reinterpret_cast<const uint4*>(fresh_k + c);
    *reinterpret_cast<uint4*>(vs + j * ld + c) = *reinterpret_cast<const uint4*>(fresh_v + c);
  }
}

// The group's queries, scaled, into qs (normed and rotated first when a.norm_inputs).
__device__ void load_queries(const AttentionLaunch& a, int64_t pos, int kvh, float* qs) {
  const int D = a.head_dim, group = a.heads / a.kv_heads, warp = threadIdx.x >> 5;
  const bf16* q = a.q + int64_t(kvh) * group * D;
  if (!a.norm_inputs) {
    for (int i = threadIdx.x; i < group * D; i += blockDim.x) qs[i] = __bfloat162float(q[i]) * a.scale;
    return;
  }
  if (warp >= group) return;
  float* row = qs + warp * D;
  const float scale = a.scale;
  HeadRow<kHeadNormMaxAccesses> raw;
  load_head_row(q + warp * D, D / 2, raw);
  RopeLane<kHeadNormMaxAccesses> rope;
  rope_lane(a.inv_freq, D / 2, float(pos), rope);
  norm_head_row(
      raw, D / 2, a.q_norm_weight, a.norm_eps, &rope,
      [row, scale](int64_t i, const float(&v)[4]) {
#pragma unroll
        for (int p = 0; p < 4; ++p) row[i + p] = v[p] * scale;
      },
      NoSink{});
}

// q · krow over D dims (a multiple of 16), with kDotAccumulators independent sums.
__device__ inline float dot_q_k(const float* q, const bf16* krow, int D) {
  float part[kDotAccumulators] = {};
  int c = 0;
  for (; c + 8 * kDotAccumulators <= D; c += 8 * kDotAccumulators)
#pragma unroll
    for (int u = 0; u < kDotAccumulators; ++u) {
      float kf[8];
      unpack8(*reinterpret_cast<const uint4*>(krow + c + 8 * u), kf);
#pragma unroll
      for (int j = 0; j < 8; ++j) part[u] = fmaf(q[c + 8 * u + j], kf[j], part[u]);
    }
  for (; c < D; c += 8) {  // head dims that are not a multiple of 32
    float kf[8];
    unpack8(*reinterpret_cast<const uint4*>(krow + c), kf);
#pragma unroll
    for (int j = 0; j < 8; ++j) part[0] = fmaf(q[c + j], kf[j], part[0]);
  }
  return (part[0] + part[1]) + (part[2] + part[3]);
}

// One warp's pass over a staged tile of keys [kb, min(kb + kTileKeys, end)): lane j scores key j
// against q, then the online softmax update of m, l and acc (8 output dims per 256-dim chunk).
__device__ void score_tile(int64_t kb, int64_t end, const DecodeSmem& lay, const bf16* ks, const bf16* vs,
                           const float* q, float& m, float& l, float (&acc)[kDimChunks][8], int D) {
  const int lane = threadIdx.x & 31;
  const bool valid = kb + lane < end;
  const float s = valid ? dot_q_k(q, ks + lane * lay.ld, D) : -FLT_MAX;
  const float m_new = fmaxf(m, warp_reduce<MaxOp>(s));
  const float p = valid ? __expf(s - m_new) : 0.0f;
  const float alpha = __expf(m - m_new);
  l = l * alpha + warp_reduce<SumOp>(p);
  m = m_new;
#pragma unroll
  for (int c = 0; c < kDimChunks; ++c)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[c][j] *= alpha;
  const int keys = int(min(int64_t(kTileKeys), end - kb));
#pragma unroll 4
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
  bf16* fresh_k = reinterpret_cast<bf16*>(smem + lay.fresh_k);
  bf16* fresh_v = reinterpret_cast<bf16*>(smem + lay.fresh_v);
  stage_tile(a, begin, end - 1, pos, kvh, ks, vs, lay.ld);  // in flight while q (and the new K/V) are read
  load_queries(a, pos, kvh, qs);
  if (end == pos + 1) make_fresh_row(a, pos, kvh, fresh_k, fresh_v);
  __syncthreads();  // qs and the new K/V rows visible to every warp
  const float* q = qs + warp * D;
  for (int64_t kb = begin; kb < end; kb += kTileKeys) {
    cp_async_wait_all();
    place_fresh_row(kb, pos, D, lay.ld, fresh_k, fresh_v, ks, vs);
    __syncthreads();  // the tile visible to every warp
    if (warp < group) score_tile(kb, end, lay, ks, vs, q, m, l, acc, D);
    __syncthreads();  // the tile consumed
    if (kb + kTileKeys < end) stage_tile(a, kb + kTileKeys, end - 1, pos, kvh, ks, vs, lay.ld);
  }
}

// Splits visible to the query at `pos` (the rest are empty).
__device__ inline int used_splits(int64_t pos, int window, int64_t split_keys, int max_splits) {
  return int(min(int64_t(max_splits), (pos + split_keys - first_key(pos, window)) / split_keys));
}

__global__ void decode_split_kernel(AttentionLaunch batch, DecodeCaches caches, SplitPartials batch_parts) {
  pdl_launch_dependents();
  extern __shared__ __align__(16) uint8_t decode_smem[];
  const AttentionLaunch a = sequence_launch(batch, caches, int(blockIdx.z));
  const SplitPartials parts = sequence_partials(batch_parts, batch, int(blockIdx.z));
  const int D = a.head_dim, group = a.heads / a.kv_heads, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int kvh = blockIdx.x, split = blockIdx.y;
  const DecodeSmem lay(D, group);
  pdl_wait();
  const int64_t pos = a.positions[0], first = first_key(pos, a.window);
  const int64_t begin = first + split * parts.split_keys, end = min(begin + parts.split_keys, pos + 1);
  if (begin >= end) return;  // an empty split: the merge does not read it
  float m = -FLT_MAX, l = 0.0f, acc[kDimChunks][8] = {};
  attend_split(a, begin, end, pos, kvh, lay, decode_smem, m, l, acc);
  if (warp >= group) return;
  const int64_t row = int64_t(kvh * group + warp) * parts.max_splits + split;
  if (lane == 0) parts.ml[row] = make_float2(m, l);
  float* out = parts.acc + row * D;
#pragma unroll
  for (int c = 0; c < kDimChunks; ++c) {
    const int d = c * 256 + lane * 8;
    if (d < D) {
      reinterpret_cast<float4*>(out + d)[0] = make_float4(acc[c][0], acc[c][1], acc[c][2], acc[c][3]);
      reinterpret_cast<float4*>(out + d)[1] = make_float4(acc[c][4], acc[c][5], acc[c][6], acc[c][7]);
    }
  }
}

// Block (head, dims [128 y, 128 y + 128)): out = sum_s w_s * acc_s over the non-empty splits with
// w_s = exp(m_s - m) / sum_s' l_s' exp(m_s' - m). The position, the splits' (m, l) and the first
// splits' acc columns are all loaded at once, before the position says how many splits are used
// (the rest are masked by selects, as a stale value may be anything): one memory latency instead
// of three in a row.
__global__ __launch_bounds__(kMergeColumns * kMergeLanes) void decode_merge_kernel(AttentionLaunch batch,
                                                                                  DecodeCaches caches,
                                                                                  SplitPartials batch_parts,
                                                                                  uint4* planes) {
  pdl_launch_dependents();
  const AttentionLaunch a = sequence_launch(batch, caches, int(blockIdx.z));
  const SplitPartials parts = sequence_partials(batch_parts, batch, int(blockIdx.z));
  __shared__ float weights[kMaxSplits];
  __shared__ float4 sums[kMergeLanes][kMergeColumns];
  const int D = a.head_dim, head = blockIdx.x, column = threadIdx.x % kMergeColumns, lane_group = threadIdx.x / kMergeColumns;
  const int d = blockIdx.y * kMergeDims + 4 * column;
  const float2* ml = parts.ml + int64_t(head) * parts.max_splits;
  const float* acc = parts.acc + int64_t(head) * parts.max_splits * D + d;
  auto load_acc = [&](int s) {
    return s < parts.max_splits && d < D ? __ldcg(reinterpret_cast<const float4*>(acc + int64_t(s) * D))
                                         : make_float4(0, 0, 0, 0);
  };
  pdl_wait();
  const int64_t pos = a.positions[0];
  float2 ml_lane[kMaxSplits / 32];  // warp 0: lane holds splits lane + 32j
  if (threadIdx.x < 32)
#pragma unroll
    for (int j = 0; j < kMaxSplits / 32; ++j) {
      const int s = threadIdx.x + 32 * j;
      ml_lane[j] = s < parts.max_splits ? __ldcg(ml + s) : make_float2(-FLT_MAX, 0.0f);
    }
  float4 v[kMergeLoads];
#pragma unroll
  for (int u = 0; u < kMergeLoads; ++u) v[u] = load_acc(lane_group + u * kMergeLanes);
  const int used = used_splits(pos, a.window, parts.split_keys, parts.max_splits);
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    float ms[kMaxSplits / 32], ls[kMaxSplits / 32], m = -FLT_MAX;
#pragma unroll
    for (int j = 0; j < kMaxSplits / 32; ++j) {
      const bool in = lane + 32 * j < used;
      ms[j] = in ? ml_lane[j].x : -FLT_MAX, ls[j] = in ? ml_lane[j].y : 0.0f;
      m = fmaxf(m, ms[j]);
    }
    m = warp_reduce<MaxOp>(m);
    float l = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxSplits / 32; ++j) l += ls[j] * __expf(ms[j] - m);
    l = warp_reduce<SumOp>(l);
#pragma unroll
    for (int j = 0; j < kMaxSplits / 32; ++j)
      if (lane + 32 * j < used) weights[lane + 32 * j] = __expf(ms[j] - m) / l;
  }
  __syncthreads();
  float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int s0 = lane_group; s0 < used; s0 += kMergeLanes * kMergeLoads) {
    if (s0 != lane_group)  // later rounds (more than kMergeLanes * kMergeLoads splits)
#pragma unroll
      for (int u = 0; u < kMergeLoads; ++u) v[u] = load_acc(s0 + u * kMergeLanes);
#pragma unroll
    for (int u = 0; u < kMergeLoads; ++u) {
      const int s = s0 + u * kMergeLanes;
      if (s >= used) continue;
      const float w = weights[s];
      sum.x = fmaf(w, v[u].x, sum.x), sum.y = fmaf(w, v[u].y, sum.y);
      sum.z = fmaf(w, v[u].z, sum.z), sum.w = fmaf(w, v[u].w, sum.w);
    }
  }
  sums[lane_group][column] = sum;
  __syncthreads();
  if (lane_group != 0) return;  // warp 0 writes the block's dims
  for (int g = 1; g < kMergeLanes; ++g) {
    const float4 o = sums[g][column];
    sum.x += o.x, sum.y += o.y, sum.z += o.z, sum.w += o.w;
  }
  const float stored[4] = {round_bf16(sum.x), round_bf16(sum.y), round_bf16(sum.z), round_bf16(sum.w)};
  const int64_t at = int64_t(head) * D + d;  // in the row of all heads
  if (d < D) {
    bf16* out = a.out + at;
    out[0] = __float2bfloat16(stored[0]), out[1] = __float2bfloat16(stored[1]);
    out[2] = __float2bfloat16(stored[2]), out[3] = __float2bfloat16(stored[3]);
  }
  // One sequence's row quantized for o_proj (launch_decode_attention allows it when D % 32 == 0, so
  // a column's 8-lane group is inside or past the head as a whole): column c holds values
  // 4 (c % 8).. of block at / 32.
  if (planes)
    quantize_block_part<4>(stored, column % 8, at / packed::kBlock, int64_t(a.heads) * D / packed::kBlock, d < D,
                           planes);
}

}  // namespace

int64_t decode_partial_floats(const AttentionLaunch& a, int max_splits) {
  return int64_t(a.heads) * max_splits * (a.head_dim + 2);
}

void launch_decode_attention(const AttentionLaunch& a, const DecodeCaches& caches, float* partials, int max_splits,
                             uint4* planes, cudaStream_t stream) {
  check_attention_shape(a);
  G4_CHECK(!planes || (caches.sequences == 1 && a.head_dim % packed::kBlock == 0),
           "decode attention: quantized planes need one sequence and heads of whole blocks");
  G4_CHECK(max_splits <= kMaxSplits, "decode attention: at most 256 splits");
  G4_CHECK(caches.sequences >= 1 && caches.sequences <= kMaxDecodeSequences,
           "decode attention: 1 to " + std::to_string(kMaxDecodeSequences) + " sequences per launch");
  // Keys a query can see span at most the window (ring) or the capacity (flat cache).
  const int64_t span = a.window ? a.window : a.capacity;
  SplitPartials parts;
  parts.split_keys = std::max<int64_t>(kTileKeys, ceil_div(ceil_div(span, max_splits), kTileKeys) * kTileKeys);
  parts.max_splits = max_splits;
  parts.acc = partials;
  parts.ml = reinterpret_cast<float2*>(partials + int64_t(a.heads) * max_splits * a.head_dim);
  const int splits = int(ceil_div(span, parts.split_keys)), group = a.heads / a.kv_heads;
  const DecodeSmem lay(a.head_dim, group);
  const unsigned sequences = unsigned(caches.sequences);
  launch_kernel("decode_split_kernel", decode_split_kernel,
                dim3(unsigned(a.kv_heads), unsigned(splits), sequences), 32 * std::max(group, kMinWarps), lay.total,
                stream, Pdl::kOn, a, caches, parts);
  launch_kernel("decode_merge_kernel", decode_merge_kernel,
                dim3(unsigned(a.heads), unsigned(ceil_div(int64_t(a.head_dim), int64_t(kMergeDims))), sequences),
                kMergeColumns * kMergeLanes, 0, stream, Pdl::kOn, a, caches, parts, planes);
}

}  // namespace g4
