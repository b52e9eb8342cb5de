// The prefill over packed weights at the 31B's shapes, piece by piece (docs/DESIGN.md §3, "Prefill"):
// for each matrix, its rows dequantized to bf16 alone (the launchers the backend uses: the packed
// layout, and for Q4_0 also records), a device copy of as many bytes for scale, cuBLAS's GEMM of T
// tokens over the dequantized rows alone, and the two in chunks of at most 128 MiB, one after the
// other on one stream and overlapped on two streams as the backend runs them.
//   bench_dequantize_cuda [tokens=512] [types=q4_0,q4_k,q6_k]
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cuda/packed_kernels.h"
#include "backend/cuda/q4_0_records.h"
#include "cuda_timing.h"
#include "model/gguf_export.h"
#include "util/dtype.h"

namespace {

using namespace g4;
using g4::bench::check;

constexpr size_t kChunkBytes = size_t(128) << 20;  // the backend's dequantized scratch
constexpr int kCopies = 3;                         // weights rotated so that L2 holds none
constexpr int kReps = 12;

struct Shape {
  const char* name;
  int64_t rows, cols;
};

// Q4_0 in records (batch invariance) or packed; the other types packed.
struct Layout {
  DType type;
  bool records;
};

size_t weight_bytes(Layout l, int64_t rows, int64_t cols) {
  return l.records ? records::matrix_bytes(rows, cols) : row_bytes(l.type, cols) * size_t(rows);
}

void dequantize(Layout l, const uint8_t* w, const Shape& s, int64_t first, int64_t n, bf16* out, cudaStream_t st) {
  if (l.records)
    launch_dequantize_q4_0_records(w, s.rows, s.cols, first, n, out, st);
  else
    launch_dequantize_rows(l.type, w, s.rows, s.cols, first, n, out, st);
}

struct Streams {
  cudaStream_t main = nullptr, side = nullptr;
  cudaEvent_t ready[2], read[2];
  cublasHandle_t blas = nullptr;
  Streams() {
    check(cudaStreamCreateWithFlags(&main, cudaStreamNonBlocking), "stream");
    check(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), "stream");
    for (int i = 0; i < 2; ++i) {
      check(cudaEventCreateWithFlags(&ready[i], cudaEventDisableTiming), "event");
      check(cudaEventCreateWithFlags(&read[i], cudaEventDisableTiming), "event");
    }
    check(cublasCreate(&blas), "cublasCreate");
    check(cublasSetStream(blas, main), "cublasSetStream");
  }
};

