// Whether a streaming kernel can hand the next one its first bytes through L2 (docs/DESIGN.md §3,
// "the next design step", item 0): a decode step is a chain of weight-streaming GEMVs with short
// dependent kernels between them (attention ~24 us a layer), during which DRAM idles. Measured
// here on plain streaming reads shaped like the 31B's matrices: kernel A reads its weights, a
// one-block kernel spins for the gap, kernel B reads its weights; A's blocks, as they finish,
// may first ask L2 for a slice of B's first bytes. Prints the chain's time per variant:
//   plain            no prefetch;
//   prefetch         A's blocks prefetch B's head into L2 (prefetch.global.L2);
//   prefetch+policy  the same with prefetch.global.L2::evict_last, A's and B's loads evict_first.
// Each chain reads weights not read in the 4 chains before it (more bytes than L2 holds).
//   bench_l2_prefetch_cuda [a_mb=65] [b_mb=25] [gap_us=20] [prefetch_mb=24]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_timing.h"

namespace {

using g4::bench::check;

constexpr int kThreads = 256;
constexpr int kUnroll = 4;
constexpr int kChains = 5;  // weights rotate over this many chains

struct Stream {
  const uint4* data;
  long long vectors;  // 16-byte vectors
};

template <bool kEvictFirst>
__device__ inline uint4 load(const uint4* p, unsigned long long policy) {
  uint4 v;
  if constexpr (kEvictFirst)
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(policy));
  else
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  (void)policy;
  return v;
}

// Sums the stream (the sum goes to `sink`, so the loads are not dropped); then, when `next` has
// bytes, this block asks L2 for its share of them.
template <bool kEvictFirst, bool kEvictLast>
__global__ void __launch_bounds__(kThreads) stream_kernel(Stream s, Stream next, unsigned* sink) {
  unsigned long long policy = 0;
  if constexpr (kEvictFirst) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  unsigned acc = 0;
  const long long stride = (long long)gridDim.x * kThreads;
  for (long long i = blockIdx.x * (long long)kThreads + threadIdx.x; i < s.vectors; i += stride * kUnroll) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      v[u] = i + u * stride < s.vectors ? load<kEvictFirst>(s.data + i + u * stride, policy) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x12345678u) *sink = acc;
  const long long lines = next.vectors / 8;  // 128-byte lines
  const long long per_block = (lines + gridDim.x - 1) / gridDim.x;
  for (long long l = blockIdx.x * per_block + threadIdx.x; l < min((long long)(blockIdx.x + 1) * per_block, lines);
       l += kThreads) {
    const uint4* p = next.data + l * 8;
    if constexpr (kEvictLast)
      asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(p));
    else
      asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
  }
}

// One block spinning for `ns` nanoseconds: the short dependent kernels between two matrices.
__global__ void gap_kernel(unsigned long long ns) {
  unsigned long long start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (unsigned long long now = start; now - start < ns;) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
}

struct Variant {
  const char* name;
  bool prefetch, policy;
};

double chain_us(const Variant& v, const std::vector<Stream>& a, const std::vector<Stream>& b, long long prefetch_vectors,
                unsigned long long gap_ns, unsigned* sink, int blocks) {
  auto launch_chain = [&](int c) {
    const Stream next{b[c].data, v.prefetch ? prefetch_vectors : 0};
    const Stream none{nullptr, 0};
    if (v.policy) {
      stream_kernel<true, true><<<blocks, kThreads>>>(a[c], next, sink);
      gap_kernel<<<1, 32>>>(gap_ns);
      stream_kernel<true, true><<<blocks, kThreads>>>(b[c], none, sink);
    } else {
      stream_kernel<false, false><<<blocks, kThreads>>>(a[c], next, sink);
      gap_kernel<<<1, 32>>>(gap_ns);
      stream_kernel<false, false><<<blocks, kThreads>>>(b[c], none, sink);
    }
  };
  for (int c = 0; c < kChains; ++c) launch_chain(c);
  return 1e3 * g4::bench::ms_per_launch([&](int r) { launch_chain(r % kChains); }, 0, 40);
}

std::vector<Stream> streams(double mb, std::vector<void*>& owned) {
  std::vector<Stream> out;
  const long long vectors = (long long)(mb * 1e6 / 16);
  for (int c = 0; c < kChains; ++c) {
    void* p = nullptr;
    check(cudaMalloc(&p, size_t(vectors) * 16), "cudaMalloc");
    check(cudaMemset(p, c + 1, size_t(vectors) * 16), "cudaMemset");
    owned.push_back(p);
    out.push_back({static_cast<const uint4*>(p), vectors});
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const double a_mb = argc > 1 ? std::atof(argv[1]) : 65, b_mb = argc > 2 ? std::atof(argv[2]) : 25;
    const double gap_us = argc > 3 ? std::atof(argv[3]) : 20, prefetch_mb = argc > 4 ? std::atof(argv[4]) : 24;
    if (a_mb <= 0 || b_mb <= 0 || gap_us < 0 || prefetch_mb < 0) throw std::runtime_error("sizes must be positive");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    std::vector<void*> owned;
    const std::vector<Stream> a = streams(a_mb, owned), b = streams(b_mb, owned);
    unsigned* sink = nullptr;
    check(cudaMalloc(&sink, sizeof(unsigned)), "cudaMalloc");
    const long long prefetch_vectors = std::min((long long)(prefetch_mb * 1e6 / 16), b[0].vectors);
    const int blocks = prop.multiProcessorCount * 4;
    const unsigned long long gap_ns = (unsigned long long)(gap_us * 1e3);
    std::printf("%s: A %.0f MB, gap %.0f us, B %.0f MB, B's first %.0f MB prefetched; us per chain\n", prop.name, a_mb,
                gap_us, b_mb, double(prefetch_vectors) * 16 / 1e6);
    const double bytes = (a_mb + b_mb) * 1e6;
    for (const Variant& v : {Variant{"plain", false, false}, Variant{"prefetch", true, false},
                             Variant{"prefetch+policy", true, true}}) {
      const double us = chain_us(v, a, b, prefetch_vectors, gap_ns, sink, blocks);
      std::printf("  %-16s %8.2f us  (%.2f TB/s over A and B, the gap included)\n", v.name, us, bytes / (us * 1e-6) / 1e12);
    }
    for (void* p : owned) cudaFree(p);
    cudaFree(sink);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
