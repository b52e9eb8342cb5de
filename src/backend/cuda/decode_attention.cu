// Decode attention (one query token), split-K "flash decoding" in two launches. The split
// kernel's block (kv head, split) scores the split's keys for every query head of the GQA group at
// once on the tensor cores, from K/V tiles staged with cp.async by all of its threads, and writes
// each head's softmax state (m, l) and unnormalised output. A warp per head scoring one key per lane
// on the CUDA cores would do 4 FMAs per byte of K/V with the 31B's full layers (8 heads of 512 dims
// per K/V head), which holds 32 k-token decode attention to ~1.3 TB/s (docs/DESIGN.md §3). The
// visible keys are spread over all splits whatever the context length (split_keys_at), so a short
// context is many short splits rather than a few long ones. It can
// fold in the head norms (AttentionLaunch::norm_inputs): each block norms its group's queries
// itself, and the block whose split holds the new token norms that token's K/V, which it also
// stores in the cache (no split reads that slot: a ring is at least a window long). The merge
// kernel's block (query head, 128 output dims) sums the splits in a fixed order, so the result
// does not depend on which split finished first; it is spread over many blocks because a global
// layer's partials (8 heads x 512 dims x up to 256 splits per kv head) are too many for one block
// to read quickly. Both grids have a third dimension, the sequences of a decode batch: block z
// works on sequence z alone, with sequence_launch's arguments, exactly as a launch of that
// sequence by itself would.
// A split block may take several splits (every P-th, P = the grid's y), one after the other with
// the next tile's copies in flight across them: a full batch of short contexts is then one block
// per (kv head, sequence) instead of thousands of one-tile blocks, each paying the queries' norms
// and a chain of memory latencies (docs/DESIGN.md §3). A block that took all of its cache's splits
// merges them itself when their partials are few (merged_in_split), in the merge kernel's exact
// order, so the bits never depend on P: P follows the batch's size, the split of the keys only
// the position.
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

constexpr int kTileKeys = 32;     // keys staged per step: two 16-key tiles of the mma
// A split block's warps: QK gives warp w key tile w % 2 over dim part w / 2 of kWarps / 2 parts, PV
// every kWarps-th 16-dim tile of O, the softmax kHeads / kWarps heads. Four warps, or eight for a
// group of up to 8 heads of more than 256 dims (kWideHeadDim): two blocks of 4 warps (the most
// a multiprocessor's shared memory holds at 512 dims) left it waiting on latency at ~40 % of the
// copy bandwidth over long contexts.
constexpr int kWideHeadDim = 256;
template <int kWarps>
struct SplitWarps {
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kDimParts = kWarps / 2;
  static constexpr int kDimTiles = kMaxAttentionHeadDim / 16 / kWarps;  // 16-dim tiles of O a warp owns
};
// Registers for as many split blocks a multiprocessor as their shared memory allows: at head dim
// 256, 5 with up to 8 heads a group, 4 with 16 (left to itself, ptxas gave the 16-head kernel 158
// registers: 3 blocks); at 512 dims, 2 of 8 warps.
template <int kHeadTiles, int kWarps>
constexpr int kSplitMinBlocks = kWarps == 8 ? 2 : kHeadTiles == 1 ? 5 : kHeadTiles == 2 ? 4 : 1;
constexpr int kMaxSplits = 256;   // the merge holds every split's (m, l) in a warp's registers
// Merge block: kMergeColumns threads own 4 output dims each; kMergeLanes of them share a column,
// each summing every kMergeLanes-th split with kMergeLoads loads in flight.
constexpr int kMergeColumns = 32, kMergeLanes = 8, kMergeLoads = 8;
constexpr int kMergeDims = 4 * kMergeColumns;

// Where the split kernel leaves each (query head, split)'s softmax state for the merge.
struct SplitPartials {
  float* acc;  // [heads][max_splits][head_dim] unnormalised outputs
  float2* ml;  // [heads][max_splits] running max m (scaled scores) and sum l
  int max_splits;
  int launched;         // splits this launch may fill (the grid may stop short of max_splits)
  int blocks_per_head;  // P: a split block takes splits y, y + P, ... of its (kv head, sequence)
  // The split grid is (sequence, kv head, y) rather than (kv head, y, sequence): the blocks of a
  // chunk's rows, which read the same keys, start side by side (launch_chunk_on_decode_kernels).
  bool sequences_fastest;
};

// A split block's sequence, kv head and y (splits y, y + P, ...).
struct SplitBlock {
  int sequence, kvh, y;
};
__device__ inline SplitBlock split_block(const SplitPartials& p) {
  if (p.sequences_fastest) return {int(blockIdx.x), int(blockIdx.y), int(blockIdx.z)};
  return {int(blockIdx.z), int(blockIdx.x), int(blockIdx.y)};
}

