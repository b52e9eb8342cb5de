// Whether a persistent decode kernel keeps the weight stream going across a layer's matrix
// boundaries (docs/DESIGN.md §3, "the next design step"): batch-1 4-bit decode runs at ~2.9 TB/s
// in its GEMVs against ~4 TB/s for one matrix alone, the difference being each launch's ramp and
// tail. A chain of 4-bit GEMVs shaped like the 31B's layers (q/k/v, o_proj, gate/up with its
// gated product, down_proj: 269 MB a layer), each matrix's input quantized from the previous
// output, runs three ways; prints the time per layer and the weights' bandwidth:
//   launches            one launch per matrix with programmatic dependent launch (the production
//                       structure: a warp's row head asked of L2 before griddepcontrol.wait);
//   persistent          one cooperative kernel, grid.sync() between the matrices;
//   persistent+preload  the same, each warp loading its first blocks of the next matrix into
//                       registers before the barrier (weights never depend on the activations).
// All three use the same grid (the cooperative kernel's) and the same per-warp loop. Weights:
// 16 bytes of nibbles per 32 weights plus an f16 scale per block; the input int8 per block of 32
// with a float scale and the block's sum, so a block's dot product is 8 dp4a (simpler than
// g4's int16 activations: the question is the memory pipeline, not the arithmetic).
//   bench_layer_chain_cuda [layers=8]
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <vector>

#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/pdl.cuh"
#include "cuda_timing.h"

namespace {

namespace cg = cooperative_groups;
using g4::load_streaming;
using g4::bench::check;

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kInFlight = 6;  // 16-byte blocks in flight per lane
constexpr int kMaxK = 21504;  // the widest input (down_proj)
constexpr int kMaxLayers = 64;
constexpr int kLayerParts = 4;

struct Matrix {
  const uint4* quants;  // [rows][K / 32] nibble blocks
  const __half* scales;  // [rows][K / 32]
  int rows, K;
  bool gated;       // rows = 2n: out[i] = silu(row i) * row n + i, n outputs
  const float* in;  // the previous output's first K values
  float* out;
};

struct Chain {
  Matrix parts[kLayerParts * kMaxLayers];
  int count;
};

struct QuantizedInput {
  int8_t q[kMaxK];
  float scale[kMaxK / 32];
  int sum[kMaxK / 32];
};

// The input, K floats written by the previous matrix, into the block's shared memory.
__device__ void quantize_input(const float* in, int K, QuantizedInput& x) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int b = warp; b < K / 32; b += kWarps) {
    const float v = __ldcg(in + b * 32 + lane);
    float amax = fabsf(v);
    for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = amax > 0.0f ? amax / 127.0f : 1.0f;
    const int q = max(-127, min(127, __float2int_rn(v / d)));
    x.q[b * 32 + lane] = int8_t(q);
    int sum = q;
    for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) x.scale[b] = d, x.sum[b] = sum;
  }
}

// Block b's dot product: nibbles (low: weights 0..15, high: 16..31) against the int8 input.
__device__ inline int dot_block(const uint4& w, const int8_t* x) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  const int* xv = reinterpret_cast<const int*>(x);
  int acc = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc = __dp4a(int(words[i] & 0x0F0F0F0Fu), xv[i], acc);
    acc = __dp4a(int((words[i] >> 4) & 0x0F0F0F0Fu), xv[4 + i], acc);
  }
  return acc;
}

// A warp's first kInFlight blocks of its first row, loaded ahead of the barrier.
struct Preload {
  uint4 blocks[kInFlight];
  int row = -1;
};

__device__ void preload_first_row(const Matrix& m, int row, Preload& pre) {
  const int lane = threadIdx.x % 32, blocks = m.K / 32;
  pre.row = row < (m.gated ? m.rows / 2 : m.rows) ? row : -1;
  if (pre.row < 0) return;
#pragma unroll
  for (int u = 0; u < kInFlight; ++u) {
    const int b = lane + 32 * u;
    pre.blocks[u] = b < blocks ? load_streaming(m.quants + int64_t(row) * blocks + b) : make_uint4(0, 0, 0, 0);
  }
}

