// y[T, N] = x[T, K] · w[N, K]^T over packed block-quantized weights for 9..64 tokens (a decode
// batch, a short prefill chunk) with exactly the decode GEMV's arithmetic, so that each token's row
// of y has the bits it has alone: the batch-invariant matmul of docs/DESIGN.md §7.
//
// The GEMV (packed_gemv.cu) computes per block the exact integer dot of the int16 activations and
// the quants, turns it into a float, scales and accumulates it (packed_blocks.h:
// accumulate_scaled_dot), lane c of a warp taking blocks c, c + 32, ... ("class" c), and adds the 32
// class sums in fold_classes' order. Here the integer dots come from the int8 tensor cores: an
// int16 activation is 256 · hi + lo (hi signed, lo unsigned bytes), so a block's dot is
// 256 · (q·hi) + q·lo, two exact mma.sync m16n8k32 with the quants centred to signed bytes (q minus
// the type's offset). Both start from 1.5 · 2^23's bits, which makes each int32 result the bits of
// the float 1.5 · 2^23 + (its dot): a subtraction gives each part as a float exactly (|parts| <
// 2^22), and one fma(hi, 256, lo) the nearest float of the whole dot — the GEMV's float(dot)
// (packed_blocks.h: centred_quants, dot_from_parts; tests/test_packed_blocks.cpp checks them on the
// CPU at every type's extremes). Then the same accumulate_scaled_dot. Integer conversions would cost eight times more (16 a clock per
// multiprocessor against 128 additions).
//
// Geometry: a thread block of 8 warps takes 128 weight rows (a 16-row mma tile per warp) and every
// token (8-column tiles: 16, 32 or 64 columns compiled), and one run of classes (fold_groups(N)
// runs of 32 / groups classes: blockIdx.y); it walks its classes' blocks in class order, staged in
// shared memory by cp.async two blocks a stage, two stages ahead (the 128 rows' bytes of a block and
// every token's activations), keeps each class's sum in registers and the run's in shared memory,
// and writes the run's sum: y itself for one run, else float partials that add_slices_kernel adds
// in run order (fold_classes' outer sum). Q6_K (two scales a block) is not taken: its batches run
// the GEMV. Measured on the H200 (docs/PERF.md): bound by instructions issued, not by memory.
#include <algorithm>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/packed_kernels.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/quantized_planes.cuh"

namespace g4 {

namespace {

using namespace packed;

constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kTileRows = 16;
static_assert(kWarps * kTileRows == kBatchRowsPerBlock, "a 16-row tile per warp");
constexpr int kBlocksPerStage = 2;                   // blocks per cp.async group and barrier
constexpr int kStages = 3;                           // stages in the ring: two staged ahead
constexpr int kTokenSlots = kMaxPackedMatmulTokens;  // tokens per block in the activation layout
constexpr int kValueBytes = 64;                      // a token's block: 32 int16 as hi and lo bytes

// The batch activations ([blocks][kTokenSlots] of each part): values, then d, then dsum (as
// ActivationBlock's). A token's 64 value bytes hold, for c in 0..3, the words 4c..4c+3: the high
// bytes of values 4c..4c+3, of values 16+4c..16+4c+3, then their low bytes — one lane's mma
// operands for one token in one 16-byte load.
__host__ __device__ inline int64_t slot(int64_t b, int64_t t) { return b * kTokenSlots + t; }
__host__ __device__ inline uint8_t* values_at(uint8_t* x, int64_t b, int64_t t) { return x + slot(b, t) * kValueBytes; }
__host__ __device__ inline float* d_at(uint8_t* x, int64_t blocks, int64_t b, int64_t t) {
  return reinterpret_cast<float*>(x + blocks * kTokenSlots * kValueBytes) + slot(b, t);
}
__host__ __device__ inline float* dsum_at(uint8_t* x, int64_t blocks, int64_t b, int64_t t) {
  return d_at(x, blocks, b, t) + blocks * kTokenSlots;  // Stager reads both as one array of two parts
}

__global__ void quantize_batch_activations_kernel(const bf16* x, int64_t T, int64_t blocks, uint8_t* out) {
  pdl_launch_dependents();
  pdl_wait();  // x comes from the previous kernel; `out` may still be read by the matmul before it
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < T * blocks;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / blocks, b = i % blocks;
    const ActivationBlock a = quantized_block(x, i);
    uint4* dst = reinterpret_cast<uint4*>(values_at(out, b, t));
#pragma unroll
    for (int c = 0; c < 4; ++c)  // q[2c], q[2c + 1]: values 4c..4c+3 as int16 pairs
      dst[c] = make_uint4(__byte_perm(a.q[2 * c], a.q[2 * c + 1], 0x7531), __byte_perm(a.q[8 + 2 * c], a.q[9 + 2 * c], 0x7531),
                          __byte_perm(a.q[2 * c], a.q[2 * c + 1], 0x6420), __byte_perm(a.q[8 + 2 * c], a.q[9 + 2 * c], 0x6420));
    *d_at(out, blocks, b, t) = a.d;
    *dsum_at(out, blocks, b, t) = a.dsum;
  }
}

// 4 bytes global -> shared (zeros when !valid: src unread).
__device__ inline void cp_async4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0) : "memory");
}

