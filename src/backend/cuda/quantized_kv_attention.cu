// Attention over KV caches of quantized rows (Q8_0, TQ4): the CUDA form of the CPU reference's
// (backend/cpu/attention.h). A store kernel encodes the chunk's K/V rows into the cache rows of
// their positions; then the attention kernel reads every key and value from the cache as stored,
// Q8_0 blocks scaled in place and TQ4 codes in the rotated space (quant/tq4.h: each query rotated
// once, the values' weighted sum rotated back once), never a decoded copy of the cache.
//
// The attention kernel's block (kv head, column tile, split, sequence) walks tiles of 64 keys
// staged in shared memory with cp.async (the next tile's copies in flight under the current one)
// and scores them against its columns, (query, head) pairs of one KV group: the group's heads of a
// decode token (8 a block), or 32 pairs of a prefill chunk. On the tensor cores (mma.sync
// m16n8k16, f16 operands, float32 sums) with the keys as the mma's rows, S^T = K·Q^T and
// O^T += V^T·P^T: a warp scores 16 keys over every head dim, one softmax warp per 2 (decode) or 8
// (prefill) columns turns a tile's scores into P, and a warp accumulates its 64-dim groups of O
// (at head dims below 256, over its share of the tile's keys: the shares are added at the end).
// The cache bytes become the mma's A fragments in registers: a TQ4 byte (two codes) becomes its
// two f16 levels through a 256-entry table in shared memory, one copy per lane so that a warp's
// lookups never meet in a bank; a pair of Q8_0 int8 becomes f16 exactly. Each thread's share of a
// tile is a whole 32-bit word of a row (K: 8 dims of one key; V: 8 dims of four keys), so the head
// dims of the mma are a permutation of the cache's, undone where the sums are read: the sums do not
// depend on the order of their terms' dims.
//
// Numerics: q (TQ4: q_rot, rotated in float in the host's butterfly order) enters the mma in f16
// scaled by a power of two per column, so that its largest value is near 2^15; the TQ4 levels in
// f16; P in f16, times each value's scale over the running largest value scale (TQ4: the norms;
// Q8_0: the block scales, folded into V's f16 values), so that every f16 operand is at most 1 in
// magnitude and O is rescaled when that largest scale grows, as it is by the softmax's running
// max. Errors: 2^-11 relative per operand, below the bf16 output's 2^-9.
//
// Decode splits the visible keys over up to 128 splits of whole tiles, by the position alone, so a
// captured graph replays at any position and a sequence's bits do not depend on its batch; a merge
// kernel adds the splits in a fixed order (and rotates TQ4 back). A prefill block walks every key
// its columns see and writes its outputs itself.
#include <cuda_fp16.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <string>
#include <type_traits>

#include "backend/backend.h"
#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/quantized_kv_kernels.h"
#include "backend/cuda/warp_reduce.cuh"
#include "quant/tq4.h"

namespace g4 {

namespace {

constexpr int kTileKeys = 64;           // keys staged a step: 16 per warp when scoring
constexpr int kPrefillColumnTiles = 4;  // a prefill block's columns: 4 mma tiles of 8
constexpr int kMaxSplits = 128;         // the merge holds the splits' weights, 4 per lane of a warp
constexpr int kMergeThreads = 512;      // a merge block: (D / 4 four-dim columns) x (split-lanes)
constexpr int kMergeBatch = 16;         // a merge thread's float4 loads in flight at most
constexpr int kStoreWarps = 4;
constexpr float kLog2e = 1.4426950408889634f;

__constant__ float tq4_levels[tq4::kLevels];                  // tq4::codebook_f32()
__constant__ double tq4_bounds[tq4::kLevels - 1];             // tq4::boundaries()
__constant__ uint32_t tq4_signs[kMaxAttentionHeadDim / 32];  // bit i % 32 of word i / 32: tq4::sign(i) < 0

__device__ inline bool tq4_negative(int i) { return (tq4_signs[i >> 5] >> (i & 31)) & 1u; }

// Sequence z's arguments: its rows of the launch's tensors and its page table (QuantizedKvLaunch).
__device__ inline AttentionLaunch sequence_of(const QuantizedKvLaunch& q, int z) {
  AttentionLaunch a = q.a;
  const int64_t queries = a.T - a.q_first;
  a.q += z * queries * a.q_stride;
  a.out += z * queries * a.out_stride;
  a.k_new += z * a.T * a.kv_stride;
  a.v_new += z * a.T * a.kv_stride;
  a.positions += z * a.T;
  a.page_table = q.caches.table[z];
  return a;
}

// Keys per decode split at `pos`: the visible keys spread over all max_splits in whole tiles.
// Positions are below 2^31 (the context).
__host__ __device__ inline int split_keys_at(int pos, int window, int max_splits) {
  const int visible = pos + 1 - int(first_key(pos, window)), per_round = max_splits * kTileKeys;
  const int keys = (visible + per_round - 1) / per_round * kTileKeys;
  return keys > kTileKeys ? keys : kTileKeys;
}

__host__ __device__ inline int used_splits(int pos, int window, int split_keys) {
  return (pos - int(first_key(pos, window))) / split_keys + 1;
}

// The unnormalised Walsh–Hadamard transform of a warp's 32 N values, lane l holding [l N, l N + N),
// in quant/tq4.cpp's butterfly order: stage h makes each pair (j, j + h) (a + b, a - b), in
// registers while h < N and across lanes l, l ^ h / N after. Each value has the host's bits: the
// same operations on the same operands, stage by stage.
template <int N, typename T>
__device__ inline void warp_hadamard(T (&v)[N]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int h = 1; h < N; h *= 2)
#pragma unroll
    for (int i = 0; i < N; ++i)
      if ((i & h) == 0) {
        const T x = v[i], y = v[i + h];
        v[i] = x + y;
        v[i + h] = x - y;
      }
#pragma unroll
  for (int m = 1; m < 32; m *= 2)
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const T other = __shfl_xor_sync(0xffffffffu, v[i], m);
      v[i] = lane & m ? other - v[i] : v[i] + other;
    }
}

// S: a warp's values negated where tq4::sign is -1 (lane l holds [l N, l N + N)).
template <int N, typename T>
__device__ inline void apply_tq4_signs(T (&v)[N]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < N; ++i)
    if (tq4_negative(lane * N + i)) v[i] = -v[i];
}

