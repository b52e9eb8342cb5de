// The committed demo model (models/demo.gguf) against transformers: greedy continuations and
// tokenizer ids made by tools/train_demo.py from the same weights (tests/fixtures/demo/golden.json).
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "model/hf_checkpoint.h"
#include "model/gguf_export.h"
#include "model/loader.h"
#include "runtime/engine.h"
#include "runtime/generator.h"
#include "runtime/session.h"
#include "support/fixtures.h"
#include "tokenizer/tokenizer.h"
#include "util/files.h"

namespace g4 {
namespace {

const std::string kDemo = std::string(G4_SOURCE_DIR) + "/models/demo.gguf";

nlohmann::json golden() {
  return nlohmann::json::parse(std::ifstream(std::string(G4_FIXTURES_DIR) + "/demo/golden.json"));
}

std::unique_ptr<Engine> demo_engine() {
  EngineOptions o;
  o.model_path = kDemo;
  return std::make_unique<Engine>(o);
}

// The float32 oracle on a trained model: transformers' float64 logits of the demo's Hugging Face
// checkpoint (tests/fixtures/demo/transformers, tools/demo_reference_logits.py) at every position.
TEST(DemoModel, LogitsMatchTransformersFloat64AtEveryPosition) {
  const test::Reference ref = test::load_demo_reference();
  CpuBackend cpu(2);
  auto model = load_model(kDemo, cpu);
  SessionOptions o;
  o.max_seq_len = ref.positions + 1;
  Session s(*model, cpu, o);
  EXPECT_LE(test::max_abs_diff(test::stored_rows(s.logits_all(ref.tokens), ref), ref.logits), 1e-3);
}

// models/demo.gguf is exactly g4's export of the checkpoint the training script wrote
// (tests/fixtures/demo/hf, the oracle's source), so the oracle above tests the exporter too.
TEST(DemoModel, IsTheExportOfItsCheckpoint) {
  const std::string path = test::temp_dir("demo_export") + "/demo.gguf";
  ExportOptions options;
  options.use_sampling = true;
  options.weights = DType::BF16;
  export_gguf(HfCheckpoint(std::string(G4_FIXTURES_DIR) + "/demo/hf"), path, options);
  EXPECT_TRUE(read_file(path) == read_file(kDemo)) << "re-export tests/fixtures/demo/hf: tools/gpu_install_demo.sh";
}

TEST(DemoModel, IsASamplingProgramWithItsTokenizer) {
  auto engine = demo_engine();
  EXPECT_TRUE(engine->use_sampling());
  ASSERT_TRUE(engine->tokenizer_json().has_value());
  const Tokenizer tok = Tokenizer::from_json(*engine->tokenizer_json());
  // Held in a local: a range-for over golden()["..."] would iterate a member of a temporary that is
  // destroyed before the loop body runs.
  const nlohmann::json g = golden();
  for (const auto& probe : g["tokenizer_probe"])
    EXPECT_EQ(tok.encode(probe["text"].get<std::string>(), true), probe["ids"].get<std::vector<int32_t>>())
        << probe["text"];
}

TEST(DemoModel, GreedyMatchesTransformers) {
  auto engine = demo_engine();
  const nlohmann::json g = golden();
  for (const auto& c : g["continuations"]) {
    GenerationRequest r;
    r.prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    r.sampler = Sampler(SamplingParams{.temperature = 0.0f});
    r.max_new_tokens = int64_t(c["greedy_ids"].size());
    r.stop_ids = {};
    EXPECT_EQ(generate(*engine->create_session(), r).tokens, c["greedy_ids"].get<std::vector<int32_t>>()) << c["name"];
  }
}

TEST(DemoModel, RunPrintsTextAndTheSameSeedRepeats) {
  const std::string cmd = std::string(G4_BINARY) + " run --prompt 'Tell me a fortune about computers.' --seed 7 --max_new_tokens 24";
  std::string a, b;
  ASSERT_EQ(test::run_command(cmd, &a), 0) << a;
  ASSERT_EQ(test::run_command(cmd, &b), 0) << b;
  const std::string text = a.substr(0, a.find("--- report ---"));
  EXPECT_EQ(text, b.substr(0, b.find("--- report ---")));
  EXPECT_GT(text.size(), 20u) << "some text: " << a;
}

}  // namespace
}  // namespace g4
