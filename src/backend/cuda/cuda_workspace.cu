#include "backend/cuda/cuda_workspace.h"

#include <algorithm>

#include "backend/cuda/packed_kernels.h"

namespace g4 {

void CudaWorkspace::grow_bytes(Tensor& t, size_t bytes) {
  if (t.bytes() < bytes) t = allocate_(DType::I32, 1, int64_t(bytes / 4));
}

void CudaWorkspace::grow_values(Tensor& t, DType dtype, int64_t values) {
  if (t.numel() < values) t = allocate_(dtype, 1, values);
}

void CudaWorkspace::reserve_staging(size_t bytes, bool spare_word) {
  if (staging.empty() || staging.bytes() < bytes) staging = allocate_(DType::I32, 1, int64_t(bytes / 4 + (spare_word ? 1 : 0)));
}

void CudaWorkspace::reserve_packed(int64_t rows, int64_t cols, size_t dequantized_cap) {
  grow_bytes(quantized, size_t(kMaxGemvTokens) * size_t(cols / packed::kBlock) * sizeof(packed::ActivationBlock));
  grow_bytes(batch_quantized, batch_activation_bytes(cols));
  reserve_packed_partials(std::max(packed_matmul_workspace_bytes(rows, cols), packed_batch_gemv_workspace_bytes(rows)));
  const size_t dequantized_bytes = std::min(dequantized_cap, size_t(rows) * size_t(cols) * 2);
  for (Tensor& scratch : dequantized)
    if (scratch.bytes() < dequantized_bytes) scratch = allocate_(DType::BF16, 1, int64_t(dequantized_bytes / 2));
}

void CudaWorkspace::reserve_packed_partials(size_t bytes) {
  if (packed_partials.bytes() < bytes) packed_partials = allocate_(DType::F32, 1, int64_t(bytes / 4));
}

}  // namespace g4