// util/half.h's f32_to_bf16: round to nearest even, a NaN kept (made quiet).
__device__ inline uint16_t bf16_bits(float f) {
  uint32_t bits = __float_as_uint(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

__device__ inline float bf16_bits_to_float(uint32_t bits) { return __uint_as_float(bits << 16); }

// ---- the store ----

// Head vector x (D bf16 values) as TQ4 by one warp, tq4::encode's double arithmetic: D / 2 code
// bytes at `codes`, the norm's bf16 at `norm`. The host sums the squares in index order, the warp
// by a tree: the same double unless the squares' exponents span more than its mantissa holds.
template <int D>
__device__ void encode_tq4_head(const bf16* x, uint8_t* codes, uint8_t* norm) {
  constexpr int N = D / 32;
  const int lane = threadIdx.x & 31;
  double v[N];
  double total = 0.0;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    v[i] = double(__bfloat162float(x[lane * N + i]));
    total += v[i] * v[i];  // exact products: a fused add rounds the same
  }
  total = warp_reduce<SumOp>(total);
  const double r = sqrt(total);
  apply_tq4_signs(v);
  warp_hadamard(v);
  uint64_t packed = 0;  // code 2i in the low nibble of byte i
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const double z = r > 0 ? v[i] / r : 0.0;
    uint64_t code = 0;
#pragma unroll
    for (int b = 0; b < tq4::kLevels - 1; ++b) code += z > tq4_bounds[b] ? 1 : 0;
    packed |= code << (4 * i);
  }
  uint8_t* dst = codes + lane * (N / 2);
  if constexpr (N == 2) *dst = uint8_t(packed);
  else if constexpr (N == 4) *reinterpret_cast<uint16_t*>(dst) = uint16_t(packed);
  else if constexpr (N == 8) *reinterpret_cast<uint32_t*>(dst) = uint32_t(packed);
  else *reinterpret_cast<uint64_t*>(dst) = packed;
  if (lane == 0) *reinterpret_cast<uint16_t*>(norm) = bf16_bits(__double2float_rn(r));
}

// One Q8_0 block by one warp, lane i holding value i: quant/legacy_blocks.cpp's encode_q8_0 (IEEE
// division, no fused multiply), or, for a block with a non-finite value, a NaN scale and zero
// quants (cpu::encode_kv_row).
__device__ void encode_q8_0_block(float x, uint8_t* block) {
  const int lane = threadIdx.x & 31;
  int quant = 0;
  uint16_t scale = 0x7e00;  // util/half.h's f32_to_f16 of a quiet NaN
  if (__all_sync(0xffffffffu, isfinite(x))) {
    const float amax = warp_reduce<MaxOp>(fabsf(x));
    const float d = __fdiv_rn(amax, 127.0f);
    const float inverse = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    quant = int(roundf(__fmul_rn(x, inverse)));
    scale = __half_as_ushort(__float2half_rn(d));
  }
  block[2 + lane] = uint8_t(int8_t(quant));
  if (lane == 0) *reinterpret_cast<uint16_t*>(block) = scale;  // blocks start 2-byte aligned
}

// Block (jobs, sequence z): warp job j = (token t, K or V, kv head h) encodes that head vector of
// sequence z's new row t into the cache row of its position. The warp of a TQ4 row's first head of
// K or V also zeroes the row's padding, so that a page's bytes depend on its values alone.
template <DType kType, int D>
__global__ void __launch_bounds__(kStoreWarps * 32) store_quantized_kv_kernel(QuantizedKvLaunch q) {
  pdl_launch_dependents();
  const int z = int(blockIdx.y), lane = threadIdx.x & 31;
  const AttentionLaunch a = sequence_of(q, z);
  const int64_t job = int64_t(blockIdx.x) * kStoreWarps + (threadIdx.x >> 5);
  if (job >= a.T * 2 * a.kv_heads) return;
  const int h = int(job % a.kv_heads), is_v = int(job / a.kv_heads % 2);
  const int64_t t = job / (2 * a.kv_heads);
  pdl_wait();
  uint8_t* row = (is_v ? q.caches.v[z] : q.caches.k[z]) + cache_row(a, a.positions[t]) * q.row_bytes;
  const bf16* x = (is_v ? a.v_new : a.k_new) + t * a.kv_stride + int64_t(h) * D;
  if constexpr (kType == DType::TQ4) {
    encode_tq4_head<D>(x, row + int64_t(h) * (D / 2), row + int64_t(a.kv_heads) * (D / 2) + 2 * h);
    if (h == 0)
      for (int64_t i = int64_t(a.kv_heads) * (D / 2 + 2) + lane; i < q.row_bytes; i += 32) row[i] = 0;
  } else {
    uint8_t* head = row + int64_t(h) * (D / 32) * 34;
    for (int b = 0; b < D / 32; ++b) encode_q8_0_block(__bfloat162float(x[32 * b + lane]), head + 34 * b);
  }
}

// ---- the attention kernel ----

// d += A·B for one warp's 16x8 tile over k = 16, f16 in, float32 sums (mma.cuh's fragment layout).
__device__ inline void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

union F16x2 {
  uint32_t bits;
  __half2 value;
};

// Bytes b0, b2 of `biased` (int8 + 128, bytes b1, b3 0x64) as f16x2: 1024 + 128 + x in f16, less
// 1152, exactly x.
__device__ inline __half2 unbias_f16x2(uint32_t biased) {
  F16x2 v;
  v.bits = biased;
  return __hsub2(v.value, __float2half2_rn(1152.0f));
}

__device__ inline uint32_t f16x2_bits(__half2 h) {
  F16x2 v;
  v.value = h;
  return v.bits;
}

// The two int8 at p (2-byte aligned) as f16x2, the first low.
__device__ inline uint32_t int8_pair_at(const uint8_t* p) {
  const uint32_t pair = *reinterpret_cast<const uint16_t*>(p);
  return f16x2_bits(unbias_f16x2(__byte_perm(pair ^ 0x8080u, 0x64646464u, 0x4140)));
}

// Two keys' int8 pairs a and b (low 16 bits each): (a0, b0) and (a1, b1) as f16x2 times `scale`.
__device__ inline void int8_columns_to_f16x2(uint32_t a, uint32_t b, __half2 scale, uint32_t& first,
                                             uint32_t& second) {
  const uint32_t mixed = __byte_perm(a, b, 0x5140) ^ 0x80808080u;  // a0, b0, a1, b1, each + 128
  first = f16x2_bits(__hmul2(unbias_f16x2(__byte_perm(mixed, 0x64646464u, 0x4140)), scale));
  second = f16x2_bits(__hmul2(unbias_f16x2(__byte_perm(mixed, 0x64646464u, 0x4342)), scale));
}