// One staged block: the thread block's 128 rows' bytes of it (qs, qh, the 4-byte word holding the
// params — a 2-byte d shares its word with a neighbour's —, a K-quant's super-block head), then
// every token's values, d and (types with a minimum) dsum.
template <DType kType>
struct Stage {
  static constexpr Format f = format_of(kType);
  static constexpr bool kHead = kType == DType::Q4_K || kType == DType::Q5_K;
  static constexpr int kRows = kBatchRowsPerBlock;
  static constexpr int kQh = kRows * f.qs, kParams = kQh + kRows * f.qh, kHeadAt = kParams + (f.params > 0 ? kRows * 4 : 0),
                       kTokensAt = kHeadAt + (kHead ? kRows * 16 : 0);
  template <int kTiles>
  static constexpr int bytes() {
    return kTokensAt + 8 * kTiles * (kValueBytes + 4 * (has_min(kType) ? 2 : 1));
  }
};

// Stages blocks for one thread block: each thread's part of a staged block — a 16-byte piece of a
// row's quants, a row's small fields, a piece of the tokens' values or scales — is fixed, so its
// addresses are computed once and each block adds its offset.
template <DType kType, int kTiles>
class Stager {
  using S = Stage<kType>;
  static constexpr Format f = S::f;
  static constexpr int kTokens = 8 * kTiles, kQsPieces = f.qs / 16, kScalePieces = kTokens / 4,
                       kScaleParts = has_min(kType) ? 2 : 1;

 public:
  __device__ Stager(const uint8_t* w, int64_t N, int64_t K, int64_t row0, const uint8_t* x, int64_t T) {
    const int i = threadIdx.x;
    const int64_t blocks = K / kBlock;
    const int qs_row = i / kQsPieces < S::kRows ? i / kQsPieces : 0, small_row = i < S::kRows ? i : 0;
    qs_on_ = i < S::kRows * kQsPieces;
    qs_valid_ = row0 + qs_row < N;
    qs_ = row_regions<kType>(w, N, K, qs_valid_ ? row0 + qs_row : row0).qs + 16 * (i % kQsPieces);
    qs_at_ = qs_row * f.qs + 16 * (i % kQsPieces);
    small_on_ = i < S::kRows;
    small_valid_ = row0 + small_row < N;
    small_ = row_regions<kType>(w, N, K, small_valid_ ? row0 + small_row : row0);
    small_row_ = small_row;
    const int t = i / 4 < kTokens ? i / 4 : 0;
    values_on_ = i < kTokens * 4;
    values_valid_ = t < T;
    values_ = x + slot(0, values_valid_ ? t : 0) * kValueBytes + 16 * (i % 4);
    values_at_ = S::kTokensAt + t * kValueBytes + 16 * (i % 4);
    const int part = i / kScalePieces < kScaleParts ? i / kScalePieces : 0, first = 4 * (i % kScalePieces);
    scales_on_ = i < kScalePieces * kScaleParts;
    scales_valid_ = first < T;
    scales_ = x + blocks * kTokenSlots * kValueBytes + (part * blocks * kTokenSlots + first) * int64_t(sizeof(float));
    scales_at_ = S::kTokensAt + kTokens * kValueBytes + (part * kTokens + first) * int(sizeof(float));
  }

