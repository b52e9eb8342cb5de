#include "support/demo_engine.h"

#include <algorithm>
#include <vector>

#include "format/gguf.h"
#include "model/gguf_export.h"
#include "model/gguf_model.h"
#include "model/hf_checkpoint.h"
#include "support/fixtures.h"

namespace g4::test {

std::string embedded_demo_path() { return std::string(G4_SOURCE_DIR) + "/models/demo.gguf"; }

const std::string& fortune_demo_path() {
  static const std::string path = [] {
    const std::string p = temp_dir("fortune_demo") + "/demo.gguf";
    ExportOptions options;
    options.use_sampling = true;
    options.weights = DType::BF16;
    export_gguf(HfCheckpoint(std::string(G4_FIXTURES_DIR) + "/demo/hf"), p, options);
    return p;
  }();
  return path;
}

namespace {

// The bytes of one NaN value of a float type.
std::vector<uint8_t> nan_bytes(DType dtype) {
  switch (dtype) {
    case DType::F32: return {0x00, 0x00, 0xC0, 0x7F};
    case DType::BF16: return {0xC0, 0x7F};
    case DType::F16: return {0x00, 0x7E};
    default: throw Error("nan_embedding_demo_path: the embedding is " + dtype_name(dtype) + ", not a float type");
  }
}

// `embedding`'s bytes with row `token` NaN.
std::vector<uint8_t> with_nan_row(const HostTensor& embedding, int32_t token) {
  const std::vector<uint8_t> nan = nan_bytes(embedding.dtype);
  const size_t row_bytes = embedding.bytes / size_t(embedding.shape[0]);
  std::vector<uint8_t> bytes(static_cast<const uint8_t*>(embedding.data),
                             static_cast<const uint8_t*>(embedding.data) + embedding.bytes);
  for (size_t at = size_t(token) * row_bytes; at < size_t(token + 1) * row_bytes; at += nan.size())
    std::copy(nan.begin(), nan.end(), bytes.begin() + std::ptrdiff_t(at));
  return bytes;
}

}  // namespace

std::string nan_embedding_demo_path(int32_t token) {
  const GgufFile demo(fortune_demo_path());
  const std::string embedding_name = gguf_tensor_name("embed_tokens.weight");
  const std::string lm_head_name = gguf_tensor_name("lm_head.weight");
  G4_CHECK(!demo.find_tensor(lm_head_name), "nan_embedding_demo_path: the demo no longer ties its LM head");
  const GgufTensorInfo& embedding_info = *demo.find_tensor(embedding_name);
  std::vector<GgufTensorPlan> plans;
  for (const GgufTensorInfo& t : demo.tensors()) plans.push_back({t.name, t.shape(), t.dtype});
  plans.push_back({lm_head_name, embedding_info.shape(), embedding_info.dtype});
  const std::string path = temp_dir("nan_embedding_demo") + "/demo.gguf";
  GgufWriter writer(path, demo.metadata(), plans);
  for (const GgufTensorInfo& t : demo.tensors()) {
    const HostTensor h = demo.tensor(t);
    if (t.name == embedding_name) {
      const std::vector<uint8_t> poisoned = with_nan_row(h, token);
      writer.append(poisoned.data(), poisoned.size());
    } else {
      writer.append(h.data, h.bytes);
    }
  }
  const HostTensor clean = demo.tensor(embedding_info);
  writer.append(clean.data, clean.bytes);
  writer.finish();
  return path;
}

std::unique_ptr<Engine> demo_engine_for(int64_t sequences, int64_t max_seq_len, const std::string& backend,
                                        const std::string& model_path, int64_t max_batch_sequences) {
  EngineOptions o;
  o.model_path = model_path;
  o.backend = backend;
  o.max_seq_len = max_seq_len;
  if (max_batch_sequences > 0) o.max_batch_sequences = max_batch_sequences;
  // One sequence's bytes depend on the model and the backend's activation type: ask an engine.
  const size_t one = Engine(o).kv_pool().sequence_bytes(max_seq_len);
  o.kv_budget_bytes = size_t(sequences) * one;
  return std::make_unique<Engine>(o);
}

std::vector<int32_t> demo_prompt(int32_t first, int n) {
  std::vector<int32_t> ids = {2};
  for (int i = 1; i < n; ++i) ids.push_back(int32_t((first + 37 * i) % 4000 + 10));
  return ids;
}

}  // namespace g4::test