__device__ inline float f16_at(const uint8_t* p) { return __half2float(*reinterpret_cast<const __half*>(p)); }
__device__ inline uint32_t u16_at(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }
__device__ inline uint32_t u32_at(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// The f16 levels of the two codes of byte `byte` of `word` (the low nibble's first), from this
// lane's copy of the table: entry e's copy l is word 32 e + l, so a warp's lookups hit 32 banks.
__device__ inline uint32_t level_pair(const uint32_t* lane_table, uint32_t word, int byte) {
  return lane_table[((word >> (8 * byte)) & 0xffu) * 32];
}

// The table of level pairs: entry e = (f16 level of code e & 15, f16 level of code e >> 4), 32 copies.
template <int kWarps>
__device__ void build_level_pairs(uint32_t* table) {
  const int lane = threadIdx.x & 31;
  const uint32_t level = lane < tq4::kLevels ? __half_as_ushort(__float2half_rn(tq4_levels[lane])) : 0u;
  for (int e = threadIdx.x >> 5; e < 256; e += kWarps)
    table[e * 32 + lane] = __shfl_sync(0xffffffffu, level, e & 15) | __shfl_sync(0xffffffffu, level, e >> 4) << 16;
}

// A head's part of a cache row as the attention kernel stages it: TQ4 its codes (the norm apart),
// Q8_0 its blocks. The pitch of the staged rows puts the fragment loads of a warp in distinct banks
// (TQ4: 4 mod 32 words) and keeps each row 16-byte aligned.
template <DType kType, int D>
struct HeadRows {
  static constexpr bool kTq4 = kType == DType::TQ4;
  static constexpr int kBytes = kTq4 ? D / 2 : D / 32 * 34;
  static constexpr int kPitch = kTq4 ? kBytes + 16 : (kBytes + 15) / 16 * 16 + 16;
  static constexpr int kTableBytes = kTq4 ? 256 * 32 * 4 : 0;
};

// A column's visible keys [lo, hi] (empty for a padding column) and its scores' factor: the
// softmax scale in base 2 over the power of two its query was scaled by.
struct ColumnInfo {
  int lo, hi;
  float factor;
};

constexpr size_t align16(size_t n) { return (n + 15) / 16 * 16; }

// The attention block's shape and shared memory, by row type, head dim and mode. A decode block of
// head dim 512 has 8 warps, two over each 16-key group's head dims (kDimParts): with 4, a block's
// 168 registers a thread and its shared memory left 2 warps a scheduler, too few to hide the
// copies' and the table lookups' latency (ncu: 0.44 instructions issued a cycle a scheduler, 40 %
// of DRAM bandwidth at 131 072 positions; docs/PERF.md).
template <DType kType, int D, bool kDecode>
struct Tile {
  using Rows = HeadRows<kType, D>;
  static constexpr int kWarps = kDecode && D == 512 ? 8 : 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kMinBlocks = kWarps == 8 ? 2 : 1;  // 8 warps: at most 128 registers a thread
  static constexpr int kDimParts = kWarps / 4;            // warps over a 16-key group's head dims
  static constexpr int kColumnTiles = kDecode ? 1 : kPrefillColumnTiles;
  static constexpr int kColumns = 8 * kColumnTiles;
  static constexpr int kChunks = D / 32;  // 32-dim chunks of a score's sum (a Q8_0 block each)
  static constexpr int kPartChunks = kChunks / kDimParts;  // a warp's chunks of a score
  static constexpr int kGroups = D / 64;  // 64-dim groups of O
  static constexpr int kGroupWarps = kGroups < kWarps ? kGroups : kWarps;  // warps across the groups ...
  static constexpr int kSlices = kWarps / kGroupWarps;                     // ... and across the keys
  static constexpr int kWarpGroups = kGroups / kGroupWarps;                // groups a warp owns
  static constexpr int kSliceSteps = kTileKeys / 16 / kSlices;             // 16-key mma steps a slice
  static constexpr int kOwnedColumns = kColumns / kWarps;                  // softmax columns a warp owns
  static constexpr int kQPitch = D + 32;  // f16: a quarter warp's 16-byte loads in distinct banks
  static constexpr int kScorePitch = kTileKeys + 4, kPPitch = kTileKeys + 8;  // conflict-free columns
  static constexpr size_t kTable = 0;
  static constexpr size_t kStage = kTable + Rows::kTableBytes;  // [2][K, V][kTileKeys] rows
  static constexpr size_t kStageBytes = size_t(2) * kTileKeys * Rows::kPitch;
  static constexpr size_t kNorms = kStage + 2 * kStageBytes;  // TQ4: uint32 [2][K, V][kTileKeys]
  static constexpr size_t kRows = kNorms + (Rows::kTq4 ? size_t(2) * 2 * kTileKeys * 4 : 0);  // int64 [2][kTileKeys]
  static constexpr size_t kInfo = kRows + size_t(2) * kTileKeys * 8;
  static constexpr size_t kAlpha = align16(kInfo + kColumns * sizeof(ColumnInfo));  // float [kColumns]
  static constexpr size_t kVMax = align16(kAlpha + kColumns * 4);                    // float [kWarps]
  static constexpr size_t kQ = align16(kVMax + kWarps * 4);                          // f16 [kColumns][kQPitch]
  static constexpr size_t kQBytes = size_t(kColumns) * kQPitch * 2;
  // Decode keeps its queries in registers once they are loaded: the scores take their place.
  // float [kDimParts][kColumns][kScorePitch]: each part's sums over its dims.
  static constexpr size_t kScores = kDecode ? kQ : kQ + kQBytes;
  static constexpr size_t kP = kScores + size_t(kDimParts) * kColumns * kScorePitch * 4;  // f16 [kColumns][kPPitch]
  static constexpr size_t kEnd = std::max(kP + size_t(kColumns) * kPPitch * 2, kQ + kQBytes);
  // After the last tile, each key slice's O at 0: float [kSlices][kColumns][D].
  static constexpr size_t kOutBytes = size_t(kSlices) * kColumns * D * 4;
  static constexpr size_t kBytes = std::max(kEnd, kOutBytes);
};

// Issues the copies of a tile's K and V heads (`rows`: byte offsets of the keys' cache rows, -1
// for none: zeros) in units of kUnit bytes, `head` bytes into each row.
template <int kThreads, int kUnit, int kBytes, int kPitch>
__device__ inline void stage_heads(const uint8_t* k_rows, const uint8_t* v_rows, const int64_t* rows, int64_t head,
                                   uint8_t* dst) {
  constexpr int kUnits = kBytes / kUnit;
  for (int i = threadIdx.x; i < 2 * kTileKeys * kUnits; i += kThreads) {
    const int is_v = i / (kTileKeys * kUnits), key = i / kUnits % kTileKeys, u = i % kUnits;
    const int64_t row = rows[key];
    const uint8_t* base = is_v ? v_rows : k_rows;
    const uint8_t* src = row >= 0 ? base + row + head + u * kUnit : base;
    const uint32_t to = shared_addr(dst + (is_v * kTileKeys + key) * kPitch + u * kUnit);
    if constexpr (kUnit == 16) cp_async16(to, src, row >= 0);
    else cp_async4(to, src, row >= 0);
  }
}

// Block (kv head and column tile, split, sequence): the columns [first_column, first_column + 8 T)
// (T = the mma column tiles) of its KV group over the keys its split holds (decode) or its columns
// see (prefill), tile by tile; decode leaves each column's split state (unnormalised O, m, l) in
// `partials` for the merge, prefill writes the outputs.
template <DType kType, int D, bool kDecode>
__global__ void __launch_bounds__(Tile<kType, D, kDecode>::kThreads, Tile<kType, D, kDecode>::kMinBlocks)
    quantized_attention_kernel(QuantizedKvLaunch q, float* partials,
                                                                      int max_splits) {
  using L = Tile<kType, D, kDecode>;
  using Rows = typename L::Rows;
  constexpr bool kTq4 = Rows::kTq4;
  constexpr int NT = L::kColumnTiles, kColumns = L::kColumns, N = D / 32, kThreads = L::kThreads;
  extern __shared__ __align__(16) uint8_t smem[];
  pdl_launch_dependents();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  if constexpr (kTq4) build_level_pairs<L::kWarps>(reinterpret_cast<uint32_t*>(smem + L::kTable));
  const uint32_t* lane_table = reinterpret_cast<const uint32_t*>(smem + L::kTable) + lane;
  const int z = int(blockIdx.z);
  const AttentionLaunch a = sequence_of(q, z);
  const uint8_t *k_rows = q.caches.k[z], *v_rows = q.caches.v[z];
  const int group = a.heads / a.kv_heads, columns = int(a.T - a.q_first) * group;
  const int column_tiles = (columns + kColumns - 1) / kColumns;
  const int kvh = int(blockIdx.x) / column_tiles, first_column = int(blockIdx.x) % column_tiles * kColumns;
  pdl_wait();
  const int query_pos0 = launch_position(a, 0) + int(a.q_first);
  const int last_column = min(columns, first_column + kColumns) - 1;
  const int p_first = query_pos0 + first_column / group, p_last = query_pos0 + last_column / group;
  int key_begin = int(first_key(p_first, a.window)), key_end = p_last + 1;
  const int split = int(blockIdx.y);
  if constexpr (kDecode) {
    const int split_keys = split_keys_at(p_last, a.window, max_splits);
    key_begin += split * split_keys;
    if (key_begin > p_last) return;  // an empty split: the merge does not read it
    key_end = min(key_end, key_begin + split_keys);
  }
  const int tiles = (key_end - key_begin + kTileKeys - 1) / kTileKeys;

  int64_t* tile_rows = reinterpret_cast<int64_t*>(smem + L::kRows);
  const uint32_t* norms = reinterpret_cast<const uint32_t*>(smem + L::kNorms);
  // The cache rows of tile t's keys into tile_rows[buffer].
  auto find_rows = [&](int t, int buffer) {
    const int kp = key_begin + t * kTileKeys + int(threadIdx.x);
    if (threadIdx.x < kTileKeys)
      tile_rows[buffer * kTileKeys + threadIdx.x] = kp < key_end ? cache_row(a, kp) * q.row_bytes : -1;
  };
  const bool rows_aligned = ((uintptr_t(k_rows) | uintptr_t(v_rows) | uint64_t(q.row_bytes)) & 15) == 0;
  // The copies of the tile whose rows are tile_rows[buffer] into stage buffer `buffer`, one group.
  auto stage_tile = [&](int buffer) {
    const int64_t* rows = tile_rows + buffer * kTileKeys;
    uint8_t* dst = smem + L::kStage + buffer * L::kStageBytes;
    const int64_t head = int64_t(kvh) * Rows::kBytes;
    if constexpr (kTq4) {
      stage_heads<kThreads, 16, Rows::kBytes, Rows::kPitch>(k_rows, v_rows, rows, head, dst);
      if (threadIdx.x < 2 * kTileKeys) {  // the norms of kv heads kvh & ~1 and kvh | 1, K then V
        const int is_v = threadIdx.x / kTileKeys, key = threadIdx.x % kTileKeys;
        const int64_t row = rows[key];
        const uint8_t* base = is_v ? v_rows : k_rows;
        const int64_t at = int64_t(a.kv_heads) * Rows::kBytes + 4 * (kvh / 2);
        cp_async4(shared_addr(smem + L::kNorms + ((buffer * 2 + is_v) * kTileKeys + key) * 4),
                  row >= 0 ? base + row + at : base, row >= 0);
      }
    } else {
      bool whole_units = false;  // 16-byte copies where the rows allow them
      if constexpr (Rows::kBytes % 16 == 0) {
        whole_units = rows_aligned;
        if (whole_units) stage_heads<kThreads, 16, Rows::kBytes, Rows::kPitch>(k_rows, v_rows, rows, head, dst);
      }
      if (!whole_units) stage_heads<kThreads, 4, Rows::kBytes, Rows::kPitch>(k_rows, v_rows, rows, head, dst);
    }
    cp_async_commit();
  };
  // Norm of key `key` of the staged buffer (is_v: its V), bf16 to float.
  auto norm_of = [&](int buffer, int is_v, int key) {
    const uint32_t pair = norms[(buffer * 2 + is_v) * kTileKeys + key];
    return bf16_bits_to_float(kvh & 1 ? pair >> 16 : pair & 0xffffu);
  };

  find_rows(0, 0);
  __syncthreads();
  stage_tile(0);
  find_rows(1, 1);

  // The queries of the columns this warp owns, as f16 rows scaled by a power of two (TQ4: rotated
  // first), and each column's visible keys and score factor.
  ColumnInfo* info = reinterpret_cast<ColumnInfo*>(smem + L::kInfo);
  __half* qs = reinterpret_cast<__half*>(smem + L::kQ);
#pragma unroll 1
  for (int i = 0; i < L::kOwnedColumns; ++i) {
    const int col = warp * L::kOwnedColumns + i, column = first_column + col;
    const bool valid = column < columns;
    const int query = column / group, head = kvh * group + column % group;
    float v[N];
    const bf16* src = a.q + int64_t(query) * a.q_stride + int64_t(head) * D + lane * N;
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = valid ? __bfloat162float(src[k]) : 0.0f;
    if constexpr (kTq4) {
      apply_tq4_signs(v);
      warp_hadamard(v);
    }
    float amax = 0.0f;
#pragma unroll
    for (int k = 0; k < N; ++k) amax = fmaxf(amax, fabsf(v[k]));
    amax = warp_reduce<MaxOp>(amax);
    // amax < 2^exponent (frexpf's exponent from the bits; subnormal and tiny values held at 2^-100).
    const int exponent =
        amax > 0.0f && isfinite(amax) ? max(int((__float_as_uint(amax) >> 23) & 0xffu) - 126, -100) : 0;
    const float to_f16 = ldexpf(1.0f, 15 - exponent);
#pragma unroll
    for (int k = 0; k < N; ++k) qs[col * L::kQPitch + lane * N + k] = __float2half_rn(v[k] * to_f16);
    if (lane == 0) {
      const int p = query_pos0 + query;
      const float factor = a.scale * kLog2e * ldexpf(1.0f, exponent - 15);
      info[col] = valid ? ColumnInfo{int(first_key(p, a.window)), p, factor} : ColumnInfo{1, 0, 0.0f};
    }
  }
  __syncthreads();

  // This thread's columns of the score tiles: 8 j + 2 c and 8 j + 2 c + 1.
  float col_factor[NT][2];
  int col_lo[NT][2], col_hi[NT][2];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const ColumnInfo ci = info[8 * j + 2 * c + e];
      col_factor[j][e] = ci.factor, col_lo[j][e] = ci.lo, col_hi[j][e] = ci.hi;
    }
  // This warp's share of a tile's scores: keys 16 (warp % 4) + g and + 8, over the chunks of its
  // part of the head dims.
  const int part = warp / 4, key_g = 16 * (warp % 4) + g, chunk0 = part * L::kPartChunks;
  // The B fragments of Q^T for the warp's chunk i and column tile j: column 8 j + g's dims
  // [32 ch + 8 c, 32 ch + 8 c + 8) of chunk ch = chunk0 + i, whose halves are the two k-steps' (k 2c,
  // 2c+1 then 2c+8, 2c+9).
  uint4 q_regs[kDecode ? L::kPartChunks : 1];
  if constexpr (kDecode)
#pragma unroll
    for (int i = 0; i < L::kPartChunks; ++i)
      q_regs[i] = *reinterpret_cast<const uint4*>(qs + g * L::kQPitch + 32 * (chunk0 + i) + 8 * c);
  auto q_fragment = [&](int i, int j) {
    if constexpr (kDecode) return q_regs[i];
    else return *reinterpret_cast<const uint4*>(qs + (8 * j + g) * L::kQPitch + 32 * (chunk0 + i) + 8 * c);
  };

  float* scores = reinterpret_cast<float*>(smem + L::kScores);
  __half* ps = reinterpret_cast<__half*>(smem + L::kP);
  float* alphas = reinterpret_cast<float*>(smem + L::kAlpha);
  float* vmaxes = reinterpret_cast<float*>(smem + L::kVMax);
  // The softmax state of the columns this warp owns (base 2), the O fragments of its groups, and
  // the largest value scale so far, which O is in units of (TQ4: norm; Q8_0: block scale).
  float m[L::kOwnedColumns], l[L::kOwnedColumns];
#pragma unroll
  for (int i = 0; i < L::kOwnedColumns; ++i) m[i] = -INFINITY, l[i] = 0.0f;
  float o[L::kWarpGroups][4][NT][4] = {};
  float vref = 0.0f;
  const int slice = warp / L::kGroupWarps, group0 = warp % L::kGroupWarps * L::kWarpGroups;

  for (int t = 0; t < tiles; ++t) {
    const int buffer = t & 1, kb = key_begin + t * kTileKeys;
    cp_async_wait_all();
    __syncthreads();  // tile t visible to all; the previous tile's readers done with the other buffer
    if (t + 1 < tiles) stage_tile(buffer ^ 1);
    if (t + 2 < tiles) find_rows(t + 2, buffer);
    const uint8_t* ks = smem + L::kStage + buffer * L::kStageBytes;
    const uint8_t* vs = ks + kTileKeys * Rows::kPitch;

    // Scores of keys key_g and key_g + 8 against this thread's columns over the warp's chunks, and
    // the largest value scale of those keys.
    float acc[NT][4] = {};
    float vmax = 0.0f;
    const uint8_t* k0 = ks + key_g * Rows::kPitch;
    const uint8_t* k8 = k0 + 8 * Rows::kPitch;
    if constexpr (kTq4) {
      float odd[NT][4] = {};  // the second k-step's sums: two independent chains of mmas
#pragma unroll
      for (int i = 0; i < L::kPartChunks; ++i) {
        const int ch = chunk0 + i;
        const uint32_t w0 = u32_at(k0 + 16 * ch + 4 * c), w8 = u32_at(k8 + 16 * ch + 4 * c);
        const uint32_t s0[4] = {level_pair(lane_table, w0, 0), level_pair(lane_table, w8, 0),
                                level_pair(lane_table, w0, 1), level_pair(lane_table, w8, 1)};
        const uint32_t s1[4] = {level_pair(lane_table, w0, 2), level_pair(lane_table, w8, 2),
                                level_pair(lane_table, w0, 3), level_pair(lane_table, w8, 3)};
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const uint4 qf = q_fragment(i, j);
          mma_f16(acc[j], s0, qf.x, qf.y);
          mma_f16(odd[j], s1, qf.z, qf.w);
        }
      }
      // Each part's sum; one part's times norm / d here, several parts' where they are added.
      const float n0 = L::kDimParts == 1 ? norm_of(buffer, 0, key_g) / float(D) : 1.0f;
      const float n8 = L::kDimParts == 1 ? norm_of(buffer, 0, key_g + 8) / float(D) : 1.0f;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        acc[j][0] = (acc[j][0] + odd[j][0]) * n0, acc[j][1] = (acc[j][1] + odd[j][1]) * n0;
        acc[j][2] = (acc[j][2] + odd[j][2]) * n8, acc[j][3] = (acc[j][3] + odd[j][3]) * n8;
      }
      if (c == 0) vmax = fmaxf(norm_of(buffer, 1, key_g), norm_of(buffer, 1, key_g + 8));
    } else {
#pragma unroll
      for (int i = 0; i < L::kPartChunks; ++i) {
        const int ch = chunk0 + i;
        const uint8_t *b0 = k0 + 34 * ch, *b8 = k8 + 34 * ch;
        const int at = 2 + 8 * c;  // the quants of dims 8 c.. of the block
        const uint32_t s0[4] = {int8_pair_at(b0 + at), int8_pair_at(b8 + at), int8_pair_at(b0 + at + 2),
                                int8_pair_at(b8 + at + 2)};
        const uint32_t s1[4] = {int8_pair_at(b0 + at + 4), int8_pair_at(b8 + at + 4), int8_pair_at(b0 + at + 6),
                                int8_pair_at(b8 + at + 6)};
        const float d0 = f16_at(b0), d8 = f16_at(b8);
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const uint4 qf = q_fragment(i, j);
          float block[4] = {};
          mma_f16(block, s0, qf.x, qf.y);
          mma_f16(block, s1, qf.z, qf.w);
          acc[j][0] = fmaf(d0, block[0], acc[j][0]), acc[j][1] = fmaf(d0, block[1], acc[j][1]);
          acc[j][2] = fmaf(d8, block[2], acc[j][2]), acc[j][3] = fmaf(d8, block[3], acc[j][3]);
        }
      }
      const uint8_t *v0 = vs + key_g * Rows::kPitch, *v8 = v0 + 8 * Rows::kPitch;
      for (int ch = c; ch < L::kChunks; ch += 4)
        vmax = fmaxf(vmax, fmaxf(f16_at(v0 + 34 * ch), f16_at(v8 + 34 * ch)));
    }
    vmax = warp_reduce<MaxOp>(vmax);
    if (lane == 0) vmaxes[warp] = vmax;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key_g + 8 * (e >> 1), kp = kb + key, col = 8 * j + 2 * c + (e & 1);
        if constexpr (L::kDimParts == 1) {
          const bool seen = kp < key_end && kp >= col_lo[j][e & 1] && kp <= col_hi[j][e & 1];
          scores[col * L::kScorePitch + key] = seen ? acc[j][e] * col_factor[j][e & 1] : -INFINITY;
        } else {
          scores[(part * kColumns + col) * L::kScorePitch + key] = acc[j][e];
        }
      }
    __syncthreads();  // the scores and every warp's largest value scale complete

    // Column col's score of key `key`: over several parts, their sums added in part order, then
    // scaled as one part's are above.
    auto score_at = [&](int col, int key) {
      if constexpr (L::kDimParts == 1) {
        return scores[col * L::kScorePitch + key];
      } else {
        float sum = scores[col * L::kScorePitch + key];
#pragma unroll
        for (int p = 1; p < L::kDimParts; ++p) sum += scores[(p * kColumns + col) * L::kScorePitch + key];
        if constexpr (kTq4) sum *= norm_of(buffer, 0, key) / float(D);
        const int kp = kb + key;
        const ColumnInfo ci = info[col];
        return kp < key_end && kp >= ci.lo && kp <= ci.hi ? sum * ci.factor : -INFINITY;
      }
    };
    // The online softmax of the owned columns, lane = keys lane and lane + 32: P (times the value
    // scale over the largest, TQ4) into ps in f16, O's rescale factor into alphas.
    float vmax_all = vmaxes[0];
