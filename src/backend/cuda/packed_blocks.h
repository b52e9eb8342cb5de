// Block-quantized weights as the CUDA backend keeps them ("packed"), and the integer arithmetic of
// its decode GEMV: written once for host and device (no CUDA header needed), so the kernels run
// these functions on the GPU and tests/test_packed_blocks.cpp runs the very same ones on the CPU
// against the quant codecs (docs/DESIGN.md, "Quantized weights on the GPU").
//
// Layout. A packed [rows, cols] tensor of a GGUF type has exactly the bytes of its GGUF form
// (Tensor::bytes() holds), rearranged at upload into regions, each [rows][blocks][bytes]
// (row-major, a row's blocks in order), so that a lane's 16-byte loads are aligned and a warp's
// loads of consecutive blocks are contiguous. Every 32 weights are one "block" b (per row
// cols / 32 of them; K-quant super-blocks of 256 hold 8):
//   qs      16 bytes per block: byte i = weight i in the low nibble, weight i + 16 in the high one
//           (Q4_0's own order; the K-quants' nibbles are reordered to it); Q8_0: its 32 int8.
//   qh      Q5_0, Q5_1, Q5_K: 4 bytes per block, the 5th bits spread for a shift and a mask: bit
//           8c + i = weight 4i + c, bit 8c + 4 + i = weight 16 + 4i + c (c, i in 0..3).
//           Q6_K: 8 bytes per block, two words of 2-bit pairs: word 0's bits 8c + 2i.. = weight
//           4i + c, word 1's = weight 16 + 4i + c.
//   params  32-weight types: f16 d (Q8_0, Q4_0, Q5_0) or f16 d then f16 m (Q4_1, Q5_1).
//   super   per super-block: Q4_K/Q5_K their 16-byte head unchanged (f16 d, f16 dmin, 12 bytes of
//           6-bit scales and mins, quant/k_scales.h); Q6_K its 16 int8 scales.
//   super_d Q6_K: per super-block its f16 d.
// Region sizes are multiples of 16 bytes when cols is a multiple of 256 (K-quants always; a
// 32-weight type's params and qh regions need only 2- and 4-byte alignment). A view of some rows
// of a packed tensor is not a packed tensor: the regions are laid out for all rows.
//
// Activations. A decode GEMV first quantizes its input per block of 32 to int16 with a float
// scale (ActivationBlock), then each block's dot product is 16 dp2a (two int16 × two int8 into an
// int32) and a few float operations. int16 keeps the quantization error at ~1e-4 relative L2,
// where int8 (llama.cpp's q8_1) costs ~2e-2 on a trained model.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "quant/k_scales.h"
#include "util/dtype.h"
#include "util/exact_float.h"
#include "util/error.h"
#include "util/half.h"
#include "util/host_device.h"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

