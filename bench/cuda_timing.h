// What the CUDA benches share: CUDA and cuBLAS errors as exceptions, and the time of back-to-back
// launches measured by events on their stream.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace g4::bench {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
inline void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": " + cublasGetStatusString(s));
}

// Milliseconds per call of launch(i), i = 0 .. reps - 1, after `warmup` calls launch(0 .. warmup - 1),
// the calls launching on `stream`.
template <typename F>
double ms_per_launch(F&& launch, int warmup, int reps, cudaStream_t stream = nullptr) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  for (int i = 0; i < warmup; ++i) launch(i);
  check(cudaEventRecord(start, stream), "record");
  for (int i = 0; i < reps; ++i) launch(i);
  check(cudaEventRecord(stop, stream), "record");
  check(cudaEventSynchronize(stop), "sync");
  check(cudaGetLastError(), "launch");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return double(ms) / reps;
}

}  // namespace g4::bench