#pragma unroll
    for (int w = 1; w < L::kWarps; ++w) vmax_all = fmaxf(vmax_all, vmaxes[w]);
    const float vref_next = fmaxf(vref, vmax_all);
    const float rescale = vref_next > 0.0f ? vref / vref_next : 1.0f;
    const float inv_vref = vref_next > 0.0f ? 1.0f / vref_next : 0.0f;
#pragma unroll
    for (int i = 0; i < L::kOwnedColumns; ++i) {
      const int col = warp * L::kOwnedColumns + i;
      const float s0 = score_at(col, lane), s1 = score_at(col, lane + 32);
      const float mx = fmaxf(m[i], warp_reduce<MaxOp>(fmaxf(s0, s1)));
      const float ref = mx == -INFINITY ? 0.0f : mx;  // no key seen yet: P and alpha 0
      float p0 = exp2_approx(s0 - ref), p1 = exp2_approx(s1 - ref);
      const float alpha = exp2_approx(m[i] - ref);
      l[i] = l[i] * alpha + warp_reduce<SumOp>(p0 + p1);
      m[i] = mx;
      if constexpr (kTq4) {
        p0 *= norm_of(buffer, 1, lane) * inv_vref;
        p1 *= norm_of(buffer, 1, lane + 32) * inv_vref;
      }
      ps[col * L::kPPitch + lane] = __float2half_rn(p0);
      ps[col * L::kPPitch + lane + 32] = __float2half_rn(p1);
      if (lane == 0) alphas[col] = alpha * rescale;
    }
    __syncthreads();  // P and the alphas complete

    // O^T += V^T·P^T over this warp's slice of the keys for its groups: row g of m-tile t is dim
    // 8 g + 2 t of a group, row g + 8 dim 8 g + 2 t + 1, so that a thread's rows are one word of
    // each of four keys' rows (keys 2c, 2c + 1, 2c + 8, 2c + 9 of a 16-key step).
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const float2 al = *reinterpret_cast<const float2*>(alphas + 8 * j + 2 * c);
#pragma unroll
      for (int gi = 0; gi < L::kWarpGroups; ++gi)
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {
          o[gi][mt][j][0] *= al.x, o[gi][mt][j][1] *= al.y;
          o[gi][mt][j][2] *= al.x, o[gi][mt][j][3] *= al.y;
        }
    }
