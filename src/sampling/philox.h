// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011): a
// counter-based generator, so the numbers of a token depend only on its seed — never on the
// backend, the batch slot or the thread that computes them. Host and device share this code.
#pragma once
#include <cstdint>

#include "util/host_device.h"

namespace g4 {

struct Philox4x32 {
  uint32_t v[4];
};

namespace philox_detail {

inline constexpr uint32_t kMul0 = 0xD2511F53u;
inline constexpr uint32_t kMul1 = 0xCD9E8D57u;
inline constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // golden ratio
inline constexpr uint32_t kWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1

G4_HOST_DEVICE void mul_hi_lo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t product = uint64_t(a) * uint64_t(b);
  *hi = uint32_t(product >> 32);
  *lo = uint32_t(product);
}

G4_HOST_DEVICE Philox4x32 round(const Philox4x32& c, uint32_t k0, uint32_t k1) {
  uint32_t hi0, lo0, hi1, lo1;
  mul_hi_lo(kMul0, c.v[0], &hi0, &lo0);
  mul_hi_lo(kMul1, c.v[2], &hi1, &lo1);
  return Philox4x32{{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
}

}  // namespace philox_detail

// The 10-round bijection of `counter` under `key`.
G4_HOST_DEVICE Philox4x32 philox4x32_10(Philox4x32 counter, uint32_t key0, uint32_t key1) {
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      key0 += philox_detail::kWeyl0;
      key1 += philox_detail::kWeyl1;
    }
    counter = philox_detail::round(counter, key0, key1);
  }
  return counter;
}

// The 64 random bits a token's draw consumes: Philox4x32-10 keyed by the token's seed
// (key = {low 32 bits, high 32 bits}) at counter {0, 0, 0, 0}; bits = v[1] << 32 | v[0].
// Read as the uniform u = bits / 2^64 in [0, 1); the sampler never forms u in floating point but
// uses the exact integer floor(u * total) (see sampling_math.h), so u = 0 is harmless and no
// u ≈ 1 round-up can select a token beyond the kept set.
G4_HOST_DEVICE uint64_t philox_draw_bits(uint64_t seed) {
  const Philox4x32 out = philox4x32_10(Philox4x32{{0, 0, 0, 0}}, uint32_t(seed), uint32_t(seed >> 32));
  return (uint64_t(out.v[1]) << 32) | out.v[0];
}

// The speculative rule's uniforms for the token of `seed` (sampling/speculative.h), from the same
// generator so that a seed gives the same text on every backend: a drafted token's acceptance test
// takes the other 64 bits of its draw's block (v[3] << 32 | v[2], counter {0, 0, 0, 0}); a rejected
// draft's correction takes counter {1, 0, 0, 0}'s first 64, as a draw does.
G4_HOST_DEVICE uint64_t philox_accept_bits(uint64_t seed) {
  const Philox4x32 out = philox4x32_10(Philox4x32{{0, 0, 0, 0}}, uint32_t(seed), uint32_t(seed >> 32));
  return (uint64_t(out.v[3]) << 32) | out.v[2];
}
G4_HOST_DEVICE uint64_t philox_correction_bits(uint64_t seed) {
  const Philox4x32 out = philox4x32_10(Philox4x32{{1, 0, 0, 0}}, uint32_t(seed), uint32_t(seed >> 32));
  return (uint64_t(out.v[1]) << 32) | out.v[0];
}

}  // namespace g4
