// Row-wise and element-wise kernels of the CUDA backend (float32 arithmetic, bf16 storage).
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace g4 {

namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n, int per_thread = 1) {
  return int(std::min<int64_t>(ceil_div(n, int64_t(kThreads) * per_thread), 65535 * 8));
}

__global__ void embed_kernel(const bf16* table, const int32_t* ids, int64_t hidden, float scale, bf16* out) {
  const int64_t t = blockIdx.y;
  const bf16* row = table + int64_t(ids[t]) * hidden;
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < hidden; i += int64_t(gridDim.x) * blockDim.x)
    out[t * hidden + i] = __float2bfloat16(__bfloat162float(row[i]) * scale);
}

// One block per row; each thread reads and writes the same elements, so in-place is safe.
__global__ void rms_norm_kernel(const bf16* x, int64_t cols, const float* weight, float eps, bf16* out) {
  const bf16* in = x + blockIdx.x * cols;
  bf16* o = out + blockIdx.x * cols;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    const float v = __bfloat162float(in[i]);
    ss += v * v;
  }
  __shared__ float partial[32];
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float s = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0f;
    s = warp_sum(s);
    if (threadIdx.x == 0) partial[0] = s;
  }
  __syncthreads();
  const float inv = rsqrtf(partial[0] / float(cols) + eps);
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    const float v = __bfloat162float(in[i]) * inv;
    o[i] = __float2bfloat16(weight ? v * weight[i] : v);
  }
}

// One thread per rotating pair (i, i + half) of one row.
__global__ void rope_kernel(bf16* x, int64_t rows, int64_t half, int64_t heads, const int32_t* positions,
                            const float* inv_freq) {
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= rows * half) return;
  const int64_t r = idx / half, i = idx % half;
  const float inv = inv_freq[i];
  if (inv == 0.0f) return;  // identity rotation (proportional partial RoPE)
  float s, c;
  sincosf(float(positions[r / heads]) * inv, &s, &c);
  bf16* v = x + r * 2 * half;
  const float a = __bfloat162float(v[i]), b = __bfloat162float(v[i + half]);
  v[i] = __float2bfloat16(a * c - b * s);
  v[i + half] = __float2bfloat16(b * c + a * s);
}

__global__ void gelu_tanh_mul_kernel(const bf16* gate, const bf16* up, bf16* out, int64_t n) {
  const float k = 0.7978845608028654f;  // sqrt(2/pi)
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = __bfloat162float(gate[i]);
    out[i] = __float2bfloat16(0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g))) * __bfloat162float(up[i]));
  }
}

__global__ void add_kernel(bf16* x, const bf16* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = __float2bfloat16(__bfloat162float(x[i]) + __bfloat162float(y[i]));
}

__global__ void scale_kernel(bf16* x, int64_t n, const void* scalar, bool scalar_bf16) {
  const float s = scalar_bf16 ? __bfloat162float(*static_cast<const bf16*>(scalar)) : *static_cast<const float*>(scalar);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = __float2bfloat16(__bfloat162float(x[i]) * s);
}