// Partials a block that took all of its cache's splits merges itself: at most this many floats
// (a thread's 64 float4 loads, under the time the merge kernel's launch would take; a sliding
// layer's 32 splits of 2 heads x 256 dims are half of it), and their weights fit in the K and V
// tiles' shared memory (32 (D + 8) floats) that the merge reuses.
constexpr int64_t kMergedInSplitFloats = 32768;
__host__ __device__ inline bool merged_in_split(const SplitPartials& p, int used, int group, int D) {
  return p.blocks_per_head == 1 && int64_t(used) * group * D <= kMergedInSplitFloats &&
         int64_t(used) * group <= int64_t(kTileKeys) * D;
}

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
  a.page_table = caches.table[z];
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

// Keys per split for the query at `pos`: its visible keys spread over all max_splits (whole tiles),
// so a short context is not one block's long walk. The position alone decides it, so a captured
// graph replays at any position and a sequence's result does not depend on its batch. Positions
// are below 2^31 (the context), and 32-bit divisions are a fraction of 64-bit ones: the split
// kernel's first copies wait for this.
__host__ __device__ inline int split_keys_at(int pos, int window, int max_splits) {
  const int visible = pos + 1 - int(first_key(pos, window)), keys_per_round = max_splits * kTileKeys;
  return std::max(int(kTileKeys), (visible + keys_per_round - 1) / keys_per_round * kTileKeys);
}

// Splits holding keys of the query at `pos` (the rest are empty).
__host__ __device__ inline int used_splits(int pos, int window, int split_keys) {
  return (pos - int(first_key(pos, window))) / split_keys + 1;
}

// The split kernel's shared memory for head dim D and a GQA group padded to 8 * kHeadTiles heads
// (the mma's 8 columns per tile), scored by kWarps warps. K, V and Q rows are D + 8 elements long,
// so the 8 rows of an ldmatrix fall in distinct banks.
template <int kHeadTiles, int kWarps>
struct DecodeSmem {
  static constexpr int kHeads = 8 * kHeadTiles;
  static constexpr int kPLd = kTileKeys + 8;  // P rows (bf16): B fragment loads in distinct banks
  int ld;
  size_t k, v, q, scores, p, alpha, fresh_k, fresh_v, total;
  __host__ __device__ explicit DecodeSmem(int D) : ld(D + 8) {
    k = 0;
    v = k + size_t(kTileKeys) * ld * 2;
    q = v + size_t(kTileKeys) * ld * 2;
    scores = q + size_t(kHeads) * ld * 2;  // float [dim parts][kTileKeys][kHeads]
    p = scores + size_t(SplitWarps<kWarps>::kDimParts) * kTileKeys * kHeads * 4;  // bf16 [kHeads][kPLd]
    alpha = p + size_t(kHeads) * kPLd * 2;          // float [kHeads]
    fresh_k = alpha + size_t(kHeads) * 4;
    fresh_v = fresh_k + size_t(D) * 2;
    total = fresh_v + size_t(D) * 2;
  }
};

