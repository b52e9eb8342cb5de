#include <cmath>
#include "support/cuda_vs_cpu.h"

#include <algorithm>
#include <random>

#include "quant/quantize.h"
#include "support/fixtures.h"
#include "util/half.h"
#ifdef G4_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace g4::test {

std::unique_ptr<Backend> cuda_backend_or_null() {
#ifdef G4_HAVE_CUDA
  if (cuda_device_count() > 0) return make_cuda_backend();
#endif
  return nullptr;
}

std::vector<float> random_values(size_t n, float spread, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-spread, spread);
  std::vector<float> v(n);
  for (float& x : v) x = bf16_to_f32(f32_to_bf16(dist(rng)));
  return v;
}

HostTensor encoded_weight(int64_t rows, int64_t cols, DType dtype, const std::vector<float>& values) {
  const int64_t stored_rows = std::max<int64_t>(rows, 1);
  auto bytes = std::make_shared<std::vector<uint8_t>>(row_bytes(dtype, cols) * size_t(stored_rows));
  for (int64_t r = 0; r < stored_rows; ++r)
    encode_row(dtype, values.data() + r * cols, cols, bytes->data() + size_t(r) * row_bytes(dtype, cols));
  HostTensor h;
  h.name = "test";
  h.dtype = dtype;
  h.shape = rows ? std::vector<int64_t>{rows, cols} : std::vector<int64_t>{cols};
  h.data = bytes->data();
  h.bytes = bytes->size();
  h.owner = bytes;
  return h;
}

Both CudaVsCpu::activation(int64_t rows, int64_t cols, const std::vector<float>& v) {
  Both b{cpu_.alloc(DType::F32, rows, cols), gpu_->alloc(DType::BF16, rows, cols)};
  cpu_.upload(v.data(), b.cpu);
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
  gpu_->upload(h.data(), b.gpu);
  return b;
}

Both CudaVsCpu::activation(int64_t rows, int64_t cols, float spread) {
  return activation(rows, cols, random_values(size_t(rows * cols), spread, seed_++));
}

Both CudaVsCpu::raw(DType dtype, int64_t rows, int64_t cols, const void* data) {
  Both b{cpu_.alloc(dtype, rows, cols), gpu_->alloc(dtype, rows, cols)};
  cpu_.upload(data, b.cpu);
  gpu_->upload(data, b.gpu);
  return b;
}

Both CudaVsCpu::rope_inv_freq(int64_t head_dim, int64_t rotating) {
  std::vector<float> inv(size_t(head_dim / 2), 0.0f);
  for (int64_t i = 0; i < rotating; ++i) inv[size_t(i)] = std::pow(10000.0f, -2.0f * float(i) / float(head_dim));
  return raw(DType::F32, head_dim / 2, 1, inv.data());
}

Both CudaVsCpu::weight(int64_t rows, int64_t cols, DType dtype, float center, float spread) {
  std::vector<float> v = random_values(size_t(std::max<int64_t>(rows, 1) * cols), spread, seed_++);
  for (float& x : v) x += center;
  return upload_weight(encoded_weight(rows, cols, dtype, v));
}

std::vector<float> CudaVsCpu::read(Backend& be, const Tensor& t) {
  std::vector<float> out(size_t(t.numel()));
  if (t.dtype == DType::BF16) {
    std::vector<uint16_t> h(out.size());
    be.download(t, h.data());
    for (size_t i = 0; i < h.size(); ++i) out[i] = bf16_to_f32(h[i]);
  } else {
    be.download(t, out.data());
  }
  return out;
}

void CudaVsCpu::expect_close(const Both& b, const std::string& what, double bound) {
  EXPECT_LE(relative_l2(read(*gpu_, b.gpu), read(cpu_, b.cpu)), bound) << what;
}

}  // namespace g4::test
