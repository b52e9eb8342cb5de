// Whether one persistent kernel per decode step streams the weights faster than a launch per matrix
// (docs/DESIGN.md §3, "Single-sequence decode and prefill: where they stand, and the next design
// step"). A chain of 31B-shaped Q4_0 layers — q/k/v, o_proj (reading q/k/v's first 8 192 outputs in
// place of the attention's), gate/up with the GELU-mul, down_proj (whose output is the next layer's
// input, in place of the residual norm) — each input quantized from the previous output, all with
// the production GEMV's own per-warp arithmetic (packed_gemv.cuh: one token, 3 blocks a row in
// flight, 4-warp blocks, the fastest sum order), runs two ways:
//   launches  the production structure: a GEMV launch and a quantize launch per matrix, with PDL,
//             replayed as one CUDA graph;
//   dataflow  one cooperative launch for the whole chain, no barrier: warp w takes units w,
//             w + warps, ... of each matrix in turn (a unit: 2 rows, or gate/up's row), asks L2 for
//             a unit's first weight bytes, waits only until its input is complete (a counter of
//             quantized blocks), and after storing its rows counts them into their block of 32;
//             the warp that completes a block quantizes it into the next matrix's input. So warps
//             done with a matrix ask for the next one's weights while the slowest finish;
//   dataflow, whole units in L2  the same, each warp asking L2 for its unit's whole rows (quants
//             and scales) before it waits, not only their first blocks: a wait for the input then
//             leaves the unit's weights arriving rather than idle bandwidth.
// Prints the time per layer and the weights' bandwidth of each (also as a share of the device's copy
// bandwidth, measure_copy_bandwidth, as g4 bench states a decode step), and whether the dataflow
// runs gave every output the launches' bits (the same arithmetic: a synchronisation that let a warp
// read an incomplete input would not).
//   bench_layer_chain_cuda [layers=8] [blocks_per_sm=as many as fit]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include "backend/cuda/copy_bandwidth.h"
#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/packed_gemv.cuh"
#include "backend/cuda/packed_kernels.h"
#include "cuda_timing.h"
#include "util/dtype.h"

