// Every scratch buffer of the CUDA backend in one place, each with its readers, writers and size
// rule. Buffers only grow, by the reserve_* calls, which the backend makes when weights are
// uploaded and when the runner reserves its largest forward (Backend::reserve_forward, before any
// forward); an op run outside a runner (tests, benchmarks) grows what it needs on its first,
// eager call. A graph being captured must not allocate, and it reads the buffers it was recorded over (a growth replaces a buffer, and
// the backend's allocation count tells graph owners to record again: Backend::replayable).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>

#include "backend/tensor.h"

namespace g4 {

class CudaWorkspace {
 public:
  // The backend's allocation (counted and metered): dtype, rows, cols.
  using Allocate = std::function<Tensor(DType, int64_t, int64_t)>;
  explicit CudaWorkspace(Allocate allocate) : allocate_(std::move(allocate)) {}

  // cuBLAS's workspace (cublasSetWorkspace): `bytes`, made with the backend.
  void reserve_cublas(size_t bytes) { grow_bytes(cublas, bytes); }
  // At least `bytes` of staging (whole I32 words, one more than bytes / 4 when `spare_word`, as the
  // upload path has always sized it).
  void reserve_staging(size_t bytes, bool spare_word);
  // The split-K partial states of decode attention: `floats` floats.
  void reserve_attention_partials(int64_t floats) { grow_values(attention_partials, DType::F32, floats); }
  // gated_gelu's up projection: `values` bf16 values.
  void reserve_up(int64_t values) { grow_values(up, DType::BF16, values); }
  // head_norms' rotations: `floats` floats.
  void reserve_rope_table(int64_t floats) { grow_values(rope_table, DType::F32, floats); }
  // What matmuls over a packed [rows, cols] weight need: the quantized inputs of up to
  // kMaxGemvTokens rows and of a batch, the partial sums of the packed matmul and batch GEMV, and
  // the two dequantized scratches of prefill (each min(dequantized_cap, rows · cols) bf16 values).
  void reserve_packed(int64_t rows, int64_t cols, size_t dequantized_cap);
  // At least `bytes` of partial sums (a group of Q4_0 records matrices needs the sum of theirs).
  void reserve_packed_partials(size_t bytes);

  Tensor cublas;  // I32 words; cuBLAS's alone
  // Host weights on their way to the device, widened (launch_convert_weight) or packed
  // (launch_pack_rows) from here by upload_weight; the packed quants of a Q4_0 matrix being
  // rearranged into records (to_records). kStagingBytes, or one source row when larger.
  Tensor staging;
  // Decode attention's per-split softmax states (launch_decode_attention), merged by its second
  // kernel: decode_partial_floats(heads, head_dim, kDecodeSplits) per sequence of a decode batch
  // (at most kMaxDecodeSequences in one launch).
  Tensor attention_partials;
  // gated_gelu's up projection when gate and up run as two matmuls (more rows than the fused GEMV
  // takes), read by the GELU-mul: max(rows, kMaxPackedMatmulTokens) · intermediate bf16 values.
  Tensor up;
  // head_norms' cos/sin per (token, rotating pair): 2 · rows · head_dim / 2 floats.
  Tensor rope_table;
  // The packed GEMV's input quantized per block of 32 (launch_quantize_activations' planes), for
  // kMaxGemvTokens rows of the widest packed weight: written by the quantize launch, or alongside by
  // the kernel that writes a one-row activation inside a fused op, and read by the packed GEMV in
  // that same op.
  Tensor quantized;
  // The packed batch GEMV's input (launch_quantize_batch_activations), batch_activation_bytes(cols).
  Tensor batch_quantized;
  // Partial sums over slices of K: launch_packed_matmul's and launch_packed_batch_gemv's for the
  // largest packed weight, and the Q4_0 records matmuls' for a group of up to kMaxSliceSums matrices.
  Tensor packed_partials;
  // Prefill over packed weights: two bf16 scratches of dequantized weight rows, filled in turn on
  // the dequantize stream while cuBLAS reads the other (multiply_dequantized_chunk); their size sets
  // the rows of a chunk, and so the GEMM shapes.
  Tensor dequantized[2];

 private:
  void grow_bytes(Tensor& t, size_t bytes);  // I32 words, bytes / 4 of them
  void grow_values(Tensor& t, DType dtype, int64_t values);

  Allocate allocate_;
};

}  // namespace g4