  // Block b into the stage at shared address `stage`.
  __device__ void stage(int64_t b, uint32_t stage) const {
    if (qs_on_) cp_async16(stage + qs_at_, qs_ + b * f.qs, qs_valid_);
    if (small_on_) {
      if constexpr (f.qh == 4) cp_async4(stage + S::kQh + small_row_ * 4, small_.qh + b * 4, small_valid_);
      if constexpr (f.params > 0) {  // the aligned word holding the block's params
        const uintptr_t at = reinterpret_cast<uintptr_t>(small_.params + b * f.params);
        cp_async4(stage + S::kParams + small_row_ * 4, reinterpret_cast<const void*>(at & ~uintptr_t(3)), small_valid_);
      }
      if constexpr (S::kHead)
        cp_async16(stage + S::kHeadAt + small_row_ * 16, small_.super + (b / kSubBlocks) * 16, small_valid_);
    }
    if (values_on_) cp_async16(stage + values_at_, values_ + b * (kTokenSlots * kValueBytes), values_valid_);
    if (scales_on_) cp_async16(stage + scales_at_, scales_ + b * (kTokenSlots * int64_t(sizeof(float))), scales_valid_);
  }

 private:
  const uint8_t *qs_, *values_, *scales_;
  RowRegions<const uint8_t> small_;
  int qs_at_, small_row_, values_at_, scales_at_;
  bool qs_on_, qs_valid_, small_on_, small_valid_, values_on_, values_valid_, scales_on_, scales_valid_;
};

