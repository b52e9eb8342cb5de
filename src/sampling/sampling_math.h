// The arithmetic that decides a sampled token (docs/DESIGN.md §4), shared by the CPU sampler and the CUDA
// kernel so that both return the same token for the same logits, parameters and seed.
//
// Exactness comes from making every decision on numbers that both processors compute bit for bit:
//  * Order. Tokens are ranked by logit (descending; equal logits: lower id first) through a 64-bit
//    rank, rank_of(). Dividing by a positive temperature does not change the order of the logits,
//    so this is the order of s = z / T and of the probabilities, without rounding-made ties.
//  * Weights. A token's softmax weight is the integer q = floor(exp(d) * 2^40), d = (z - z_max) / T
//    (computed as (z - z_max) * (1 / T)), with our own exp built from IEEE-exact operations (no
//    libm, whose exp differs between host and device). The argmax weighs exactly 2^40; tokens more
//    than kMaxLogGap below it weigh 0 (they would round to at most 1 anyway). Sums of q are
//    integer, hence identical in any summation order (sequential on the CPU, trees on the GPU).
//  * top_p keeps the shortest prefix (in rank order) whose weight reaches ceil(top_p * Q_k)
//    (Q_k: weight of the top-k set); min_p keeps q >= ceil(min_p * 2^40) (p >= min_p * max p).
//  * The draw takes r = floor(u * Q) with u = philox_draw_bits(seed) / 2^64 and Q the kept weight,
//    and returns the lowest id whose cumulative kept weight (ids ascending) exceeds r.
//
// Code in this file must keep every multiply-add an explicit fma: compilers may otherwise fuse
// a*b+c on one processor and not on the other.
#pragma once
#include <cstdint>

#include "util/exact_float.h"
#include "util/host_device.h"
#include "sampling/philox.h"

#if !defined(__CUDA_ARCH__)
#include <cmath>
#include <cstring>
#endif

