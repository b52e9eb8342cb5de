// What the prefill and decode attention kernels share: where a key position lives (the chunk's
// fresh K/V or a cache row), the sliding window's first visible key, and the shape checks.
// Key position kp is in the chunk (row kp - pos0 of k_new) when kp >= pos0, else in cache row
// kp % capacity. pos0 is read from device memory, so a captured graph replays at new positions.
#pragma once
#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace g4 {

inline constexpr int kMaxAttentionHeadDim = 512;

__device__ inline const bf16* key_row(const AttentionLaunch& a, const bf16* fresh, const bf16* cached, int64_t kp,
                                      int64_t pos0, int kvh) {
  const bf16* base = kp >= pos0 ? fresh + (kp - pos0) * a.kv_stride : cached + (kp % a.capacity) * a.kv_stride;
  return base + int64_t(kvh) * a.head_dim;
}

// First visible key position of a query at position p.
__device__ inline int64_t first_key(int64_t p, int window) { return window ? max(int64_t(0), p - window + 1) : 0; }

inline void check_attention_shape(const AttentionLaunch& a) {
  G4_CHECK(a.head_dim % 16 == 0 && a.head_dim <= kMaxAttentionHeadDim,
           "cuda attention: head_dim must be a multiple of 16 and at most 512");
  G4_CHECK(a.kv_heads > 0 && a.heads % a.kv_heads == 0 && a.heads / a.kv_heads <= 32,
           "cuda attention: query heads must be a multiple (at most 32x) of kv heads");
  G4_CHECK(a.window == 0 || a.capacity >= a.window, "attention: ring cache smaller than the sliding window");
}

}  // namespace g4
