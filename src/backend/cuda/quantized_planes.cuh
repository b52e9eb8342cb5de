// Quantizing a one-row activation for the packed GEMV inside the kernel that produces it
// (residual_norm's next input, the decode attention's output), which saves the GEMV's quantize
// launch (docs/DESIGN.md §3, "The quantized input"). A block of 32 values is held by 32 / kValues
// consecutive lanes, kValues each; they combine their maxima and integer sums by shuffles and write
// the block's plane entries (packed_blocks.h), with the functions quantize_activation_block uses, so
// the bits are those of the quantize kernel.
#pragma once
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/packed_blocks.h"
#include "backend/cuda/warp_reduce.cuh"

namespace g4 {

// Block i of a bf16 activation (32 values from x + 32 i) quantized as quantize_activation_block does:
// the quantize kernels' step (packed_gemv.cu's planes, packed_batch_gemv.cu's batch layout).
__device__ inline packed::ActivationBlock quantized_block(const bf16* x, int64_t i) {
  const uint4* src = reinterpret_cast<const uint4*>(x + i * packed::kBlock);
  float values[packed::kBlock];
#pragma unroll
  for (int k = 0; k < packed::kBlock / 8; ++k) unpack8(src[k], values + 8 * k);
  packed::ActivationBlock a;
  packed::quantize_activation_block(values, a);
  return a;
}

// Values [part * kValues, (part + 1) * kValues) of block `block` (of `blocks` in the row), already
// rounded to the stored bf16 numbers. Every lane of the warp must call it, with whole blocks per
// lane group; `store` false for a group past the row (it only joins the shuffles).
template <int kValues>
__device__ inline void quantize_block_part(const float (&x)[kValues], int part, int64_t block, int64_t blocks,
                                           bool store, uint4* planes) {
  using namespace packed;
  constexpr int kLanes = kBlock / kValues;
  static_assert(kValues == 4 || kValues == 8, "a lane's words fill half or all of a plane entry");
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < kValues; ++j) amax = activation_amax(amax, fabsf(x[j]));
#pragma unroll
  for (int offset = 1; offset < kLanes; offset *= 2)
    amax = activation_amax(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  const float inverse = activation_inverse(amax);
  uint32_t words[kValues / 2];
  int sum = 0;
#pragma unroll
  for (int i = 0; i < kValues / 2; ++i) {
    const int q0 = quantize_activation(x[2 * i], inverse), q1 = quantize_activation(x[2 * i + 1], inverse);
    sum += q0 + q1;
    words[i] = activation_word(q0, q1);
  }
  int sum_lo = part < kLanes / 2 ? sum : 0;  // values 0..15
#pragma unroll
  for (int offset = 1; offset < kLanes; offset *= 2) {
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    sum_lo += __shfl_xor_sync(0xffffffffu, sum_lo, offset);
  }
  if (!store) return;
  const int word = part * (kValues / 2);  // this lane's first word of the block's 16
  uint4* entry = planes + plane_index(0, word / 4, blocks, block);
  if constexpr (kValues == 8) {
    *entry = make_uint4(words[0], words[1], words[2], words[3]);
  } else {
    reinterpret_cast<uint2*>(entry)[(word % 4) / 2] = make_uint2(words[0], words[1]);
  }
  if (part != 0) return;
  const float d = activation_scale(amax);
  planes[plane_index(0, 4, blocks, block)] =
      make_uint4(__float_as_uint(d), __float_as_uint(d * float(sum)), uint32_t(sum), uint32_t(sum_lo));
}

}  // namespace g4
