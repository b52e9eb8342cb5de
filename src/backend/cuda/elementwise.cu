// Row-wise and element-wise kernels of the CUDA backend (float32 arithmetic, bf16 storage). The
// ones a forward runs are launched with PDL (pdl.cuh): none reads a weight before pdl_wait() here,
// the gain is only the earlier launch.
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "util/uniform_hash.h"
#include "backend/cuda/head_norm.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/packed_blocks.h"
#include "backend/cuda/packed_kernels.h"
#include "backend/cuda/quantized_planes.cuh"
#include "backend/cuda/warp_reduce.cuh"

namespace g4 {

namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n, int per_thread = 1) {
  return int(std::min<int64_t>(ceil_div(n, int64_t(kThreads) * per_thread), 65535 * 8));
}

// Threads for a row kernel over `n` elements per row: a multiple of 32, at most `max_threads`.
int row_threads(int64_t n, int max_threads) { return int(std::clamp<int64_t>(ceil_div(n, 32) * 32, 32, max_threads)); }

__global__ void embed_kernel(const bf16* table, const int32_t* ids, int64_t hidden, float scale, bf16* out) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t t = blockIdx.y;
  const bf16* row = table + int64_t(ids[t]) * hidden;
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < hidden; i += int64_t(gridDim.x) * blockDim.x)
    out[t * hidden + i] = __float2bfloat16(__bfloat162float(row[i]) * scale);
}

// Sum of v over the block (blockDim.x a multiple of 32); every thread gets the total. A kernel
// may call it repeatedly: each call's barriers order its shared-memory use after the previous one.
__device__ float block_sum(float v) {
  __shared__ float partial[32];
  __shared__ float total;
  v = warp_reduce<SumOp>(v);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    float s = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0f;
    s = warp_reduce<SumOp>(s);
    if (threadIdx.x == 0) total = s;
  }
  __syncthreads();
  return total;
}

// The row kernels below run one block per row, and each thread rereads and writes only the
// elements it read itself, so in place is safe.
__global__ void rms_norm_kernel(const bf16* x, int64_t cols, const float* weight, float eps, bf16* out) {
  pdl_launch_dependents();
  pdl_wait();
  const bf16* in = x + blockIdx.x * cols;
  bf16* o = out + blockIdx.x * cols;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    const float v = __bfloat162float(in[i]);
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum(ss) / float(cols) + eps);
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    const float v = __bfloat162float(in[i]) * inv;
    o[i] = __float2bfloat16(weight ? v * weight[i] : v);
  }
}

constexpr int kHeadNormWarps = 8;

// table[t][i] = (cos, sin) of pair i's rotation at positions[t]: sincosf once per token and pair,
// not once per head (it dominated the head-norm kernel's instructions).
__global__ void rope_table_kernel(const int32_t* positions, const float* inv_freq, int64_t T, int64_t half,
                                  float2* table) {
  pdl_wait();  // writes nothing before the kernels ahead of it are done (an earlier head norm reads the table)
  pdl_launch_dependents();
  for (int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; n < T * half; n += int64_t(gridDim.x) * blockDim.x)
    table[n] = rope_cos_sin(inv_freq, n % half, half, float(positions[n / half]));
}

// Warp w of block b norms head row r = b * kHeadNormWarps + w: q rows, then k rows, then (unless
// v comes from k) v rows. (Sharing one RoPE rotation among a warp's rows of a token, four rows per
// warp, was measured slower on a 2048-token chunk.)
template <int kAccesses>
__global__ void head_norms_kernel(HeadNormLaunch a, int64_t rows) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t half = a.head_dim / 2, D = a.head_dim, r = int64_t(blockIdx.x) * kHeadNormWarps + (threadIdx.x >> 5);
  if (r >= rows) return;
  HeadRow<kAccesses> raw;
  RopeLane<kAccesses> rope;
  if (r < a.q_rows + a.k_rows) {  // q and k rows: norm, weight, RoPE
    const bool is_q = r < a.q_rows;
    const int64_t row = is_q ? r : r - a.q_rows;
    const int64_t token = is_q ? a.q_first + row / (a.q_rows / (a.T - a.q_first)) : row / (a.k_rows / a.T);
    bf16* data = (is_q ? a.q : a.k) + row * D;
    load_head_row(data, half, raw);
    rope_lane(a.rope_table + token * half, half, rope);
    const bool v_from_k = !is_q && a.v_in == a.k;
    norm_head_row(raw, half, is_q ? a.q_weight : a.k_weight, a.eps, &rope, Bf16RowSink{data},
                  Bf16RowSink{v_from_k ? a.v + row * D : nullptr});
    return;
  }
  const int64_t vr = r - a.q_rows - a.k_rows;  // v rows: norm alone
  load_head_row(a.v_in + vr * D, half, raw);
  norm_head_row(raw, half, nullptr, a.eps, static_cast<const RopeLane<kAccesses>*>(nullptr), Bf16RowSink{a.v + vr * D},
                NoSink{});
}

