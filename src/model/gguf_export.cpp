#include "model/gguf_export.h"

#include "model/generation_config.h"
#include "model/gguf_tokenizer.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <sys/mman.h>
#include <unistd.h>

#include "quant/quantize.h"
#include "model/weights.h"
#include "util/error.h"
#include "util/files.h"

namespace g4 {

namespace {

// Output bytes converted per append: small enough to keep the exporter's memory flat.
constexpr size_t kChunkBytes = size_t(8) << 20;

struct PlannedTensor {
  HostTensor source;  // canonical name; data from the checkpoint (or rope_freqs' own buffer)
  bool mapped = true;  // `source` lies in the checkpoint's file mapping
  GgufTensorPlan plan;
  std::string note;
};

HostTensor host_f32(const std::string& name, std::shared_ptr<std::vector<float>> values) {
  HostTensor t;
  t.name = name;
  t.dtype = DType::F32;
  t.shape = {int64_t(values->size())};
  t.data = values->data();
  t.bytes = values->size() * sizeof(float);
  t.owner = std::move(values);
  return t;
}

std::vector<PlannedTensor> plan_tensors(const HfCheckpoint& checkpoint, const ExportOptions& options) {
  const ModelConfig& c = checkpoint.config();
  validate_tensors(c, checkpoint);
  std::vector<PlannedTensor> planned;
  const int v_count = int(std::count_if(c.layers.begin(), c.layers.end(), [](const LayerConfig& l) { return !l.k_eq_v; }));
  int v_index = 0;
  for (const TensorSpec& spec : expected_tensors(c)) {
    PlannedTensor p;
    p.source = *checkpoint.find(spec.name);
    const std::optional<DType> requested = requested_dtype(spec.name, options, c.num_layers(), v_index, v_count);
    if (spec.name.ends_with("self_attn.v_proj.weight")) ++v_index;
    p.plan = {gguf_tensor_name(spec.name), spec.shape,
              stored_dtype(spec.shape, p.source.dtype, requested, &p.note,
                           spec.name == "embed_tokens.weight" && !options.quantize_embedding)};
    planned.push_back(std::move(p));
  }
  auto factors = std::make_shared<std::vector<float>>(rope_freq_factors(c));
  if (!factors->empty()) {
    PlannedTensor p;
    p.source = host_f32(kRopeFreqsTensor, factors);
    p.mapped = false;
    p.plan = {kRopeFreqsTensor, p.source.shape, DType::F32};
    planned.push_back(std::move(p));
  }
  return planned;
}

// Drops the mapped checkpoint pages of [begin, begin + bytes) from this process once they are
// converted, so that resident memory stays near one chunk instead of growing to the checkpoint's
// size (the pages are file-backed and read-only: nothing is lost).
void release_pages(const void* begin, size_t bytes) {
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t first = (reinterpret_cast<uintptr_t>(begin) + page - 1) / page * page;
  const uintptr_t last = (reinterpret_cast<uintptr_t>(begin) + bytes) / page * page;
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

// Converts (or, for an unchanged dtype, copies) chunks of rows; `mapped` sources (the checkpoint)
// give their pages back after each chunk.
void stream_tensor(GgufWriter& writer, const HostTensor& src, DType to, bool mapped) {
  const int64_t cols = src.shape.back(), rows = src.numel() / cols;
  const size_t in_row = row_bytes(src.dtype, cols), out_row = row_bytes(to, cols);
  const int64_t chunk_rows = std::max<int64_t>(1, int64_t(kChunkBytes / std::max(out_row, size_t(cols) * 4)));
  std::vector<float> wide(static_cast<size_t>(cols));
  std::vector<uint8_t> out(src.dtype == to ? 0 : size_t(std::min(chunk_rows, rows)) * out_row);
  const uint8_t* in = static_cast<const uint8_t*>(src.data);
  for (int64_t first = 0; first < rows; first += chunk_rows) {
    const int64_t n = std::min(chunk_rows, rows - first);
    const uint8_t* chunk = in + size_t(first) * in_row;
    if (src.dtype == to) {
      writer.append(chunk, size_t(n) * in_row);
    } else {
      for (int64_t r = 0; r < n; ++r) {
        decode_row(src.dtype, chunk + size_t(r) * in_row, cols, wide.data());
        encode_row(to, wide.data(), cols, out.data() + size_t(r) * out_row);
      }
      writer.append(out.data(), size_t(n) * out_row);
    }
    if (mapped) release_pages(chunk, size_t(n) * in_row);
  }
}

std::optional<std::string> read_tokenizer_json(const std::string& dir) {
  return read_file_if_exists((std::filesystem::path(dir) / "tokenizer.json").string());
}

}  // namespace

namespace {

constexpr DType kWeightDtypes[] = {DType::F32,  DType::BF16, DType::F16,  DType::Q8_0, DType::Q6_K, DType::Q5_K,
                                   DType::Q5_1, DType::Q5_0, DType::Q4_K, DType::Q4_1, DType::Q4_0};

std::string lower(std::string s) {
  for (char& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// Fewer than 8 bits a weight: the embedding (also the tied LM head) stays Q8_0, as the reference
// design's quantizer keeps it, unless the caller asks for it explicitly.
bool below_8_bits(DType t) { return is_block_quantized(t) && t != DType::Q8_0; }

}  // namespace

DType parse_weight_dtype(const std::string& name) {
  std::string known;
  for (DType t : kWeightDtypes) {
    if (lower(dtype_name(t)) == name) return t;
    known += (known.empty() ? "" : ", ") + lower(dtype_name(t));
  }
  throw Error("--weights must be one of " + known + " or q4_k_m (got '" + name + "')");
}

DType stored_dtype(const std::vector<int64_t>& shape, DType source, std::optional<DType> requested,
                   std::string* note, bool embedding) {
  note->clear();
  if (shape.size() != 2) return DType::F32;
  DType want = requested.value_or(source);
  if (embedding && below_8_bits(want)) {
    *note = "the token embedding stays Q8_0 (8 bits)";
    want = DType::Q8_0;
  }
  if (is_block_quantized(want) && shape[1] % block_size(want) != 0) {
    // llama.cpp's quantizer's fallbacks: a K-quant to the 32-block type of about the same size,
    // then F16 when 32 does not divide the rows either.
    DType fallback = want == DType::Q4_K ? DType::Q5_0 : want == DType::Q5_K ? DType::Q5_1
                     : want == DType::Q6_K ? DType::Q8_0 : DType::F16;
    if (shape[1] % block_size(fallback) != 0) fallback = DType::F16;
    *note = "in-features " + std::to_string(shape[1]) + " is not a multiple of " + std::to_string(block_size(want)) +
            ": " + dtype_name(fallback) + " instead of " + dtype_name(want);
    return fallback;
  }
  return want;
}

std::optional<DType> requested_dtype(const std::string& name, const ExportOptions& options, int layers,
                                     int v_index, int v_count) {
  if (!options.q4_k_m) return options.weights;
  // llama.cpp's Q4_K_M: Q4_K, with Q6_K for the output matrix and for attn_v and ffn_down in the
  // first and last eighth of the layers and every third one between (its use_more_bits).
  auto more_bits = [](int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; };
  if (name == "lm_head.weight" || name == "embed_tokens.weight") return DType::Q6_K;
  if (name.ends_with("self_attn.v_proj.weight")) return more_bits(v_index, v_count) ? DType::Q6_K : DType::Q4_K;
  if (name.ends_with("mlp.down_proj.weight")) {
    const int layer = std::stoi(name.substr(name.find('.') + 1));
    return more_bits(layer, layers) ? DType::Q6_K : DType::Q4_K;
  }
  return DType::Q4_K;
}

ExportResult export_gguf(const HfCheckpoint& checkpoint, const std::string& output, const ExportOptions& options,
                         const std::function<void(const ExportedTensor&)>& on_tensor) {
  ExportResult result;
  result.program = default_program_flags(checkpoint.config(), options.use_sampling, options.max_seq_len);
  layer_kv_dtypes(checkpoint.config(), options.kv_types, DType::BF16);  // throws for a type a head dim cannot take
  result.program.kv_types = options.kv_types;
  std::vector<PlannedTensor> planned = plan_tensors(checkpoint, options);
  GgufMetadata metadata = gemma4_metadata(checkpoint.config(), result.program);
  write_generation_defaults(read_generation_config(checkpoint.dir()), metadata);
  if (const std::optional<int64_t> drafts = read_num_assistant_tokens(checkpoint.dir()))
    write_num_assistant_tokens(*drafts, metadata);
  if (auto tokenizer = read_tokenizer_json(checkpoint.dir())) {
    // g4 reads tokenizer.huggingface.json; llama.cpp reads the tokenizer.ggml.* keys.
    // A tokenizer llama.cpp's gemma4 one cannot express still travels for g4; the reason is kept.
    try {
      GgufMetadata ggml;
      write_ggml_tokenizer(*tokenizer, checkpoint.config().vocab_size, ggml);
      for (const auto& [key, value] : ggml.entries()) metadata.set(key, value);
    } catch (const Error& e) {
      result.ggml_tokenizer_skipped = e.what();
    }
    metadata.set(gguf_key::kTokenizerJson, std::move(*tokenizer));
    result.tokenizer_embedded = true;
  }
  if (auto chat_template = read_chat_template(checkpoint.dir()))
    metadata.set(gguf_key::kChatTemplate, std::move(*chat_template));
  std::vector<GgufTensorPlan> plans;
  for (const PlannedTensor& p : planned) plans.push_back(p.plan);
  GgufWriter writer(output, metadata, std::move(plans));
  for (const PlannedTensor& p : planned) {
    try {
      stream_tensor(writer, p.source, p.plan.dtype, p.mapped);
    } catch (const Error& e) {
      throw Error("tensor '" + p.source.name + "' as " + dtype_name(p.plan.dtype) + ": " + e.what());
    }
    if (on_tensor)
      on_tensor({p.plan.name, p.plan.shape, p.source.dtype, p.plan.dtype,
                 uint64_t(p.source.numel() / p.plan.shape.back()) * row_bytes(p.plan.dtype, p.plan.shape.back()),
                 p.note});
  }
  result.tensor_count = planned.size();
  result.file_bytes = writer.finish();
  return result;
}

}  // namespace g4
