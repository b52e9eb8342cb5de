// What the prefill and decode attention kernels share: the sliding window's first visible key, the
// cache row of a key, and the shape checks. In both, key position kp is in the chunk (row kp - pos0
// of k_new) when kp >= pos0, else in cache row cache_row(a, kp); pos0 is read from device memory,
// and so are the page tables, so a captured graph replays at new positions and over new pages.
#pragma once
#include <algorithm>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace g4 {

inline constexpr int kMaxAttentionHeadDim = 512;

// First visible key position of a query at position p.
__host__ __device__ inline int64_t first_key(int64_t p, int window) { return window ? std::max<int64_t>(0, p - window + 1) : 0; }

// The cache row of key position p (KvCache's page_row; 32-bit: positions are below 2^31).
__device__ inline int64_t cache_row(const AttentionLaunch& a, int p) {
  const int page = a.page_table[(p / a.page_positions) % a.table_slots];
  return int64_t(page) * a.page_stride + p % a.page_positions;
}

inline void check_attention_shape(const AttentionLaunch& a) {
  G4_CHECK(a.head_dim % 16 == 0 && a.head_dim <= kMaxAttentionHeadDim,
           "cuda attention: head_dim must be a multiple of 16 and at most 512");
  G4_CHECK(a.kv_heads > 0 && a.heads % a.kv_heads == 0 && a.heads / a.kv_heads <= 32,
           "cuda attention: query heads must be a multiple (at most 32x) of kv heads");
  G4_CHECK(a.window == 0 || a.capacity() >= a.window, "attention: ring cache smaller than the sliding window");
  G4_CHECK(a.page_table && a.table_slots > 0 && a.page_positions > 0, "cuda attention: a cache without pages");
}

}  // namespace g4