// One row's dot product with the input, kInFlight blocks per lane in flight (the first of them
// from `pre` when it holds them).
__device__ float row_dot(const Matrix& m, int row, const QuantizedInput& x, const Preload* pre) {
  const int lane = threadIdx.x % 32, blocks = m.K / 32;
  const uint4* quants = m.quants + int64_t(row) * blocks;
  const __half* scales = m.scales + int64_t(row) * blocks;
  float acc = 0.0f;
  for (int b0 = 0; b0 < blocks; b0 += 32 * kInFlight) {
    const bool preloaded = pre != nullptr && b0 == 0 && pre->row == row;
    uint4 w[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int b = b0 + lane + 32 * u;
      w[u] = preloaded ? pre->blocks[u] : b < blocks ? load_streaming(quants + b) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int b = b0 + lane + 32 * u;
      if (b < blocks)
        acc = fmaf(__half2float(__ldg(scales + b)) * x.scale[b], float(dot_block(w[u], x.q + b * 32) - 8 * x.sum[b]), acc);
    }
  }
  for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  return acc;
}

// Rows warp, warp + warps, ... of m (gated: the products of row i and row n + i).
__device__ void multiply(const Matrix& m, int warp, int warps, const QuantizedInput& x, Preload* pre) {
  const int n = m.gated ? m.rows / 2 : m.rows;
  for (int r = warp; r < n; r += warps) {
    const float y = row_dot(m, r, x, pre);
    const float out = m.gated ? y / (1.0f + __expf(-y)) * row_dot(m, r + n, x, nullptr) : y;
    if (threadIdx.x % 32 == 0) m.out[r] = out;
    if (pre != nullptr) pre->row = -1;
  }
}

__global__ void __launch_bounds__(kThreads) matrix_kernel(Matrix m) {
  g4::pdl_launch_dependents();
  __shared__ QuantizedInput x;
  const int warp = blockIdx.x * kWarps + threadIdx.x / 32, warps = gridDim.x * kWarps, lane = threadIdx.x % 32;
  if (warp < m.rows && lane < 4)  // the row head's first 4 lines
    asm volatile("prefetch.global.L2 [%0];" ::"l"(m.quants + int64_t(warp) * (m.K / 32) + lane * 8));
  g4::pdl_wait();
  quantize_input(m.in, m.K, x);
  __syncthreads();
  multiply(m, warp, warps, x, nullptr);
}