namespace {

using namespace g4;
using namespace g4::packed;
using g4::bench::check;

constexpr DType kType = DType::Q4_0;
using G = OneToken;
constexpr int kMaxLayers = 16;
constexpr size_t kLine = 128 / sizeof(unsigned);  // counters in an L2 line

// A link's counters: next_ready alone on its line, then the done counters, up to a whole line.
size_t counter_span(int64_t rows) { return kLine + (size_t(rows / kBlock) + kLine - 1) / kLine * kLine; }

// One matrix of the chain: where its input comes from and where its output goes.
struct Link {
  const uint8_t* w;     // packed [rows, K]; gated: gate
  const uint8_t* w_up;  // gated: up (row i's output is gelu(gate_i) · up_i); else null
  int64_t rows, K;
  const uint4* x;       // the input's planes, K / 32 blocks
  bf16* y;              // [rows]
  uint4* next_x;        // the next link's input: y's first next_blocks blocks, quantized
  int64_t next_blocks;
  unsigned* ready;      // the input's blocks quantized so far (null: complete at launch)
  unsigned* next_ready;
  unsigned* done;       // per block of 32 outputs: rows stored
};

__device__ inline unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Returns once `count` blocks of the input are quantized (lane 0 waits; the warp barrier passes its
// acquire on to the other lanes' loads).
__device__ inline void wait_for_input(const unsigned* ready, unsigned count, int lane) {
  if (ready != nullptr && lane == 0)
    while (load_acquire(ready) < count) __nanosleep(64);
  __syncwarp();
}

// Counts the warp's n rows stored from `first` into their block of 32; the warp that completes the
// block quantizes it (from L2: another SM's L1 may hold none of it, this one's may hold it stale)
// into the next link's input and counts it there.
__device__ void rows_stored(const Link& l, int64_t first, int n, int lane) {
  const int64_t b = first / kBlock;
  unsigned before = 0;
  if (lane == 0) {
    __threadfence();
    before = atomicAdd(l.done + b, unsigned(n));
  }
  before = __shfl_sync(0xffffffffu, before, 0);
  if (before + unsigned(n) != unsigned(kBlock) || b >= l.next_blocks || lane != 0) return;
  __threadfence();
  float values[kBlock];
  const uint4* src = reinterpret_cast<const uint4*>(l.y + b * kBlock);
#pragma unroll
  for (int k = 0; k < kBlock / 8; ++k) unpack8(__ldcg(src + k), values + 8 * k);
  ActivationBlock a;
  quantize_activation_block(values, a);
#pragma unroll
  for (int k = 0; k < 4; ++k)
    l.next_x[plane_index(0, k, l.next_blocks, b)] = make_uint4(a.q[4 * k], a.q[4 * k + 1], a.q[4 * k + 2], a.q[4 * k + 3]);
  l.next_x[plane_index(0, 4, l.next_blocks, b)] =
      make_uint4(__float_as_uint(a.d), __float_as_uint(a.dsum), uint32_t(a.sum), uint32_t(a.sum_lo));
  __threadfence();
  atomicAdd(l.next_ready, 1u);
}

// What a warp asks L2 for before it waits for a unit's input.
enum class Prefetch { kFirstBlocks, kWholeUnit };

// Unit u of link l: rows 2u and 2u + 1, or gate/up's row u; what packed_gemv_kernel and
// packed_gated_gelu_kernel compute for them, stored by lane 0.
template <bool kGated, Prefetch kPrefetch>
__device__ void run_unit(const Link& l, int64_t u, int lane) {
  const int64_t blocks = l.K / kBlock;
  const int64_t first = kGated ? u : u * kRowsPerWarp;
  const int n = kGated ? 1 : int(min(int64_t(kRowsPerWarp), l.rows - first));
  RowRegions<const uint8_t> rows[2];
  if constexpr (kGated) {
    rows[0] = row_regions<kType>(l.w, l.rows, l.K, u);
    rows[1] = row_regions<kType>(l.w_up, l.rows, l.K, u);
  } else {
    for (int r = 0; r < 2; ++r) rows[r] = row_regions<kType>(l.w, l.rows, l.K, min(first + r, l.rows - 1));
  }
  for (int r = 0; r < 2; ++r) {
    if constexpr (kPrefetch == Prefetch::kFirstBlocks) {
      prefetch_first_blocks<kType, G::kInFlight>(rows[r], blocks, lane);
    } else {
      prefetch_l2(rows[r].qs, blocks * format_of(kType).qs, lane);
      prefetch_l2(rows[r].params, blocks * format_of(kType).params, lane);
    }
  }
  wait_for_input(l.ready, unsigned(blocks), lane);
  const float sum = packed_rows_dot<kType, 1, 2, G::kInFlight, SumOrder::kFastest>(rows, l.x, blocks, 1, l.rows, lane);
  const float second = __shfl_sync(0xffffffffu, sum, 1);  // row first + 1, or up
  if (lane == 0) {
    if constexpr (kGated) {
      l.y[first] = __float2bfloat16(gelu_tanh(round_bf16(sum)) * round_bf16(second));
    } else {
      l.y[first] = __float2bfloat16(sum);
      if (n == 2) l.y[first + 1] = __float2bfloat16(second);
    }
  }
  rows_stored(l, first, n, lane);
}

// Every link in order; warps never wait on a later link, and a cooperative launch keeps every
// warp resident, so every wait ends.
// 5 blocks a multiprocessor: the occupancy of the production gate/up kernel (96 registers).
template <Prefetch kPrefetch>
__global__ __launch_bounds__(G::kWarps * 32, 5) void dataflow_kernel(const Link* links, int count) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = int64_t(blockIdx.x) * G::kWarps + threadIdx.x / 32, warps = int64_t(gridDim.x) * G::kWarps;
  for (int i = 0; i < count; ++i) {
    const Link l = links[i];
    if (l.w_up != nullptr) {
      for (int64_t u = warp; u < l.rows; u += warps) run_unit<true, kPrefetch>(l, u, lane);
    } else {
      for (int64_t u = warp; u < (l.rows + 1) / 2; u += warps) run_unit<false, kPrefetch>(l, u, lane);
    }
  }
}

// The 31B's shapes: hidden, MLP width, q/k/v rows (8 192 + 4 096 + 4 096), attention output.
constexpr int64_t kHidden = 5376, kMlp = 21504, kQkv = 16384, kAttention = 8192;

}  // namespace