// Values [8v, 8v + 8) of a row of `cols` (zeros past the end): one 16-byte access when rows are
// whole 16-byte vectors (vector_rows), else element by element.
__device__ inline void load8(const bf16* row, int64_t cols, int64_t v, bool vector_rows, float (&out)[8]) {
  if (vector_rows && 8 * v + 8 <= cols) return unpack8(*reinterpret_cast<const uint4*>(row + 8 * v), out);
#pragma unroll
  for (int j = 0; j < 8; ++j) out[j] = 8 * v + j < cols ? __bfloat162float(row[8 * v + j]) : 0.0f;
}

// The same values packed as bf16.
__device__ inline uint4 load8_raw(const bf16* row, int64_t cols, int64_t v, bool vector_rows) {
  if (vector_rows && 8 * v + 8 <= cols) return *reinterpret_cast<const uint4*>(row + 8 * v);
  float values[8];
  load8(row, cols, v, vector_rows, values);
  return pack8(values);
}

__device__ inline void store8(bf16* row, int64_t cols, int64_t v, bool vector_rows, const float (&in)[8]) {
  if (vector_rows && 8 * v + 8 <= cols) {
    *reinterpret_cast<uint4*>(row + 8 * v) = pack8(in);
    return;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j)
    if (8 * v + j < cols) row[8 * v + j] = __float2bfloat16(in[j]);
}

// weight[8v .. 8v + 8) (1 when weight is null or past the end).
__device__ inline void load_weight8(const float* weight, int64_t cols, int64_t v, bool vector_rows, float (&out)[8]) {
  if (weight && vector_rows && 8 * v + 8 <= cols) {
    const float4 lo = reinterpret_cast<const float4*>(weight)[2 * v], hi = reinterpret_cast<const float4*>(weight)[2 * v + 1];
    out[0] = lo.x, out[1] = lo.y, out[2] = lo.z, out[3] = lo.w, out[4] = hi.x, out[5] = hi.y, out[6] = hi.z, out[7] = hi.w;
    return;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) out[j] = weight && 8 * v + j < cols ? weight[8 * v + j] : 1.0f;
}

// One block per row: x = (x + rms_norm(o)·post_weight) · scalar, then next_out = rms_norm(x)·next_weight.
// Each thread keeps its kResidualVecs 8-value vectors of o and x in registers, read in one go, as
// packed bf16 (x's new values are bf16 numbers too): half the registers of floats, which decides
// how many blocks an SM holds on prefill rows. A decode step has one row, so the kernel is a
// latency chain: kWeightsFirst reads the norm weights before pdl_wait() (they depend on no earlier
// kernel). A prefill chunk has thousands of rows and wants the registers for occupancy: the
// weights are read where they are used. (One vector per thread in 672-thread blocks was measured
// slower on prefill rows.)
constexpr int kResidualVecs = 2;

