// The prefill GEMMs of the 31B shape under every algorithm cuBLASLt's heuristic offers: prints each
// candidate's configuration, time, TFLOP/s and whether its output equals the default's bit for bit,
// beside cublasGemmEx's default. For choosing the prefill GEMM algorithm on a GPU (docs/PERF.md).
//   bench_gemm_cuda [tokens=2048] [candidates=12]
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cuda/cuda_kernels.h"
#include "cuda_timing.h"

namespace {

using g4::bench::check;

struct Shape {
  const char* name;
  int n, k;
};

// y[T, N] = x[T, K] · w[N, K]^T, as the backend's matmul computes it (column-major y^T = w^T' x^T).
struct Gemm {
  int T, N, K;
  void *w, *x, *y, *ref, *workspace;
  size_t workspace_bytes;
};

template <typename F>
float time_ms(F&& launch, int reps) {
  return float(g4::bench::ms_per_launch([&](int) { launch(); }, 3, reps));
}

int config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  uint32_t v = 0;  // every attribute read here fits 32 bits
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written) != CUBLAS_STATUS_SUCCESS) return -1;
  return int(v);
}

bool same_bits(const Gemm& g) {
  std::vector<uint16_t> a(size_t(g.T) * g.N), b(a.size());
  check(cudaMemcpy(a.data(), g.y, a.size() * 2, cudaMemcpyDeviceToHost), "copy");
  check(cudaMemcpy(b.data(), g.ref, b.size() * 2, cudaMemcpyDeviceToHost), "copy");
  return std::memcmp(a.data(), b.data(), a.size() * 2) == 0;
}

void run_shape(cublasHandle_t blas, cublasLtHandle_t lt, const Gemm& g, const char* name, int candidates) {
  const double flop = 2.0 * g.T * g.N * g.K;
  const float one = 1.0f, zero = 0.0f;
  auto gemm_ex = [&](void* out) {
    check(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, g.N, g.T, g.K, &one, g.w, CUDA_R_16BF, g.K, g.x, CUDA_R_16BF,
                       g.K, &zero, out, CUDA_R_16BF, g.N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
  };
  gemm_ex(g.ref);
  const float ex_ms = time_ms([&] { gemm_ex(g.y); }, 20);
  std::printf("%-10s T=%d N=%d K=%d  cublasGemmEx default: %.3f ms  %.0f TFLOP/s\n", name, g.T, g.N, g.K, ex_ms,
              flop / ex_ms / 1e9);

  cublasLtMatmulDesc_t desc;
  check(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "transa");
  check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "transb");
  cublasLtMatrixLayout_t a, b, c;
  check(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, g.K, g.N, g.K), "layout a");
  check(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, g.K, g.T, g.K), "layout b");
  check(cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, g.N, g.T, g.N), "layout c");
  cublasLtMatmulPreference_t pref;
  check(cublasLtMatmulPreferenceCreate(&pref), "pref");
  check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &g.workspace_bytes,
                                             sizeof(g.workspace_bytes)),
        "workspace");
  std::vector<cublasLtMatmulHeuristicResult_t> results(candidates);
  int found = 0;
  check(cublasLtMatmulAlgoGetHeuristic(lt, desc, a, b, c, c, pref, candidates, results.data(), &found), "heuristic");
  for (int i = 0; i < found; ++i) {
    const cublasLtMatmulAlgo_t& algo = results[i].algo;
    auto matmul = [&] {
      check(cublasLtMatmul(lt, desc, &one, g.w, a, g.x, b, &zero, g.y, c, g.y, c, &algo, g.workspace,
                           g.workspace_bytes, nullptr),
            "cublasLtMatmul");
    };
    const float ms = time_ms(matmul, 20);
    std::printf("  #%-2d id %3d tile %3d stages %3d splitK %2d reduction %d swizzle %d cluster %3d  %.3f ms  %.0f "
                "TFLOP/s  %s\n",
                i, config(algo, CUBLASLT_ALGO_CONFIG_ID), config(algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                config(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID), config(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                config(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME), config(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
                config(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID), ms, flop / ms / 1e9,
                same_bits(g) ? "bits == default" : "bits differ");
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(a);
  cublasLtMatrixLayoutDestroy(b);
  cublasLtMatrixLayoutDestroy(c);
  cublasLtMatmulDescDestroy(desc);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int T = argc > 1 ? std::atoi(argv[1]) : 2048, candidates = argc > 2 ? std::atoi(argv[2]) : 12;
    // Gemma 4 31B: hidden 5376, 32 heads, sliding kv 16 x 256, global kv 4 x 512 (K=V), MLP 21504.
    // "gate+up" and "q+k+v" are the shapes of one GEMM over both (all three) matrices stacked.
    const Shape shapes[] = {{"q", 8192, 5376},        {"k|v", 4096, 5376},         {"o", 5376, 8192},
                            {"gate|up", 21504, 5376}, {"down", 5376, 21504},       {"q global", 16384, 5376},
                            {"k global", 2048, 5376}, {"o global", 5376, 16384},   {"gate+up", 43008, 5376},
                            {"q+k+v", 16384, 5376}};
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    check(cublasCreate(&blas), "cublasCreate");
    check(cublasLtCreate(&lt), "cublasLtCreate");
    Gemm g{};
    g.T = T;
    g.workspace_bytes = size_t(32) << 20;
    const size_t max_elems = size_t(43008) * 5376;
    check(cudaMalloc(&g.w, max_elems * 2), "malloc");
    check(cudaMalloc(&g.x, size_t(T) * 21504 * 2), "malloc");
    check(cudaMalloc(&g.y, size_t(T) * 43008 * 2), "malloc");
    check(cudaMalloc(&g.ref, size_t(T) * 43008 * 2), "malloc");
    check(cudaMalloc(&g.workspace, g.workspace_bytes), "malloc");
    g4::launch_fill_uniform(static_cast<g4::bf16*>(g.w), int64_t(max_elems), 0.0f, 0.02f, 1, nullptr);
    g4::launch_fill_uniform(static_cast<g4::bf16*>(g.x), int64_t(T) * 21504, 0.0f, 1.0f, 2, nullptr);
    check(cublasSetWorkspace(blas, g.workspace, g.workspace_bytes), "workspace");
    for (const Shape& s : shapes) {
      g.N = s.n;
      g.K = s.k;
      run_shape(blas, lt, g, s.name, candidates);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gemm_cuda: %s\n", e.what());
    return 1;
  }
}