int main(int argc, char** argv) {
  try {
    const int layers = argc > 1 ? std::atoi(argv[1]) : 8;
    if (layers < 1 || layers > kMaxLayers) throw std::runtime_error("layers: 1 to 16");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    int fit = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, dataflow_kernel<Prefetch::kWholeUnit>, G::kWarps * 32, 0),
          "occupancy");
    int fit_first = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit_first, dataflow_kernel<Prefetch::kFirstBlocks>,
                                                        G::kWarps * 32, 0),
          "occupancy");
    fit = std::min(fit, fit_first);
    const int per_sm = argc > 2 ? std::atoi(argv[2]) : fit;
    if (per_sm < 1 || per_sm > fit) throw std::runtime_error("blocks_per_sm: 1 to " + std::to_string(fit));

    std::vector<void*> owned;
    auto device_alloc = [&](size_t bytes) {
      void* p = nullptr;
      check(cudaMalloc(&p, bytes), "cudaMalloc");
      owned.push_back(p);
      return p;
    };
    auto planes = [&](int64_t K) { return static_cast<uint4*>(device_alloc(size_t(K / kBlock) * kActivationPlanes * 16)); };
    auto weights = [&](int64_t rows, int64_t K, uint64_t seed) {
      auto* w = static_cast<uint8_t*>(device_alloc(row_bytes(kType, K) * size_t(rows)));
      launch_fill_random_blocks(kType, w, rows, K, 0.01f, seed, nullptr);
      return w;
    };

    // The links, each with its output, the next link's input planes and counters.
    std::vector<Link> links;
    double bytes = 0;
    size_t counters = 0;
    uint4* const first_x = planes(kHidden);
    const uint4* x = first_x;
    for (int layer = 0; layer < layers; ++layer) {
      const struct {
        int64_t rows, K;
        bool gated;
        int64_t next_K;
      } parts[] = {{kQkv, kHidden, false, kAttention}, {kHidden, kAttention, false, kHidden},
                   {kMlp, kHidden, true, kMlp}, {kHidden, kMlp, false, kHidden}};
      for (const auto& p : parts) {
        Link l{};
        const uint64_t seed = 1000 + links.size() * 2;
        l.w = weights(p.rows, p.K, seed);
        l.w_up = p.gated ? weights(p.rows, p.K, seed + 1) : nullptr;
        l.rows = p.rows, l.K = p.K, l.x = x;
        l.y = static_cast<bf16*>(device_alloc(size_t(p.rows) * sizeof(bf16)));
        l.next_x = planes(p.next_K);
        l.next_blocks = p.next_K / kBlock;
        links.push_back(l);
        x = l.next_x;
        bytes += double(row_bytes(kType, p.K)) * double(p.rows) * (p.gated ? 2 : 1);
        counters += counter_span(p.rows);
      }
    }
    auto* counter_memory = static_cast<unsigned*>(device_alloc(counters * sizeof(unsigned)));
    unsigned* next_counter = counter_memory;
    for (size_t i = 0; i < links.size(); ++i) {
      links[i].ready = i == 0 ? nullptr : links[i - 1].next_ready;
      // Every warp of the next link polls next_ready: a line of its own, away from the done counters
      // the producers add to.
      links[i].next_ready = next_counter;
      links[i].done = next_counter + kLine;
      next_counter += counter_span(links[i].rows);
    }
    Link* device_links = static_cast<Link*>(device_alloc(links.size() * sizeof(Link)));
    check(cudaMemcpy(device_links, links.data(), links.size() * sizeof(Link), cudaMemcpyHostToDevice), "cudaMemcpy");

    // The first input: a fixed bf16 row, quantized once.
    std::vector<bf16> first(kHidden);
    for (int64_t i = 0; i < kHidden; ++i) first[size_t(i)] = __float2bfloat16(float(i * 7919 % 1000) / 1000.0f - 0.5f);
    auto* first_row = static_cast<bf16*>(device_alloc(first.size() * sizeof(bf16)));
    check(cudaMemcpy(first_row, first.data(), first.size() * sizeof(bf16), cudaMemcpyHostToDevice), "cudaMemcpy");
    launch_quantize_activations(first_row, 1, kHidden, first_x, nullptr);
    check(cudaDeviceSynchronize(), "setup");

    cudaStream_t stream;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    const int grid = prop.multiProcessorCount * per_sm;
    std::printf("%s: %d layers of Q4_0 q/k/v, o_proj, gate/up, down_proj (%.0f MB); dataflow grid %d blocks of %d "
                "threads (%d of %d a multiprocessor)\n",
                prop.name, layers, bytes / 1e6, grid, G::kWarps * 32, per_sm, fit);

    // launches: the production kernels, recorded once as a graph.
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
    for (const Link& l : links) {
      if (l.w_up != nullptr) {
        launch_packed_gated_gelu(kType, l.x, l.w, l.w_up, l.y, 1, l.rows, l.K, SumOrder::kFastest, stream);
      } else {
        const PackedGemvTarget target{l.w, l.y, l.rows};
        launch_packed_gemv(kType, l.x, &target, 1, 1, l.K, SumOrder::kFastest, stream);
      }
      launch_quantize_activations(l.y, 1, l.next_blocks * kBlock, l.next_x, stream);
    }
    cudaGraph_t graph;
    check(cudaStreamEndCapture(stream, &graph), "end capture");
    cudaGraphExec_t replay;
    check(cudaGraphInstantiate(&replay, graph, 0), "instantiate");
    const auto launches = [&](int) { check(cudaGraphLaunch(replay, stream), "cudaGraphLaunch"); };

    const int count = int(links.size());
    const auto dataflow = [&](const void* kernel) {
      return [&, kernel](int) {
        check(cudaMemsetAsync(counter_memory, 0, counters * sizeof(unsigned), stream), "cudaMemsetAsync");
        const Link* chain = device_links;
        void* args[] = {&chain, const_cast<int*>(&count)};
        check(cudaLaunchCooperativeKernel(kernel, dim3(unsigned(grid)), dim3(G::kWarps * 32), args, 0, stream),
              "cudaLaunchCooperativeKernel");
      };
    };
    const auto first_blocks = dataflow(reinterpret_cast<const void*>(dataflow_kernel<Prefetch::kFirstBlocks>));
    const auto whole_units = dataflow(reinterpret_cast<const void*>(dataflow_kernel<Prefetch::kWholeUnit>));

    // The outputs of one run of each, compared bit for bit.
    auto outputs = [&] {
      check(cudaStreamSynchronize(stream), "sync");
      std::vector<std::vector<bf16>> all;
      for (const Link& l : links) {
        all.emplace_back(size_t(l.rows));
        check(cudaMemcpy(all.back().data(), l.y, size_t(l.rows) * sizeof(bf16), cudaMemcpyDeviceToHost), "cudaMemcpy");
      }
      return all;
    };
    launches(0);
    const auto expected = outputs();
    // The matrices whose outputs differ from the launches' after one run of `run`.
    const auto differing = [&](const auto& run) {
      for (const Link& l : links) check(cudaMemset(l.y, 0xFF, size_t(l.rows) * sizeof(bf16)), "cudaMemset");
      run(0);
      const auto got = outputs();
      int count = 0;
      for (size_t i = 0; i < links.size(); ++i)
        count += std::memcmp(expected[i].data(), got[i].data(), expected[i].size() * sizeof(bf16)) != 0;
      return count;
    };
    const int differing_first = differing(first_blocks), differing_whole = differing(whole_units);

    // The ceiling: the device's copy bandwidth, as g4 bench states a decode step against it.
    const double copy = measure_copy_bandwidth(size_t(2) << 30);
    std::printf("  copy speed %.2f TB/s\n", copy / 1e12);
    const auto report = [&](const char* name, double ms) {
      const double rate = bytes / (ms * 1e-3);
      std::printf("  %-28s %8.1f us a layer  %.2f TB/s  %.1f %% of copy\n", name, ms * 1e3 / layers, rate / 1e12,
                  100.0 * rate / copy);
    };
    report("launches", g4::bench::ms_per_launch(launches, 2, 20, stream));
    report("dataflow", g4::bench::ms_per_launch(first_blocks, 2, 20, stream));
    report("dataflow, whole units in L2", g4::bench::ms_per_launch(whole_units, 2, 20, stream));
    const std::pair<const char*, int> checks[] = {{"dataflow", differing_first},
                                                  {"dataflow, whole units in L2", differing_whole}};
    for (const auto& [name, d] : checks)
      std::printf("  %s, the launches' bits: %s (%d of %zu matrices' outputs differ)\n", name, d == 0 ? "yes" : "NO", d,
                  links.size());
    cudaGraphExecDestroy(replay);
    cudaGraphDestroy(graph);
    for (void* p : owned) cudaFree(p);
    return differing_first == 0 && differing_whole == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
