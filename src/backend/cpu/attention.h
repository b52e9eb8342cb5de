// The CPU backend's attention, the reference (backend.h, AttentionArgs and KvCache): per (query row,
// head), a float softmax over double-accumulated scores, for caches of unquantized float32 rows and
// of quantized rows (Q8_0, TQ4). Quantized rows are read as stored — Q8_0 blocks scaled in place,
// TQ4 in the rotated space (quant/tq4.h: each query rotated once, the values' weighted sum rotated
// back once) — never through a decoded copy of the cache.
#pragma once
#include <cstdint>

#include "backend/backend.h"

namespace g4::cpu {

// The cache row of position p: the page its table names, then the row in the page.
int64_t cache_row(const KvCache& cache, int64_t p);

// Encodes one K or V row (kv_heads head vectors of head_dim floats) as a cache row of `dtype`
// (Q8_0 or TQ4). A Q8_0 block holding a NaN or infinity gets a NaN scale and a TQ4 head vector a
// NaN norm, so that attention over them gives NaN (and the draw kNanLogitsToken), as unquantized
// caches do, instead of silently dropping the value.
void encode_kv_row(DType dtype, const float* x, int kv_heads, int head_dim, uint8_t* row);

// The (query row, head) jobs [b, e) of `a`, each over positions [first, p] (below positions[0] when
// a.reads_cache_only): from the cache and the chunk's own K/V rows (unquantized), or all from a
// quantized cache that already holds the chunk.
void attention_jobs(const AttentionArgs& a, int64_t b, int64_t e);

}  // namespace g4::cpu