#pragma unroll
    for (int step = 0; step < L::kSliceSteps; ++step) {
      const int key0 = (slice * L::kSliceSteps + step) * 16;
      uint32_t b0[NT], b1[NT];
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const __half* p_row = ps + (8 * j + g) * L::kPPitch + key0 + 2 * c;
        b0[j] = *reinterpret_cast<const uint32_t*>(p_row);
        b1[j] = *reinterpret_cast<const uint32_t*>(p_row + 8);
      }
      const uint8_t* va = vs + (key0 + 2 * c) * Rows::kPitch;
      const uint8_t *vb = va + Rows::kPitch, *vc = va + 8 * Rows::kPitch, *vd = vc + Rows::kPitch;
#pragma unroll
      for (int gi = 0; gi < L::kWarpGroups; ++gi) {
        const int grp = group0 + gi;
        uint32_t frag[4][4];  // [m-tile][a0..a3]
        if constexpr (kTq4) {
          const int at = 32 * grp + 4 * g;
          const uint32_t wa = u32_at(va + at), wb = u32_at(vb + at), wc = u32_at(vc + at), wd = u32_at(vd + at);
          // Byte t: (even dim 8 g + 2 t of the first key, of the second) as a table index; odd dims.
          const uint32_t even_ab = (wa & 0x0f0f0f0fu) | ((wb << 4) & 0xf0f0f0f0u);
          const uint32_t odd_ab = ((wa >> 4) & 0x0f0f0f0fu) | (wb & 0xf0f0f0f0u);
          const uint32_t even_cd = (wc & 0x0f0f0f0fu) | ((wd << 4) & 0xf0f0f0f0u);
          const uint32_t odd_cd = ((wc >> 4) & 0x0f0f0f0fu) | (wd & 0xf0f0f0f0u);
#pragma unroll
          for (int mt = 0; mt < 4; ++mt) {
            frag[mt][0] = level_pair(lane_table, even_ab, mt), frag[mt][1] = level_pair(lane_table, odd_ab, mt);
            frag[mt][2] = level_pair(lane_table, even_cd, mt), frag[mt][3] = level_pair(lane_table, odd_cd, mt);
          }
        } else {
          // The block of dims 8 g.. of the group: its scales over the largest, then the quants.
          const int block = 34 * (2 * grp + g / 4), at = block + 2 + 8 * (g % 4);
          const __half2 scale_ab = __floats2half2_rn(f16_at(va + block) * inv_vref, f16_at(vb + block) * inv_vref);
          const __half2 scale_cd = __floats2half2_rn(f16_at(vc + block) * inv_vref, f16_at(vd + block) * inv_vref);
#pragma unroll
          for (int mt = 0; mt < 4; ++mt) {
            const int pair = at + 2 * mt;
            int8_columns_to_f16x2(u16_at(va + pair), u16_at(vb + pair), scale_ab, frag[mt][0], frag[mt][1]);
            int8_columns_to_f16x2(u16_at(vc + pair), u16_at(vd + pair), scale_cd, frag[mt][2], frag[mt][3]);
          }
        }
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
#pragma unroll
          for (int j = 0; j < NT; ++j) mma_f16(o[gi][mt][j], frag[mt], b0[j], b1[j]);
      }
    }
    vref = vref_next;
  }

  // Each slice's O into shared memory (over the tables and tiles: every warp is past the last
  // tile, no copy in flight), then the owned columns' sums of the slices in order.
  __syncthreads();
  float* outs = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int gi = 0; gi < L::kWarpGroups; ++gi)
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = 8 * j + 2 * c + (e & 1), dim = 64 * (group0 + gi) + 8 * g + 2 * mt + (e >> 1);
          outs[(slice * kColumns + col) * D + dim] = o[gi][mt][j][e];
        }
  __syncthreads();
  const float o_scale = kTq4 ? vref / float(D) : vref;  // O's units, and TQ4's norm / d