template <bool kPreload>
__global__ void __launch_bounds__(kThreads) chain_kernel(const Chain* chain) {
  __shared__ QuantizedInput x;
  const cg::grid_group grid = cg::this_grid();
  const int warp = blockIdx.x * kWarps + threadIdx.x / 32, warps = gridDim.x * kWarps;
  Preload pre;
  for (int i = 0; i < chain->count; ++i) {
    const Matrix m = chain->parts[i];
    if (i > 0) {
      if constexpr (kPreload) preload_first_row(m, warp, pre);
      grid.sync();  // the previous output complete
    }
    quantize_input(m.in, m.K, x);
    __syncthreads();
    multiply(m, warp, warps, x, kPreload ? &pre : nullptr);
    __syncthreads();  // x is rewritten by the next matrix
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int layers = argc > 1 ? std::atoi(argv[1]) : 8;
    if (layers < 1 || layers > kMaxLayers) throw std::runtime_error("layers: 1 to 64");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    // rows, K, gated: q/k/v, o_proj (reads q/k/v's first 8 192 outputs), gate/up, down_proj.
    const int shapes[kLayerParts][3] = {{16384, 5376, 0}, {5376, 8192, 0}, {43008, 5376, 1}, {5376, 21504, 0}};
    std::vector<void*> owned;
    auto device_alloc = [&](size_t bytes) {
      void* p = nullptr;
      check(cudaMalloc(&p, bytes), "cudaMalloc");
      owned.push_back(p);
      return p;
    };
    float* outputs[kLayerParts];
    for (float*& o : outputs) o = static_cast<float*>(device_alloc(43008 * sizeof(float)));
    std::vector<float> first(kMaxK);
    for (int i = 0; i < kMaxK; ++i) first[size_t(i)] = float(i * 7919 % 1000) / 1000.0f - 0.5f;
    check(cudaMemcpy(outputs[kLayerParts - 1], first.data(), first.size() * sizeof(float), cudaMemcpyHostToDevice),
          "cudaMemcpy");
    Chain chain{};
    chain.count = kLayerParts * layers;
    double bytes = 0;
    for (int i = 0; i < chain.count; ++i) {
      const int* s = shapes[i % kLayerParts];
      const size_t blocks = size_t(s[0]) * (s[1] / 32);
      void* quants = device_alloc(blocks * 16);
      void* scales = device_alloc(blocks * 2);
      check(cudaMemset(quants, 0x5A, blocks * 16), "cudaMemset");
      check(cudaMemset(scales, 0x11, blocks * 2), "cudaMemset");  // a small positive f16
      chain.parts[i] = {static_cast<const uint4*>(quants), static_cast<const __half*>(scales), s[0], s[1], s[2] != 0,
                        outputs[(i + kLayerParts - 1) % kLayerParts], outputs[i % kLayerParts]};
      bytes += double(blocks) * 18;
    }
    Chain* device_chain = static_cast<Chain*>(device_alloc(sizeof(Chain)));
    check(cudaMemcpy(device_chain, &chain, sizeof(Chain), cudaMemcpyHostToDevice), "cudaMemcpy");
    cudaStream_t stream;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    // The grid every variant uses: the cooperative kernel with the preload (more registers) resident at once.
    int per_sm = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, chain_kernel<true>, kThreads, 0), "occupancy");
    const int grid = prop.multiProcessorCount * per_sm;
    std::printf("%s: %d layers of 4-bit q/k/v, o_proj, gate/up, down_proj (%.0f MB); %d blocks of %d threads\n",
                prop.name, layers, bytes / 1e6, grid, kThreads);
    auto launches = [&](int) {
      for (int i = 0; i < chain.count; ++i) {
        const Matrix& m = chain.parts[i];
        cudaLaunchAttribute pdl{};
        pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        pdl.val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t config{};
        config.gridDim = dim3(unsigned(grid));
        config.blockDim = dim3(kThreads);
        config.stream = stream;
        config.attrs = &pdl;
        config.numAttrs = 1;
        check(cudaLaunchKernelEx(&config, matrix_kernel, m), "matrix_kernel");
      }
    };
    auto cooperative = [&](const void* kernel) {
      return [&, kernel](int) {
        void* args[] = {&device_chain};
        check(cudaLaunchCooperativeKernel(kernel, dim3(unsigned(grid)), dim3(kThreads), args, 0, stream),
              "cudaLaunchCooperativeKernel");
      };
    };
    const auto report = [&](const char* name, double ms) {
      std::printf("  %-20s %8.1f us a layer  %.2f TB/s\n", name, ms * 1e3 / layers, bytes / (ms * 1e-3) / 1e12);
    };
    report("launches", g4::bench::ms_per_launch(launches, 2, 10, stream));
    report("persistent", g4::bench::ms_per_launch(cooperative(reinterpret_cast<const void*>(chain_kernel<false>)), 2,
                                                  10, stream));
    report("persistent+preload", g4::bench::ms_per_launch(
                                     cooperative(reinterpret_cast<const void*>(chain_kernel<true>)), 2, 10, stream));
    for (void* p : owned) cudaFree(p);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
