// The one-shot all-reduce over peer memory (protocol and its invariants: peer_all_reduce.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/comm/peer_all_reduce.h"
#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/launch.cuh"

namespace g4 {

namespace {

constexpr int kThreads = 128;  // a tile: 128 vectors of 16 bytes (a 5 376-wide bf16 row is 6 tiles)
constexpr size_t kSlotVectors = kPeerSlotBytes / 16;

__device__ inline void store_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ inline uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ inline uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// 16 bytes of T as floats, and back (rounded to nearest even).
template <typename T>
struct Vector16;

template <>
struct Vector16<__nv_bfloat16> {
  static constexpr int kLanes = 8;
  __device__ static void add(const uint4& raw, float* acc) {
    float v[8];
    unpack8(raw, v);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] += v[i];
  }
  __device__ static uint4 pack(const float* acc) { return pack8(acc); }
};

template <>
struct Vector16<__half> {
  static constexpr int kLanes = 8;
  __device__ static void add(const uint4& raw, float* acc) {
    const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(h[i]);
      acc[2 * i] += f.x;
      acc[2 * i + 1] += f.y;
    }
  }
  __device__ static uint4 pack(const float* acc) {
    uint4 raw;
    __half2* h = reinterpret_cast<__half2*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2half2_rn(acc[2 * i], acc[2 * i + 1]);
    return raw;
  }
};

template <>
struct Vector16<float> {
  static constexpr int kLanes = 4;
  __device__ static void add(const uint4& raw, float* acc) {
    acc[0] += __uint_as_float(raw.x);
    acc[1] += __uint_as_float(raw.y);
    acc[2] += __uint_as_float(raw.z);
    acc[3] += __uint_as_float(raw.w);
  }
  __device__ static uint4 pack(const float* acc) {
    return make_uint4(__float_as_uint(acc[0]), __float_as_uint(acc[1]), __float_as_uint(acc[2]), __float_as_uint(acc[3]));
  }
};

__device__ inline uint4* inbox_of(const PeerGroupView& g, int owner, int half, int sender) {
  return reinterpret_cast<uint4*>(g.ranks[owner].inbox) + (size_t(half) * g.size + sender) * kSlotVectors;
}

// Thread `sender` of the block waits until that sender's flag for this block reaches `epoch`
// (wrap-safe). Returns false when it gave up (timeout or the group's abort).
__device__ bool wait_for_flag(const PeerGroupView& g, int sender, uint32_t epoch) {
  const uint32_t* flag = g.ranks[g.rank].flags + sender * kPeerBlocks + blockIdx.x;
  const uint64_t start = global_ns();
  for (uint32_t spins = 1;; ++spins) {
    if (int32_t(load_acquire_sys(flag) - epoch) >= 0) return true;
    if (spins % 256 != 0) continue;
    if (*g.abort != 0) return false;
    if (global_ns() - start > g.timeout_ns) {
      *g.timed_out = 1;
      return false;
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) peer_all_reduce_kernel(uint4* data, int64_t vectors, PeerGroupView g) {
  // Launched with PDL: resident while the projection before it runs; nothing is touched, the
  // epoch counter included, before that projection has completed.
  pdl_launch_dependents();
  pdl_wait();
  __shared__ uint32_t epoch_shared;
  __shared__ int gave_up;
  if (threadIdx.x == 0) {
    epoch_shared = g.epochs[blockIdx.x] + 1;
    g.epochs[blockIdx.x] = epoch_shared;
    gave_up = 0;
  }
  __syncthreads();
  const uint32_t epoch = epoch_shared;
  const int half = int(epoch & 1);
  const int64_t stride = int64_t(gridDim.x) * kThreads;

  // 1. This rank's vectors into every peer's inbox.
  for (int64_t v = int64_t(blockIdx.x) * kThreads + threadIdx.x; v < vectors; v += stride) {
    const uint4 x = data[v];
    for (int p = 0; p < g.size; ++p)
      if (p != g.rank) inbox_of(g, p, half, g.rank)[v] = x;
  }
  __syncthreads();
  // 2. The block's flag in every peer, released after the block's stores; 3. every peer's flag.
  const int peer = int(threadIdx.x);
  if (peer < g.size && peer != g.rank) {
    __threadfence_system();
    store_release_sys(g.ranks[peer].flags + g.rank * kPeerBlocks + blockIdx.x, epoch);
    if (!wait_for_flag(g, peer, epoch)) gave_up = 1;
  }
  __syncthreads();
  if (gave_up) return;

  // 4. The sum in rank order, in place.
  for (int64_t v = int64_t(blockIdx.x) * kThreads + threadIdx.x; v < vectors; v += stride) {
    float acc[Vector16<T>::kLanes] = {};
    for (int q = 0; q < g.size; ++q)
      Vector16<T>::add(q == g.rank ? data[v] : __ldcg(inbox_of(g, g.rank, half, q) + v), acc);
    data[v] = Vector16<T>::pack(acc);
  }
}

template <typename T>
void launch_pieces(const Tensor& t, const PeerGroupView& g, cudaStream_t stream) {
  uint8_t* bytes = static_cast<uint8_t*>(t.data);
  for (size_t done = 0, total = t.bytes(); done < total;) {
    const size_t piece = std::min(kPeerSlotBytes, total - done);
    const int64_t vectors = int64_t(piece / 16);
    // Only blocks that own a tile of this piece run (a decode row: 6 of them). Every rank skips the
    // same blocks, whose epochs then stay unchanged on every rank alike.
    const unsigned blocks = unsigned(std::min<int64_t>(kPeerBlocks, ceil_div(vectors, kThreads)));
    launch_kernel("peer_all_reduce", peer_all_reduce_kernel<T>, dim3(blocks), dim3(kThreads), 0, stream, Pdl::kOn,
                  reinterpret_cast<uint4*>(bytes + done), vectors, g);
    done += piece;
  }
}

}  // namespace

size_t peer_inbox_bytes(int size) { return 2 * size_t(size) * kPeerSlotBytes; }
size_t peer_flag_bytes(int size) { return size_t(size) * kPeerBlocks * sizeof(uint32_t); }

bool peer_all_reduce_takes(const Tensor& t) {
  const bool type = t.dtype == DType::BF16 || t.dtype == DType::F16 || t.dtype == DType::F32;
  return type && t.bytes() % 16 == 0 && reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
}

void peer_all_reduce(const Tensor& t, const PeerGroupView& group, cudaStream_t stream) {
  G4_CHECK(peer_all_reduce_takes(t), "peer_all_reduce: " + dtype_name(t.dtype) + " tensor of " +
                                         std::to_string(t.bytes()) + " bytes is not whole aligned 16-byte vectors");
  G4_CHECK(group.size >= 2 && group.size <= kMaxPeerRanks, "peer_all_reduce: a group of " + std::to_string(group.size));
  switch (t.dtype) {
    case DType::BF16: return launch_pieces<__nv_bfloat16>(t, group, stream);
    case DType::F16: return launch_pieces<__half>(t, group, stream);
    default: return launch_pieces<float>(t, group, stream);
  }
}

}  // namespace g4