#pragma unroll 1
  for (int i = 0; i < L::kOwnedColumns; ++i) {
    const int col = warp * L::kOwnedColumns + i, column = first_column + col;
    if (column >= columns) continue;
    const int query = column / group, head = kvh * group + column % group;
    float v[N];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      v[k] = 0.0f;
#pragma unroll
      for (int s = 0; s < L::kSlices; ++s) v[k] += outs[(s * kColumns + col) * D + lane * N + k];
    }
    if constexpr (kDecode) {
      float* base = partials + int64_t(z) * a.heads * max_splits * (D + 2);
      float* acc = base + (int64_t(head) * max_splits + split) * D + lane * N;
#pragma unroll
      for (int k = 0; k < N; ++k) acc[k] = v[k] * o_scale;
      if (lane == 0)
        reinterpret_cast<float2*>(base + int64_t(a.heads) * max_splits * D)[int64_t(head) * max_splits + split] =
            make_float2(m[i], l[i]);
    } else {
      const float f = o_scale / l[i];
#pragma unroll
      for (int k = 0; k < N; ++k) v[k] *= f;
      if constexpr (kTq4) {
        warp_hadamard(v);
        apply_tq4_signs(v);
      }
      bf16* out = a.out + int64_t(query) * a.out_stride + int64_t(head) * D + lane * N;
#pragma unroll
      for (int k = 0; k < N; ++k) out[k] = __float2bfloat16(v[k]);
    }
  }
}