// acc[nt][e] += this block's term of (row, token) for the warp's 16 rows and every token.
template <DType kType, int kTiles>
__device__ inline void multiply_block(const uint8_t* stage, int64_t row0, int blocks, int b, int warp, int lane,
                                      float (&acc)[kTiles][4]) {
  using S = Stage<kType>;
  constexpr Format f = S::f;
  constexpr int kTokens = 8 * kTiles;
  const int g = lane / 4, c = lane % 4;
  uint32_t a[4];
  float scale[2], minimum[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // rows g and g + 8 of the warp's tile
    const int lr = warp * kTileRows + g + 8 * h;
    RawBlock raw;
    const uint32_t* qs = reinterpret_cast<const uint32_t*>(stage + lr * f.qs);
    raw.qs[0] = raw.qs[1] = raw.qs[2] = raw.qs[3] = qs[c];  // unpack_word_pair(raw, c) reads word c
    if constexpr (f.qs == 32) raw.qs[4] = raw.qs[5] = raw.qs[6] = raw.qs[7] = qs[4 + c];
    if constexpr (f.qh == 4) raw.qh[0] = *reinterpret_cast<const uint32_t*>(stage + S::kQh + lr * 4);
    if constexpr (f.params > 0) {
      const uint32_t word = *reinterpret_cast<const uint32_t*>(stage + S::kParams + lr * 4);
      // the block's d in the word's upper half: an odd index (r * blocks + b) among 2-byte fields
      const bool upper = f.params == 2 && ((unsigned(row0 + lr) * unsigned(blocks) + unsigned(b)) & 1u);
      raw.params = f.params == 4 ? word : upper ? word >> 16 : word & 0xFFFFu;
    }
    if constexpr (S::kHead) {
      const uint4 head = *reinterpret_cast<const uint4*>(stage + S::kHeadAt + lr * 16);
      raw.super[0] = head.x, raw.super[1] = head.y, raw.super[2] = head.z, raw.super[3] = head.w;
    }
    uint32_t lo, hi;
    unpack_word_pair<kType>(raw, c, &lo, &hi);
    a[h] = centred_quants<kType>(lo);      // k 4c..4c+3: weights 4c..4c+3
    a[2 + h] = centred_quants<kType>(hi);  // k 16+4c..: weights 16+4c..
    BlockWeights bw{};
    unpack_scales<kType>(raw, int(b % kSubBlocks), bw);
    scale[h] = bw.scale;
    minimum[h] = bw.min;
  }
  const uint8_t* tokens = stage + S::kTokensAt;
  const float* d = reinterpret_cast<const float*>(tokens + kTokens * kValueBytes);
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt) {
    const uint4 v = *reinterpret_cast<const uint4*>(tokens + (8 * nt + g) * kValueBytes + 16 * c);
    int high[4], low[4];
    mma_s8_s8(high, a, v.x, v.y, kMagicBits);
    mma_s8_u8(low, a, v.z, v.w, kMagicBits);
    const float2 ds = *reinterpret_cast<const float2*>(d + 8 * nt + 2 * c);  // tokens 8nt + 2c, + 1
    float2 dsums = make_float2(0.0f, 0.0f);
    if constexpr (has_min(kType)) dsums = *reinterpret_cast<const float2*>(d + kTokens + 8 * nt + 2 * c);
#pragma unroll
    for (int e = 0; e < 4; ++e) {  // (row g + 8 (e / 2), token 8nt + 2c + e % 2)
      acc[nt][e] = accumulate_scaled_dot<kType>(acc[nt][e], scale[e / 2], minimum[e / 2], e % 2 ? ds.y : ds.x,
                                                e % 2 ? dsums.y : dsums.x, dot_from_parts(high[e], low[e]));
    }
  }
}

// The blocks of classes [begin, end) of a row of `blocks` blocks, class by class, each class's
// blocks c, c + 32, ... in order. Classes past the row's last block hold none and come last, so the
// walk ends after steps() blocks without skipping any.
class ClassWalk {
 public:
  __device__ ClassWalk(int begin, int end, int blocks) : class_(begin), count_(count(begin, blocks)), blocks_(blocks) {
    for (int c = begin; c < end; ++c) steps_ += count(c, blocks);
  }
  __device__ int steps() const { return steps_; }
  __device__ int block() const { return class_ + kClasses * j_; }
  __device__ bool last_in_class() const { return j_ + 1 == count_; }
  __device__ void next() {
    if (++j_ < count_) return;
    j_ = 0;
    count_ = count(++class_, blocks_);
  }

 private:
  __device__ static int count(int c, int blocks) { return c < blocks ? (blocks - 1 - c) / kClasses + 1 : 0; }
  int class_, count_, blocks_, j_ = 0, steps_ = 0;
};

