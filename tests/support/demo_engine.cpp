#include "support/demo_engine.h"

#include "model/gguf_export.h"
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

std::unique_ptr<Engine> demo_engine_for(int64_t sequences, int64_t max_seq_len, const std::string& backend) {
  EngineOptions o;
  o.model_path = fortune_demo_path();
  o.backend = backend;
  o.max_seq_len = max_seq_len;
  // One sequence's bytes depend on the model and the backend's activation type: ask an engine.
  const size_t one = Engine(o).kv_pool().sequence_bytes(max_seq_len);
  o.kv_budget_bytes = size_t(sequences) * one;
  return std::make_unique<Engine>(o);
}

}  // namespace g4::test