// Block (head, sequence): out = sum_s w_s O_s over the position's splits, w_s = 2^(m_s - m) /
// sum_s' l_s' 2^(m_s' - m); TQ4 rotated back (S·H). A few blocks read up to 128 partial rows each,
// so the time is load latency, not bandwidth: each 4-dim column is read by kLanes split-lanes
// (split-lane j takes splits j, j + kLanes, ...) with up to kMergeBatch float4 loads in flight a
// thread, the first batch issued while warp 0 computes the weights. Each split-lane adds its splits
// in order and their sums are added in split-lane order, so the bits depend on the position alone.
template <DType kType, int D>
__global__ void __launch_bounds__(kMergeThreads) quantized_merge_kernel(QuantizedKvLaunch q, const float* partials,
                                                                       int max_splits) {
  constexpr int N = D / 32, kPerLane = kMaxSplits / 32;
  constexpr int kColumns = D / 4, kLanes = kMergeThreads / kColumns;
  constexpr int kBatch = std::min(kMergeBatch, kMaxSplits / kLanes);  // no more than a lane's splits
  static_assert(kColumns * kLanes == kMergeThreads, "every thread a (column, split-lane)");
  pdl_launch_dependents();
  __shared__ float weights[kMaxSplits];
  __shared__ __align__(16) float4 parts[kMergeThreads - kColumns];  // [split_lane - 1][column], split-lanes 1..kLanes-1
  __shared__ __align__(16) float merged[D];
  const int head = int(blockIdx.x), z = int(blockIdx.y), lane = threadIdx.x & 31;
  const int column = int(threadIdx.x) % kColumns, split_lane = int(threadIdx.x) / kColumns;
  const AttentionLaunch a = sequence_of(q, z);
  const float* base = partials + int64_t(z) * a.heads * max_splits * (D + 2);
  const float* acc = base + int64_t(head) * max_splits * D + 4 * column;
  const float2* ml =
      reinterpret_cast<const float2*>(base + int64_t(a.heads) * max_splits * D) + int64_t(head) * max_splits;
  pdl_wait();
  const int pos = launch_position(a, 0);
  const int used = used_splits(pos, a.window, split_keys_at(pos, a.window, max_splits));
  float4 rows[kBatch];
  auto load = [&](int first) {  // splits first, first + kLanes, ... below used
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int s = first + b * kLanes;
      if (s < used) rows[b] = __ldcg(reinterpret_cast<const float4*>(acc + int64_t(s) * D));
    }
  };
  load(split_lane);  // in flight while warp 0 computes the weights
  if (threadIdx.x < 32) {
    float ms[kPerLane], ls[kPerLane], mx = -FLT_MAX;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int s = lane + 32 * j;
      const float2 v = s < used ? __ldcg(ml + s) : make_float2(-FLT_MAX, 0.0f);
      ms[j] = v.x, ls[j] = v.y, mx = fmaxf(mx, v.x);
    }
    mx = warp_reduce<MaxOp>(mx);
    float total = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) total += ls[j] * exp2f(ms[j] - mx);
    total = warp_reduce<SumOp>(total);
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      if (lane + 32 * j < used) weights[lane + 32 * j] = exp2f(ms[j] - mx) / total;
  }
  __syncthreads();
  float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int first = split_lane; first < used; first += kBatch * kLanes) {
    if (first != split_lane) load(first);  // the first batch is already loaded
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int s = first + b * kLanes;
      if (s >= used) break;
      const float w = weights[s];
      sum.x = fmaf(w, rows[b].x, sum.x), sum.y = fmaf(w, rows[b].y, sum.y);
      sum.z = fmaf(w, rows[b].z, sum.z), sum.w = fmaf(w, rows[b].w, sum.w);
    }
  }
  if (split_lane > 0) parts[threadIdx.x - kColumns] = sum;
  __syncthreads();
  if (split_lane == 0) {
#pragma unroll
    for (int j = 1; j < kLanes; ++j) {  // split-lane order: the same bits whatever finished first
      const float4 p = parts[(j - 1) * kColumns + column];
      sum.x += p.x, sum.y += p.y, sum.z += p.z, sum.w += p.w;
    }
    if constexpr (kType == DType::TQ4) {
      *reinterpret_cast<float4*>(merged + 4 * column) = sum;
    } else {
      bf16* out = a.out + int64_t(head) * D + 4 * column;
      out[0] = __float2bfloat16(sum.x), out[1] = __float2bfloat16(sum.y);
      out[2] = __float2bfloat16(sum.z), out[3] = __float2bfloat16(sum.w);
    }
  }
  if constexpr (kType == DType::TQ4) {
    __syncthreads();
    if (threadIdx.x >= 32) return;
    float v[N];
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = merged[lane * N + k];
    warp_hadamard(v);
    apply_tq4_signs(v);
    bf16* out = a.out + int64_t(head) * D + lane * N;
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = __float2bfloat16(v[k]);
  }
}

// f(type, dim) with the launch's row type and head dim as compile-time constants.
template <typename F>
void with_type_and_dim(DType dtype, int head_dim, F&& f) {
  auto dims = [&](auto type) {
    switch (head_dim) {
      case 64: return f(type, std::integral_constant<int, 64>{});
      case 128: return f(type, std::integral_constant<int, 128>{});
      case 256: return f(type, std::integral_constant<int, 256>{});
      default: return f(type, std::integral_constant<int, 512>{});
    }
  };
  if (dtype == DType::TQ4) dims(std::integral_constant<DType, DType::TQ4>{});
  else dims(std::integral_constant<DType, DType::Q8_0>{});
}

