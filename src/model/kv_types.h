// The KV cache types a run chooses (docs/DESIGN.md, "Quantized KV"): one for the full-attention
// layers (--kv_type bf16|q8_0|tq4) and one for the sliding layers (--kv_sliding_type bf16|q8_0).
// "bf16" is the unquantized cache in the backend's activation dtype (bf16 on CUDA; float32 on the
// CPU, the reference); q8_0 is GGUF's Q8_0 block per 32 values; tq4 is TurboQuant 4-bit
// (quant/tq4.h), for full layers only: a sliding layer keeps one window, small at any context.
#pragma once
#include <cstddef>
#include <optional>
#include <string>
#include <span>
#include <string_view>
#include <vector>

#include "model/config.h"
#include "util/dtype.h"

namespace g4 {

enum class KvType { kBf16, kQ8_0, kTq4 };

struct KvTypes {
  KvType full = KvType::kBf16, sliding = KvType::kBf16;
  bool operator==(const KvTypes&) const = default;
};

// A run's choice: a type per layer kind, or none to take the model file's default
// (ProgramFlags::kv_types: what `g4 export --kv_type` recorded; bf16 in files without it).
struct KvTypeChoice {
  std::optional<KvType> full, sliding;
  KvTypes over(KvTypes defaults) const { return {full.value_or(defaults.full), sliding.value_or(defaults.sliding)}; }
};

std::string kv_type_name(KvType t);  // "bf16", "q8_0", "tq4"
// Parses a --kv_type (full layers) or --kv_sliding_type value; throws Error(kInvalidArgument)
// naming the flag and the accepted values.
KvType parse_kv_type(std::string_view name, bool sliding);

// The row type of a cache of type t (KvCache::k.dtype) on a backend whose activations are `activation`.
DType kv_row_dtype(KvType t, DType activation);
// The row type of each layer's cache, in layer order.
std::vector<DType> layer_kv_dtypes(const ModelConfig& config, KvTypes types, DType activation);

// Bytes one position takes in every layer of a kind, K and V together (what a token costs where it
// is kept: full layers for the whole context, sliding layers for their window).
struct KvBytesPerToken {
  size_t full = 0, sliding = 0;
};
KvBytesPerToken kv_bytes_per_token(const ModelConfig& config, std::span<const DType> layer_dtypes);

}  // namespace g4