// A residual block's output o, row by row as packed bf16 vectors (zeros past the row): read from o
// (OutputRows), or summed from a matmul's slices (SliceRows).
struct OutputRows {
  const bf16* o;
  __device__ uint4 load(int64_t row, int64_t cols, int64_t v, bool vector_rows) const {
    return load8_raw(o + row * cols, cols, v, vector_rows);
  }
};
// Each output its slices' partials added from 0 in slice order and rounded to bf16, as add_slices
// stores it (sum_slices), and stored there too. Rows of whole 16-byte vectors, 16-byte aligned
// partials and o (launch_residual_norm_of_slices).
struct SliceRows {
  SliceSum o;
  __device__ uint4 load(int64_t row, int64_t cols, int64_t v, bool) const {
    if (8 * v >= cols) return make_uint4(0, 0, 0, 0);
    constexpr int kLoads = 4;  // slices loaded before they are added
    const int64_t at = row * cols + 8 * v;
    float sum[8] = {};
    for (int j0 = 0; j0 < o.slices; j0 += kLoads) {
      float4 part[kLoads][2];
#pragma unroll
      for (int u = 0; u < kLoads; ++u)
        if (j0 + u < o.slices) {
          const float4* p = reinterpret_cast<const float4*>(o.partial + (j0 + u) * o.count + at);
          part[u][0] = __ldcs(p), part[u][1] = __ldcs(p + 1);
        }
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        if (j0 + u >= o.slices) break;
        const float values[8] = {part[u][0].x, part[u][0].y, part[u][0].z, part[u][0].w,
                                 part[u][1].x, part[u][1].y, part[u][1].z, part[u][1].w};
#pragma unroll
        for (int e = 0; e < 8; ++e) sum[e] += values[e];
      }
    }
    const uint4 raw = pack8(sum);
    *reinterpret_cast<uint4*>(o.y + at) = raw;
    return raw;
  }
};

template <bool kWeightsFirst, typename ORows>
__device__ inline void residual_norm_row(bf16* x, const ORows& o, int64_t cols, const float* post_weight,
                                         const float* scalar, float eps, const float* next_weight, bf16* next_out,
                                         uint4* planes) {
  pdl_launch_dependents();
  const bool vector_rows = cols % 8 == 0;
  float post_w[kResidualVecs][8], next_w[kResidualVecs][8];
  if constexpr (kWeightsFirst) {
#pragma unroll
    for (int k = 0; k < kResidualVecs; ++k) {
      load_weight8(post_weight, cols, threadIdx.x + int64_t(k) * blockDim.x, vector_rows, post_w[k]);
      load_weight8(next_weight, cols, threadIdx.x + int64_t(k) * blockDim.x, vector_rows, next_w[k]);
    }
  }
  pdl_wait();
  bf16* xr = x + int64_t(blockIdx.x) * cols;
  uint4 o_raw[kResidualVecs], x_raw[kResidualVecs];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kResidualVecs; ++k) {
    const int64_t v = threadIdx.x + int64_t(k) * blockDim.x;
    o_raw[k] = o.load(blockIdx.x, cols, v, vector_rows);
    x_raw[k] = load8_raw(xr, cols, v, vector_rows);
    float ov[8];
    unpack8(o_raw[k], ov);
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += ov[j] * ov[j];
  }
  const float inv_o = rsqrtf(block_sum(ss) / float(cols) + eps);
  float ss_x = 0.0f;
#pragma unroll
  for (int k = 0; k < kResidualVecs; ++k) {
    const int64_t v = threadIdx.x + int64_t(k) * blockDim.x;
    if constexpr (!kWeightsFirst) load_weight8(post_weight, cols, v, vector_rows, post_w[k]);
    float ov[8], xv[8];
    unpack8(o_raw[k], ov);
    unpack8(x_raw[k], xv);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float r = round_bf16(xv[j] + round_bf16(ov[j] * inv_o * post_w[k][j]));
      if (scalar) r = round_bf16(r * *scalar);
      xv[j] = 8 * v + j < cols ? r : 0.0f;
      ss_x += xv[j] * xv[j];
    }
    x_raw[k] = pack8(xv);  // exact: every value is a bf16 number
    store8(xr, cols, v, vector_rows, xv);
  }
  if (!next_out) return;  // the same for the whole block
  const float inv_x = rsqrtf(block_sum(ss_x) / float(cols) + eps);
  bf16* nr = next_out + int64_t(blockIdx.x) * cols;
