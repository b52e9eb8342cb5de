// The batch-1 decode GEMVs over packed weights at the 31B's shapes, alone: for each weight type and
// matrix (q/k/v as one launch, o_proj, gate/up as the gated GELU, down_proj, the LM head), the
// launch's time (events over back-to-back launches, rotating through enough copies of the weight
// that L2 holds none of them) and the bandwidth it reaches. For choosing the packed GEMV's geometry
// (docs/DESIGN.md §3) and seeing what one matrix costs beside the whole step (docs/PERF.md).
// For one token, each launch in both sum orders (packed_kernels.h: SumOrder); with 2..8 tokens, a
// layer's GEMVs at that count (the quantize launch included) against the packed tensor-core matmul
// at that count (where a non-invariant forward of few rows should switch); with 9..64 tokens, the
// batch GEMV against the packed tensor-core matmul at that count.
//   bench_packed_gemv_cuda [types=q4_0,q4_k,q6_k,q8_0] [tokens=1]
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <cstdint>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/packed_kernels.h"
#include "cuda_timing.h"
#include "util/dtype.h"

namespace {

using namespace g4;

using g4::bench::check;

constexpr size_t kRotationBytes = size_t(600) << 20;  // well past the H200's 50 MB L2
constexpr int kReps = 40;

// `copies` packed [rows, cols] weights of random blocks.
struct Weights {
  std::vector<uint8_t*> copies;
  size_t bytes = 0;
  Weights(DType type, int64_t rows, int64_t cols) : bytes(row_bytes(type, cols) * size_t(rows)) {
    const size_t n = std::max<size_t>(2, (kRotationBytes + bytes - 1) / bytes);
    for (size_t i = 0; i < n; ++i) {
      uint8_t* p = nullptr;
      check(cudaMalloc(&p, bytes), "cudaMalloc weights");
      launch_fill_random_blocks(type, p, rows, cols, 0.05f, 17 + i, nullptr);
      copies.push_back(p);
    }
    check(cudaDeviceSynchronize(), "fill");
  }
  ~Weights() {
    for (uint8_t* p : copies) cudaFree(p);
  }
  Weights(const Weights&) = delete;
  Weights& operator=(const Weights&) = delete;
};

// Microseconds per launch(copy index), the copies in turn.
template <typename F>
double time_us(F&& launch, size_t copies) {
  return 1e3 * g4::bench::ms_per_launch([&](int i) { launch(size_t(i) % copies); }, 3, kReps);
}

// The 31B's shapes: hidden, MLP width, query and KV projection widths, vocabulary.
constexpr int64_t H = 5376, I = 21504, Q = 8192, KV = 4096, V = 262144;

// Copy c of a sliding layer's q, k and v as one GEMV launch's targets, T tokens each, the three
// outputs one after another from y.
std::array<PackedGemvTarget, 3> qkv_targets(const Weights& q, const Weights& k, const Weights& v, size_t c, bf16* y,
                                            int64_t T) {
  return {PackedGemvTarget{q.copies[c % q.copies.size()], y, Q},
          PackedGemvTarget{k.copies[c % k.copies.size()], y + T * Q, KV},
          PackedGemvTarget{v.copies[c % v.copies.size()], y + T * (Q + KV), KV}};
}

void report(DType type, const char* name, int64_t rows, int64_t cols, size_t bytes, double us, SumOrder order) {
  std::printf("%-5s %-8s [%6lld, %5lld]  %8.2f us  %5.2f TB/s  %s\n", dtype_name(type).c_str(), name,
              static_cast<long long>(rows), static_cast<long long>(cols), us, double(bytes) / (us * 1e-6) / 1e12,
              order == SumOrder::kFastest ? "fastest" : "batch-invariant order");
}

void run_type(DType type, uint4* x, bf16* y, const bf16* input, SumOrder order) {
  struct Gemv {
    const char* name;
    int64_t rows, cols;
  };
  for (const Gemv& g : {Gemv{"o_proj", H, Q}, Gemv{"down", H, I}, Gemv{"lm_head", V, H}}) {
    const Weights w(type, g.rows, g.cols);
    launch_quantize_activations(input, 1, g.cols, x, nullptr);
    const double us = time_us(
        [&](size_t c) {
          const PackedGemvTarget t{w.copies[c], y, g.rows};
          launch_packed_gemv(type, x, &t, 1, 1, g.cols, order, nullptr);
        },
        w.copies.size());
    report(type, g.name, g.rows, g.cols, w.bytes, us, order);
  }
  {  // q, k and v of a sliding layer in one launch
    const Weights q(type, Q, H), k(type, KV, H), v(type, KV, H);
    launch_quantize_activations(input, 1, H, x, nullptr);
    const double us = time_us(
        [&](size_t c) {
          launch_packed_gemv(type, x, qkv_targets(q, k, v, c, y, 1).data(), 3, 1, H, order, nullptr);
        },
        std::max({q.copies.size(), k.copies.size(), v.copies.size()}));
    report(type, "q/k/v", Q + 2 * KV, H, q.bytes + k.bytes + v.bytes, us, order);
  }
  {
    const Weights gate(type, I, H), up(type, I, H);
    launch_quantize_activations(input, 1, H, x, nullptr);
    const double us = time_us(
        [&](size_t c) { launch_packed_gated_gelu(type, x, gate.copies[c], up.copies[c], y, 1, I, H, order, nullptr); },
        gate.copies.size());
    report(type, "gate/up", 2 * I, H, 2 * gate.bytes, us, order);
  }
}

// T tokens (2..kMaxGemvTokens) of a sliding layer's matrices: the GEMVs as the backend runs them
// (the input quantized, q/k/v as one launch, gate/up as the gated GELU) against the packed
// tensor-core matmul (q, k and v as three launches, gate and up as two, then the GELU-mul).
void run_few_tokens_type(DType type, int64_t T, const bf16* input, uint4* x, bf16* y, bf16* up) {
  size_t workspace_bytes = 4;
  for (const auto& [rows, cols] :
       {std::pair{Q, H}, std::pair{KV, H}, std::pair{H, Q}, std::pair{H, I}, std::pair{I, H}})
    workspace_bytes = std::max(workspace_bytes, packed_matmul_workspace_bytes(rows, cols));
  float* workspace = nullptr;
  check(cudaMalloc(&workspace, workspace_bytes), "cudaMalloc workspace");
  auto matmul = [&](const uint8_t* w, bf16* out, int64_t rows, int64_t cols) {
    launch_packed_matmul(type, input, w, out, T, rows, cols, workspace, workspace_bytes, nullptr);
  };
  double gemv_total = 0, matmul_total = 0;
  auto row = [&](const char* name, double gemv_us, double matmul_us) {
    std::printf("%-5s %-8s T=%lld  GEMV %8.2f us  packed matmul %8.2f us\n", dtype_name(type).c_str(), name,
                static_cast<long long>(T), gemv_us, matmul_us);
    gemv_total += gemv_us, matmul_total += matmul_us;
  };
  {
    const Weights q(type, Q, H), k(type, KV, H), v(type, KV, H);
    const size_t copies = std::max({q.copies.size(), k.copies.size(), v.copies.size()});
    const double gemv_us = time_us(
        [&](size_t c) {
          launch_quantize_activations(input, T, H, x, nullptr);
          launch_packed_gemv(type, x, qkv_targets(q, k, v, c, y, T).data(), 3, T, H, SumOrder::kFastest, nullptr);
        },
        copies);
    const double matmul_us = time_us(
        [&](size_t c) {
          matmul(q.copies[c % q.copies.size()], y, Q, H);
          matmul(k.copies[c % k.copies.size()], y + T * Q, KV, H);
          matmul(v.copies[c % v.copies.size()], y + T * (Q + KV), KV, H);
        },
        copies);
    row("q/k/v", gemv_us, matmul_us);
  }
  for (const auto& [name, rows, cols] : {std::tuple{"o_proj", H, Q}, std::tuple{"down", H, I}}) {
    const Weights w(type, rows, cols);
    const double gemv_us = time_us(
        [&](size_t c) {
          const PackedGemvTarget t{w.copies[c], y, rows};
          launch_quantize_activations(input, T, cols, x, nullptr);
          launch_packed_gemv(type, x, &t, 1, T, cols, SumOrder::kFastest, nullptr);
        },
        w.copies.size());
    const double matmul_us = time_us(
        [&](size_t c) { matmul(w.copies[c], y, rows, cols); }, w.copies.size());
    row(name, gemv_us, matmul_us);
  }
  {
    const Weights gate(type, I, H), up_w(type, I, H);
    const double gemv_us = time_us(
        [&](size_t c) {
          launch_quantize_activations(input, T, H, x, nullptr);
          launch_packed_gated_gelu(type, x, gate.copies[c], up_w.copies[c], y, T, I, H, SumOrder::kFastest, nullptr);
        },
        gate.copies.size());
    const double matmul_us = time_us(
        [&](size_t c) {
          matmul(gate.copies[c], y, I, H);
          matmul(up_w.copies[c], up, I, H);
          launch_gelu_tanh_mul(y, up, y, T * I, nullptr);
        },
        gate.copies.size());
    row("gate/up", gemv_us, matmul_us);
  }
  std::printf("%-5s layer    T=%lld  GEMV %8.2f us  packed matmul %8.2f us\n", dtype_name(type).c_str(),
              static_cast<long long>(T), gemv_total, matmul_total);
  cudaFree(workspace);
}

// T tokens (9..64) of each matrix: the batch GEMV (its quantize launch included, as the backend
// runs it) against the packed tensor-core matmul (bf16 input, not batch invariant).
void run_batch_type(DType type, int64_t T, const bf16* input, bf16* y) {
  struct Matrix {
    const char* name;
    int64_t rows, cols;
  };
  for (const Matrix& m : {Matrix{"q_proj", Q, H}, Matrix{"k_proj", KV, H}, Matrix{"o_proj", H, Q}, Matrix{"gate", I, H},
                          Matrix{"down", H, I}, Matrix{"lm_head", V, H}}) {
    const Weights w(type, m.rows, m.cols);
    const size_t workspace_bytes =
        std::max(packed_batch_gemv_workspace_bytes(m.rows), packed_matmul_workspace_bytes(m.rows, m.cols));
    float* workspace = nullptr;
    uint8_t* x = nullptr;
    check(cudaMalloc(&workspace, std::max<size_t>(workspace_bytes, 4)), "cudaMalloc workspace");
    check(cudaMalloc(&x, batch_activation_bytes(m.cols)), "cudaMalloc batch input");
    const double batch_us = time_us(
        [&](size_t c) {
          launch_quantize_batch_activations(input, T, m.cols, x, nullptr);
          launch_packed_batch_gemv(type, x, w.copies[c], y, T, m.rows, m.cols, workspace, workspace_bytes, nullptr);
        },
        w.copies.size());
    const double matmul_us = time_us(
        [&](size_t c) {
          launch_packed_matmul(type, input, w.copies[c], y, T, m.rows, m.cols, workspace, workspace_bytes, nullptr);
        },
        w.copies.size());
    std::printf("%-5s %-8s [%6lld, %5lld] T=%lld  batch GEMV %8.2f us (%5.2f TB/s, %d runs)  packed matmul %8.2f us\n",
                dtype_name(type).c_str(), m.name, static_cast<long long>(m.rows), static_cast<long long>(m.cols),
                static_cast<long long>(T), batch_us, double(w.bytes) / (batch_us * 1e-6) / 1e12,
                packed::fold_groups(m.rows), matmul_us);
    cudaFree(workspace);
    cudaFree(x);
  }
}

DType parse_type(std::string name) {
  for (char& ch : name) ch = char(std::toupper(static_cast<unsigned char>(ch)));
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4_K, DType::Q5_K,
                  DType::Q6_K})
    if (dtype_name(t) == name) return t;
  throw std::runtime_error("bench_packed_gemv_cuda: unknown block type '" + name + "'");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<DType> types;
    std::stringstream list(argc > 1 ? argv[1] : "q4_0,q4_k,q6_k,q8_0");
    for (std::string name; std::getline(list, name, ',');) types.push_back(parse_type(name));
    const int64_t tokens = argc > 2 ? std::stoll(argv[2]) : 1;
    if (tokens < 1 || tokens > kMaxPackedMatmulTokens)
      throw std::runtime_error("bench_packed_gemv_cuda: tokens is 1.." + std::to_string(kMaxPackedMatmulTokens));
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    std::printf("packed GEMV, %lld token(s), 31B shapes, %s; us per launch (%d back-to-back)\n",
                static_cast<long long>(tokens), prop.name, kReps);
    constexpr int64_t kWidest = I;  // down_proj's input
    bf16* input = nullptr;
    bf16* y = nullptr;
    bf16* up = nullptr;
    uint4* x = nullptr;
    const size_t input_bytes = size_t(tokens) * kWidest * sizeof(bf16);
    check(cudaMalloc(&input, input_bytes), "cudaMalloc input");
    check(cudaMemset(input, 0x3c, input_bytes), "cudaMemset input");  // bf16 0x3c3c ~ 0.0115
    check(cudaMalloc(&y, size_t(tokens) * 262144 * sizeof(bf16)), "cudaMalloc output");
    check(cudaMalloc(&up, size_t(tokens) * kWidest * sizeof(bf16)), "cudaMalloc up projection");
    check(cudaMalloc(&x, size_t(tokens) * size_t(kWidest / 32) * 80), "cudaMalloc quantized input");
    for (DType type : types) {
      if (tokens == 1)
        for (SumOrder order : {SumOrder::kFastest, SumOrder::kBatchInvariant}) run_type(type, x, y, input, order);
      else if (tokens <= kMaxGemvTokens)
        run_few_tokens_type(type, tokens, input, x, y, up);
      else if (type != DType::Q6_K)
        run_batch_type(type, tokens, input, y);
    }
    cudaFree(input);
    cudaFree(y);
    cudaFree(up);
    cudaFree(x);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
