// Which CUDA kernel takes how many rows of a matmul: the bounds of the decode GEMVs and of the
// tensor-core packed matmul, and the rule between them; and which attention kernels take a chunk. Host-only (no CUDA header), so tests built
// without CUDA choose their tolerances by the same rule the backend follows.
#pragma once
#include <cstdint>

namespace g4 {

// Tokens up to which the decode GEMVs (bf16 and packed) run.
inline constexpr int kMaxGemvTokens = 8;
// Tokens up to which the packed matmul runs (a decode batch, a short prefill chunk); more go
// through dequantized rows and cuBLAS.
inline constexpr int kMaxPackedMatmulTokens = 64;
// Tokens up to which the Q4_0 records matmul runs (q4_0_records.cu): one arithmetic for every count,
// so a batch-invariant forward holds up to this many rows.
inline constexpr int kMaxRecordsTokens = 256;
// Rows a batch-invariant forward holds at most on the CUDA backend: the records matmul's tokens; the
// other weights' invariant kernels take them in groups (docs/DESIGN.md §7).
inline constexpr int kMaxBatchInvariantRows = kMaxRecordsTokens;
// k values per shared-memory stage of the packed matmul: K must be a multiple of it.
inline constexpr int kPackedMatmulChunk = 128;
// Whether the packed matmul takes T tokens of a K-wide weight: 1 <= T <= kMaxPackedMatmulTokens
// (the backend gives it kPackedMatmulFromRows or more without invariance, else more than
// kMaxGemvTokens; fewer than 16 pad the first 16 mma columns), K a multiple of kPackedMatmulChunk.
inline bool packed_matmul_fits(int64_t T, int64_t K) {
  return T >= 1 && T <= kMaxPackedMatmulTokens && K % kPackedMatmulChunk == 0;
}
// Fewest rows of a forward that need not be batch invariant the packed matmul takes from the GEMV:
// the GEMV's time grows with the rows, the matmul's hardly changes below 16 (docs/PERF.md, "Few rows").
inline constexpr int64_t kPackedMatmulFromRows = 5;
// Rows from which a forward that need not be batch invariant multiplies a packed weight's bf16
// copy (Backend::set_bf16_weight_copies) with cuBLAS instead of running the packed matmul: the
// copy's 2 bytes a weight, read near the memory's rate, against the packed matmul's time, which
// grows with the rows. On the H100 the copy is ahead from 33 rows (29.3 against 30.0 ms a 31B
// step at 33, 29.0 against 30.5 at 36; docs/DESIGN.md §10, "bf16 weight copies").
inline constexpr int64_t kBf16CopyFromRows = 33;
// Whether T rows of a K-wide packed weight run the GEMV (else the packed matmul or a larger path).
inline bool packed_gemv_takes(int64_t T, int64_t K, bool batch_invariant) {
  return T <= kMaxGemvTokens && (batch_invariant || T < kPackedMatmulFromRows || !packed_matmul_fits(T, K));
}

// Rows up to which a chunk whose rows are decode steps (AttentionArgs::rows_as_decode_steps: a
// speculative verify chunk) runs its attention over a bf16 cache on the decode kernels, split over
// the context, rather than on the prefill kernel, whose blocks (one per kv head and 16-query tile: 4
// for a 31B full layer) each walk the whole context: the verify of K + 1 = 5 rows took 1.27 times a
// decode step at 512 positions that way, 1.245 times on the decode kernels (docs/PERF.md). A backend
// reserves decode partials for this many rows.
inline constexpr int64_t kMaxChunkRowsOnDecodeKernels = 8;
// Whether a chunk of T rows whose queries start at q_first, over a cache of `capacity` key rows with
// `window` (0: none), runs on the decode kernels: its keys are stored before its rows read them, so
// they must fit beside a window of older keys.
inline bool chunk_on_decode_kernels(int64_t T, int64_t q_first, int64_t window, int64_t capacity) {
  return T >= 2 && T <= kMaxChunkRowsOnDecodeKernels && q_first == 0 && (window == 0 || T <= capacity - window);
}

}  // namespace g4
