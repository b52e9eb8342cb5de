// The CPU backend's hot loops are built twice on x86-64, for x86-64-v3 (AVX2, FMA) and for the
// baseline, and the dynamic loader picks one for the CPU it runs on (GCC/clang target_clones, an
// ifunc): the portable binary keeps the speed of an AVX2 build. A build that already targets AVX2
// (G4_NATIVE_ARCH) and other architectures compile them once.
#pragma once
#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__AVX2__)
#define G4_HOT_LOOP __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define G4_HOT_LOOP
#endif

namespace g4::cpu {

// Inlined into each G4_HOT_LOOP clone, so it is compiled for that clone's target.
inline float dot(const float* a, const float* b, int64_t n) {
  // Eight independent partial sums keep the loop vectorised; double sums keep the CPU, the oracle the
  // GPU paths are held to, near transformers' float32 at long context (docs/DESIGN.md, "Oracles":
  // 2.19e-5 against its 1.97e-5 on the 4 096-position oracle, 2.45e-5 with float sums; ~15 % slower).
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += double(a[i + j]) * b[i + j];
  double s = 0;
  for (; i < n; ++i) s += double(a[i]) * b[i];
  for (double v : acc) s += v;
  return float(s);
}

}  // namespace g4::cpu