#pragma unroll
  for (int k = 0; k < kResidualVecs; ++k) {
    const int64_t v = threadIdx.x + int64_t(k) * blockDim.x;
    if constexpr (!kWeightsFirst) load_weight8(next_weight, cols, v, vector_rows, next_w[k]);
    float xv[8];
    unpack8(x_raw[k], xv);
#pragma unroll
    for (int j = 0; j < 8; ++j) xv[j] = xv[j] * inv_x * next_w[k][j];
    store8(nr, cols, v, vector_rows, xv);
    if constexpr (kWeightsFirst)
      if (planes) {  // vector v is part v % 4 of block v / 4 (cols % 32 == 0: whole blocks per 4 lanes)
        float stored[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) stored[j] = round_bf16(xv[j]);
        const int64_t blocks = cols / packed::kBlock;
        quantize_block_part<8>(stored, int(v % 4), v / 4, blocks, v / 4 < blocks, planes);
      }
  }
}

__global__ void residual_norm_decode_kernel(bf16* x, const bf16* o, int64_t cols, const float* post_weight,
                                            const float* scalar, float eps, const float* next_weight, bf16* next_out,
                                            uint4* planes) {
  residual_norm_row<true>(x, OutputRows{o}, cols, post_weight, scalar, eps, next_weight, next_out, planes);
}

__global__ void residual_norm_slices_kernel(bf16* x, SliceSum o, int64_t cols, const float* post_weight,
                                            const float* scalar, float eps, const float* next_weight, bf16* next_out) {
  residual_norm_row<true>(x, SliceRows{o}, cols, post_weight, scalar, eps, next_weight, next_out, nullptr);
}

// At most 56 registers: three 352-thread blocks (a 5376-wide row) per SM instead of two, for a
// few spilled bytes.
__global__ __maxnreg__(56) void residual_norm_prefill_kernel(bf16* x, const bf16* o, int64_t cols,
                                                             const float* post_weight, const float* scalar, float eps,
                                                             const float* next_weight, bf16* next_out) {
  residual_norm_row<false>(x, OutputRows{o}, cols, post_weight, scalar, eps, next_weight, next_out, nullptr);
}

// 8 values per thread with 16-byte accesses (the launcher checks the pointers' alignment); the
// last n % 8 values one by one.
__global__ void gelu_tanh_mul_kernel(const bf16* gate, const bf16* up, bf16* out, int64_t n) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t vecs = n / 8, first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  for (int64_t i = first; i < vecs; i += int64_t(gridDim.x) * blockDim.x) {
    float g[8], u[8];
    unpack8(reinterpret_cast<const uint4*>(gate)[i], g);
    unpack8(reinterpret_cast<const uint4*>(up)[i], u);
#pragma unroll
    for (int j = 0; j < 8; ++j) g[j] = gelu_tanh(g[j]) * u[j];
    reinterpret_cast<uint4*>(out)[i] = pack8(g);
  }
  if (first < n % 8) {
    const int64_t i = vecs * 8 + first;
    out[i] = __float2bfloat16(gelu_tanh(__bfloat162float(gate[i])) * __bfloat162float(up[i]));
  }
}

__global__ void softcap_kernel(const bf16* x, int64_t n, float cap, float* out) {
  pdl_launch_dependents();
  pdl_wait();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float z = __bfloat162float(x[i]);
    out[i] = cap > 0.0f ? cap * tanhf(z / cap) : z;
  }
}

__device__ float load_weight(const void* src, DType dtype, int64_t row_bytes, int64_t r, int64_t c) {
  const uint8_t* row = static_cast<const uint8_t*>(src) + r * row_bytes;
  switch (dtype) {
    case DType::F32: return reinterpret_cast<const float*>(row)[c];
    case DType::F16: return __half2float(reinterpret_cast<const __half*>(row)[c]);
    default: return __bfloat162float(reinterpret_cast<const bf16*>(row)[c]);
  }
}

__global__ void convert_weight_kernel(const void* src, DType dtype, int64_t row_bytes, int64_t rows, int64_t cols,
                                      void* dst, bool dst_f32) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * cols;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = load_weight(src, dtype, row_bytes, i / cols, i % cols);
    if (dst_f32)
      static_cast<float*>(dst)[i] = v;
    else
      static_cast<bf16*>(dst)[i] = __float2bfloat16(v);
  }
}