__global__ void softcap_kernel(const bf16* x, int64_t n, float cap, float* out) {
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
    case DType::BF16: return __bfloat162float(reinterpret_cast<const bf16*>(row)[c]);
    default: {  // Q8_0: blocks of an f16 scale then 32 int8 values
      const uint8_t* block = row + (c / kQ8BlockSize) * kQ8BlockBytes;
      const __half d = *reinterpret_cast<const __half*>(block);  // 2-byte aligned: blocks are 34 bytes
      return __half2float(d) * float(reinterpret_cast<const int8_t*>(block + 2)[c % kQ8BlockSize]);
    }
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

__device__ float uniform_hash(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i;  // splitmix64 finaliser of (seed, index)
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return float(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;  // [-1, 1)
}

template <typename T>
__global__ void fill_uniform_kernel(T* dst, int64_t n, float center, float spread, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = T(center + spread * uniform_hash(seed, uint64_t(i)));
}

}  // namespace

void launch_embed(const bf16* table, const int32_t* ids, int64_t T, int64_t hidden, float scale, bf16* out,
                  cudaStream_t stream) {
  embed_kernel<<<dim3(unsigned(ceil_div(hidden, kThreads)), unsigned(T)), kThreads, 0, stream>>>(table, ids, hidden,
                                                                                                  scale, out);
  G4_CUDA_LAUNCHED(embed_kernel);
}

void launch_rms_norm(const bf16* x, int64_t rows, int64_t cols, const float* weight, float eps, bf16* out,
                     cudaStream_t stream) {
  const int threads = cols >= 2048 ? 512 : cols >= 512 ? 128 : 64;
  rms_norm_kernel<<<unsigned(rows), threads, 0, stream>>>(x, cols, weight, eps, out);
  G4_CUDA_LAUNCHED(rms_norm_kernel);
}

void launch_rope(bf16* x, int64_t rows, int64_t head_dim, int64_t heads, const int32_t* positions,
                 const float* inv_freq, cudaStream_t stream) {
  const int64_t half = head_dim / 2;
  rope_kernel<<<unsigned(ceil_div(rows * half, kThreads)), kThreads, 0, stream>>>(x, rows, half, heads, positions,
                                                                                   inv_freq);
  G4_CUDA_LAUNCHED(rope_kernel);
}

void launch_gelu_tanh_mul(const bf16* gate, const bf16* up, bf16* out, int64_t n, cudaStream_t stream) {
  gelu_tanh_mul_kernel<<<blocks_for(n), kThreads, 0, stream>>>(gate, up, out, n);
  G4_CUDA_LAUNCHED(gelu_tanh_mul_kernel);
}

void launch_add(bf16* x, const bf16* y, int64_t n, cudaStream_t stream) {
  add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, y, n);
  G4_CUDA_LAUNCHED(add_kernel);
}

void launch_scale(bf16* x, int64_t n, const void* scalar, DType scalar_dtype, cudaStream_t stream) {
  G4_CHECK(scalar_dtype == DType::F32 || scalar_dtype == DType::BF16, "cuda scale: scalar must be F32 or BF16");
  scale_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, scalar, scalar_dtype == DType::BF16);
  G4_CUDA_LAUNCHED(scale_kernel);
}

void launch_softcap(const bf16* x, int64_t n, float cap, float* out, cudaStream_t stream) {
  softcap_kernel<<<blocks_for(n, 4), kThreads, 0, stream>>>(x, n, cap, out);
  G4_CUDA_LAUNCHED(softcap_kernel);
}

void launch_convert_weight(const void* src, DType src_dtype, int64_t rows, int64_t cols, void* dst, bool dst_f32,
                           cudaStream_t stream) {
  G4_CHECK(src_dtype == DType::F32 || src_dtype == DType::F16 || src_dtype == DType::BF16 || src_dtype == DType::Q8_0,
           "cuda backend: cannot use a " + dtype_name(src_dtype) + " tensor as a weight");
  convert_weight_kernel<<<blocks_for(rows * cols, 8), kThreads, 0, stream>>>(
      src, src_dtype, int64_t(row_bytes(src_dtype, cols)), rows, cols, dst, dst_f32);
  G4_CUDA_LAUNCHED(convert_weight_kernel);
}

void launch_advance_step(const int64_t* token, int32_t* ids, int32_t* positions, cudaStream_t stream) {
  advance_step_kernel<<<1, 1, 0, stream>>>(token, ids, positions);
  G4_CUDA_LAUNCHED(advance_step_kernel);
}

void launch_fill_uniform(bf16* dst, int64_t n, float center, float spread, uint64_t seed, cudaStream_t stream) {
  fill_uniform_kernel<<<blocks_for(n, 16), kThreads, 0, stream>>>(dst, n, center, spread, seed);
  G4_CUDA_LAUNCHED(fill_uniform_kernel);
}

void launch_fill_uniform(float* dst, int64_t n, float center, float spread, uint64_t seed, cudaStream_t stream) {
  fill_uniform_kernel<<<blocks_for(n, 16), kThreads, 0, stream>>>(dst, n, center, spread, seed);
  G4_CUDA_LAUNCHED(fill_uniform_kernel);
}

}  // namespace g4