namespace g4::packed {

inline constexpr int kBlock = 32;      // weights of a packed block, values of an activation block
inline constexpr int kSubBlocks = 8;   // blocks of a K-quant super-block
inline constexpr int kMaxGgufBlockBytes = 210;  // Q6_K's

// Bytes of each region per block (qs, qh, params) and per super-block (super, super_d).
struct Format {
  int qs, qh, params, super, super_d;
};

G4_HOST_DEVICE constexpr Format format_of(DType t) {
  switch (t) {
    case DType::Q8_0: return {32, 0, 2, 0, 0};
    case DType::Q4_0: return {16, 0, 2, 0, 0};
    case DType::Q4_1: return {16, 0, 4, 0, 0};
    case DType::Q5_0: return {16, 4, 2, 0, 0};
    case DType::Q5_1: return {16, 4, 4, 0, 0};
    case DType::Q4_K: return {16, 0, 0, 16, 0};
    case DType::Q5_K: return {16, 4, 0, 16, 0};
    case DType::Q6_K: return {16, 8, 0, 16, 2};
    default: return {0, 0, 0, 0, 0};
  }
}
G4_HOST_DEVICE constexpr bool is_k_quant(DType t) { return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K; }
// w = scale * (q - offset) (+ min): the stored q of a zero weight for the symmetric types.
G4_HOST_DEVICE constexpr int quant_offset(DType t) {
  return t == DType::Q4_0 ? 8 : t == DType::Q5_0 ? 16 : t == DType::Q6_K ? 32 : 0;
}
G4_HOST_DEVICE constexpr bool has_min(DType t) {
  return t == DType::Q4_1 || t == DType::Q5_1 || t == DType::Q4_K || t == DType::Q5_K;
}

// One row's regions in a packed tensor of `rows` x `cols` at `data` (Byte: const or not).
template <typename Byte>
struct RowRegions {
  Byte *qs, *qh, *params, *super, *super_d;
};

template <DType kType, typename Byte>
G4_HOST_DEVICE RowRegions<Byte> row_regions(Byte* data, int64_t rows, int64_t cols, int64_t row) {
  constexpr Format f = format_of(kType);
  const int64_t blocks = cols / kBlock, supers = cols / (kBlock * kSubBlocks);  // supers: K-quants only
  Byte* qh = data + rows * blocks * f.qs;
  Byte* params = qh + rows * blocks * f.qh;
  Byte* super = params + rows * blocks * f.params;
  Byte* super_d = super + rows * supers * f.super;
  return {data + row * blocks * f.qs, qh + row * blocks * f.qh, params + row * blocks * f.params,
          super + row * supers * f.super, super_d + row * supers * f.super_d};
}

// ---- reading a block ----

G4_HOST_DEVICE float f16_bits_to_float(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
#else
  return f16_to_f32(static_cast<uint16_t>(bits));
#endif
}

// Loads of naturally aligned packed fields (the kernels that stream weights bring their own with
// the same interface: load16, load8, load4, load2).
struct PlainLoads {
  G4_HOST_DEVICE static void load16(const uint8_t* p, uint32_t* w) {
#if defined(__CUDA_ARCH__)
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
#else
    std::memcpy(w, p, 16);
#endif
  }
  G4_HOST_DEVICE static void load8(const uint8_t* p, uint32_t* w) {
#if defined(__CUDA_ARCH__)
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    w[0] = v.x, w[1] = v.y;
#else
    std::memcpy(w, p, 8);
#endif
  }
  G4_HOST_DEVICE static uint32_t load4(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  G4_HOST_DEVICE static uint32_t load2(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
  }
};

// A block's bytes as loaded (fields a type does not use stay zero and vanish once inlined).
struct RawBlock {
  uint32_t qs[8] = {};     // qs[0..3]: the nibbles; Q8_0: all 8 words
  uint32_t qh[2] = {};     // the high bits: qh[0] (5-bit types), both (Q6_K)
  uint32_t params = 0;     // f16 d | f16 m << 16
  uint32_t super[4] = {};  // Q4_K/Q5_K: the super-block head; Q6_K: [0] the block's two int8 scales, [1] f16 d
};

template <DType kType, class Loads>
G4_HOST_DEVICE RawBlock load_block(const RowRegions<const uint8_t>& r, int64_t b) {
  constexpr Format f = format_of(kType);
  RawBlock raw;
  Loads::load16(r.qs + b * f.qs, raw.qs);
  if constexpr (f.qs == 32) Loads::load16(r.qs + b * f.qs + 16, raw.qs + 4);
  if constexpr (f.qh == 4) raw.qh[0] = Loads::load4(r.qh + b * 4);
  if constexpr (f.qh == 8) Loads::load8(r.qh + b * 8, raw.qh);
  if constexpr (f.params == 2) raw.params = Loads::load2(r.params + b * 2);
  if constexpr (f.params == 4) raw.params = Loads::load4(r.params + b * 4);
  const int64_t s = b / kSubBlocks;
  if constexpr (kType == DType::Q4_K || kType == DType::Q5_K) Loads::load16(r.super + s * 16, raw.super);
  if constexpr (kType == DType::Q6_K) {
    raw.super[0] = Loads::load2(r.super + s * 16 + 2 * (b % kSubBlocks));
    raw.super[1] = Loads::load2(r.super_d + s * 2);
  }
  return raw;
}

// Words i and 4 + i of a block's quants (weights 4i..4i+3 and 16+4i..16+4i+3, byte j = weight
// 4i + j), i in 0..3: the part of unpack_block one lane of a tensor-core tile needs.
template <DType kType>
G4_HOST_DEVICE void unpack_word_pair(const RawBlock& raw, int i, uint32_t* lo, uint32_t* hi) {
  constexpr Format f = format_of(kType);
  // Word i of the four at q, selected, not indexed: a lane's i is not known at compile time, and an
  // indexed register array would go to local memory.
  auto word = [i](const uint32_t* q) { return i == 0 ? q[0] : i == 1 ? q[1] : i == 2 ? q[2] : q[3]; };
  if constexpr (kType == DType::Q8_0) {
    *lo = word(raw.qs);
    *hi = word(raw.qs + 4);
  } else {
    const uint32_t qs = word(raw.qs);
    *lo = qs & 0x0F0F0F0Fu;
    *hi = (qs >> 4) & 0x0F0F0F0Fu;
    if constexpr (f.qh == 4) {  // bit 8c + i (weight 4i + c) and 8c + 4 + i (16 + 4i + c) to bit 8c + 4
      *lo |= (raw.qh[0] << (4 - i)) & 0x10101010u;
      *hi |= (raw.qh[0] >> i) & 0x10101010u;
    }
    if constexpr (f.qh == 8) {  // bits 8c + 2i, 8c + 2i + 1 to bits 8c + 4, 8c + 5
      *lo |= ((raw.qh[0] >> (2 * i)) & 0x03030303u) << 4;
      *hi |= ((raw.qh[1] >> (2 * i)) & 0x03030303u) << 4;
    }
  }
}

// A block ready for arithmetic: weight i = scale(i) * (q_i - quant_offset) (+ min), where q_i is
// byte i % 4 of q[i / 4] (unsigned, or int8 for Q8_0) and scale(i) is `scale` for i < 16,
// `scale_hi` above (they differ only for Q6_K, whose scales cover 16 weights).
struct BlockWeights {
  uint32_t q[8];
  float scale, scale_hi, min;
};

// The scales and minimum of a block (BlockWeights without q); `sub` = b % kSubBlocks: which of its
// super-block's scales a K-quant block uses.
template <DType kType>
G4_HOST_DEVICE void unpack_scales(const RawBlock& raw, int sub, BlockWeights& w) {
  if constexpr (kType == DType::Q4_K || kType == DType::Q5_K) {
    int sc, m;
    k_scale_min(sub, raw.super[1], raw.super[2], raw.super[3], &sc, &m);
    w.scale = f16_bits_to_float(raw.super[0] & 0xFFFFu) * float(sc);
    w.min = -(f16_bits_to_float(raw.super[0] >> 16) * float(m));
    w.scale_hi = w.scale;
  } else if constexpr (kType == DType::Q6_K) {
    const float d = f16_bits_to_float(raw.super[1]);
    w.scale = d * float(int8_t(raw.super[0] & 0xFFu));
    w.scale_hi = d * float(int8_t((raw.super[0] >> 8) & 0xFFu));
  } else {
    w.scale = w.scale_hi = f16_bits_to_float(raw.params & 0xFFFFu);
    if constexpr (has_min(kType)) w.min = f16_bits_to_float(raw.params >> 16);
  }
}

template <DType kType>
G4_HOST_DEVICE BlockWeights unpack_block(const RawBlock& raw, int sub) {
  BlockWeights w{};
  for (int i = 0; i < 4; ++i) unpack_word_pair<kType>(raw, i, &w.q[i], &w.q[4 + i]);
  unpack_scales<kType>(raw, sub, w);
  return w;
}

// A weight from its stored quant byte, as the quant codecs compute it (bit-identical to decode_row).
template <DType kType>
G4_HOST_DEVICE float dequantize_quant(uint32_t byte, float scale, float min) {
  const int q = kType == DType::Q8_0 ? int(int8_t(byte)) : int(byte);
  const float v = scale * float(q - quant_offset(kType));
  if constexpr (has_min(kType)) return v + min;
  return v;
}

// Weight i of the block.
template <DType kType>
G4_HOST_DEVICE float dequantized(const BlockWeights& w, int i) {
  return dequantize_quant<kType>((w.q[i / 4] >> (8 * (i % 4))) & 0xFFu, i < kBlock / 2 ? w.scale : w.scale_hi, w.min);
}

// ---- activations ----

// 32 activations as int16 with a float scale: x ≈ d · q, d = amax / 32767.
struct alignas(16) ActivationBlock {
  uint32_t q[16];  // value 2k in the low half of word k, value 2k + 1 in the high half
  float d;
  float dsum;      // d · sum: the weights' minimum term
  int32_t sum;     // Σ q: the offset term, exact
  int32_t sum_lo;  // Σ q over values 0..15 (Q6_K's scales cover 16 weights)
};
static_assert(sizeof(ActivationBlock) == 80, "five 16-byte loads per block");

// The steps of quantizing a block, shared by quantize_activation_block and the kernels that
// quantize a block spread over several threads (each step's result does not depend on the order
// in which a block's values or partial maxima are combined).
// A block's running max |x|; a NaN wins and stays.
G4_HOST_DEVICE float activation_amax(float amax, float a) { return a > amax || a != a ? a : amax; }
// 32767 / amax, or 0 (every q 0) when amax is 0 or not finite.
G4_HOST_DEVICE float activation_inverse(float amax) {
  return amax <= 3.4028234663852886e38f && amax > 0.0f ? 32767.0f / amax : 0.0f;
}
G4_HOST_DEVICE int quantize_activation(float x, float inverse) {
  const float v = rintf(x * inverse);
  return v > 32767.0f ? 32767 : v < -32767.0f ? -32767 : int(v);
}
// Values 2k and 2k + 1 as word k.
G4_HOST_DEVICE uint32_t activation_word(int q0, int q1) {
  return uint32_t(uint16_t(int16_t(q0))) | uint32_t(uint16_t(int16_t(q1))) << 16;
}
// d: NaN for a non-finite block, so its dot products (and the logits) are NaN.
G4_HOST_DEVICE float activation_scale(float amax) { return amax <= 3.4028234663852886e38f ? amax / 32767.0f : NAN; }

G4_HOST_DEVICE void quantize_activation_block(const float* x, ActivationBlock& out) {
  float amax = 0.0f;
  for (int i = 0; i < kBlock; ++i) amax = activation_amax(amax, fabsf(x[i]));
  const float inverse = activation_inverse(amax);
  int sum = 0, sum_lo = 0;
  for (int k = 0; k < kBlock / 2; ++k) {
    const int q0 = quantize_activation(x[2 * k], inverse), q1 = quantize_activation(x[2 * k + 1], inverse);
    sum += q0 + q1;
    if (k < kBlock / 4) sum_lo += q0 + q1;
    out.q[k] = activation_word(q0, q1);
  }
  out.d = activation_scale(amax);
  out.dsum = out.d * float(sum);
  out.sum = sum;
  out.sum_lo = sum_lo;
}

// The quantized input in device memory: per token five planes of 16 bytes per block, planes 0-3
// holding words 4k..4k+3 of each block's q, plane 4 its d, dsum, sum and sum_lo. Lanes on
// consecutive blocks then read 512 contiguous bytes per load (80-byte blocks side by side would
// make each load touch 20 cache lines instead of 4). plane_index(t, k, blocks, b): the 16-byte
// entry of plane k, block b of token t, for rows of `blocks` blocks.
inline constexpr int kActivationPlanes = 5;
static_assert(sizeof(ActivationBlock) == kActivationPlanes * 16, "one 16-byte plane entry per block each");
G4_HOST_DEVICE int64_t plane_index(int64_t t, int k, int64_t blocks, int64_t b) {
  return (t * kActivationPlanes + k) * blocks + b;
}

// ---- the dot product ----

// c + a.lo16 · b.byte0 + a.hi16 · b.byte1 (dp2a.lo), with bytes 2 and 3 (dp2a.hi); signed. Every
// packed quant byte but Q8_0's is below 128, so signed bytes read them right.
// (Not volatile, unlike CUDA's __dp2a_lo, so the compiler may schedule them.)
G4_HOST_DEVICE int dp2a_lo(uint32_t a, uint32_t b, int c) {
#if defined(__CUDA_ARCH__)
  int d;
  asm("dp2a.lo.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
#else
  return c + int(int16_t(uint16_t(a))) * int(int8_t(uint8_t(b))) +
         int(int16_t(uint16_t(a >> 16))) * int(int8_t(uint8_t(b >> 8)));
#endif
}
G4_HOST_DEVICE int dp2a_hi(uint32_t a, uint32_t b, int c) {
#if defined(__CUDA_ARCH__)
  int d;
  asm("dp2a.hi.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
#else
  return dp2a_lo(a, b >> 16, c);
#endif
}

// acc + Σ w_i · x_i over the block, for every type but Q6_K (each rounding pinned: util/exact_float.h,
// so the GEMV and the batch GEMV give the same bits), from the exact integer dot
// dot = Σ (q_i - offset) · x.q_i (|dot| < 2^28; its float is the nearest, however computed):
// acc = fma(min, d·sum, acc) for the types with a minimum, then acc = fma(scale · d, dot, acc).
// d and dsum: the activation block's (ActivationBlock).
template <DType kType>
G4_HOST_DEVICE float accumulate_scaled_dot(float acc, float scale, float min, float d, float dsum, float dot) {
  if constexpr (has_min(kType)) acc = fma_f32(min, dsum, acc);
  return fma_f32(mul_f32(scale, d), dot, acc);
}

// The exact integer dots of a block with the activations: *lo over weights 0..15, *hi over 16..31.
template <DType kType>
G4_HOST_DEVICE void block_integer_dots(const BlockWeights& w, const ActivationBlock& x, int* lo, int* hi) {
  *lo = 0, *hi = 0;
  for (int i = 0; i < 4; ++i) {
    *lo = dp2a_lo(x.q[2 * i], w.q[i], *lo);
    *lo = dp2a_hi(x.q[2 * i + 1], w.q[i], *lo);
    *hi = dp2a_lo(x.q[8 + 2 * i], w.q[4 + i], *hi);
    *hi = dp2a_hi(x.q[9 + 2 * i], w.q[4 + i], *hi);
  }
}

// Σ w_i · x_i over the block, for the fastest GEMV (whose caller's addition the compiler may fuse
// with the last product). Offsets are subtracted as integers, minimums added through d·sum.
template <DType kType>
G4_HOST_DEVICE float block_dot(const BlockWeights& w, const ActivationBlock& x) {
  int lo, hi;
  block_integer_dots<kType>(w, x, &lo, &hi);
  constexpr int offset = quant_offset(kType);
  if constexpr (kType == DType::Q6_K)
    return x.d * (w.scale * float(lo - offset * x.sum_lo) + w.scale_hi * float(hi - offset * (x.sum - x.sum_lo)));
  const float dot = (w.scale * x.d) * float(lo + hi - offset * x.sum);
  if constexpr (has_min(kType)) return w.min * x.dsum + dot;
  return dot;
}

// acc + Σ w_i · x_i over the block with every rounding pinned: accumulate_scaled_dot's arithmetic,
// which the batch GEMV reproduces (Q6_K, which it does not take, pinned alike).
template <DType kType>
G4_HOST_DEVICE float accumulate_block_dot(float acc, const BlockWeights& w, const ActivationBlock& x) {
  int lo, hi;
  block_integer_dots<kType>(w, x, &lo, &hi);
  constexpr int offset = quant_offset(kType);
  if constexpr (kType == DType::Q6_K)
    return fma_f32(x.d,
                  fma_f32(w.scale, float(lo - offset * x.sum_lo), mul_f32(w.scale_hi, float(hi - offset * (x.sum - x.sum_lo)))),
                  acc);
  return accumulate_scaled_dot<kType>(acc, w.scale, w.min, x.d, x.dsum, float(lo + hi - offset * x.sum));
}

// ---- the batch GEMV's integer dots (packed_batch_gemv.cu) ----
//
// The batch GEMV gets a block's integer dot from two int8 tensor-core products: an int16 activation
// is 256 · hi + lo (hi its signed high byte, lo its unsigned low byte) and the quants minus the
// type's offset are signed bytes, so dot = 256 · Σ c·hi + Σ c·lo. Both products start from
// kMagicBits, so each result is the bit pattern of the float kMagic + its part, exact while the part
// is below 2^22 in magnitude (every type but Q6_K: at most 128 · 128 · 32 and 255 · 128 · 32).

// Four quant bytes minus the type's offset, as signed bytes (q's bits above the offset's are 0).
template <DType kType>
G4_HOST_DEVICE uint32_t centred_quants(uint32_t q) {
  constexpr uint32_t offset = quant_offset(kType), bits = offset * 0x01010101u;
  if constexpr (offset == 0) {
    return q;
  } else {
    const uint32_t t = q ^ bits;                            // q - offset in offset's two's complement width
    return t | (t & bits) * ((256 - 2 * offset) / offset);  // sign-extended to the byte
  }
}

inline constexpr int kMagicBits = 0x4B400000;   // 1.5 · 2^23
inline constexpr float kMagic = 12582912.0f;

// float(256 · hi + lo), correctly rounded (what the GEMV's float(dot) gives), from high =
// kMagicBits + hi and low = kMagicBits + lo: each subtraction is exact, and the fma rounds once.
G4_HOST_DEVICE float dot_from_parts(int high, int low) {
  return fma_f32(bits_float(uint32_t(high)) - kMagic, 256.0f, bits_float(uint32_t(low)) - kMagic);
}

// ---- the order of a row's sum ----
//
// For batch invariance (SumOrder::kBatchInvariant) a row's dot product is the sum of 32 "class"
// partials: class c accumulates blocks c, c + 32, c + 64, ... in that order from 0 (the GEMV's lane
// c, with accumulate_block_dot). The classes are added in `groups` runs of
// 32 / groups consecutive classes, each run summed from 0 in class order, and the runs' sums then
// added from 0 in order. `groups` (1, 2, 4, ... 32) depends only on the matrix's shape
// (fold_groups), so the GEMV (one row per warp) and the batched kernel (a run of classes per thread
// block, packed_batch_gemv.cu) give a row the same bits. docs/DESIGN.md §7.
inline constexpr int kClasses = 32;

// Runs for a matrix of N rows: enough that the batched kernel's thread blocks (kBatchRowsPerBlock
// rows and one run each) fill the GPU.
inline constexpr int kBatchRowsPerBlock = 128;
G4_HOST_DEVICE constexpr int fold_groups(int64_t N) {
  constexpr int64_t kWantedBlocks = 256;
  const int64_t tiles = (N + kBatchRowsPerBlock - 1) / kBatchRowsPerBlock;
  int groups = 1;
  while (groups < kClasses && tiles * groups < kWantedBlocks) groups *= 2;
  return groups;
}

// The sum of class partials partial(0..31) in the order above, for kGroups runs (unrolled: the 32
// reads can all be in flight before the additions, which stay in order).
template <int kGroups, typename Get>
G4_HOST_DEVICE float fold_classes(Get partial) {
  constexpr int kPerGroup = kClasses / kGroups;
  float total = 0.0f;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int g = 0; g < kGroups; ++g) {
    float run = 0.0f;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int c = g * kPerGroup; c < (g + 1) * kPerGroup; ++c) run += partial(c);
    total += run;
  }
  return total;
}

// fold_classes for a run count known at run time (one of 1, 2, 4, 8, 16, 32).
template <typename Get>
G4_HOST_DEVICE float fold_classes(int groups, Get partial) {
  switch (groups) {
    case 1: return fold_classes<1>(partial);
    case 2: return fold_classes<2>(partial);
    case 4: return fold_classes<4>(partial);
    case 8: return fold_classes<8>(partial);
    case 16: return fold_classes<16>(partial);
    default: return fold_classes<32>(partial);
  }
}

// ---- packing GGUF blocks ----

// The 32 quant values (Q8_0: its int8 bytes) of block `sub` of a GGUF block, as the codecs in
// src/quant/ decode them.
template <DType kType>
G4_HOST_DEVICE void gguf_quants(const uint8_t* block, int sub, uint8_t (&q)[kBlock]) {
  if constexpr (kType == DType::Q8_0) {
    for (int i = 0; i < kBlock; ++i) q[i] = block[2 + i];
  } else if constexpr (!is_k_quant(kType)) {  // d, [m], [qh: bit i = weight i], 16 bytes of nibbles
    constexpr int high = has_min(kType) ? 4 : 2;
    constexpr int nibbles = high + format_of(kType).qh;
    for (int i = 0; i < kBlock / 2; ++i) {
      q[i] = block[nibbles + i] & 0xF;
      q[i + 16] = block[nibbles + i] >> 4;
    }
    if constexpr (format_of(kType).qh == 4)
      for (int i = 0; i < kBlock; ++i) q[i] |= uint8_t(((block[high + i / 8] >> (i % 8)) & 1) << 4);
  } else if constexpr (kType == DType::Q6_K) {  // ql 128, qh 64: block sub = half h, group g
    const int h = sub / 4, g = sub % 4;
    for (int l = 0; l < kBlock; ++l)
      q[l] = uint8_t(((block[64 * h + 32 * (g % 2) + l] >> (4 * (g / 2))) & 0xF) |
                     (((block[128 + 32 * h + l] >> (2 * g)) & 3) << 4));
  } else {  // Q4_K, Q5_K: head 16, [qh 32: bit sub of byte l], nibbles in 4 chunks of 32 bytes
    constexpr int nibbles = kType == DType::Q5_K ? 48 : 16;
    for (int l = 0; l < kBlock; ++l) {
      q[l] = (block[nibbles + 32 * (sub / 2) + l] >> (4 * (sub % 2))) & 0xF;
      if constexpr (kType == DType::Q5_K) q[l] |= uint8_t(((block[16 + l] >> sub) & 1) << 4);
    }
  }
}

// Writes one block's quant values into its qs and qh bytes (layout above).
template <DType kType>
G4_HOST_DEVICE void pack_quants(const uint8_t (&q)[kBlock], uint8_t* qs, uint8_t* qh) {
  constexpr Format f = format_of(kType);
  if constexpr (kType == DType::Q8_0) {
    for (int i = 0; i < kBlock; ++i) qs[i] = q[i];
  } else {
    for (int i = 0; i < kBlock / 2; ++i) qs[i] = uint8_t((q[i] & 0xF) | (q[i + 16] & 0xF) << 4);
    uint32_t words[2] = {0, 0};
    for (int c = 0; c < 4; ++c)
      for (int i = 0; i < 4; ++i) {
        const uint32_t low = q[4 * i + c] >> 4, high = q[16 + 4 * i + c] >> 4;  // the bits above the nibble
        if constexpr (f.qh == 4) words[0] |= (low & 1) << (8 * c + i) | (high & 1) << (8 * c + 4 + i);
        if constexpr (f.qh == 8) {
          words[0] |= (low & 3) << (8 * c + 2 * i);
          words[1] |= (high & 3) << (8 * c + 2 * i);
        }
      }
    for (int i = 0; i < f.qh; ++i) qh[i] = uint8_t(words[i / 4] >> (8 * (i % 4)));
  }
}

// Packs GGUF block `index` (of its row; one block of 32 weights, or a K-quant super-block of 256)
// into the row's regions.
template <DType kType>
G4_HOST_DEVICE void pack_block(const uint8_t* gguf, const RowRegions<uint8_t>& r, int64_t index) {
  constexpr Format f = format_of(kType);
  constexpr int blocks = is_k_quant(kType) ? kSubBlocks : 1;
  for (int sub = 0; sub < blocks; ++sub) {
    uint8_t q[kBlock];
    gguf_quants<kType>(gguf, sub, q);
    const int64_t b = index * blocks + sub;
    pack_quants<kType>(q, r.qs + b * f.qs, r.qh + b * f.qh);
  }
  for (int i = 0; i < f.params; ++i) r.params[index * f.params + i] = gguf[i];  // d, [m] lead the block
  if constexpr (kType == DType::Q4_K || kType == DType::Q5_K)
    for (int i = 0; i < 16; ++i) r.super[index * 16 + i] = gguf[i];
  if constexpr (kType == DType::Q6_K) {
    for (int i = 0; i < 16; ++i) r.super[index * 16 + i] = gguf[192 + i];
    for (int i = 0; i < 2; ++i) r.super_d[index * 2 + i] = gguf[208 + i];
  }
}

// Calls f(std::integral_constant<DType, t>{}) for a block-quantized t (host code: launchers, tests).
template <typename F>
decltype(auto) with_block_type(DType t, F&& f) {
  switch (t) {
    case DType::Q8_0: return f(std::integral_constant<DType, DType::Q8_0>{});
    case DType::Q4_0: return f(std::integral_constant<DType, DType::Q4_0>{});
    case DType::Q4_1: return f(std::integral_constant<DType, DType::Q4_1>{});
    case DType::Q5_0: return f(std::integral_constant<DType, DType::Q5_0>{});
    case DType::Q5_1: return f(std::integral_constant<DType, DType::Q5_1>{});
    case DType::Q4_K: return f(std::integral_constant<DType, DType::Q4_K>{});
    case DType::Q5_K: return f(std::integral_constant<DType, DType::Q5_K>{});
    case DType::Q6_K: return f(std::integral_constant<DType, DType::Q6_K>{});
    default: throw Error(ErrorKind::kInternal, "packed weights: " + dtype_name(t) + " is not a block-quantized type");
  }
}

}  // namespace g4::packed