__global__ void advance_step_kernel(const int64_t* token, int32_t* ids, int32_t* positions) {
  ids[0] = int32_t(token[0]);
  positions[0] += 1;
}

__global__ void tokens_to_ids_kernel(const int64_t* tokens, int32_t* ids, int64_t rows) {
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < rows; r += int64_t(gridDim.x) * blockDim.x)
    ids[r] = tokens[r] >= 0 ? int32_t(tokens[r]) : 0;
}

template <typename T>
__global__ void fill_uniform_kernel(T* dst, int64_t n, float center, float spread, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = T(uniform_fill_value(seed, uint64_t(i), center, spread));
}

}  // namespace

void launch_embed(const bf16* table, const int32_t* ids, int64_t T, int64_t hidden, float scale, bf16* out,
                  cudaStream_t stream) {
  launch_kernel("embed_kernel", embed_kernel, dim3(unsigned(ceil_div(hidden, kThreads)), unsigned(T)), kThreads, 0,
                stream, Pdl::kOn, table, ids, hidden, scale, out);
}

void launch_rms_norm(const bf16* x, int64_t rows, int64_t cols, const float* weight, float eps, bf16* out,
                     cudaStream_t stream) {
  const int threads = cols >= 2048 ? 512 : cols >= 512 ? 128 : 64;
  launch_kernel("rms_norm_kernel", rms_norm_kernel, unsigned(rows), threads, 0, stream, Pdl::kOn, x, cols, weight, eps,
                out);
}

void launch_head_norms(const HeadNormLaunch& a, cudaStream_t stream) {
  G4_CHECK(a.head_dim % 8 == 0 && a.head_dim <= 512, "head_norms: head_dim must be a multiple of 8, at most 512");
  G4_CHECK(a.T > 0 && a.q_first >= 0 && a.q_first <= a.T && a.k_rows % a.T == 0 &&
               (a.q_first < a.T ? a.q_rows % (a.T - a.q_first) == 0 : a.q_rows == 0),
           "head_norms: rows must be whole heads of every token");
  G4_CHECK(a.inv_freq, "head_norms: the RoPE frequencies are missing");
  G4_CHECK(a.rope_table, "head_norms: the RoPE table scratch is missing");
  const int64_t half = a.head_dim / 2;
  launch_kernel("rope_table_kernel", rope_table_kernel, blocks_for(a.T * half), kThreads, 0, stream, Pdl::kOn,
                a.positions, a.inv_freq, a.T, half, a.rope_table);
  const int64_t rows = a.q_rows + a.k_rows + (a.v_in == a.k ? 0 : a.v_rows);
  const unsigned blocks = unsigned(ceil_div(rows, kHeadNormWarps));
  if (a.head_dim <= 256)
    launch_kernel("head_norms_kernel", head_norms_kernel<1>, blocks, kHeadNormWarps * 32, 0, stream, Pdl::kOn, a, rows);
  else
    launch_kernel("head_norms_kernel", head_norms_kernel<2>, blocks, kHeadNormWarps * 32, 0, stream, Pdl::kOn, a, rows);
}

void launch_residual_norm(bf16* x, const bf16* o, int64_t rows, int64_t cols, const float* post_weight,
                          const float* scalar, float eps, const float* next_weight, bf16* next_out, uint4* planes,
                          cudaStream_t stream) {
  G4_CHECK(cols <= 1024 * 8 * kResidualVecs, "residual_norm: rows wider than 16384 values are not supported");
  G4_CHECK(!planes || (rows == 1 && next_out && cols % packed::kBlock == 0),
           "residual_norm: quantized planes need one row of whole blocks and a next output");
  const unsigned threads = unsigned(row_threads(ceil_div(cols, 8 * kResidualVecs), 1024));
  // A decode batch's rows are one wave of blocks: registers do not limit them, so their weights
  // load while the previous kernel finishes (the same arithmetic as the prefill kernel's).
  if (rows <= kMaxDecodeSequences)
    return launch_kernel("residual_norm_kernel", residual_norm_decode_kernel, unsigned(rows), threads, 0, stream,
                         Pdl::kOn, x, o, cols, post_weight, scalar, eps, next_weight, next_out, planes);
  launch_kernel("residual_norm_kernel", residual_norm_prefill_kernel, unsigned(rows), threads, 0, stream, Pdl::kOn, x,
                o, cols, post_weight, scalar, eps, next_weight, next_out);
}