void check_quantized_launch(const QuantizedKvLaunch& q) {
  const AttentionLaunch& a = q.a;
  check_attention_shape(a);
  G4_CHECK(is_quantized_kv(q.dtype), "quantized attention: " + dtype_name(q.dtype) + " is not a quantized KV type");
  G4_CHECK(a.head_dim == 64 || a.head_dim == 128 || a.head_dim == 256 || a.head_dim == 512,
           "cuda attention: " + dtype_name(q.dtype) + " KV caches need a head dim of 64, 128, 256 or 512, not " +
               std::to_string(a.head_dim));
  G4_CHECK(q.row_bytes == int64_t(row_bytes(q.dtype, kv_cache_cols(q.dtype, a.kv_heads, a.head_dim))),
           "cuda attention: " + dtype_name(q.dtype) + " cache rows of " + std::to_string(q.row_bytes) +
               " bytes do not hold " + std::to_string(a.kv_heads) + " heads of " + std::to_string(a.head_dim));
  // The chunk's rows are stored before its queries read the cache, so they must not overwrite keys
  // its first query still reads: the ring holds the window and the chunk, or the chunk ends before
  // the ring would wrap (a cache as long as the context).
  G4_CHECK(a.window == 0 || a.capacity() >= a.window + a.T - 1 ||
               (q.last_position >= 0 && q.last_position < a.capacity()),
           "cuda attention: a quantized ring must hold the window and the chunk (window + T - 1 positions)");
  G4_CHECK(a.scale > 0.0f, "cuda attention: the softmax scale must be positive");
  G4_CHECK(q.caches.sequences >= 1 && q.caches.sequences <= kMaxDecodeSequences,
           "quantized attention: 1 to " + std::to_string(kMaxDecodeSequences) + " sequences per launch");
  // TQ4 rows are staged 16 bytes at a time, Q8_0 rows (34-byte blocks) at least 4.
  const uint64_t alignment = q.dtype == DType::TQ4 ? 16 : 4;
  for (int z = 0; z < q.caches.sequences; ++z)
    G4_CHECK(q.caches.k[z] && q.caches.v[z] && q.caches.table[z] &&
                 ((uintptr_t(q.caches.k[z]) | uintptr_t(q.caches.v[z]) | uint64_t(q.row_bytes)) % alignment) == 0,
             "cuda attention: " + dtype_name(q.dtype) + " cache rows must start " + std::to_string(alignment) +
                 "-byte aligned");
}

}  // namespace

void upload_tq4_tables() {
  float levels[tq4::kLevels];
  double bounds[tq4::kLevels - 1];
  uint32_t signs[kMaxAttentionHeadDim / 32] = {};
  for (int k = 0; k < tq4::kLevels; ++k) levels[k] = tq4::codebook_f32()[size_t(k)];
  for (int k = 0; k < tq4::kLevels - 1; ++k) bounds[k] = tq4::boundaries()[size_t(k)];
  for (int i = 0; i < kMaxAttentionHeadDim; ++i)
    if (tq4::sign(i) < 0) signs[i / 32] |= 1u << (i % 32);
  G4_CUDA(cudaMemcpyToSymbol(tq4_levels, levels, sizeof(levels)));
  G4_CUDA(cudaMemcpyToSymbol(tq4_bounds, bounds, sizeof(bounds)));
  G4_CUDA(cudaMemcpyToSymbol(tq4_signs, signs, sizeof(signs)));
}

void launch_store_quantized_kv(const QuantizedKvLaunch& q, cudaStream_t stream) {
  check_quantized_launch(q);
  const int64_t jobs = q.a.T * 2 * q.a.kv_heads;
  with_type_and_dim(q.dtype, q.a.head_dim, [&](auto type, auto dim) {
    launch_kernel("store_quantized_kv_kernel", store_quantized_kv_kernel<decltype(type)::value, decltype(dim)::value>,
                  dim3(unsigned(ceil_div(jobs, kStoreWarps)), unsigned(q.caches.sequences)), kStoreWarps * 32, 0,
                  stream, Pdl::kOn, q);
  });
}

int quantized_decode_splits(int64_t position, int window, int max_splits) {
  const int pos = int(position);
  return used_splits(pos, window, split_keys_at(pos, window, max_splits));
}

void launch_quantized_decode_attention(const QuantizedKvLaunch& q, float* partials, int max_splits,
                                       cudaStream_t stream, int splits_bound) {
  check_quantized_launch(q);
  const AttentionLaunch& a = q.a;
  G4_CHECK(a.T == 1 && a.q_first == 0, "quantized decode attention: one query a sequence");
  G4_CHECK(max_splits >= 1 && max_splits <= kMaxSplits,
           "quantized decode attention: 1 to " + std::to_string(kMaxSplits) + " splits");
  // Keys a query can see span at most the window (ring) or the capacity (flat cache).
  const int64_t span = a.window ? a.window : a.capacity();
  int splits = int(std::min<int64_t>(max_splits, ceil_div(span, kTileKeys)));
  if (splits_bound > 0) splits = std::min(splits, splits_bound);  // past it every split is empty
  const int column_tiles = int(ceil_div(a.heads / a.kv_heads, 8));
  with_type_and_dim(q.dtype, a.head_dim, [&](auto type, auto dim) {
    constexpr DType kType = decltype(type)::value;
    constexpr int D = decltype(dim)::value;
    launch_kernel("quantized_attention_kernel", quantized_attention_kernel<kType, D, true>,
                  dim3(unsigned(a.kv_heads * column_tiles), unsigned(splits), unsigned(q.caches.sequences)),
                  Tile<kType, D, true>::kThreads, Tile<kType, D, true>::kBytes, stream, Pdl::kOn, q, partials, max_splits);
    launch_kernel("quantized_merge_kernel", quantized_merge_kernel<kType, D>,
                  dim3(unsigned(a.heads), unsigned(q.caches.sequences)), kMergeThreads, 0, stream, Pdl::kOn, q,
                  static_cast<const float*>(partials), max_splits);
  });
}

void launch_quantized_prefill_attention(const QuantizedKvLaunch& q, cudaStream_t stream) {
  check_quantized_launch(q);
  const AttentionLaunch& a = q.a;
  G4_CHECK(q.caches.sequences == 1, "quantized prefill attention: one sequence a launch");
  const int64_t columns = (a.T - a.q_first) * (a.heads / a.kv_heads);
  if (columns == 0) return;  // no queries: the store alone
  const int64_t blocks = a.kv_heads * ceil_div(columns, 8 * kPrefillColumnTiles);
  G4_CHECK(blocks < (int64_t(1) << 31), "quantized prefill attention: too many queries in one chunk");
  with_type_and_dim(q.dtype, a.head_dim, [&](auto type, auto dim) {
    constexpr DType kType = decltype(type)::value;
    constexpr int D = decltype(dim)::value;
    launch_kernel("quantized_attention_kernel", quantized_attention_kernel<kType, D, false>, dim3(unsigned(blocks)),
                  Tile<kType, D, false>::kThreads, Tile<kType, D, false>::kBytes, stream, Pdl::kOn, q, static_cast<float*>(nullptr), 0);
  });
}

}  // namespace g4
