// What the decode GEMVs share (gemv.cu: bf16 weights; packed_gemv.cu: block-quantized ones): warps
// per block, streaming weight loads, the token count as a template parameter, and the launch of
// several matrices that read one input (q/k/v) as one grid.
#pragma once
#include <cuda_runtime.h>

#include <string>
#include <type_traits>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace g4 {

inline constexpr int kGemvWarpsPerBlock = 8;

// Weights are read exactly once per step: bypass L1 so the activations stay resident there.
__device__ inline uint4 load_streaming(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// Asks L2 for `bytes` bytes from p (128-byte lines, spread over the warp's lanes): the head of a
// warp's weight rows, issued before pdl_wait() (weights depend on no earlier kernel).
__device__ inline void prefetch_l2(const void* p, int64_t bytes, int lane) {
  for (int64_t at = int64_t(lane) * 128; at < bytes; at += 32 * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(static_cast<const char*>(p) + at));
}

// Calls f(std::integral_constant<int, T>{}): the kernels keep one accumulator per token in registers,
// so the token count is a template parameter.
template <typename F>
void with_token_count(int64_t T, F&& f) {
  switch (T) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    case 8: return f(std::integral_constant<int, 8>{});
    default: throw Error(ErrorKind::kInternal, "gemv: " + std::to_string(T) + " tokens is more than kMaxGemvTokens");
  }
}

// Up to kMaxGemvTargets matrices in one grid: block b serves target s when first_block[s] <= b <
// first_block[s + 1] (targets past the count have no blocks).
template <typename Target>
struct GemvTargets {
  Target targets[kMaxGemvTargets];
  unsigned first_block[kMaxGemvTargets + 1];
};

// blocks_of(target) blocks for each of the `count` targets.
template <typename Target, typename BlocksOf>
GemvTargets<Target> plan_gemv_targets(const Target* targets, int count, BlocksOf&& blocks_of) {
  G4_CHECK(count >= 1 && count <= kMaxGemvTargets, "gemv: 1 to kMaxGemvTargets matrices per launch");
  GemvTargets<Target> plan{};
  for (int s = 0; s < kMaxGemvTargets; ++s) {
    if (s < count) plan.targets[s] = targets[s];
    plan.first_block[s + 1] = plan.first_block[s] + (s < count ? unsigned(blocks_of(targets[s])) : 0u);
  }
  return plan;
}

// This block's target and its block index within that target. Selected by value, not by a
// dynamic index, which would copy the parameters to local memory.
template <typename Target>
__device__ inline Target gemv_target(const GemvTargets<Target>& plan, unsigned* block_in_target) {
  static_assert(kMaxGemvTargets == 3, "the selection below names three targets");
  const int s = blockIdx.x >= plan.first_block[2] ? 2 : blockIdx.x >= plan.first_block[1] ? 1 : 0;
  *block_in_target = blockIdx.x - (s == 0 ? 0u : s == 1 ? plan.first_block[1] : plan.first_block[2]);
  return s == 0 ? plan.targets[0] : s == 1 ? plan.targets[1] : plan.targets[2];
}

}  // namespace g4
