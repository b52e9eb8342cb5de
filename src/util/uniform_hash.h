// A counter-based uniform number in [-1, 1) from (seed, index): a splitmix64 finaliser. Used to fill
// tensors with random values (and random quantized blocks) identically on every backend
// (Backend::fill_uniform).
#pragma once
#include <cmath>
#include <cstdint>

#include "util/host_device.h"

namespace g4 {

// 64 random bits from (seed, index).
G4_HOST_DEVICE uint64_t hash_bits(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

G4_HOST_DEVICE float uniform_hash(uint64_t seed, uint64_t i) {
  return float(hash_bits(seed, i) >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
}

// center + spread * uniform_hash(seed, i), one rounding on every backend (nvcc would fuse it anyway).
G4_HOST_DEVICE float uniform_fill_value(uint64_t seed, uint64_t i, float center, float spread) {
  return fmaf(spread, uniform_hash(seed, i), center);
}

}  // namespace g4
