// The Q4_0 records matmul (backend/cuda/q4_0_records.cu, docs/DESIGN.md §7) at the 31B's shapes and
// 1 to 256 tokens: µs per matrix, TB/s of weights and TFLOP/s, after checking sampled rows against a host sum
// over the same weights and activations, and that tokens of an 8- and a 64-token run have the bits
// they have alone. Weights rotate through 600 MB so that L2 holds none. Compare with
// `bench_packed_gemv_cuda q4_0 T` on the same machine. (The lab kernels this one was chosen from —
// other arithmetics, one tile a block, a dp2a GEMV over the records — were measured by
// bench_mma_gemv_cuda, in the history before the records became a layout; docs/PERF.md.)
//   bench_q4_0_records_cuda [q_proj|o_proj|gate|down|lm_head]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/packed_kernels.h"
#include "backend/cuda/q4_0_records.h"
#include "cuda_timing.h"
#include "util/half.h"

namespace {

using g4::bench::check;
namespace records = g4::records;

constexpr size_t kRotationBytes = size_t(600) << 20;
constexpr int kReps = 40, kMaxT = 256;

struct Shape {
  const char* name;
  int64_t N, K;
};
// The 31B's matrices: hidden 5 376, MLP 21 504, queries 8 192, vocabulary 262 144.
constexpr Shape kShapes[] = {{"q_proj", 8192, 5376}, {"o_proj", 5376, 8192}, {"gate", 21504, 5376},
                             {"down", 5376, 21504},  {"lm_head", 262144, 5376}};

// A random Q4_0 matrix (scales like a small model's: fp16 in [0.001, 0.01)) in records.
std::vector<uint8_t> random_records(int64_t N, int64_t K, uint64_t seed) {
  std::vector<uint8_t> gguf(size_t(N * K / 32) * records::kGgufBlockBytes);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> scale(0.001f, 0.01f);
  for (size_t at = 0; at < gguf.size(); at += records::kGgufBlockBytes) {
    const uint16_t h = g4::f32_to_f16(scale(rng));
    std::memcpy(&gguf[at], &h, 2);
    for (int i = 2; i < records::kGgufBlockBytes; i += 8) {
      const uint64_t v = rng();
      std::memcpy(&gguf[at + i], &v, std::min(8, records::kGgufBlockBytes - i));
    }
  }
  std::vector<uint8_t> bytes(records::matrix_bytes(N, K));
  for (int64_t tile = 0; tile < N / records::kTileRows; ++tile)
    for (int64_t chunk = 0; chunk < K / records::kValues; ++chunk)
      records::pack_q4_0_record(gguf.data(), K, tile, chunk, bytes.data() + records::record_offset(K, tile, chunk));
  return bytes;
}

double weight_at(const std::vector<uint8_t>& w, int64_t K, int64_t n, int64_t k) {
  const uint8_t* r = w.data() + records::record_offset(K, n / records::kTileRows, k / records::kValues);
  const int row = int(n % records::kTileRows), kk = int(k % records::kValues);
  return double(records::quant_at(r, row, kk) - 8) * double(g4::f16_to_f32(records::scale_bits_at(r, row, kk)));
}

std::vector<uint16_t> read_bits(const __nv_bfloat16* y, size_t count) {
  std::vector<uint16_t> bits(count);
  check(cudaMemcpy(bits.data(), y, count * 2, cudaMemcpyDeviceToHost), "copy y");
  return bits;
}

}  // namespace