void launch_residual_norm_of_slices(const SliceSum& o, int64_t rows, int64_t cols, const ResidualNormTail& r,
                                    cudaStream_t stream) {
  G4_CHECK(o.count == rows * cols, "residual_norm of slices: the partials are not [rows, cols]");
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  // A decode batch's rows (weights first, as launch_residual_norm takes them) of whole vectors.
  if (rows > kMaxDecodeSequences || cols % 8 != 0 || cols > 1024 * 8 * kResidualVecs || !aligned(o.partial) ||
      !aligned(o.y)) {
    launch_add_slices(std::span(&o, 1), stream);
    return launch_residual_norm(r.x, o.y, rows, cols, r.post_weight, r.scalar, r.eps, r.next_weight, r.next_out,
                                nullptr, stream);
  }
  const unsigned threads = unsigned(row_threads(ceil_div(cols, 8 * kResidualVecs), 1024));
  launch_kernel("residual_norm_slices_kernel", residual_norm_slices_kernel, unsigned(rows), threads, 0, stream,
                Pdl::kOn, r.x, o, cols, r.post_weight, r.scalar, r.eps, r.next_weight, r.next_out);
}

void launch_gelu_tanh_mul(const bf16* gate, const bf16* up, bf16* out, int64_t n, cudaStream_t stream) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  G4_CHECK(aligned(gate) && aligned(up) && aligned(out), "gelu_tanh_mul: buffers must be 16-byte aligned");
  launch_kernel("gelu_tanh_mul_kernel", gelu_tanh_mul_kernel, blocks_for(std::max<int64_t>(n / 8, 8)), kThreads, 0,
                stream, Pdl::kOn, gate, up, out, n);
}

void launch_softcap(const bf16* x, int64_t n, float cap, float* out, cudaStream_t stream) {
  launch_kernel("softcap_kernel", softcap_kernel, blocks_for(n, 4), kThreads, 0, stream, Pdl::kOn, x, n, cap, out);
}

void launch_convert_weight(const void* src, DType src_dtype, int64_t rows, int64_t cols, void* dst, bool dst_f32,
                           cudaStream_t stream) {
  G4_CHECK(src_dtype == DType::F32 || src_dtype == DType::F16 || src_dtype == DType::BF16,
           "cuda backend: cannot widen a " + dtype_name(src_dtype) + " tensor");
  launch_kernel("convert_weight_kernel", convert_weight_kernel, blocks_for(rows * cols, 8), kThreads, 0, stream,
                Pdl::kOff, src, src_dtype, int64_t(row_bytes(src_dtype, cols)), rows, cols, dst, dst_f32);
}

void launch_advance_step(const int64_t* token, int32_t* ids, int32_t* positions, cudaStream_t stream) {
  launch_kernel("advance_step_kernel", advance_step_kernel, 1, 1, 0, stream, Pdl::kOff, token, ids, positions);
}

void launch_tokens_to_ids(const int64_t* tokens, int32_t* ids, int64_t rows, cudaStream_t stream) {
  launch_kernel("tokens_to_ids_kernel", tokens_to_ids_kernel, blocks_for(rows, 1), kThreads, 0, stream, Pdl::kOff,
                tokens, ids, rows);
}

void launch_fill_uniform(bf16* dst, int64_t n, float center, float spread, uint64_t seed, cudaStream_t stream) {
  launch_kernel("fill_uniform_kernel", fill_uniform_kernel<bf16>, blocks_for(n, 16), kThreads, 0, stream, Pdl::kOff,
                dst, n, center, spread, seed);
}

void launch_fill_uniform(float* dst, int64_t n, float center, float spread, uint64_t seed, cudaStream_t stream) {
  launch_kernel("fill_uniform_kernel", fill_uniform_kernel<float>, blocks_for(n, 16), kThreads, 0, stream, Pdl::kOff,
                dst, n, center, spread, seed);
}

}  // namespace g4
