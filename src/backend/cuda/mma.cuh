// Tensor-core and asynchronous-copy primitives: Hopper's (sm_90a) warpgroup wgmma, and the warp's
// mma.sync m16n8k16 with ldmatrix (for tiles too small for a warpgroup).
//
// wgmma.m64nNk16 runs on a warpgroup (4 warps, 128 threads); warp w of it owns rows 16w..16w+15.
// With g = lane / 4, c = lane % 4, each register holding two bf16 (low first):
//   A in registers (16x16 per warp): a0 = (row g, k 2c, 2c+1), a1 = row g+8, a2 = row g k 2c+8, 2c+9,
//     a3 = row g+8 k 2c+8, 2c+9.
//   D (float): block i of 8 columns: d[i][0..1] = (row g, cols 8i+2c, +1), d[i][2..3] = row g+8.
// This is mma.m16n8k16's layout, so S's accumulators become P's A fragments in place.
// Operands in shared memory use the 128-byte swizzle: rows of 64 bf16 (128 bytes), 16-byte chunk j
// of row r stored at chunk j ^ (r % 8), 8-row groups 1024 bytes apart, tiles 1024-byte aligned.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace g4 {

__device__ inline uint32_t shared_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// 16 bytes global -> shared without passing through L1; writes zeros instead when !valid (src unread).
__device__ inline void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
// 4 bytes global -> shared (through L1: only the 16-byte form may bypass it); zeros when !valid.
__device__ inline void cp_async4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0) : "memory");
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most `Pending` of this thread's most recently committed copy groups are in flight.
template <int Pending>
__device__ inline void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}
// Waits for all of this thread's copies (committed or not).
__device__ inline void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
// Waits for this thread's copies, then orders them before later tensor-core (async proxy) reads.
__device__ inline void cp_async_wait_all_for_wgmma() {
  asm volatile("cp.async.wait_group 0;\nfence.proxy.async.shared::cta;\n" ::: "memory");
}

// Byte offset of element (row, col) in a swizzled tile of `rows` rows: 64-column blocks one after another.
__device__ inline uint32_t swizzled_offset(int rows, int row, int col) {
  return uint32_t((col >> 6) * rows * 128 + row * 128 + ((((col >> 3) & 7) ^ (row & 7)) << 4) + (col & 7) * 2);
}

// Descriptor of a swizzled operand starting at shared address `addr` within one 64-column block.
// The only stride such an operand needs is the 8-row step (1024 bytes): between row groups of a
// K-major operand, between 8-row key groups of an MN-major one 64 columns wide. Both offset fields
// carry it, as the two majors read different fields. Adding bytes / 16 moves the start.
__device__ inline uint64_t swizzled_desc(uint32_t addr) {
  constexpr uint64_t kRowGroup = 1024 >> 4, kSwizzle128 = 1;
  return (kSwizzle128 << 62) | (kRowGroup << 32) | (kRowGroup << 16) | ((addr & 0x3FFFF) >> 4);
}

__device__ inline void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ inline void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ inline void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Waits until at most `Pending` of the warpgroup's committed wgmma groups are in flight.
template <int Pending>
__device__ inline void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
}
// Pins accumulators at this point of the program: the compiler may not move their reads or writes
// across it, so none lands between an asynchronous wgmma and its wait.
template <int Blocks>
__device__ inline void wgmma_pin(float (&d)[Blocks][4]) {
#pragma unroll
  for (int i = 0; i < Blocks; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
}

#define G4_WGMMA_D4(i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])

// d = A·B^T (+ d when accumulate) for a 64xN tile over k = 16: A (64x16) and B (Nx16) K-major in
// shared memory.
template <int N>
__device__ inline void wgmma_ss(float (&d)[N / 8][4], uint64_t a, uint64_t b, bool accumulate) {
  static_assert(N == 32 || N == 64, "wgmma_ss: N is 32 or 64");
  if constexpr (N == 64) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
        "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, "
        "%33, p, 1, 1, 0, 0;\n}\n"
        : G4_WGMMA_D4(0), G4_WGMMA_D4(1), G4_WGMMA_D4(2), G4_WGMMA_D4(3), G4_WGMMA_D4(4), G4_WGMMA_D4(5),
          G4_WGMMA_D4(6), G4_WGMMA_D4(7)
        : "l"(a), "l"(b), "r"(int(accumulate)));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
        "%12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
        : G4_WGMMA_D4(0), G4_WGMMA_D4(1), G4_WGMMA_D4(2), G4_WGMMA_D4(3)
        : "l"(a), "l"(b), "r"(int(accumulate)));
  }
}

// d += A·B for a 64x64 tile over k = 16: A in registers, B (16x64) MN-major in shared memory.
__device__ inline void wgmma_rs_n64(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, "
      "%33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : G4_WGMMA_D4(0), G4_WGMMA_D4(1), G4_WGMMA_D4(2), G4_WGMMA_D4(3), G4_WGMMA_D4(4), G4_WGMMA_D4(5), G4_WGMMA_D4(6),
        G4_WGMMA_D4(7)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

// d = A·B (+ d when accumulate) for a 64xN tile over k = 16: A in registers (mma_bf16's fragments,
// warp w of the warpgroup rows 16w..16w+15), B (Nx16) K-major in shared memory.
template <int N>
__device__ inline void wgmma_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t b, bool accumulate) {
  static_assert(N == 8 || N == 16 || N == 32 || N == 64, "wgmma_rs: N is 8, 16, 32 or 64");
  if constexpr (N == 8) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, %8, p, 1, 1, 0;\n}\n"
        : G4_WGMMA_D4(0)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(accumulate)));
  } else if constexpr (N == 16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, "
        "{%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
        : G4_WGMMA_D4(0), G4_WGMMA_D4(1)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(accumulate)));
  } else if constexpr (N == 32) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
        : G4_WGMMA_D4(0), G4_WGMMA_D4(1), G4_WGMMA_D4(2), G4_WGMMA_D4(3)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(accumulate)));
  } else if constexpr (N == 64) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : G4_WGMMA_D4(0), G4_WGMMA_D4(1), G4_WGMMA_D4(2), G4_WGMMA_D4(3), G4_WGMMA_D4(4), G4_WGMMA_D4(5), G4_WGMMA_D4(6), G4_WGMMA_D4(7)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(accumulate)));
  }
}

#undef G4_WGMMA_D4

// d += A·B for one warp's 16x8 tile over k = 16 (bf16 in, float32 sums), fragments in the layout above.
__device__ inline void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d = A·B + c (c in every element) for one warp's 16x8 tile over k = 32 of int8 (int32 sums, exact):
// A signed, B signed (mma_s8_s8) or unsigned (mma_s8_u8). Registers as mma_bf16's with four int8 per
// register: a0 = (row g, k 4c..4c+3), a1 = row g+8, a2/a3 the same at k 16+4c..; b0 = (k 4c..4c+3,
// col g), b1 = k 16+4c..; d as mma_bf16's.
__device__ inline void mma_s8_s8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, int c) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c));
}
__device__ inline void mma_s8_u8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, int c) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c));
}

// Four (two) 8x8 bf16 matrices from shared memory, lanes 8j..8j+7 giving the 16-byte rows of
// matrix j: register j holds (row g, cols 2c, 2c+1) of it, or with .trans (rows 2c, 2c+1, col g).
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ inline void ldmatrix_x2(uint32_t& r0, uint32_t& r1, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
}

__device__ inline uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// 2^x by the special-function unit (2^-inf = 0).
__device__ inline float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace g4
