// Float operations rounded once each, the same on host and device: where the CPU and the GPU (or
// two GPU kernels) must compute the same bits, no multiply-add may be left to the compiler to fuse
// on one side and not the other. Used by the sampler's arithmetic (sampling/sampling_math.h) and the
// packed GEMVs' block arithmetic (backend/cuda/packed_blocks.h).
#pragma once
#include <cstdint>

#include "util/host_device.h"

#if !defined(__CUDA_ARCH__)
#include <cmath>
#include <cstring>
#endif

namespace g4 {

G4_HOST_DEVICE uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
#endif
}

G4_HOST_DEVICE float bits_float(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
#endif
}

G4_HOST_DEVICE float fma_f32(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

G4_HOST_DEVICE float mul_f32(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

}  // namespace g4
