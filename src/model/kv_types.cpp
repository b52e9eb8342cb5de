#include "model/kv_types.h"

#include "backend/backend.h"
#include "util/error.h"

namespace g4 {

std::string kv_type_name(KvType t) {
  switch (t) {
    case KvType::kBf16: return "bf16";
    case KvType::kQ8_0: return "q8_0";
    case KvType::kTq4: return "tq4";
  }
  return "?";
}

KvType parse_kv_type(std::string_view name, bool sliding) {
  if (name == "bf16") return KvType::kBf16;
  if (name == "q8_0") return KvType::kQ8_0;
  if (name == "tq4" && !sliding) return KvType::kTq4;
  if (sliding)
    throw Error(ErrorKind::kInvalidArgument,
                "--kv_sliding_type must be bf16 or q8_0, not '" + std::string(name) +
                    "' (tq4 is for the full-attention layers' caches, --kv_type)");
  throw Error(ErrorKind::kInvalidArgument, "--kv_type must be bf16, q8_0 or tq4, not '" + std::string(name) + "'");
}

DType kv_row_dtype(KvType t, DType activation) {
  return t == KvType::kQ8_0 ? DType::Q8_0 : t == KvType::kTq4 ? DType::TQ4 : activation;
}

std::vector<DType> layer_kv_dtypes(const ModelConfig& config, KvTypes types, DType activation) {
  std::vector<DType> out;
  for (const LayerConfig& l : config.layers) {
    out.push_back(kv_row_dtype(l.sliding ? types.sliding : types.full, activation));
    // The row layout checks the head dim against the type (Q8_0 blocks, TQ4's power of two).
    kv_cache_cols(out.back(), l.kv_heads, l.head_dim);
  }
  return out;
}

KvBytesPerToken kv_bytes_per_token(const ModelConfig& config, std::span<const DType> layer_dtypes) {
  G4_ASSERT(layer_dtypes.size() == config.layers.size(), "one KV type per layer");
  KvBytesPerToken bytes;
  for (size_t i = 0; i < config.layers.size(); ++i) {
    const LayerConfig& l = config.layers[i];
    const size_t row = row_bytes(layer_dtypes[i], kv_cache_cols(layer_dtypes[i], l.kv_heads, l.head_dim));
    (l.sliding ? bytes.sliding : bytes.full) += 2 * row;
  }
  return bytes;
}

}  // namespace g4
