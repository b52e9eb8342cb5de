// The CPU backend's hot loops are built twice on x86-64, for x86-64-v3 (AVX2, FMA) and for the
// baseline, and the dynamic loader picks one for the CPU it runs on (GCC/clang target_clones, an
// ifunc): the portable binary keeps the speed of an AVX2 build. A build that already targets AVX2
// (G4_NATIVE_ARCH) and other architectures compile them once.
#pragma once
#include <cstddef>
#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__AVX2__)
#define G4_HOT_LOOP __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define G4_HOT_LOOP
#endif

// The numeric kernels that read whole ranges their op has checked are built without the sanitizers'
// per-access checks, which stop their vectorisation (20-30x slower under ASan + UBSan); in an ASan
// build each call has ASan check every range it reads and writes instead (check_range), so a range
// past its buffer still aborts with ASan's report.
// (clang refuses no_sanitize beside target_clones: there the kernels keep their per-access checks.)
#if defined(__clang__)
#define G4_UNCHECKED_KERNEL
#else
#define G4_UNCHECKED_KERNEL __attribute__((no_sanitize("address", "undefined")))
#endif

#if defined(__SANITIZE_ADDRESS__)
#define G4_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define G4_ASAN 1
#endif
#endif
#ifdef G4_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace g4::cpu {

// The independent double sums every dot product of the CPU backend accumulates in.
inline constexpr int kDotLanes = 8;

// Inlined into each G4_HOT_LOOP clone, so it is compiled for that clone's target.
inline float dot(const float* a, const float* b, int64_t n) {
  // Eight independent partial sums keep the loop vectorised; double sums keep the CPU, the oracle the
  // GPU paths are held to, near transformers' float32 at long context (docs/DESIGN.md, "Oracles":
  // 2.19e-5 against its 1.97e-5 on the 4 096-position oracle, 2.45e-5 with float sums; ~15 % slower).
  double acc[kDotLanes] = {};
  int64_t i = 0;
  for (; i + kDotLanes <= n; i += kDotLanes)
    for (int j = 0; j < kDotLanes; ++j) acc[j] += double(a[i + j]) * b[i + j];
  double s = 0;
  for (; i < n; ++i) s += double(a[i]) * b[i];
  for (double v : acc) s += v;
  return float(s);
}

#ifdef G4_ASAN
// A read of the first poisoned byte of [p, p + bytes), from instrumented code, makes ASan report it.
inline void check_range(const void* p, size_t bytes) {
  if (const void* bad = __asan_region_is_poisoned(const_cast<void*>(p), bytes))
    (void)*static_cast<const volatile char*>(bad);
}
#else
inline void check_range(const void*, size_t) {}
#endif

// out[r * out_stride] = dot(x row r, w) for the R rows of x (row stride K): cpu::dot's sums, term for
// term and in its order, over operands already widened to double (exact), so the loop is loads and
// FMAs alone and the R rows share each load of w.
template <int R>
[[gnu::always_inline]] G4_UNCHECKED_KERNEL inline void dots(const double* x, int64_t K, const double* w, float* out,
                                                            int64_t out_stride) {
  double acc[R][kDotLanes] = {};
  int64_t i = 0;
  for (; i + kDotLanes <= K; i += kDotLanes)
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < kDotLanes; ++j) acc[r][j] += x[r * K + i + j] * w[i + j];
  for (int r = 0; r < R; ++r) {
    double s = 0;
    for (int64_t k = i; k < K; ++k) s += x[r * K + k] * w[k];
    for (double v : acc[r]) s += v;
    out[r * out_stride] = float(s);
  }
}

}  // namespace g4::cpu
