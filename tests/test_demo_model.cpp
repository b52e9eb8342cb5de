// The fortune demo (the earlier embedded model, kept as a fixture: support/demo_engine.h) against
// transformers: greedy continuations and tokenizer ids made by the training script of the time from
// the same weights (tests/fixtures/demo/golden.json), float64 logits from its checkpoint.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "model/loader.h"
#include "runtime/engine.h"
#include "runtime/generator.h"
#include "runtime/session.h"
#include "support/demo_engine.h"
#include "support/fixtures.h"
#include "tokenizer/tokenizer.h"

namespace g4 {
namespace {

nlohmann::json golden() {
  return nlohmann::json::parse(std::ifstream(std::string(G4_FIXTURES_DIR) + "/demo/golden.json"));
}

std::unique_ptr<Engine> demo_engine() {
  EngineOptions o;
  o.model_path = test::fortune_demo_path();
  return std::make_unique<Engine>(o);
}

// The float32 oracle on a trained model: transformers' float64 logits of the demo's Hugging Face
// checkpoint (tests/fixtures/demo/transformers, tools/fixtures/demo_reference_logits.py) at every position.
TEST(DemoModel, LogitsMatchTransformersFloat64AtEveryPosition) {
  const test::Reference ref = test::load_demo_reference();
  CpuBackend cpu(2);
  auto model = load_model(test::fortune_demo_path(), cpu);
  SessionOptions o;
  o.max_seq_len = ref.positions + 1;
  Session s(*model, cpu, o);
  EXPECT_LE(test::max_abs_diff(test::stored_rows(s.logits_all(ref.tokens), ref), ref.logits), 1e-3);
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
