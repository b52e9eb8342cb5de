// Hugging Face checkpoint -> one GGUF model file (`g4 export`), streamed tensor by tensor and, within
// a tensor, in chunks of rows: peak memory is a few MiB plus the mapped input, whatever the size
// of the checkpoint.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "model/hf_checkpoint.h"
#include "model/gguf_model.h"

namespace g4 {

struct ExportOptions {
  bool use_sampling = false;     // g4.use_sampling: the program returns a sampled token
  std::optional<DType> weights;  // dtype of the matrices; nullopt keeps each one's checkpoint dtype
  int64_t max_seq_len = 0;       // 0: min(max_position_embeddings, 4096)
  bool quantize_embedding = false;  // below-8-bit weights for the embedding too (else it stays Q8_0)
  bool q4_k_m = false;              // llama.cpp's Q4_K_M mix of Q4_K and Q6_K (weights is then Q4_K)
  KvTypes kv_types;                 // recorded as the caches runs take by default (g4.kv_type, g4.kv_sliding_type)
};

// One tensor as written.
struct ExportedTensor {
  std::string name;            // GGUF name
  std::vector<int64_t> shape;  // outermost first
  DType source = DType::F32, stored = DType::F32;
  uint64_t bytes = 0;
  std::string note;  // why `stored` is not the requested dtype ("" when it is)
};

struct ExportResult {
  ProgramFlags program;
  size_t tensor_count = 0;
  uint64_t file_bytes = 0;
  bool tokenizer_embedded = false;
  std::string ggml_tokenizer_skipped;  // why no tokenizer.ggml.* keys were written ("" when they were)
};

// "f32", "bf16", "f16", "q8_0", "q6_k", "q5_k", "q5_1", "q5_0", "q4_k", "q4_1" or "q4_0"; throws
// g4::Error listing the choices otherwise.
DType parse_weight_dtype(const std::string& name);

// The dtype a tensor is stored as: 1-D tensors (norms, scalars) stay F32, matrices take `requested`
// (nullopt: `source`), except that a block type needs in-features divisible by its block size
// (32, or 256 for K-quants) and falls back as llama.cpp's quantizer does (Q4_K to Q5_0, Q5_K to
// Q5_1, Q6_K to Q8_0, then F16), and that the `embedding` stays Q8_0 under a type of fewer than 8
// bits; *note then says why.
DType stored_dtype(const std::vector<int64_t>& shape, DType source, std::optional<DType> requested, std::string* note,
                   bool embedding = false);
// The type a checkpoint tensor (Hugging Face text name) is asked for: options.weights, or under
// options.q4_k_m llama.cpp's Q4_K_M choice for it (v_index: the tensor's place among the
// v_proj tensors, v_count of them, as llama.cpp counts attn_v). stored_dtype then applies the
// fallbacks and the embedding rule.
std::optional<DType> requested_dtype(const std::string& name, const ExportOptions& options, int layers, int v_index,
                                     int v_count);

// Writes `checkpoint` to `output` (via a unique temporary name beside it, renamed at the end;
// nothing is left at either path on failure). Embeds <checkpoint dir>/tokenizer.json when present,
// both as itself and as llama.cpp's tokenizer.ggml.* keys, and the chat template when there is one. Calls on_tensor
// after each tensor is written.
ExportResult export_gguf(const HfCheckpoint& checkpoint, const std::string& output, const ExportOptions& options,
                         const std::function<void(const ExportedTensor&)>& on_tensor = {});

}  // namespace g4
