// Launchers of attention over KV caches of quantized rows (backend.h: KvCache, kv_cache_cols; Q8_0
// and TQ4), the kernels of quantized_kv_attention.cu: the chunk's K/V rows are encoded into the
// cache first, then every key and value is read from it as stored, the chunk's own too
// (AttentionArgs). Every launcher enqueues on `stream` and returns at once.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_kernels.h"
#include "util/dtype.h"

namespace g4 {

// The sequences of one launch over quantized caches: sequence z's new K/V rows and positions are
// rows [z T, z T + T) of a's (T = a.T: a decode batch's sequences have one row each), its queries
// and outputs rows [z Q, z Q + Q) of a's q and out (Q = T - q_first), and its cache caches.k[z],
// caches.v[z] (rows of row_bytes bytes) with page table caches.table[z]. a.k_cache, a.v_cache and
// a.page_table are not read.
struct QuantizedKvLaunch {
  AttentionLaunch a;
  DType dtype = DType::TQ4;  // the rows' type: Q8_0 or TQ4
  int64_t row_bytes = 0;     // bytes of one cache row: kv_cache_cols of the type
  SequenceCaches<uint8_t> caches;
  // positions[T - 1] when the host knows it (AttentionArgs::last_position), else -1: a chunk that
  // ends before the cache's capacity overwrites no key, whatever the ring's size.
  int64_t last_position = -1;
};

// Uploads TQ4's levels, boundaries and signs (quant/tq4.h) to the current device's constant
// memory, which the kernels read; once per device, before any launch there.
void upload_tq4_tables();

// Encodes every sequence's T new K and V rows (bf16) into the cache rows of their positions, as
// cpu::encode_kv_row does: Q8_0 blocks bit for bit; TQ4 codes from the same double arithmetic
// (the norm's sum of squares in another order, so a code may differ at an exact tie).
void launch_store_quantized_kv(const QuantizedKvLaunch& q, cudaStream_t stream);

// Decode (T == 1) for 1 to kMaxDecodeSequences sequences: split-K over each sequence's visible
// keys (how they split depends on the position alone), then a merge of the splits in a fixed
// order. `partials` holds sequences * decode_partial_floats(q.a, max_splits) floats (max_splits
// <= 128); `splits_bound` as launch_decode_attention's (quantized_decode_splits of the last
// positions; 0 launches every split the cache could need).
void launch_quantized_decode_attention(const QuantizedKvLaunch& q, float* partials, int max_splits,
                                       cudaStream_t stream, int splits_bound = 0);
// Splits holding keys of a decode query at `position`.
int quantized_decode_splits(int64_t position, int window, int max_splits);

// Prefill (T > 1, one sequence): the chunk's queries over the keys each sees.
void launch_quantized_prefill_attention(const QuantizedKvLaunch& q, cudaStream_t stream);

}  // namespace g4
