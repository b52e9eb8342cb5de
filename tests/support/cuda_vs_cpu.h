// CUDA ops against the CPU backend's (the float32 reference): the same inputs on both backends,
// outputs read back as float32 and compared by relative L2 (tests/test_cuda_backend.cpp,
// tests/test_cuda_quant.cpp). Tests skip without a usable GPU (G4_SKIP_OR_FAIL_WITHOUT_GPU).
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "format/tensor_source.h"
#include "support/fixtures.h"

namespace g4::test {

// The CUDA backend, or null when g4 was built without CUDA or no GPU is usable.
std::unique_ptr<Backend> cuda_backend_or_null();

// n values uniform in [-spread, spread], each a bf16 number, so both backends see the same inputs.
std::vector<float> random_values(size_t n, float spread, uint32_t seed);

// `values` ([rows, cols], 1-D when rows == 0) encoded as `dtype` (quant/quantize.h) in a host
// tensor that owns its bytes, as a file would hand it to upload_weight.
HostTensor encoded_weight(int64_t rows, int64_t cols, DType dtype, const std::vector<float>& values);

// One tensor on each backend.
struct Both {
  Tensor cpu, gpu;
};

// Op by op, a kernel bug lands far above this (bf16 storage of the CUDA output costs a few 1e-3).
inline constexpr double kOpRelativeL2 = 1e-2;

class CudaVsCpu : public ::testing::Test {
 protected:
  void SetUp() override { G4_SKIP_OR_FAIL_WITHOUT_GPU(gpu_); }

  // The same activation on the CPU (F32) and the GPU (bf16).
  Both activation(int64_t rows, int64_t cols, const std::vector<float>& v);
  Both activation(int64_t rows, int64_t cols, float spread = 1.0f);
  // Same raw bytes on both backends (ids, positions, F32 tables).
  Both raw(DType dtype, int64_t rows, int64_t cols, const void* data);
  // RoPE inverse frequencies [head_dim / 2] (F32) where only the first `rotating` pairs rotate
  // (θ 10 000), the rest 0: the partial rotation of Gemma 4's full layers.
  Both rope_inv_freq(int64_t head_dim, int64_t rotating);
  // A random weight stored as `dtype` (1-D when rows == 0), uploaded to both.
  Both weight(int64_t rows, int64_t cols, DType dtype, float center = 0.0f, float spread = 0.5f);
  Both upload_weight(const HostTensor& h) { return {cpu_.upload_weight(h), gpu_->upload_weight(h)}; }
  std::vector<float> read(Backend& be, const Tensor& t);
  void expect_close(const Both& b, const std::string& what, double bound = kOpRelativeL2);

  CpuBackend cpu_{2};
  std::unique_ptr<Backend> gpu_ = cuda_backend_or_null();
  uint32_t seed_ = 1;
};

}  // namespace g4::test
