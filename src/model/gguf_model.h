// Gemma 4 in a GGUF file, the way llama.cpp's `gemma4` architecture lays it out (docs/DESIGN.md §3), plus
// g4's own program keys under `g4.`.
//
// Metadata: ModelConfig <-> `gemma4.*` keys. Per-layer facts are arrays (`attention.head_count_kv`,
// `attention.sliding_window_pattern`, true = sliding); the two layer types each have one head
// size (`attention.key_length` full, `attention.key_length_swa` sliding) and one RoPE base.
// Proportional partial RoPE of the full layers is the `rope_freqs` tensor (f32[full head_dim / 2]):
// 1.0 for the rotating pairs, 1e30 for the rest (llama.cpp divides the angle by the factor).
// K=V layers are the layers without `attn_v`; tied embeddings mean no `output` tensor.
//
// Tensors: canonical Hugging Face names (tensor_source.h) <-> GGUF names, e.g.
// "layers.3.self_attn.q_proj.weight" <-> "blk.3.attn_q.weight". GGUF dims are innermost first, so a
// linear weight [out, in] is stored with dims [in, out] (ne[0] = in-features) and the same bytes.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "model/config.h"
#include "model/kv_types.h"
#include "format/tensor_source.h"

namespace g4 {

namespace gguf_key {
inline constexpr const char* kArchitecture = "general.architecture";
inline constexpr const char* kUseSampling = "g4.use_sampling";
inline constexpr const char* kMaxSeqLen = "g4.max_seq_len";
inline constexpr const char* kMaxPrefillChunk = "g4.max_prefill_chunk";
inline constexpr const char* kMinPrefillChunk = "g4.min_prefill_chunk";
inline constexpr const char* kKvType = "g4.kv_type";                 // optional, as --kv_type
inline constexpr const char* kKvSlidingType = "g4.kv_sliding_type";  // optional, as --kv_sliding_type
inline constexpr const char* kEosTokenIds = "g4.eos_token_ids";
inline constexpr const char* kTokenizerJson = "tokenizer.huggingface.json";
}  // namespace gguf_key

inline constexpr const char* kGemma4Architecture = "gemma4";
// llama.cpp's layout of Gemma 4's MTP assistant (model/assistant.h): gemma4's keys under this
// prefix, plus embedding_length_out (the target's hidden size) and nextn_predict_layers.
inline constexpr const char* kGemma4AssistantArchitecture = "gemma4-assistant";
inline constexpr const char* kRopeFreqsTensor = "rope_freqs.weight";

// How an exported program runs (docs/DESIGN.md §3), stored under g4.* keys.
struct ProgramFlags {
  bool use_sampling = false;      // forward returns the sampled int64 token instead of logits
  int64_t max_seq_len = 0;        // context size the program was exported for
  int64_t max_prefill_chunk = 0;  // min(max_seq_len - 1, 2 * sliding_window)
  int64_t min_prefill_chunk = 1;  // backend-defined; 1 on the CPU
  KvTypes kv_types;               // the KV caches a run takes unless its flags choose others
};

// The flags of docs/DESIGN.md §3 for a config: max_seq_len 0 means min(max_position_embeddings, 4096)
// (the context a session allocates by default). Throws unless 2 <= max_seq_len <= max positions.
ProgramFlags default_program_flags(const ModelConfig& c, bool use_sampling, int64_t max_seq_len = 0);

// ModelConfig + flags -> metadata (architecture, gemma4.*, tokenizer.ggml bos/eos, g4.*). Throws
// naming the feature when the config has something llama.cpp's gemma4 layout cannot express (e.g.
// two full layers with different head sizes).
GgufMetadata gemma4_metadata(const ModelConfig& c, const ProgramFlags& flags);
// The rope_freqs tensor's values (empty when the model has no full-attention layer).
std::vector<float> rope_freq_factors(const ModelConfig& c);

// Reads the config from a gemma4 (or, for an assistant, gemma4-assistant) GGUF file's metadata and
// tensor table (rope_freqs, attn_v, output, token_embd). Throws naming the key for missing or
// unsupported metadata.
ModelConfig gemma4_config(const GgufFile& file, ModelRole role = ModelRole::kTarget);
// The g4.* flags; files without them (e.g. from llama.cpp) get default_program_flags(config, false).
ProgramFlags program_flags(const GgufMetadata& metadata, const ModelConfig& c);

// Canonical <-> GGUF tensor names. gguf_tensor_name throws for a name outside the model;
// canonical_tensor_name returns "" for GGUF tensors g4 does not expose (rope_freqs, others).
std::string gguf_tensor_name(const std::string& canonical);
std::string canonical_tensor_name(const std::string& gguf_name);

// A GGUF model file seen as a TensorSource under canonical names, with its config, program flags
// and embedded tokenizer.
class GgufModel : public TensorSource {
 public:
  // Throws g4::Error naming the file and the problem. An assistant's file (ModelRole::kAssistant)
  // has no tokenizer of its own.
  explicit GgufModel(const std::string& path, ModelRole role = ModelRole::kTarget);
  explicit GgufModel(GgufFile file, ModelRole role = ModelRole::kTarget);  // a file already opened

  const GgufFile& file() const { return file_; }
  const ModelConfig& config() const { return config_; }
  const ProgramFlags& program() const { return program_; }
  // The checkpoint's tokenizer.json text (tokenizer.huggingface.json), else the equivalent of the
  // file's tokenizer.ggml.* keys (gguf_tokenizer.h); nullopt when the file has neither.
  const std::optional<std::string>& tokenizer_json() const { return tokenizer_json_; }

  const HostTensor* find(const std::string& name) const override;
  std::vector<std::string> names() const override;

 private:
  GgufFile file_;
  ModelConfig config_;
  ProgramFlags program_;
  std::optional<std::string> tokenizer_json_;
  std::map<std::string, HostTensor> tensors_;  // canonical name -> tensor
};

}  // namespace g4