namespace g4::sampling {

inline constexpr int kWeightBits = 40;
inline constexpr uint64_t kWeightOne = uint64_t(1) << kWeightBits;  // weight of the argmax
inline constexpr float kMaxLogGap = 28.0f;  // exp(-28) * 2^40 < 1: weight 0 beyond this gap
// Weights fit in 64 bits for rows of up to 2^23 tokens (2^23 * 2^40 < 2^64).
inline constexpr int64_t kMaxVocab = int64_t(1) << 23;

G4_HOST_DEVICE float round_to_int_f32(float x) {  // ties to even, like the default rounding mode
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::rint(x);
#endif
}

G4_HOST_DEVICE double ceil_f64(double x) {
#if defined(__CUDA_ARCH__)
  return ceil(x);
#else
  return std::ceil(x);
#endif
}

G4_HOST_DEVICE uint64_t mul_hi_u64(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#else
  return uint64_t((unsigned __int128)a * b >> 64);
#endif
}

// Monotone map of a float to uint32: a < b  <=>  key(a) < key(b) (with -0 < +0).
G4_HOST_DEVICE uint32_t logit_key(float z) {
  const uint32_t b = float_bits(z);
  return b ^ (uint32_t(int32_t(b) >> 31) | 0x80000000u);  // negative: flip all bits; else the sign
}

G4_HOST_DEVICE float key_logit(uint32_t key) {
  return bits_float((key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key);
}

// Position in the ranking as one number: larger = ranked earlier (higher logit, then lower id).
G4_HOST_DEVICE uint64_t rank_of(uint32_t key, uint32_t id) {
  return (uint64_t(key) << 32) | uint32_t(0xFFFFFFFFu - id);
}
G4_HOST_DEVICE uint32_t rank_id(uint64_t rank) { return 0xFFFFFFFFu - uint32_t(rank); }
// A rank every token reaches: "no cut".
inline constexpr uint64_t kKeepAllRanks = 0;

// exp(x) for x in [-kMaxLogGap, 0]: x = n*ln2 + r with |r| <= ln2/2, e^r by its degree-7 Taylor
// polynomial (error < 1e-8 relative), 2^n applied through the exponent bits; the 2^40 weight
// scale folds into that power of two. Returns exp(x) * 2^kWeightBits.
G4_HOST_DEVICE float scaled_exp_nonpositive(float x) {
  const float kLog2e = 1.44269504f;
  const float kLn2Hi = 0.693145751953125f;  // few mantissa bits: n * kLn2Hi is exact
  const float kLn2Lo = 1.42860677e-06f;
  const float n = round_to_int_f32(x * kLog2e);
  float r = fma_f32(n, -kLn2Hi, x);
  r = fma_f32(n, -kLn2Lo, r);
  float p = 1.0f / 5040.0f;
  p = fma_f32(p, r, 1.0f / 720.0f);
  p = fma_f32(p, r, 1.0f / 120.0f);
  p = fma_f32(p, r, 1.0f / 24.0f);
  p = fma_f32(p, r, 1.0f / 6.0f);
  p = fma_f32(p, r, 0.5f);
  p = fma_f32(p, r, 1.0f);
  p = fma_f32(p, r, 1.0f);
  const int exponent = int(n) + kWeightBits;  // >= 40 - 41 > -126: a normal float
  return p * bits_float(uint32_t(exponent + 127) << 23);
}

G4_HOST_DEVICE float inverse_temperature(float temperature) { return 1.0f / temperature; }

// Softmax weight of logit z in a row whose largest logit is z_max (see the file comment), scaled
// by 2^40 and not yet truncated: finish_weight(z, scaled_exp_nonpositive(weight_exponent(z))).
// The three steps are separate so that the host can run each as its own vectorised loop.
G4_HOST_DEVICE float weight_exponent(float z, float z_max, float inv_temperature) {
  const float d = (z - z_max) * inv_temperature;
  return d >= -kMaxLogGap ? d : -kMaxLogGap;  // also maps -inf and NaN (inf - inf) into range
}

// Tokens beyond the gap (and -inf) weigh 0; z == z_max weighs exactly 2^40, also when infinite.
G4_HOST_DEVICE float finish_weight(float z, float z_max, float inv_temperature, float scaled_exp) {
  const float d = (z - z_max) * inv_temperature;
  const float weight = d >= -kMaxLogGap ? scaled_exp : 0.0f;
  return z == z_max ? float(kWeightOne) : weight;
}

G4_HOST_DEVICE float scaled_token_weight(float z, float z_max, float inv_temperature) {
  return finish_weight(z, z_max, inv_temperature,
                       scaled_exp_nonpositive(weight_exponent(z, z_max, inv_temperature)));
}

// The integer weight q of logit z: the scaled weight, truncated.
G4_HOST_DEVICE uint64_t token_weight(float z, float z_max, float inv_temperature) {
  return uint64_t(scaled_token_weight(z, z_max, inv_temperature));
}

// Weight the top-p prefix must reach: ceil(top_p * total), at least 1.
G4_HOST_DEVICE uint64_t top_p_target(float top_p, uint64_t total) {
  const uint64_t target = uint64_t(ceil_f64(double(top_p) * double(total)));
  return target < 1 ? 1 : target;
}

// Smallest weight min_p keeps: p >= min_p * max(p)  <=>  q >= min_p * 2^40.
G4_HOST_DEVICE uint64_t min_p_floor(float min_p) {
  return uint64_t(ceil_f64(double(min_p) * double(kWeightOne)));
}

// The draw: the token is the lowest id whose cumulative kept weight reaches this target (in
// 1..total): floor(u * total) + 1 with u = philox_draw_bits(seed) / 2^64.
G4_HOST_DEVICE uint64_t draw_target(uint64_t seed, uint64_t total) {
  return mul_hi_u64(philox_draw_bits(seed), total) + 1;
}

}  // namespace g4::sampling
