// A counter-based uniform number in [-1, 1) from (seed, index): a splitmix64 finaliser. Used to fill
// tensors with random values identically on every backend (Backend::fill_uniform).
#pragma once
#include <cmath>
#include <cstdint>

#include "util/host_device.h"

namespace g4 {

G4_HOST_DEVICE float uniform_hash(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return float(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
}

// center + spread * uniform_hash(seed, i), one rounding on every backend (nvcc would fuse it anyway).
G4_HOST_DEVICE float uniform_fill_value(uint64_t seed, uint64_t i, float center, float spread) {
  return fmaf(spread, uniform_hash(seed, i), center);
}

}  // namespace g4