// Grid (row tiles, runs). A class's sum starts from 0 and is added to its run's when its last block
// is done; a class without blocks adds nothing (a run's sum is never -0, so adding the GEMV lane's
// +0 would not change it). The runs' sums wait in shared memory (registers hold the class's).
template <DType kType, int kTiles>
__global__ void __launch_bounds__(kThreads, 2) packed_batch_gemv_kernel(const uint8_t* x, const uint8_t* w, bf16* y,
                                                                        float* partial, int64_t T, int64_t N, int64_t K,
                                                                        int groups) {
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int kBlockBytes = Stage<kType>::template bytes<kTiles>(), kStageBytes = kBlocksPerStage * kBlockBytes;
  float* runs = reinterpret_cast<float*>(smem + kStages * kStageBytes);  // [warp][nt][e][lane]
  pdl_launch_dependents();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* run = runs + warp * (kTiles * 4 * 32) + lane;
#pragma unroll
  for (int k = 0; k < kTiles * 4; ++k) run[32 * k] = 0.0f;
  const int64_t row0 = int64_t(blockIdx.x) * kBatchRowsPerBlock;
  const int blocks = int(K / kBlock), per_group = kClasses / groups, first_class = int(blockIdx.y) * per_group;
  ClassWalk load(first_class, first_class + per_group, blocks), use = load;
  const int steps = load.steps(), stage_count = (steps + kBlocksPerStage - 1) / kBlocksPerStage;
  const Stager<kType, kTiles> stager(w, N, K, row0, x, T);
  const uint32_t stages = shared_addr(smem);
  auto stage = [&](int s) {  // stage s: steps kBlocksPerStage * s, ... (one cp.async group, maybe empty)
    for (int u = 0; u < kBlocksPerStage; ++u) {
      if (kBlocksPerStage * s + u < steps) stager.stage(load.block(), stages + (s % kStages) * kStageBytes + u * kBlockBytes);
      load.next();
    }
    cp_async_commit();
  };
  pdl_wait();
  for (int s = 0; s < kStages - 1; ++s) stage(s);
  float acc[kTiles][4] = {};
  for (int s = 0; s < stage_count; ++s) {
    cp_async_wait_group<kStages - 2>();
    __syncthreads();  // stage s is in for all; every warp is done with stage s - 1's buffer
    stage(s + kStages - 1);
    for (int u = 0; u < kBlocksPerStage && kBlocksPerStage * s + u < steps; ++u) {
      multiply_block<kType, kTiles>(smem + (s % kStages) * kStageBytes + u * kBlockBytes, row0, blocks, use.block(), warp,
                                    lane, acc);
      if (use.last_in_class()) {
#pragma unroll
        for (int nt = 0; nt < kTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            run[32 * (4 * nt + e)] += acc[nt][e];
            acc[nt][e] = 0.0f;
          }
      }
      use.next();
    }
  }
  const int g = lane / 4, c = lane % 4;
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t row = row0 + warp * kTileRows + g + 8 * (e / 2), t = 8 * nt + 2 * c + e % 2;
      if (row >= N || t >= T) continue;
      const float sum = run[32 * (4 * nt + e)];
      if (groups == 1)  // fold_classes: 0 + the run's sum is the run's sum
        y[t * N + row] = __float2bfloat16(sum);
      else
        partial[(int64_t(blockIdx.y) * T + t) * N + row] = sum;
    }
}

// Shared bytes of a launch: the stages, then the runs' sums.
template <DType kType, int kTiles>
constexpr size_t batch_gemv_smem_bytes() {
  return size_t(kStages) * kBlocksPerStage * Stage<kType>::template bytes<kTiles>() + size_t(kThreads) * kTiles * 4 * sizeof(float);
}

