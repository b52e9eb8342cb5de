#include "support/demo_engine.h"

namespace g4::test {

std::unique_ptr<Engine> demo_engine_for(int64_t sequences, int64_t max_seq_len, const std::string& backend) {
  EngineOptions o;
  o.model_path = std::string(G4_SOURCE_DIR) + "/models/demo.gguf";
  o.backend = backend;
  o.max_seq_len = max_seq_len;
  // One sequence's bytes depend on the model and the backend's activation type: ask an engine.
  const size_t one = Engine(o).kv_pool().sequence_bytes(max_seq_len);
  o.kv_budget_bytes = size_t(sequences) * one;
  return std::make_unique<Engine>(o);
}

}  // namespace g4::test