int main(int argc, char** argv) {
  const char* only_shape = argc > 1 ? argv[1] : nullptr;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("bench_q4_0_records_cuda: no GPU present, skipped\n");
    return 0;
  }
  std::printf("Q4_0 records matmul (us per matrix, weights rotated through %zu MB)\n", kRotationBytes >> 20);
  for (const Shape& shape : kShapes) {
    if (only_shape && std::strcmp(only_shape, shape.name) != 0) continue;
    const std::vector<uint8_t> layout = random_records(shape.N, shape.K, 7);
    const size_t bytes = layout.size(), copies = std::max<size_t>(2, (kRotationBytes + bytes - 1) / bytes);
    std::vector<uint8_t*> w(copies);
    for (uint8_t*& p : w) {
      check(cudaMalloc(&p, bytes), "cudaMalloc weights");
      check(cudaMemcpy(p, layout.data(), bytes, cudaMemcpyHostToDevice), "copy weights");
    }
    std::vector<uint16_t> x_bits(size_t(kMaxT * shape.K));
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (uint16_t& b : x_bits) b = g4::f32_to_bf16(uniform(rng));
    __nv_bfloat16 *x = nullptr, *y = nullptr, *alone = nullptr;
    float* workspace = nullptr;
    const size_t workspace_bytes = std::max<size_t>(g4::q4_0_records_workspace_bytes(shape.N, shape.K), 4);
    check(cudaMalloc(&x, x_bits.size() * 2), "cudaMalloc x");
    check(cudaMemcpy(x, x_bits.data(), x_bits.size() * 2, cudaMemcpyHostToDevice), "copy x");
    check(cudaMalloc(&workspace, workspace_bytes), "cudaMalloc workspace");
    check(cudaMalloc(&y, size_t(kMaxT) * shape.N * 2), "cudaMalloc y");
    check(cudaMalloc(&alone, size_t(shape.N) * 2), "cudaMalloc alone");
    auto launch = [&](const uint8_t* weights, const __nv_bfloat16* in, __nv_bfloat16* out, int T) {
      g4::launch_q4_0_records_matmul(weights, in, out, T, shape.N, shape.K, workspace, workspace_bytes, nullptr);
    };
    for (int T : {1, 2, 8, 16, 32, 64, 128, 256}) {
      launch(w[0], x, y, T);
      check(cudaDeviceSynchronize(), "records matmul");
      const std::vector<uint16_t> got = read_bits(y, size_t(T) * shape.N);
      double worst = 0;
      for (int64_t n = 0; n < shape.N; n += 97 + shape.N / 4096) {
        for (int t = 0; t < T; t += std::max(1, T / 4)) {
          double want = 0, scale = 0;
          for (int64_t k = 0; k < shape.K; ++k) {
            const double term =
                weight_at(layout, shape.K, n, k) * double(g4::bf16_to_f32(x_bits[size_t(t * shape.K + k)]));
            want += term;
            scale += std::fabs(term);
          }
          worst = std::max(worst, std::fabs(double(g4::bf16_to_f32(got[size_t(t * shape.N + n)])) - want) / scale);
        }
      }
      int other_bits = 0;
      for (int t : {0, T / 2, T - 1}) {
        if (T == 1) break;
        launch(w[0], x + size_t(t) * shape.K, alone, 1);
        const std::vector<uint16_t> one = read_bits(alone, size_t(shape.N));
        other_bits += std::equal(one.begin(), one.end(), got.begin() + size_t(t) * shape.N) ? 0 : 1;
      }
      const double us = 1e3 * g4::bench::ms_per_launch([&](int i) { launch(w[size_t(i) % copies], x, y, T); }, 3, kReps);
      std::printf("%-7s [%6lld, %5lld] T=%-3d %8.2f us  %5.2f TB/s  %6.1f TFLOP/s  max error %.2e%s%s\n",
                  shape.name, static_cast<long long>(shape.N), static_cast<long long>(shape.K), T, us,
                  double(bytes) / (us * 1e-6) / 1e12, 2.0 * double(T) * double(shape.N * shape.K) / (us * 1e-6) / 1e12,
                  worst, worst < 1e-2 ? "" : "  WRONG",
                  T == 1 ? "" : other_bits == 0 ? "  same bits as alone" : "  OTHER BITS than alone");
    }
    for (uint8_t* p : w) cudaFree(p);
    for (void* p : {static_cast<void*>(x), static_cast<void*>(y), static_cast<void*>(alone), static_cast<void*>(workspace)})
      cudaFree(p);
  }
  return 0;
}