void gemm(Streams& s, const bf16* w, const bf16* x, bf16* y, int64_t n, int64_t T, int64_t K, int64_t ldy) {
  const float one = 1.0f, zero = 0.0f;
  check(cublasGemmEx(s.blas, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(T), int(K), &one, w, CUDA_R_16BF, int(K), x,
                     CUDA_R_16BF, int(K), &zero, y, CUDA_R_16BF, int(ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
}

void run_shape(Streams& s, Layout layout, const Shape& shape, int64_t T, bf16* x, bf16* y, bf16* scratch[2]) {
  std::vector<uint8_t*> copies(kCopies);
  const size_t bytes = weight_bytes(layout, shape.rows, shape.cols);
  for (uint8_t*& p : copies) {
    check(cudaMalloc(&p, bytes), "cudaMalloc weights");
    // Random blocks (as records, Q4_0's bytes are random nibbles and scales: the timing does not
    // depend on the values).
    launch_fill_random_blocks(layout.type, p, shape.rows, shape.cols, 0.05f, 17 + (&p - copies.data()), s.main);
  }
  check(cudaStreamSynchronize(s.main), "fill");
  const int64_t chunk = std::min<int64_t>(shape.rows, int64_t(kChunkBytes / (2 * size_t(shape.cols))) / 64 * 64);
  const size_t out_bytes = size_t(chunk) * size_t(shape.cols) * 2;
  auto per = [&](auto&& f) { return 1e3 * g4::bench::ms_per_launch(f, 2, kReps, s.main); };
  const double dq_us =
      per([&](int i) { dequantize(layout, copies[i % kCopies], shape, 0, chunk, scratch[0], s.main); });
  const double copy_us = per([&](int i) {
    check(cudaMemcpyAsync(scratch[i % 2], scratch[1 - i % 2], out_bytes, cudaMemcpyDeviceToDevice, s.main), "copy");
  });
  const double gemm_us = per([&](int) { gemm(s, scratch[0], x, y, chunk, T, shape.cols, shape.rows); });
  auto chunks = [&](int i, bool overlap) {
    for (int64_t r = 0, c = 0; r < shape.rows; r += chunk, ++c) {
      const int b = int(c % 2);
      const int64_t n = std::min(chunk, shape.rows - r);
      if (overlap) check(cudaStreamWaitEvent(s.side, s.read[b]), "wait");
      dequantize(layout, copies[i % kCopies], shape, r, n, scratch[b], overlap ? s.side : s.main);
      if (overlap) {
        check(cudaEventRecord(s.ready[b], s.side), "record");
        check(cudaStreamWaitEvent(s.main, s.ready[b]), "wait");
      }
      gemm(s, scratch[b], x, y + r, n, T, shape.cols, shape.rows);
      if (overlap) check(cudaEventRecord(s.read[b], s.main), "record");
    }
  };
  const double serial_us = per([&](int i) { chunks(i, false); });
  const double overlap_us = per([&](int i) { chunks(i, true); });
  std::printf("%-5s %-7s %-8s [%6lld, %5lld] chunk %5lld rows: dequantize %7.1f us (%4.2f TB/s; copy of its output "
              "%6.1f us)  GEMM %7.1f us (%4.0f TFLOP/s)  matrix: serial %7.1f us, two streams %7.1f us\n",
              dtype_name(layout.type).c_str(), layout.records ? "records" : "packed", shape.name,
              static_cast<long long>(shape.rows), static_cast<long long>(shape.cols), static_cast<long long>(chunk),
              dq_us,
              double(bytes * chunk / shape.rows + out_bytes) / (dq_us * 1e-6) / 1e12, copy_us, gemm_us,
              2.0 * double(chunk) * double(T) * double(shape.cols) / (gemm_us * 1e-6) / 1e12, serial_us, overlap_us);
  for (uint8_t* p : copies) cudaFree(p);
}

std::vector<DType> parse_types(const std::string& list) {
  std::vector<DType> types;
  std::stringstream ss(list);
  for (std::string name; std::getline(ss, name, ',');) types.push_back(parse_weight_dtype(name));
  return types;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int64_t T = argc > 1 ? std::stoll(argv[1]) : 512;
    const std::vector<DType> types = parse_types(argc > 2 ? argv[2] : "q4_0,q4_k,q6_k");
    const Shape shapes[] = {{"q", 8192, 5376}, {"o_proj", 5376, 8192}, {"gate", 21504, 5376}, {"down", 5376, 21504}};
    Streams s;
    bf16 *x = nullptr, *y = nullptr, *scratch[2] = {nullptr, nullptr};
    check(cudaMalloc(&x, size_t(T) * 21504 * 2), "cudaMalloc x");
    check(cudaMemset(x, 0x3c, size_t(T) * 21504 * 2), "cudaMemset x");
    check(cudaMalloc(&y, size_t(T) * 21504 * 2), "cudaMalloc y");
    for (bf16*& p : scratch) check(cudaMalloc(&p, kChunkBytes), "cudaMalloc scratch");
    std::printf("prefill over packed weights, %lld tokens, 31B shapes\n", static_cast<long long>(T));
    for (DType type : types)
      for (bool records : {false, true}) {
        if (records && type != DType::Q4_0) continue;
        for (const Shape& shape : shapes) run_shape(s, Layout{type, records}, shape, T, x, y, scratch);
      }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
