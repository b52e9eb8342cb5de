// One attention head's norm and RoPE by one warp (Backend::head_norms' math), shared by the
// head-norm kernel and the decode attention kernel that folds the norms in.
#pragma once
#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/warp_reduce.cuh"

namespace g4 {

inline constexpr int kHeadNormPairsPerAccess = 4;
inline constexpr int kHeadNormMaxAccesses = 512 / 2 / 32 / kHeadNormPairsPerAccess;  // head_dim <= 512

__device__ inline void load_bf16x4(const bf16* p, float (&out)[4]) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  out[0] = lo.x, out[1] = lo.y, out[2] = hi.x, out[3] = hi.y;
}

__device__ inline void store_bf16x4(bf16* p, const float (&in)[4]) {
  uint2 raw;
  *reinterpret_cast<__nv_bfloat162*>(&raw.x) = __floats2bfloat162_rn(in[0], in[1]);
  *reinterpret_cast<__nv_bfloat162*>(&raw.y) = __floats2bfloat162_rn(in[2], in[3]);
  *reinterpret_cast<uint2*>(p) = raw;
}

// weight[i .. i + 4), or ones when weight is null.
__device__ inline float4 load_weight4(const float* weight, int64_t i) {
  return weight ? *reinterpret_cast<const float4*>(weight + i) : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
}

// Lane l of a warp owns the rotating pairs (i + p, i + p + half) of a head row for
// i = 4 (l + 32j), p < 4, j < kAccesses (half a multiple of 4).
__device__ inline int64_t head_norm_pair(int j) { return kHeadNormPairsPerAccess * ((threadIdx.x & 31) + 32 * j); }

// The rotation of a lane's pairs at one position.
template <int kAccesses>
struct RopeLane {
  float cos[kAccesses][kHeadNormPairsPerAccess], sin[kAccesses][kHeadNormPairsPerAccess];
};

// cos and sin of pair i's rotation at `position`, inv_freq F32 [half] (a zero frequency rotates by
// nothing: proportional partial RoPE). Every kernel gets them from here, so all agree bit for bit.
__device__ inline float2 rope_cos_sin(const float* inv_freq, int64_t i, int64_t half, float position) {
  const float f = i < half ? inv_freq[i] : 0.0f;
  float sn = 0.0f, cs = 1.0f;
  if (f != 0.0f) sincosf(position * f, &sn, &cs);
  return make_float2(cs, sn);
}

template <int kAccesses>
__device__ inline void rope_lane(const float* inv_freq, int64_t half, float position, RopeLane<kAccesses>& r) {
#pragma unroll
  for (int j = 0; j < kAccesses; ++j)
#pragma unroll
    for (int p = 0; p < kHeadNormPairsPerAccess; ++p) {
      const float2 cs = rope_cos_sin(inv_freq, head_norm_pair(j) + p, half, position);
      r.cos[j][p] = cs.x, r.sin[j][p] = cs.y;
    }
}

// The same from a row of precomputed rope_cos_sin values [half] (one token's).
template <int kAccesses>
__device__ inline void rope_lane(const float2* table_row, int64_t half, RopeLane<kAccesses>& r) {
#pragma unroll
  for (int j = 0; j < kAccesses; ++j) {
    const int64_t i = head_norm_pair(j);
    float4 lo = make_float4(1.0f, 0.0f, 1.0f, 0.0f), hi = lo;
    if (i < half) {
      lo = *reinterpret_cast<const float4*>(table_row + i);
      hi = *reinterpret_cast<const float4*>(table_row + i + 2);
    }
    r.cos[j][0] = lo.x, r.sin[j][0] = lo.y, r.cos[j][1] = lo.z, r.sin[j][1] = lo.w;
    r.cos[j][2] = hi.x, r.sin[j][2] = hi.y, r.cos[j][3] = hi.z, r.sin[j][3] = hi.w;
  }
}

// A lane's raw values of one head row (zeros past the row).
template <int kAccesses>
struct HeadRow {
  float a[kAccesses][4], b[kAccesses][4];  // first and second half
};

template <int kAccesses>
__device__ inline void load_head_row(const bf16* in, int64_t half, HeadRow<kAccesses>& r) {
#pragma unroll
  for (int j = 0; j < kAccesses; ++j) {
    const int64_t i = head_norm_pair(j);
    if (i < half) {
      load_bf16x4(in + i, r.a[j]);
      load_bf16x4(in + i + half, r.b[j]);
    } else {
#pragma unroll
      for (int p = 0; p < 4; ++p) r.a[j][p] = r.b[j][p] = 0.0f;
    }
  }
}

// Norms a loaded head row of 2 * half values: out = rope(rms_norm(in)·weight) (a null weight is
// ones, a null rope rotates nothing). Each group of four values goes to out(i, values) and
// plain(i, values), for i in the first half and i + half in the second, where plain gets
// rms_norm(in) alone (V of a K=V layer). Values handed to out are rounded to bf16, as the op
// stores them.
template <int kAccesses, typename Out, typename Plain>
__device__ void norm_head_row(const HeadRow<kAccesses>& r, int64_t half, const float* weight, float eps,
                              const RopeLane<kAccesses>* rope, Out&& out, Plain&& plain) {
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kAccesses; ++j)
#pragma unroll
    for (int p = 0; p < 4; ++p) ss = fmaf(r.b[j][p], r.b[j][p], fmaf(r.a[j][p], r.a[j][p], ss));
  const float inv = rsqrtf(warp_reduce<SumOp>(ss) / float(2 * half) + eps);
#pragma unroll
  for (int j = 0; j < kAccesses; ++j) {
    const int64_t i = head_norm_pair(j);
    if (i >= half) continue;
    float na[4], nb[4];
#pragma unroll
    for (int p = 0; p < 4; ++p) na[p] = r.a[j][p] * inv, nb[p] = r.b[j][p] * inv;
    plain(i, na);
    plain(i + half, nb);
    const float4 wa = load_weight4(weight, i), wb = load_weight4(weight, i + half);
    const float was[4] = {wa.x, wa.y, wa.z, wa.w}, wbs[4] = {wb.x, wb.y, wb.z, wb.w};
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      float ra = round_bf16(na[p] * was[p]), rb = round_bf16(nb[p] * wbs[p]);
      if (rope) {
        const float cs = rope->cos[j][p], sn = rope->sin[j][p];
        // Explicit roundings: every kernel that inlines this computes the same bits.
        const float ta = __fsub_rn(__fmul_rn(ra, cs), __fmul_rn(rb, sn));
        const float tb = __fadd_rn(__fmul_rn(rb, cs), __fmul_rn(ra, sn));
        ra = ta;
        rb = tb;
      }
      na[p] = round_bf16(ra), nb[p] = round_bf16(rb);
    }
    out(i, na);
    out(i + half, nb);
  }
}

// A sink that stores nothing.
struct NoSink {
  __device__ void operator()(int64_t, const float (&)[4]) const {}
};

// A head_norm_row sink that stores bf16 values at row + i; a null row stores nothing.
struct Bf16RowSink {
  bf16* row;
  __device__ void operator()(int64_t i, const float (&v)[4]) const {
    if (row) store_bf16x4(row + i, v);
  }
};

}  // namespace g4