// Starts copying the K or V rows (`cache`) of keys [kb, kb + kTileKeys) into shared rows of `ld`
// elements (a cp.async wait completes it): keys past `last` become zeros (P is 0 there, and 0
// times a stale NaN would not be), the new token's (key `fresh`; -1: none) is left to
// place_fresh_row. Every other key kp is cache row cache_row(a, kp).
__device__ void stage_tile(const AttentionLaunch& a, const bf16* cache, int kb, int last, int fresh, int kvh,
                           bf16* rows, int ld) {
  const int vecs = a.head_dim / 8;
  const int64_t head_offset = int64_t(kvh) * a.head_dim;
  for (int i = threadIdx.x; i < kTileKeys * vecs; i += blockDim.x) {
    const int j = i / vecs, c = (i - j * vecs) * 8;
    if (kb + j == fresh) continue;
    const bool valid = kb + j <= last;
    cp_async16(shared_addr(rows + j * ld + c),
               cache + (valid ? cache_row(a, kb + j) * a.kv_stride + head_offset + c : 0), valid);
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

// The new token's K and V rows of kv head kvh (normed first when a.norm_inputs, by the block's
// last two warps) into fresh_k / fresh_v and into its cache row.
__device__ void make_fresh_row(const AttentionLaunch& a, int64_t pos, int kvh, bf16* fresh_k, bf16* fresh_v) {
  const int D = a.head_dim, warps = blockDim.x >> 5, warp = threadIdx.x >> 5;
  const int64_t head_offset = int64_t(kvh) * D, row = cache_row(a, int(pos)) * a.kv_stride + head_offset;
  if (!a.norm_inputs) {
    for (int c = 8 * threadIdx.x; c < D; c += 8 * blockDim.x) {
      const uint4 k = *reinterpret_cast<const uint4*>(a.k_new + head_offset + c);
      const uint4 v = *reinterpret_cast<const uint4*>(a.v_new + head_offset + c);
      *reinterpret_cast<uint4*>(fresh_k + c) = k;
      *reinterpret_cast<uint4*>(fresh_v + c) = v;
      *reinterpret_cast<uint4*>(a.k_cache + row + c) = k;
      *reinterpret_cast<uint4*>(a.v_cache + row + c) = v;
    }
    return;
  }
  if (warp < warps - 2) return;
  const bool is_k = warp == warps - 1;
  HeadRow<kHeadNormMaxAccesses> raw;
  load_head_row((is_k ? a.k_new : a.v_new) + head_offset, D / 2, raw);
  if (!is_k) {
    norm_head_row(raw, D / 2, nullptr, a.norm_eps, static_cast<const RopeLane<kHeadNormMaxAccesses>*>(nullptr),
                  SharedAndGlobalSink{fresh_v, a.v_cache + row}, NoSink{});
    return;
  }
  RopeLane<kHeadNormMaxAccesses> rope;
  rope_lane(a.inv_freq, D / 2, float(pos), rope);
  norm_head_row(raw, D / 2, a.k_norm_weight, a.norm_eps, &rope, SharedAndGlobalSink{fresh_k, a.k_cache + row},
                NoSink{});
}

// Copies the new token's K or V row into the staged tile when the tile [kb, kb + kTileKeys) holds pos.
__device__ void place_fresh_row(int64_t kb, int64_t pos, int D, int ld, const bf16* fresh, bf16* rows) {
  if (pos < kb || pos >= kb + kTileKeys) return;
  const int j = int(pos - kb);
  for (int c = 8 * threadIdx.x; c < D; c += 8 * blockDim.x)
    *reinterpret_cast<uint4*>(rows + j * ld + c) = *reinterpret_cast<const uint4*>(fresh + c);
}

// The group's queries as bf16 rows of qs (normed and rotated first when a.norm_inputs, with the
// rounding the separate head-norm op stores), the padding heads' rows zero.
template <int kHeadTiles>
__device__ void load_queries(const AttentionLaunch& a, int64_t pos, int kvh, bf16* qs, int ld) {
  const int D = a.head_dim, group = a.heads / a.kv_heads, vecs = D / 8;
  const bf16* q = a.q + int64_t(kvh) * group * D;
  for (int i = threadIdx.x; i < 8 * kHeadTiles * vecs; i += blockDim.x) {
    const int h = i / vecs, c = (i - h * vecs) * 8;
    if (h >= group) *reinterpret_cast<uint4*>(qs + h * ld + c) = make_uint4(0, 0, 0, 0);
    else if (!a.norm_inputs) *reinterpret_cast<uint4*>(qs + h * ld + c) = *reinterpret_cast<const uint4*>(q + h * D + c);
  }
  if (!a.norm_inputs) return;
  RopeLane<kHeadNormMaxAccesses> rope;
  rope_lane(a.inv_freq, D / 2, float(pos), rope);
  for (int h = threadIdx.x >> 5; h < group; h += blockDim.x >> 5) {
    HeadRow<kHeadNormMaxAccesses> raw;
    load_head_row(q + h * D, D / 2, raw);
    norm_head_row(raw, D / 2, a.q_norm_weight, a.norm_eps, &rope, Bf16RowSink{qs + h * ld}, NoSink{});
  }
}

// Raw scores S^T = K·Q^T of a staged tile (keys x heads) on the tensor cores: warp w takes key
// tile w % 2 over dim part w / 2 (of the 16-dim steps, part p takes [ceil(p·S/P), ceil((p+1)·S/P)));
// the parts land in scores[part][key][head].
template <int kHeadTiles, int kWarps>
__device__ void tile_scores(const DecodeSmem<kHeadTiles, kWarps>& lay, const bf16* ks, const bf16* qs, float* scores,
                            int D) {
  constexpr int kHeads = 8 * kHeadTiles, kParts = SplitWarps<kWarps>::kDimParts;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, key_tile = warp & 1, part = warp >> 1;
  const int steps = D / 16, step_end = ((part + 1) * steps + kParts - 1) / kParts;
  const bf16* a_row = ks + (key_tile * 16 + (lane & 15)) * lay.ld + (lane >> 4) * 8;
  const bf16* b_row = qs + (lane & 7) * lay.ld + ((lane >> 3) & 1) * 8;
  // Two independent sums (even and odd steps), so that consecutive mmas do not wait on each other.
  float s[kHeadTiles][4] = {}, s_odd[kHeadTiles][4] = {};
  auto step_into = [&](int step, float(&acc)[kHeadTiles][4]) {
    uint32_t k_frag[4];
    ldmatrix_x4(k_frag, shared_addr(a_row + step * 16));
#pragma unroll
    for (int nt = 0; nt < kHeadTiles; ++nt) {
      uint32_t q0, q1;
      ldmatrix_x2(q0, q1, shared_addr(b_row + nt * 8 * lay.ld + step * 16));
      mma_bf16(acc[nt], k_frag, q0, q1);
    }
  };
  int step = (part * steps + kParts - 1) / kParts;
#pragma unroll 2
  for (; step + 1 < step_end; step += 2) {
    step_into(step, s);
    step_into(step + 1, s_odd);
  }
  if (step < step_end) step_into(step, s);
#pragma unroll
  for (int nt = 0; nt < kHeadTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] += s_odd[nt][e];
  const int key = key_tile * 16 + (lane >> 2);
#pragma unroll
  for (int nt = 0; nt < kHeadTiles; ++nt) {
    const int h = nt * 8 + 2 * (lane & 3);
    *reinterpret_cast<float2*>(scores + (part * kTileKeys + key) * kHeads + h) = make_float2(s[nt][0], s[nt][1]);
    *reinterpret_cast<float2*>(scores + (part * kTileKeys + key + 8) * kHeads + h) = make_float2(s[nt][2], s[nt][3]);
  }
}

// Heads of a tile's softmax a warp owns.
template <int kHeadTiles, int kWarps>
constexpr int kWarpHeads = 8 * kHeadTiles / kWarps;

// The online softmax over one tile for the heads warp w owns (kWarpHeads of them, lane = key; a
// score is its dim parts' sum, added in part order): m and l advance, P = exp(scale (s - m)) goes to
// shared memory in bf16, and each head's rescale factor of O to alphas. In base 2, as prefill:
// exp2(s * scale_log2 - m * scale_log2).
template <int kHeadTiles, int kWarps>
__device__ void tile_softmax(int64_t kb, int64_t end, int group, float scale_log2, const float* scores, bf16* p,
                             float* alphas, float (&m)[kWarpHeads<kHeadTiles, kWarps>],
                             float (&l)[kWarpHeads<kHeadTiles, kWarps>]) {
  constexpr int kHeads = 8 * kHeadTiles, kPLd = DecodeSmem<kHeadTiles, kWarps>::kPLd;
  constexpr int kOwn = kWarpHeads<kHeadTiles, kWarps>, kParts = SplitWarps<kWarps>::kDimParts;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const bool valid = kb + lane < end;
#pragma unroll
  for (int i = 0; i < kOwn; ++i) {
    const int h = warp * kOwn + i;
    if (h >= group) {  // a padding column of the mma (its O is discarded): P zero, alpha one
      p[h * kPLd + lane] = __float2bfloat16(0.0f);
      if (lane == 0) alphas[h] = 1.0f;
      continue;
    }
    float s = scores[lane * kHeads + h];
#pragma unroll
    for (int part = 1; part < kParts; ++part) s += scores[(part * kTileKeys + lane) * kHeads + h];
    s = valid ? s : -INFINITY;
    const float mx = fmaxf(m[i], warp_reduce<MaxOp>(s));  // finite: a tile holds at least one key
    const float ref = mx * scale_log2;
    const float pj = exp2_approx(fmaf(s, scale_log2, -ref));
    const float alpha = exp2_approx(fmaf(m[i], scale_log2, -ref));  // 0 before the first tile
    l[i] = l[i] * alpha + warp_reduce<SumOp>(pj);
    m[i] = mx;
    p[h * kPLd + lane] = __float2bfloat16(pj);
    if (lane == 0) alphas[h] = alpha;
  }
}

// O^T += V^T·P^T for the tile (dims x heads) on the tensor cores, after O is rescaled by alpha:
// warp w owns the 16-dim tiles w, w + kWarps, ...
template <int kHeadTiles, int kWarps>
__device__ void tile_values(const DecodeSmem<kHeadTiles, kWarps>& lay, const bf16* vs, const bf16* p,
                            const float* alphas, int D, float (&o)[SplitWarps<kWarps>::kDimTiles][kHeadTiles][4]) {
  constexpr int kPLd = DecodeSmem<kHeadTiles, kWarps>::kPLd, kDimTiles = SplitWarps<kWarps>::kDimTiles;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float alpha[kHeadTiles][2];
#pragma unroll
  for (int nt = 0; nt < kHeadTiles; ++nt) {
    const float2 a2 = *reinterpret_cast<const float2*>(alphas + nt * 8 + 2 * (lane & 3));
    alpha[nt][0] = a2.x, alpha[nt][1] = a2.y;
  }
#pragma unroll
  for (int t = 0; t < kDimTiles; ++t)
#pragma unroll
    for (int nt = 0; nt < kHeadTiles; ++nt) {
      o[t][nt][0] *= alpha[nt][0], o[t][nt][1] *= alpha[nt][1];
      o[t][nt][2] *= alpha[nt][0], o[t][nt][3] *= alpha[nt][1];
    }
  const bf16* v_row = vs + ((lane & 7) + (lane >> 4) * 8) * lay.ld + ((lane >> 3) & 1) * 8;
#pragma unroll
  for (int kk = 0; kk < kTileKeys / 16; ++kk) {
    uint32_t p0[kHeadTiles], p1[kHeadTiles];
#pragma unroll
    for (int nt = 0; nt < kHeadTiles; ++nt) {
      const bf16* row = p + (nt * 8 + (lane >> 2)) * kPLd + kk * 16 + 2 * (lane & 3);
      p0[nt] = *reinterpret_cast<const uint32_t*>(row);
      p1[nt] = *reinterpret_cast<const uint32_t*>(row + 8);
    }
#pragma unroll
    for (int t = 0; t < kDimTiles; ++t) {
      const int dim_tile = warp + kWarps * t;
      if (dim_tile * 16 >= D) break;
      uint32_t v_frag[4];
      ldmatrix_x4_trans(v_frag, shared_addr(v_row + kk * 16 * lay.ld + dim_tile * 16));
#pragma unroll
      for (int nt = 0; nt < kHeadTiles; ++nt) mma_bf16(o[t][nt], v_frag, p0[nt], p1[nt]);
    }
  }
}

// The merge's weights of one head's splits, by one warp whose lane holds the (m, l) of splits
// lane + 32 j (any values past `used`): w_s = exp(m_s - m) / sum_s' l_s' exp(m_s' - m) for s < used.
__device__ void merge_weights(const float2 (&ml_lane)[kMaxSplits / 32], int used, float* weights) {
  const int lane = threadIdx.x & 31;
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

// Stores a merged float4 of head `head` at dims [d, d + 4) (when `store`) in bf16, and, with
// `planes`, quantizes it for o_proj: `part` is the float4's place among the 8 of its block of 32,
// whose 8 lanes run this together (launch_decode_attention allows planes when D % 32 == 0, so a
// block's lanes are all inside or all past the head).
__device__ void store_merged(const AttentionLaunch& a, int head, int d, float4 sum, int part, bool store,
                             uint4* planes) {
  const float stored[4] = {round_bf16(sum.x), round_bf16(sum.y), round_bf16(sum.z), round_bf16(sum.w)};
  const int64_t at = int64_t(head) * a.head_dim + d;  // in the row of all heads
  if (store) {
    bf16* out = a.out + at;
    out[0] = __float2bfloat16(stored[0]), out[1] = __float2bfloat16(stored[1]);
    out[2] = __float2bfloat16(stored[2]), out[3] = __float2bfloat16(stored[3]);
  }
  if (planes)
    quantize_block_part<4>(stored, part, at / packed::kBlock, int64_t(a.heads) * a.head_dim / packed::kBlock, store,
                           planes);
}

__device__ inline void fma4(float w, const float4& v, float4& sum) {
  sum.x = fmaf(w, v.x, sum.x), sum.y = fmaf(w, v.y, sum.y);
  sum.z = fmaf(w, v.z, sum.z), sum.w = fmaf(w, v.w, sum.w);
}
__device__ inline void add4(const float4& o, float4& sum) { sum.x += o.x, sum.y += o.y, sum.z += o.z, sum.w += o.w; }

// The merge of the group's heads by the block that computed all their splits, with the merge
// kernel's bits: its kMergeLanes lane groups' sums (group g: splits g, g + kMergeLanes, ... from 0)
// become a thread's kMergeLanes running sums, added in group order.
__device__ void merge_group(const AttentionLaunch& a, const SplitPartials& parts, int kvh, int used, float* weights,
                            uint4* planes) {
  const int D = a.head_dim, group = a.heads / a.kv_heads, warp = threadIdx.x >> 5, columns = D / 4;
  for (int h = warp; h < group; h += blockDim.x >> 5) {
    const float2* ml = parts.ml + int64_t(kvh * group + h) * parts.max_splits;
    float2 ml_lane[kMaxSplits / 32];
#pragma unroll
    for (int j = 0; j < kMaxSplits / 32; ++j) {
      const int s = (threadIdx.x & 31) + 32 * j;
      ml_lane[j] = s < used ? __ldcg(ml + s) : make_float2(-FLT_MAX, 0.0f);
    }
    merge_weights(ml_lane, used, weights + h * used);
  }
  __syncthreads();
  // Every thread runs every round (quantize_block_part's shuffles): columns past the group's idle.
  for (int c0 = 0; c0 < group * columns; c0 += blockDim.x) {
    const int c = c0 + int(threadIdx.x), h = min(c / columns, group - 1), d = 4 * (c % columns);
    const float* acc = parts.acc + int64_t(kvh * group + h) * parts.max_splits * D + d;
    const float* w = weights + h * used;
    float4 sums[kMergeLanes] = {};
    for (int s0 = 0; s0 < used; s0 += kMergeLanes) {
      float4 v[kMergeLanes];
#pragma unroll
      for (int g = 0; g < kMergeLanes; ++g)
        v[g] = s0 + g < used ? __ldcg(reinterpret_cast<const float4*>(acc + int64_t(s0 + g) * D)) : make_float4(0, 0, 0, 0);
#pragma unroll
      for (int g = 0; g < kMergeLanes; ++g)
        if (s0 + g < used) fma4(w[s0 + g], v[g], sums[g]);
    }
#pragma unroll
    for (int g = 1; g < kMergeLanes; ++g) add4(sums[g], sums[0]);
    // The float4's place among the 8 of its block of 32 (the head's columns start at a block).
    store_merged(a, kvh * group + h, d, sums[0], (c % columns) % 8, c < group * columns, planes);
  }
}

// The tiles a split block walks: splits y, y + P, ... below `used`, each one's tiles of kTileKeys
// keys in order. Positions are below 2^31 (the context), so 32-bit.
struct SplitTiles {
  int first, split_keys, stop, step, used;  // the first visible key, keys per split, pos + 1, P
};
// The tile [kb, min(kb + kTileKeys, end)) of split `split`.
struct Tile {
  int split, kb, end;
  __device__ bool valid(const SplitTiles& w) const { return split < w.used; }
  __device__ bool ends_split() const { return kb + kTileKeys >= end; }
  __device__ static Tile first_of(const SplitTiles& w, int split) {
    const int kb = w.first + split * w.split_keys;
    return {split, kb, min(kb + w.split_keys, w.stop)};
  }
  __device__ Tile next(const SplitTiles& w) const {
    if (kb + kTileKeys < end) return {split, kb + kTileKeys, end};
    return split + w.step < w.used ? first_of(w, split + w.step) : Tile{w.used, 0, 0};
  }
};

// Block (kv head, y, sequence) (split_block): splits y, y + P, ... of the sequence's keys, one
// after another, each scored for every query head of the GQA group at once on the tensor cores
// (mma.sync: S^T = K·Q^T with the heads as the mma's 8 columns, then O^T += V^T·P^T), tile by tile
// through shared memory; leaves each split's per-head softmax state (m, l) and unnormalised output
// for the merge, which the block then does itself when merged_in_split. K and V are bf16, Q is
// rounded to bf16 (as the separate head-norm op stores it) and P to bf16, as in prefill; sums are
// float32. A split's arithmetic does not depend on which block takes it.
template <int kHeadTiles, int kWarps>
__global__ void __launch_bounds__(SplitWarps<kWarps>::kThreads, (kSplitMinBlocks<kHeadTiles, kWarps>))
    decode_split_kernel(AttentionLaunch batch, DecodeCaches caches, SplitPartials batch_parts, uint4* planes) {
  constexpr int kOwn = kWarpHeads<kHeadTiles, kWarps>, kDimTiles = SplitWarps<kWarps>::kDimTiles;
  pdl_launch_dependents();
  extern __shared__ __align__(16) uint8_t decode_smem[];
  const SplitBlock block = split_block(batch_parts);
  const AttentionLaunch a = sequence_launch(batch, caches, block.sequence);
  const SplitPartials parts = sequence_partials(batch_parts, batch, block.sequence);
  const int D = a.head_dim, group = a.heads / a.kv_heads, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int kvh = block.kvh, y = block.y;
  const DecodeSmem<kHeadTiles, kWarps> lay(D);
  bf16* ks = reinterpret_cast<bf16*>(decode_smem + lay.k);
  bf16* vs = reinterpret_cast<bf16*>(decode_smem + lay.v);
  bf16* qs = reinterpret_cast<bf16*>(decode_smem + lay.q);
  float* scores = reinterpret_cast<float*>(decode_smem + lay.scores);
  bf16* p = reinterpret_cast<bf16*>(decode_smem + lay.p);
  float* alphas = reinterpret_cast<float*>(decode_smem + lay.alpha);
  bf16* fresh_k = reinterpret_cast<bf16*>(decode_smem + lay.fresh_k);
  bf16* fresh_v = reinterpret_cast<bf16*>(decode_smem + lay.fresh_v);
  pdl_wait();
  const int pos = launch_position(a, 0), first = int(first_key(pos, a.window));
  const int fresh = a.cache_only ? -1 : pos;  // the key whose K/V the launch brings (none: all cached)
  const int split_keys = split_keys_at(pos, a.window, parts.max_splits);
  if (first + y * split_keys > pos) return;  // empty splits only: the merge does not read them
  const int used = used_splits(pos, a.window, split_keys);
  const SplitTiles walk{first, split_keys, pos + 1, parts.blocks_per_head, used};
  // The next tile is computed where it is needed: held in a variable across the loop, it cost 30
  // registers (4 blocks a multiprocessor instead of 5).
  Tile tile = Tile::first_of(walk, y);
  // K and V of a tile are separate copy groups, so that each is waited for only where it is used:
  // V's copies run under the scores and the softmax, the next K's under the softmax and P·V.
  auto stage = [&](const bf16* cache, const Tile& t, bf16* rows) {
    if (t.valid(walk)) stage_tile(a, cache, t.kb, t.end - 1, fresh, kvh, rows, lay.ld);
    cp_async_commit();  // empty past the last tile, so that the counts below hold
  };
  stage(a.k_cache, tile, ks);  // in flight while the queries (and the new K/V) are read
  stage(a.v_cache, tile, vs);
  load_queries<kHeadTiles>(a, pos, kvh, qs, lay.ld);
  if (!a.cache_only && (used - 1 - y) % parts.blocks_per_head == 0)
    make_fresh_row(a, pos, kvh, fresh_k, fresh_v);  // the last split is ours
  __syncthreads();  // the new K/V rows (normed by two warps) visible to place_fresh_row's threads
  const float scale_log2 = a.scale * 1.4426950408889634f;
  float m[kOwn], l[kOwn], o[kDimTiles][kHeadTiles][4];
  auto reset = [&] {
#pragma unroll
    for (int i = 0; i < kOwn; ++i) m[i] = -INFINITY, l[i] = 0.0f;
#pragma unroll
    for (int t = 0; t < kDimTiles; ++t)
#pragma unroll
      for (int nt = 0; nt < kHeadTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[t][nt][e] = 0.0f;
  };
  // The state of the heads this warp's softmax owns, then the outputs of its dim tiles.
  auto store_split = [&](int split) {
#pragma unroll
    for (int i = 0; i < kOwn; ++i) {
      const int h = warp * kOwn + i;
      if (h < group && lane == 0)
        parts.ml[int64_t(kvh * group + h) * parts.max_splits + split] = make_float2(m[i] * a.scale, l[i]);
    }
#pragma unroll
    for (int t = 0; t < kDimTiles; ++t) {
      const int d = (warp + kWarps * t) * 16 + (lane >> 2);
      if (d >= D) break;
#pragma unroll
      for (int nt = 0; nt < kHeadTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = nt * 8 + 2 * (lane & 3) + (e & 1);
          if (h < group)
            parts.acc[(int64_t(kvh * group + h) * parts.max_splits + split) * D + d + 8 * (e >> 1)] = o[t][nt][e];
        }
    }
  };
  reset();
  while (tile.valid(walk)) {
    cp_async_wait_group<1>();  // this tile's K (its V may still be in flight)
    place_fresh_row(tile.kb, fresh, D, lay.ld, fresh_k, ks);
    __syncthreads();  // K (and the queries) visible to every warp
    tile_scores(lay, ks, qs, scores, D);
    __syncthreads();  // K consumed, the scores complete
    stage(a.k_cache, tile.next(walk), ks);
    tile_softmax<kHeadTiles, kWarps>(tile.kb, tile.end, group, scale_log2, scores, p, alphas, m, l);
    cp_async_wait_group<1>();  // this tile's V (the next K may still be in flight)
    place_fresh_row(tile.kb, fresh, D, lay.ld, fresh_v, vs);
    __syncthreads();  // V, P and alpha visible to every warp
    tile_values(lay, vs, p, alphas, D, o);
    __syncthreads();  // V consumed
    stage(a.v_cache, tile.next(walk), vs);
    if (tile.ends_split()) {
      store_split(tile.split);
      reset();
    }
    tile = tile.next(walk);
  }
  if (!merged_in_split(parts, used, group, D)) return;
  __syncthreads();  // every split's partials stored (and the tiles' shared memory free: no copy pending)
  merge_group(a, parts, kvh, used, reinterpret_cast<float*>(decode_smem + lay.k), planes);
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
    return s < parts.launched && d < D ? __ldcg(reinterpret_cast<const float4*>(acc + int64_t(s) * D))
                                         : make_float4(0, 0, 0, 0);
  };
  pdl_wait();
  const int64_t pos = launch_position(a, 0);
  float2 ml_lane[kMaxSplits / 32];  // warp 0: lane holds splits lane + 32j
  if (threadIdx.x < 32)
#pragma unroll
    for (int j = 0; j < kMaxSplits / 32; ++j) {
      const int s = threadIdx.x + 32 * j;
      ml_lane[j] = s < parts.launched ? __ldcg(ml + s) : make_float2(-FLT_MAX, 0.0f);
    }
  float4 v[kMergeLoads];
#pragma unroll
  for (int u = 0; u < kMergeLoads; ++u) v[u] = load_acc(lane_group + u * kMergeLanes);
  const int used = used_splits(int(pos), a.window, split_keys_at(int(pos), a.window, parts.max_splits));
  if (merged_in_split(parts, used, a.heads / a.kv_heads, D)) return;  // the split kernel merged them
  if (threadIdx.x < 32) merge_weights(ml_lane, used, weights);
  __syncthreads();
  float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int s0 = lane_group; s0 < used; s0 += kMergeLanes * kMergeLoads) {
    if (s0 != lane_group)  // later rounds (more than kMergeLanes * kMergeLoads splits)
#pragma unroll
      for (int u = 0; u < kMergeLoads; ++u) v[u] = load_acc(s0 + u * kMergeLanes);
#pragma unroll
    for (int u = 0; u < kMergeLoads; ++u) {
      const int s = s0 + u * kMergeLanes;
      if (s < used) fma4(weights[s], v[u], sum);
    }
  }
  sums[lane_group][column] = sum;
  __syncthreads();
  if (lane_group != 0) return;  // warp 0 writes the block's dims
  for (int g = 1; g < kMergeLanes; ++g) add4(sums[g][column], sum);
  store_merged(a, head, d, sum, column % 8, d < D, planes);
}

}  // namespace

int64_t decode_partial_floats(const AttentionLaunch& a, int max_splits) {
  return int64_t(a.heads) * max_splits * (a.head_dim + 2);
}

int decode_attention_splits(int64_t position, int window, int max_splits) {
  const int pos = int(position);
  return used_splits(pos, window, split_keys_at(pos, window, max_splits));
}

namespace {

// One split kernel's launch: its threads and shared memory follow from its template arguments.
// Sets parts.blocks_per_head (the merge decision reads it): every split its own block when the GPU
// holds them all at once; else the fewest blocks per (kv head, sequence) that still fill it, each
// taking every P-th split.
template <int kHeadTiles, int kWarps>
void launch_split(const AttentionLaunch& a, const DecodeCaches& caches, SplitPartials& parts, uint4* planes,
                  cudaStream_t stream, bool sequences_fastest) {
  auto* kernel = decode_split_kernel<kHeadTiles, kWarps>;
  const int threads = SplitWarps<kWarps>::kThreads;
  const size_t smem = DecodeSmem<kHeadTiles, kWarps>(a.head_dim).total;
  const int64_t heads = int64_t(a.kv_heads) * caches.sequences, blocks = int64_t(parts.launched) * heads;
  const int64_t resident = resident_blocks(reinterpret_cast<const void*>(kernel), threads, smem);
  parts.blocks_per_head = blocks <= resident ? parts.launched : int(ceil_div(parts.launched, ceil_div(blocks, resident)));
  const unsigned kv_heads = unsigned(a.kv_heads), p = unsigned(parts.blocks_per_head), z = unsigned(caches.sequences);
  launch_kernel("decode_split_kernel", kernel, sequences_fastest ? dim3(z, kv_heads, p) : dim3(kv_heads, p, z), threads,
                smem, stream, Pdl::kOn, a, caches, parts, planes);
}

// The split kernel over caches.sequences sequences (grid order: SplitPartials::sequences_fastest),
// then the merge unless the split blocks merge themselves.
void launch_splits_and_merge(const AttentionLaunch& a, const DecodeCaches& caches, float* partials, int max_splits,
                             uint4* planes, cudaStream_t stream, int splits_bound, bool sequences_fastest) {
  check_attention_shape(a);
  G4_CHECK(!planes || (caches.sequences == 1 && a.head_dim % packed::kBlock == 0),
           "decode attention: quantized planes need one sequence and heads of whole blocks");
  G4_CHECK(max_splits <= kMaxSplits, "decode attention: at most 256 splits");
  G4_CHECK(caches.sequences >= 1 && caches.sequences <= kMaxDecodeSequences,
           "decode attention: 1 to " + std::to_string(kMaxDecodeSequences) + " sequences per launch");
  G4_CHECK(a.scale > 0.0f, "decode attention: the softmax scale must be positive");
  SplitPartials parts;
  parts.max_splits = max_splits;
  parts.acc = partials;
  parts.ml = reinterpret_cast<float2*>(partials + int64_t(a.heads) * max_splits * a.head_dim);
  parts.sequences_fastest = sequences_fastest;
  // Keys a query can see span at most the window (ring) or the capacity (flat cache); a split
  // holds at least one tile of them (split_keys_at).
  const int64_t span = a.window ? a.window : a.capacity();
  int splits = int(std::min<int64_t>(max_splits, ceil_div(span, int64_t(kTileKeys))));
  if (splits_bound > 0) splits = std::min(splits, splits_bound);  // past it every split is empty
  parts.launched = splits;  // the merge loads no more (at 64 sequences the loads were most of its time)
  const int group = a.heads / a.kv_heads;
  const int D = a.head_dim;
  if (group <= 8 && D > kWideHeadDim) launch_split<1, 8>(a, caches, parts, planes, stream, sequences_fastest);
  else if (group <= 8) launch_split<1, 4>(a, caches, parts, planes, stream, sequences_fastest);
  else if (group <= 16) launch_split<2, 4>(a, caches, parts, planes, stream, sequences_fastest);
  else launch_split<4, 4>(a, caches, parts, planes, stream, sequences_fastest);
  if (merged_in_split(parts, splits, group, a.head_dim)) return;  // at every position this launch can be at
  launch_kernel("decode_merge_kernel", decode_merge_kernel,
                dim3(unsigned(a.heads), unsigned(ceil_div(int64_t(a.head_dim), int64_t(kMergeDims))),
                     unsigned(caches.sequences)),
                kMergeColumns * kMergeLanes, 0, stream, Pdl::kOn, a, caches, parts, planes);
}

}  // namespace

void launch_decode_attention(const AttentionLaunch& a, const DecodeCaches& caches, float* partials, int max_splits,
                             uint4* planes, cudaStream_t stream, int splits_bound) {
  launch_splits_and_merge(a, caches, partials, max_splits, planes, stream, splits_bound, false);
}

void launch_chunk_on_decode_kernels(const AttentionLaunch& a, float* partials, int max_splits, cudaStream_t stream,
                                    int splits_bound) {
  G4_CHECK(a.T >= 2 && a.T <= kMaxDecodeSequences && a.q_first == 0 && !a.cache_only && !a.norm_inputs,
           "decode kernels: a chunk of 2 to " + std::to_string(kMaxDecodeSequences) +
               " normed query rows with keys of their own");
  G4_CHECK(a.window == 0 || a.T <= a.capacity() - a.window,
           "decode kernels: the chunk's keys would overwrite keys its first rows still see");
  launch_store_kv(a, stream);
  DecodeCaches caches;  // every row reads the one cache (its own keys stored by now)
  caches.sequences = int(a.T);
  for (int z = 0; z < caches.sequences; ++z) {
    caches.k[z] = a.k_cache;
    caches.v[z] = a.v_cache;
    caches.table[z] = a.page_table;
  }
  launch_splits_and_merge(a, caches, partials, max_splits, nullptr, stream, splits_bound, true);
}

}  // namespace g4