// Each output = its slices' partial sums added from 0 in slice order; the outputs of the group one
// after another in i, kVec at a time (a thread's loads of every slice are issued before its adds:
// at 64 tokens the partials are ~16 MB a matrix, docs/PERF.md).
struct SliceSumGroup {
  SliceSum sums[kMaxSliceSums];
  int count;
  int64_t total;
};
template <int kVec>
struct SliceVec;
template <>
struct SliceVec<1> {
  float v[1];
  __device__ static SliceVec load(const float* p) { return {{__ldcs(p)}}; }
  __device__ void store(bf16* y) const { *y = __float2bfloat16(v[0]); }
};
template <>
struct SliceVec<4> {
  float v[4];
  __device__ static SliceVec load(const float* p) {
    const float4 f = __ldcs(reinterpret_cast<const float4*>(p));
    return {{f.x, f.y, f.z, f.w}};
  }
  __device__ void store(bf16* y) const {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v[0], v[1]), hi = __floats2bfloat162_rn(v[2], v[3]);
    uint2 packed;
    packed.x = *reinterpret_cast<const uint32_t*>(&lo);
    packed.y = *reinterpret_cast<const uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(y) = packed;
  }
};
// Output at's slices added from 0 in slice order, kVec outputs from at on.
template <int kVec>
__device__ SliceVec<kVec> sum_slices(const SliceSum& s, int64_t at) {
  constexpr int kLoads = 4;  // slices loaded before they are added
  SliceVec<kVec> sum{};
  for (int j0 = 0; j0 < s.slices; j0 += kLoads) {
    SliceVec<kVec> part[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u)
      if (j0 + u < s.slices) part[u] = SliceVec<kVec>::load(s.partial + (j0 + u) * s.count + at);
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      if (j0 + u >= s.slices) break;
#pragma unroll
      for (int e = 0; e < kVec; ++e) sum.v[e] += part[u].v[e];
    }
  }
  return sum;
}

template <int kVec>
__global__ void add_slices_kernel(SliceSumGroup group) {
  pdl_launch_dependents();
  pdl_wait();
  for (int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * kVec; i < group.total;
       i += int64_t(gridDim.x) * blockDim.x * kVec) {
    SliceSum s = group.sums[0];
    int64_t at = i;
#pragma unroll
    for (int m = 1; m < kMaxSliceSums; ++m) {  // static indices: the group stays in parameter space
      if (m < group.count && at >= s.count) {
        at -= s.count;
        s = group.sums[m];
      }
    }
    sum_slices<kVec>(s, at).store(s.y + at);
  }
}

// gate's and up's sums rounded to bf16 where their outputs would store them, then
// gelu_tanh_mul_kernel's arithmetic: its bits without the round trip through two outputs.
template <int kVec>
__global__ void add_slices_gelu_kernel(SliceSum gate, SliceSum up, bf16* out) {
  pdl_launch_dependents();
  pdl_wait();
  for (int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * kVec; i < gate.count;
       i += int64_t(gridDim.x) * blockDim.x * kVec) {
    SliceVec<kVec> g = sum_slices<kVec>(gate, i);
    const SliceVec<kVec> u = sum_slices<kVec>(up, i);
#pragma unroll
    for (int e = 0; e < kVec; ++e) g.v[e] = gelu_tanh(round_bf16(g.v[e])) * round_bf16(u.v[e]);
    g.store(out + i);
  }
}

}  // namespace

namespace {

// Whether a sum's partials and output allow four outputs a thread (float4 loads, 8-byte stores).
bool whole_vectors(const SliceSum& s) {
  return s.count % 4 == 0 && reinterpret_cast<uintptr_t>(s.partial) % 16 == 0 && reinterpret_cast<uintptr_t>(s.y) % 8 == 0;
}

unsigned add_blocks(int64_t outputs, int vec) { return unsigned(std::min<int64_t>(ceil_div(outputs, 256 * vec), 4096)); }

}  // namespace

void launch_add_slices(std::span<const SliceSum> sums, cudaStream_t stream) {
  G4_CHECK(!sums.empty() && sums.size() <= size_t(kMaxSliceSums), "add_slices: 1 to 3 outputs a launch");
  SliceSumGroup group{};
  group.count = int(sums.size());
  bool vectors = true;
  for (size_t m = 0; m < sums.size(); ++m) {
    group.sums[m] = sums[m];
    group.total += sums[m].count;
    vectors = vectors && whole_vectors(sums[m]);
  }
  if (vectors)
    launch_kernel("add_slices_kernel", add_slices_kernel<4>, add_blocks(group.total, 4), 256, 0, stream, Pdl::kOn, group);
  else
    launch_kernel("add_slices_kernel", add_slices_kernel<1>, add_blocks(group.total, 1), 256, 0, stream, Pdl::kOn, group);
}

