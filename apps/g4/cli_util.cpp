#include "cli_util.h"

#include <charconv>
#include <cstdio>
#include <iostream>
#include <iterator>

#include "util/error.h"
#include "util/files.h"

// Bounds of models/demo.gguf and models/demo-assistant.gguf, placed in the executable by the
// assembler file CMake generates.
extern "C" const uint8_t g4_demo_gguf_begin[];
extern "C" const uint8_t g4_demo_gguf_end[];
extern "C" const uint8_t g4_demo_assistant_gguf_begin[];
extern "C" const uint8_t g4_demo_assistant_gguf_end[];

namespace g4::cli {

ModelImage demo_model() {
  return {{g4_demo_gguf_begin, size_t(g4_demo_gguf_end - g4_demo_gguf_begin)}, "the embedded demo model"};
}

KvTypeChoice KvTypeFlags::choice() const {
  KvTypeChoice c;
  if (!full.empty()) c.full = parse_kv_type(full, false);
  if (!sliding.empty()) c.sliding = parse_kv_type(sliding, true);
  return c;
}

void add_kv_type_flags(CLI::App& cmd, KvTypeFlags& f) {
  cmd.add_option("--kv_type,--kv-type", f.full,
                 "KV cache of the full-attention layers: bf16, q8_0 or tq4 (TurboQuant 4-bit, ~3.9x smaller) "
                 "(default: the model file's g4.kv_type, else bf16)");
  cmd.add_option("--kv_sliding_type,--kv-sliding-type", f.sliding,
                 "KV cache of the sliding-window layers: bf16 or q8_0 (default: the model file's g4.kv_sliding_type, "
                 "else bf16)");
}

void add_bf16_weight_copies_flag(CLI::App& cmd, bool& on) {
  cmd.add_flag("--bf16_weight_copies,--bf16-weight-copies", on,
               "Keep a bf16 copy of every quantized weight on the GPU (2 bytes a weight, taken from the KV caches' "
               "memory): decode batches of 33 or more sequences without batch invariance, and prefill, multiply "
               "the copies instead of dequantizing every weight each forward (CUDA)");
}

std::string describe_kv_caches(const KvPool& pool) {
  const KvBytesPerToken bytes = pool.bytes_per_token();
  std::string out = "KV caches: full layers " + kv_type_name(pool.types().full) + ", " + std::to_string(bytes.full) +
                    " bytes a token";
  if (bytes.sliding > 0)
    out += "; sliding layers " + kv_type_name(pool.types().sliding) + ", " + std::to_string(bytes.sliding) +
           " bytes a token (of the window)";
  return out + "; pages of " + std::to_string(pool.page_bytes()) + " bytes";
}

std::string describe_drafting(const SpeculationStats& s, int64_t draft_tokens) {
  char text[256];
  std::snprintf(text, sizeof text,
                "drafting: %lld tokens a round; %lld rounds, %lld of %lld drafts accepted (%.1f %%), %.2f tokens a "
                "round; draft %.3f s, verify %.3f s",
                static_cast<long long>(draft_tokens), static_cast<long long>(s.rounds),
                static_cast<long long>(s.accepted), static_cast<long long>(s.drafted), 100.0 * s.acceptance(),
                s.tokens_per_round(), s.draft_seconds, s.verify_seconds);
  return text;
}

void use_model_or_demo(EngineOptions& options, const std::string& model_path) {
  options.model_path = model_path;
  if (model_path.empty()) options.model_image = demo_model();
}

ModelImage demo_assistant() {
  return {{g4_demo_assistant_gguf_begin, size_t(g4_demo_assistant_gguf_end - g4_demo_assistant_gguf_begin)},
          "the embedded demo assistant"};
}

void use_draft_model(EngineOptions& options, const std::string& draft_model) {
  options.draft_model = draft_model;
  if (draft_model == kDemoDraftModel) options.draft_image = demo_assistant();
}

WeightTypes weight_types(const GgufFile& file) {
  WeightTypes w;
  uint64_t weights = 0, bytes = 0;
  for (const GgufTensorInfo& t : file.tensors()) {
    uint64_t n = 1;
    for (uint64_t d : t.dims) n *= d;
    TypeUse& use = w.by_type[dtype_name(t.dtype)];
    ++use.tensors;
    use.weights += n;
    use.bytes += t.bytes;
    weights += n;
    bytes += t.bytes;
  }
  w.bits_per_weight = weights ? 8.0 * double(bytes) / double(weights) : 0.0;
  return w;
}

std::string WeightTypes::summary() const {
  std::string s;
  for (const auto& [type, use] : by_type) s += (s.empty() ? "" : ", ") + type + " x" + std::to_string(use.tensors);
  char bits[48];
  std::snprintf(bits, sizeof bits, " (%.2f bits per weight)", bits_per_weight);
  return s + bits;
}

Tokenizer open_tokenizer_of(const std::string& tokenizer_path, const std::string& model_path) {
  if (!tokenizer_path.empty()) return Tokenizer::from_file(tokenizer_path);
  const std::optional<std::string> json =
      model_path.empty() ? model_tokenizer_json(demo_model()) : model_tokenizer_json(model_path);
  G4_CHECK(json, "the model '" + model_path + "' has no tokenizer; pass --tokenizer_path");
  return Tokenizer::from_json(*json);
}

std::vector<int32_t> parse_id_list(const std::string& text) {
  std::vector<int32_t> ids;
  size_t at = 0;
  while (at <= text.size()) {
    size_t comma = text.find(',', at);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(at, comma - at);
    int64_t value = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    G4_CHECK(!item.empty() && ec == std::errc() && end == item.data() + item.size() && value >= INT32_MIN &&
                 value <= INT32_MAX,
             "bad token id '" + item + "' in '" + text + "'");
    ids.push_back(int32_t(value));
    at = comma + 1;
  }
  return ids;
}

std::string read_input(const std::string& path) {
  if (path != "-") return read_file(path);
  std::string text{std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
  G4_CHECK(!std::cin.bad(), "cannot read standard input");
  return text;
}

}  // namespace g4::cli
