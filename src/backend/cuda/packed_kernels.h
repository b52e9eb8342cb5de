// Launchers of the kernels over packed block-quantized weights (layout: packed_blocks.h). Every
// launcher enqueues on `stream` and returns at once; pointers are device pointers; `type` is the
// weight's GGUF type (any of the eight block types), `K` its row length (a multiple of 32; of 256
// for the K-quants).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <type_traits>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/packed_blocks.h"
#include "backend/cuda/row_routing.h"

namespace g4 {

// ---- packed_weights.cu ----

// Packs rows [first_row, first_row + n) of a [rows, cols] tensor from GGUF blocks (n rows of them
// at `gguf`, device memory) into the packed tensor at `dst`.
void launch_pack_rows(DType type, const uint8_t* gguf, int64_t first_row, int64_t n, uint8_t* dst, int64_t rows,
                      int64_t cols, cudaStream_t stream);
// Fills the packed tensor with random_block(type, random_block_scales(type, spread), seed, i) for
// every GGUF block i (row-major): the blocks the CPU backend's fill makes.
void launch_fill_random_blocks(DType type, uint8_t* dst, int64_t rows, int64_t cols, float spread, uint64_t seed,
                               cudaStream_t stream);
// out[n, K] (bf16) = rows [first_row, first_row + n) of the packed [rows, K] weight.
void launch_dequantize_rows(DType type, const uint8_t* w, int64_t rows, int64_t K, int64_t first_row, int64_t n,
                            bf16* out, cudaStream_t stream);
// out[t] = bf16(table[ids[t]] * scale) from a packed [rows, hidden] table (as launch_embed).
void launch_embed_packed(DType type, const uint8_t* table, int64_t rows, int64_t hidden, const int32_t* ids, int64_t T,
                         float scale, bf16* out, cudaStream_t stream);

// ---- packed_gemv.cu ----

// x [T, K] quantized per block of 32 (quantize_activation_block) into `out`, T * K / 32 *
// sizeof(packed::ActivationBlock) bytes, in the planes packed_gemv.cu reads.
void launch_quantize_activations(const bf16* x, int64_t T, int64_t K, uint4* out, cudaStream_t stream);
// y_i[T, N_i] = x · w_i^T for 1..kMaxGemvTokens tokens and 1..kMaxGemvTargets packed matrices of
// one type sharing the quantized input x (launch_quantize_activations' output for [T, K]).
struct PackedGemvTarget {
  const uint8_t* w;
  bf16* y;
  int64_t rows;  // N_i
};
// How a GEMV adds a row's block terms: kFastest lets the compiler round them as it likes and adds
// the lanes' sums by the warp's butterfly; kBatchInvariant pins every rounding and adds in the
// order the batch GEMV reproduces (packed_blocks.h, fold_classes), a few percent slower.
enum class SumOrder { kFastest, kBatchInvariant };
void launch_packed_gemv(DType type, const uint4* x, const PackedGemvTarget* targets, int count, int64_t T, int64_t K,
                        SumOrder order, cudaStream_t stream);
// ---- packed_matmul.cu ----

// Calls f(std::integral_constant<int, n>{}) with n the 8-column tiles compiled for T tokens of the
// tensor-core kernels over 9..kMaxPackedMatmulTokens tokens: 2, 4 or 8.
template <typename F>
void with_token_tiles(int64_t T, F&& f) {
  if (T <= 16) return f(std::integral_constant<int, 2>{});
  if (T <= 32) return f(std::integral_constant<int, 4>{});
  f(std::integral_constant<int, 8>{});
}
// The float workspace launch_packed_matmul needs for an [N, K] weight (its slices of K's partial
// sums for kMaxPackedMatmulTokens tokens; 0 when one slice covers K).
size_t packed_matmul_workspace_bytes(int64_t N, int64_t K);
// y[T, N] = x[T, K] · w^T with tensor cores, the packed weight read once for all tokens; the same
// bits for a token whatever T (slices of K fixed by the shape).
void launch_packed_matmul(DType type, const bf16* x, const uint8_t* w, bf16* y, int64_t T, int64_t N, int64_t K,
                          float* workspace, size_t workspace_bytes, cudaStream_t stream);

// ---- packed_batch_gemv.cu ----

// The quantized input of launch_packed_batch_gemv for up to kMaxPackedMatmulTokens rows of K values.
size_t batch_activation_bytes(int64_t K);
// x [T, K] quantized per block as launch_quantize_activations does (the same numbers), laid out for
// the batch GEMV, into `out` (batch_activation_bytes(K)).
void launch_quantize_batch_activations(const bf16* x, int64_t T, int64_t K, uint8_t* out, cudaStream_t stream);
// Whether launch_packed_batch_gemv takes T tokens of a K-wide weight of `type`: kMaxGemvTokens < T
// <= kMaxPackedMatmulTokens, every block type but Q6_K.
bool packed_batch_gemv_fits(DType type, int64_t T, int64_t K);
// The float workspace it needs for a weight of N rows (0 when one thread block row covers K).
size_t packed_batch_gemv_workspace_bytes(int64_t N);
// y[T, N] = x · w^T with the decode GEMV's arithmetic, bit for bit: each token's row as launch_packed_gemv
// with SumOrder::kBatchInvariant gives it alone. x: launch_quantize_batch_activations' output.
void launch_packed_batch_gemv(DType type, uint8_t* x, const uint8_t* w, bf16* y, int64_t T, int64_t N, int64_t K,
                              float* workspace, size_t workspace_bytes, cudaStream_t stream);
// y[i] = bf16(Σ_s partial[s * count + i]), summed from 0 in s order.
void launch_add_slices(const float* partial, int slices, int64_t count, bf16* y, cudaStream_t stream);
// The same for up to kMaxSliceSums outputs in one launch.
inline constexpr int kMaxSliceSums = 3;
struct SliceSum {
  const float* partial;
  int slices;
  int64_t count;
  bf16* y;
};
void launch_add_slices(std::span<const SliceSum> sums, cudaStream_t stream);
// out = gelu_tanh(bf16(gate's sum)) · bf16(up's sum): add_slices of both, then gelu_tanh_mul, in one
// launch with their bits. up.y is unused.
void launch_add_slices_gelu(const SliceSum& gate, const SliceSum& up, bf16* out, cudaStream_t stream);
// launch_residual_norm's arguments but o (elementwise.cu).
struct ResidualNormTail {
  bf16* x;
  const float *post_weight, *scalar;
  float eps;
  const float* next_weight;
  bf16* next_out;
};
// launch_residual_norm(x, o.y, ...) of the [rows, cols] o that add_slices(o) would store, which
// it also stores: one launch, the same bits (elementwise.cu).
void launch_residual_norm_of_slices(const SliceSum& o, int64_t rows, int64_t cols, const ResidualNormTail& r,
                                    cudaStream_t stream);

// out[T, N] = gelu_tanh(x · w_gate^T) * (x · w_up^T), both weights packed in `type`, for few tokens.
void launch_packed_gated_gelu(DType type, const uint4* x, const uint8_t* w_gate, const uint8_t* w_up, bf16* out,
                              int64_t T, int64_t N, int64_t K, SumOrder order, cudaStream_t stream);

// ---- q4_0_records.cu: Q4_0 in tile-interleaved records (q4_0_records.h) ----

// The float workspace launch_q4_0_records_matmul needs for an [N, K] matrix at up to
// kMaxPackedMatmulTokens tokens (0 when one slice covers K); a group of matrices needs the sum.
size_t q4_0_records_workspace_bytes(int64_t N, int64_t K);
// y[T, N] = x[T, K] · w^T for 1 <= T <= kMaxPackedMatmulTokens, w in records: a token's row has the
// same bits at any T (the slices of K fixed by the shape).
void launch_q4_0_records_matmul(const uint8_t* w, const bf16* x, bf16* y, int64_t T, int64_t N, int64_t K,
                                float* workspace, size_t workspace_bytes, cudaStream_t stream);
// The same for up to kMaxSliceSums matrices of one input in one launch (and one launch adding their
// slices), each with its own slices and so its own bits alone.
struct RecordsTarget {
  const uint8_t* w;
  bf16* y;
  int64_t N;
};
// With gelu_out: the targets are gate and up, and gelu_out = gelu_tanh(gate's y) · up's y, as
// launch_gelu_tanh_mul would write it (their slices' sums and the GELU-mul in one launch where both
// have several slices; the targets' y may then be left unwritten). With `then_norm`: one target,
// its y a residual block's o, and launch_residual_norm(x, y, ...) after it (with the slices' sums in
// one launch where the target has several slices).
void launch_q4_0_records_matmuls(std::span<const RecordsTarget> targets, const bf16* x, int64_t T, int64_t K,
                                 float* workspace, size_t workspace_bytes, cudaStream_t stream,
                                 bf16* gelu_out = nullptr, const ResidualNormTail* then_norm = nullptr);
// Rows [first_row, first_row + n) (whole tiles) of a packed Q4_0 matrix (packed_blocks.h) written as
// records into `w`, the [rows, K] matrix's records: `qs` holds those rows' quants (the packed qs
// plane from row first_row), `params` the whole params plane (copies: the records overwrite the
// packed planes they come from).
void launch_q4_0_records_from_planes(const uint8_t* qs, const uint8_t* params, int64_t first_row, int64_t n, int64_t K,
                                     uint8_t* w, cudaStream_t stream);
// As launch_dequantize_rows and launch_embed_packed, from records (the same values, bit for bit).
void launch_dequantize_q4_0_records(const uint8_t* w, int64_t rows, int64_t K, int64_t first_row, int64_t n, bf16* out,
                                    cudaStream_t stream);
void launch_embed_q4_0_records(const uint8_t* table, int64_t rows, int64_t hidden, const int32_t* ids, int64_t T,
                               float scale, bf16* out, cudaStream_t stream);

}  // namespace g4