void launch_add_slices_gelu(const SliceSum& gate, const SliceSum& up, bf16* out, cudaStream_t stream) {
  G4_CHECK(gate.count == up.count, "add_slices_gelu: gate and up of different sizes");
  const SliceSum as_out{gate.partial, gate.slices, gate.count, out};
  if (whole_vectors(as_out) && whole_vectors(up))
    launch_kernel("add_slices_gelu_kernel", add_slices_gelu_kernel<4>, add_blocks(gate.count, 4), 256, 0, stream, Pdl::kOn,
                  gate, up, out);
  else
    launch_kernel("add_slices_gelu_kernel", add_slices_gelu_kernel<1>, add_blocks(gate.count, 1), 256, 0, stream, Pdl::kOn,
                  gate, up, out);
}

void launch_add_slices(const float* partial, int slices, int64_t count, bf16* y, cudaStream_t stream) {
  const SliceSum one{partial, slices, count, y};
  launch_add_slices(std::span(&one, 1), stream);
}

size_t batch_activation_bytes(int64_t K) {
  return size_t(K / kBlock) * kTokenSlots * (kValueBytes + 2 * sizeof(float));
}

void launch_quantize_batch_activations(const bf16* x, int64_t T, int64_t K, uint8_t* out, cudaStream_t stream) {
  G4_CHECK(K % kBlock == 0 && T <= kTokenSlots && reinterpret_cast<uintptr_t>(x) % 16 == 0,
           "quantize_batch_activations: at most " + std::to_string(kTokenSlots) +
               " rows of a multiple of 32 values, 16-byte aligned");
  const int64_t blocks = K / kBlock;
  launch_kernel("quantize_batch_activations_kernel", quantize_batch_activations_kernel,
                unsigned(ceil_div(T * blocks, 128)), 128, 0, stream, Pdl::kOn, x, T, blocks, out);
}

bool packed_batch_gemv_fits(DType type, int64_t T, int64_t K) {
  return is_block_quantized(type) && type != DType::Q6_K && T > kMaxGemvTokens && T <= kTokenSlots && K % kBlock == 0;
}

size_t packed_batch_gemv_workspace_bytes(int64_t N) {
  const int groups = fold_groups(N);
  return groups == 1 ? 0 : size_t(groups) * size_t(kTokenSlots) * size_t(N) * sizeof(float);
}

void launch_packed_batch_gemv(DType type, uint8_t* x, const uint8_t* w, bf16* y, int64_t T, int64_t N, int64_t K,
                              float* workspace, size_t workspace_bytes, cudaStream_t stream) {
  G4_CHECK(packed_batch_gemv_fits(type, T, K), "packed batch gemv: " + dtype_name(type) + ", " + std::to_string(T) +
                                                   " tokens of " + std::to_string(K) + " values");
  const int groups = fold_groups(N);
  G4_CHECK(groups == 1 || size_t(groups) * size_t(T) * size_t(N) * sizeof(float) <= workspace_bytes,
           "packed batch gemv: the workspace reserved for this matrix is too small");
  const dim3 grid(unsigned(ceil_div(N, kBatchRowsPerBlock)), unsigned(groups));
  with_block_type(type, [&](auto t) {
    constexpr DType kType = decltype(t)::value;
    if constexpr (kType != DType::Q6_K) {
      with_token_tiles(T, [&](auto tiles) {
        constexpr int kTiles = decltype(tiles)::value;
        launch_kernel("packed_batch_gemv_kernel", packed_batch_gemv_kernel<kType, kTiles>, grid, kThreads,
                      batch_gemv_smem_bytes<kType, kTiles>(), stream, Pdl::kOn, static_cast<const uint8_t*>(x), w, y,
                      workspace, T, N, K, groups);
      });
    }
  });
  if (groups > 1) launch_add_slices(workspace, groups, T * N, y, stream);
}

}  // namespace g4
