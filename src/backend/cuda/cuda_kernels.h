// Launchers of the CUDA backend's kernels. Every launcher enqueues on `stream` and returns at once;
// pointers are device pointers. Activations are bf16 with float32 arithmetic inside each kernel.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/row_routing.h"
#include "sampling/logit_penalties.h"
#include "util/dtype.h"

namespace g4 {

using bf16 = __nv_bfloat16;

// out[t] = bf16(table[ids[t]] * scale); `scale` is already rounded to the activation dtype.
void launch_embed(const bf16* table, const int32_t* ids, int64_t T, int64_t hidden, float scale, bf16* out,
                  cudaStream_t stream);
// Per-row RMSNorm (in place allowed); weight F32 [cols] or nullptr.
void launch_rms_norm(const bf16* x, int64_t rows, int64_t cols, const float* weight, float eps, bf16* out,
                     cudaStream_t stream);
// The attention block's head norms in one launch (see Backend::head_norms). Rows are heads of
// head_dim values; q_rows / T and k_rows / T heads per token. v_in == k (K=V layers): each k row
// also yields its v row, written before k is normed in place; otherwise v_in rows are normed into v.
struct HeadNormLaunch {
  bf16 *q, *k, *v;
  const bf16* v_in;
  const float *q_weight, *k_weight;  // F32 [head_dim] or nullptr
  int64_t q_rows, k_rows, v_rows, T, head_dim;
  int64_t q_first;  // q holds the heads of tokens [q_first, T)
  float eps;
  const int32_t* positions;
  const float* inv_freq;  // F32 [head_dim / 2]; zeros rotate by nothing
  float2* rope_table;     // scratch [T][head_dim / 2]: each token's (cos, sin), computed once for all its heads
};
void launch_head_norms(const HeadNormLaunch& a, cudaStream_t stream);
// Per row: x = (x + rms_norm(o)·post_weight) · scalar[0]; then, when next_out is not null,
// next_out = rms_norm(x)·next_weight. Weights F32 [cols], scalar F32 [1]; each may be nullptr (none).
// With `planes` (one row, cols a multiple of 32, a next_out): next_out also quantized for the
// packed GEMV, as launch_quantize_activations would (packed_kernels.h), saving that launch.
void launch_residual_norm(bf16* x, const bf16* o, int64_t rows, int64_t cols, const float* post_weight,
                          const float* scalar, float eps, const float* next_weight, bf16* next_out, uint4* planes,
                          cudaStream_t stream);
void launch_gelu_tanh_mul(const bf16* gate, const bf16* up, bf16* out, int64_t n, cudaStream_t stream);
void launch_softcap(const bf16* x, int64_t n, float cap, float* out, cudaStream_t stream);
// Widens rows of a weight stored as F32/F16/BF16 into bf16 or float32 (dst_f32); block-quantized
// weights stay packed (packed_kernels.h).
void launch_convert_weight(const void* src, DType src_dtype, int64_t rows, int64_t cols, void* dst, bool dst_f32,
                           cudaStream_t stream);
// Row r of logits [rows, vocab]: the adjustments [offsets[r], offsets[r + 1]) of entries applied in
// place (Backend::adjust_logits).
void launch_adjust_logits(float* logits, int64_t rows, int64_t vocab, const LogitAdjustment* entries,
                          const int32_t* offsets, cudaStream_t stream);
// Row r of logits [rows, vocab] with row_mask[r] >= 0: tokens whose bit in mask row_mask[r] of
// `masks` ([*, words] 32-bit words) is clear, or past its words, become -infinity
// (Backend::mask_logits).
void launch_mask_logits(float* logits, int64_t rows, int64_t vocab, const uint32_t* masks, int64_t words,
                        const int32_t* row_mask, cudaStream_t stream);
// ids[0] = int32(token[0]); positions[0] += 1 (the device-side step advance of graph decode).
void launch_advance_step(const int64_t* token, int32_t* ids, int32_t* positions, cudaStream_t stream);
void launch_tokens_to_ids(const int64_t* tokens, int32_t* ids, int64_t rows, cudaStream_t stream);
// Uniform values in [center - spread, center + spread] from a counter hash of (seed, index).
void launch_fill_uniform(bf16* dst, int64_t n, float center, float spread, uint64_t seed, cudaStream_t stream);
void launch_fill_uniform(float* dst, int64_t n, float center, float spread, uint64_t seed, cudaStream_t stream);

// y_i[T, N_i] = x[T, K] · w_i[N_i, K]^T for small T (1..kMaxGemvTokens, row_routing.h) and up to kMaxGemvTargets
// matrices sharing x (the q/k/v projections): one memory-bound weight stream, one launch.
inline constexpr int kMaxGemvTargets = 3;
struct GemvTarget {
  const bf16* w;
  bf16* y;
  int64_t rows;  // N_i
};
void launch_gemv(const bf16* x, const GemvTarget* targets, int count, int64_t T, int64_t K, cudaStream_t stream);
// out[T, N] = gelu_tanh(x · w_gate^T) * (x · w_up^T) for small T: both weight streams in one launch.
void launch_gated_gelu(const bf16* x, const bf16* w_gate, const bf16* w_up, bf16* out, int64_t T, int64_t N,
                       int64_t K, cudaStream_t stream);

// Attention (see Backend::attention). `pos0` is read from device memory so graphs replay correctly.
struct AttentionLaunch {
  const bf16 *q, *k_new, *v_new;
  bf16 *k_cache, *v_cache, *out;
  const int32_t* positions;
  int64_t T;
  // The cache's pages (KvCache): key position p's K/V row is cache_row(a, p) of k_cache/v_cache.
  const int32_t* page_table;
  int table_slots, page_positions;
  int64_t page_stride;
  __host__ __device__ int64_t capacity() const { return int64_t(table_slots) * page_positions; }
  int heads, kv_heads, head_dim, window;
  float scale;
  int64_t q_stride, kv_stride, out_stride;  // row strides in elements
  int64_t q_first = 0;  // the queries (q and out rows) are tokens [q_first, T)
  // Decode only: when norm_inputs, q, k_new and v_new are the raw projections (v_new is K itself on
  // K=V layers) and are normed here as Backend::head_norms would (q/k weights, RoPE inv_freq).
  bool norm_inputs = false;
  const float *q_norm_weight = nullptr, *k_norm_weight = nullptr, *inv_freq = nullptr;
  float norm_eps = 0.0f;
  // Queries over the cache alone (AttentionArgs::reads_cache_only: an MTP assistant's), nothing
  // stored. The kernels then see each query one position earlier, with a window one shorter
  // (attention_launch): keys (P − window, P − 1] of a query at P, all read from the cache.
  bool cache_only = false;
};
// The position of a launch's query t as its kernels see it (AttentionLaunch::cache_only).
__host__ __device__ inline int launch_position(const AttentionLaunch& a, int64_t t) {
  return a.positions[t] - int(a.cache_only);
}
// Decode (T == 1): split-K flash decoding (which also stores the token's K/V), then the merge of
// the splits, for one to kMaxDecodeSequences sequences in one launch pair. Sequence z's query, new
// K/V, output and position are row z of a's tensors (a.q + z * q_stride, ..., a.positions + z); its
// caches are caches.k[z], caches.v[z] and caches.table[z] (a's own are not read). Each sequence's blocks compute
// exactly what a launch of that sequence alone computes (docs/DESIGN.md §7, batch invariance).
// `partials` holds sequences * decode_partial_floats(a, max_splits) floats. With `planes` (one
// sequence, head_dim a multiple of 32), the output row is also quantized for the packed GEMV, as
// launch_quantize_activations would (packed_kernels.h), saving that launch.
inline constexpr int kMaxDecodeSequences = 64;  // a whole decode batch (1 KB of kernel parameters)
// Each sequence's cache of a launch: its K and V rows (of element type Row) and its page table.
template <typename Row>
struct SequenceCaches {
  int sequences = 1;
  Row* k[kMaxDecodeSequences] = {};
  Row* v[kMaxDecodeSequences] = {};
  const int32_t* table[kMaxDecodeSequences] = {};
};
using DecodeCaches = SequenceCaches<bf16>;
int64_t decode_partial_floats(const AttentionLaunch& a, int max_splits);
// `splits_bound` > 0 (the most decode_attention_splits of the launch's sequences) launches only the
// splits that can hold keys; 0 launches every split the cache could need (what a graph replayed at
// later positions must).
void launch_decode_attention(const AttentionLaunch& a, const DecodeCaches& caches, float* partials, int max_splits,
                             uint4* planes, cudaStream_t stream, int splits_bound = 0);
// Splits holding keys of a decode query at `position` (those past it are empty): the position alone
// decides how the keys are split, so a sequence's result does not depend on its batch.
int decode_attention_splits(int64_t position, int window, int max_splits);
// Prefill (T > 1): tiled tensor-core attention, then the chunk's K/V are stored in the cache.
void launch_prefill_attention(const AttentionLaunch& a, cudaStream_t stream);
// The chunk's K/V rows stored in the cache (the last capacity() of them), nothing else.
void launch_store_kv(const AttentionLaunch& a, cudaStream_t stream);
// A short chunk (2 <= T <= kMaxDecodeSequences, every row a query, the chunk's keys fitting the cache
// beside a window of older ones) on the decode kernels: its K/V stored first, then each row z
// attended as a decode query at positions[z] over the same cache, exactly as a decode step there
// would, split over the context (a verify chunk of speculative decoding: the prefill kernel's few
// blocks walk the whole context). Blocks of the rows that read the same keys run next to each other,
// so the keys come from DRAM about once. `partials` holds T * decode_partial_floats(a, max_splits).
void launch_chunk_on_decode_kernels(const AttentionLaunch& a, float* partials, int max_splits, cudaStream_t stream,
                                    int splits_bound = 0);

}  // namespace g4
