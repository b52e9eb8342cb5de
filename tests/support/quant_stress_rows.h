// The generated rows of the quantization stress check (tests/test_quant.cpp), shared with the tool
// that records llama.cpp's results on them (tools/fixtures/llamacpp_golden.cpp, C++17): value i of rows of
// kQuantStressCols. Integer hashing and exact float steps only, so every compiler gives the same rows.
#pragma once
#include <cstdint>

namespace g4::test {

inline constexpr int kQuantStressRows = 2048;
inline constexpr int kQuantStressCols = 256;  // one K-quant super-block, eight 32-blocks

inline float quant_stress_value(uint64_t i) {
  uint64_t z = i + 0x9e3779b97f4a7c15ull;  // splitmix64
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  const float t = float(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;  // uniform in [-1, 1)
  const uint64_t row = i / kQuantStressCols, block = (i % kQuantStressCols) / 32;
  const float scale = float(1u << (row % 16)) * (1.0f / 4096.0f);  // 2^-12 .. 2^3
  switch (row % 4) {
    case 0: return scale * t;                                                  // uniform
    case 1: return scale * t * t * t;                                          // peaked at zero
    case 2: return (z & 63) == 0 ? 16.0f * scale * t : scale * t;             // outliers
    default: return (row / 4 + block) % 3 == 0 ? 0.0f : scale * (t + 0.75f);  // zero blocks, offset
  }
}

}  // namespace g4::test
