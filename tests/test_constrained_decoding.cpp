// Constrained decoding in the scheduler (docs/DESIGN.md §4 "Constrained decoding", §7): requests
// with a grammar draw, on the backend, only tokens their grammar allows. Seeded and greedy
// generations of the embedded demo under several JSON Schemas, batched: every token the backend drew
// must be one xgrammar allows at that step (its masks replayed token by token, and g4's masks equal
// to xgrammar's at every step; on CUDA, g4's own masks), every output that ended must be valid
// against its schema (valijson), and unconstrained requests beside them draw exactly what they draw
// alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend_factory.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "model/loader.h"
#include "runtime/engine.h"
#include "runtime/scheduler.h"
#include "support/build_kind.h"
#include "support/demo_engine.h"
#include "support/fixtures.h"
#include "support/grammar_oracle.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace g4 {
namespace {

using grammar::CompiledGrammar;
using grammar::GrammarMatcher;
using grammar::TokenVocabulary;

constexpr int64_t kMaxSeqLen = 256;
constexpr int64_t kBatch = 32;

const char* const kSchemas[] = {
    R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},"age":{"type":"integer"},
        "ok":{"type":"boolean"},"tags":{"type":"array","items":{"enum":["red","green","blue"]},"maxItems":3}},
        "required":["name","age"],"additionalProperties":false})",
    R"({"type":"array","items":{"anyOf":[{"type":"number"},{"type":"null"},{"const":"x"}]},"minItems":1,"maxItems":5})",
    R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
        "next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["v","next"],"additionalProperties":false}},
        "$ref":"#/$defs/node"})",
    R"({"type":"object","properties":{"city":{"type":"string"},"unit":{"enum":["celsius","fahrenheit"]}},
        "required":["city","unit"],"additionalProperties":false})",
    R"({"type":"object"})",
};

struct Demo {
  explicit Demo(const std::string& backend = "cpu")
      : engine(test::demo_engine_for(kBatch, kMaxSeqLen, backend, test::embedded_demo_path())) {}
  std::unique_ptr<Engine> engine;
  Tokenizer tokenizer = Tokenizer::from_json(*model_tokenizer_json(test::embedded_demo_path()));
  std::vector<int32_t> stops = {kGemma4StopTokenIds.begin(), kGemma4StopTokenIds.end()};
  std::shared_ptr<const TokenVocabulary> vocabulary =
      std::make_shared<TokenVocabulary>(tokenizer, stops, engine->config().vocab_size);
};

SchedulerRequest constrained(const Demo& demo, std::shared_ptr<const CompiledGrammar> grammar, int i) {
  SchedulerRequest r;
  r.prompt = demo.tokenizer.encode("<bos><|turn>user\nWrite the JSON answer number " + std::to_string(i) +
                                       "<turn|>\n<|turn>model\n",
                                   /*parse_special=*/true);
  // Hot and wide, so that the walks wander through the grammar; every fifth greedy.
  r.sampling = i % 5 == 0 ? SamplingParams{.temperature = 0.0f}
                          : SamplingParams{.temperature = 1.5f, .top_k = 64, .seed = uint64_t(7000 + i)};
  r.max_new_tokens = 48;
  r.stop_ids = demo.stops;
  r.grammar = std::move(grammar);
  return r;
}

struct Generated {
  std::vector<int32_t> tokens;  // drawn, the stop token included
  StopReason stop = StopReason::kNone;
};

std::map<RequestId, Generated> run_all(Scheduler& scheduler, const std::vector<SchedulerRequest>& requests,
                                       std::vector<RequestId>& ids) {
  std::map<RequestId, Generated> out;
  size_t next = 0;
  while (next < requests.size() || !scheduler.idle()) {
    // Requests arrive while others decode, so that forwards mix prompts and decode rows.
    for (int k = 0; k < 4 && next < requests.size(); ++k) ids.push_back(scheduler.add(requests[next++]));
    for (const SequenceEvent& e : scheduler.step()) {
      EXPECT_TRUE(e.error.empty()) << "request " << e.id << ": " << e.error;
      out[e.id].tokens.push_back(e.drawn.token);
      out[e.id].stop = e.drawn.stop;
    }
  }
  return out;
}

// Which masks a drawn token is checked against: xgrammar's (through node, with g4's masks compared
// to them at every step), or g4's own matcher's, which the xgrammar comparison on the CPU pins; the
// GPU machine has no node.
enum class MaskOracle { kXgrammar, kG4Matcher };

// kPerSchema requests a schema on `backend`: every draw checked against the oracle's masks, every
// finished output validated.
void expect_draws_in_the_grammar(const std::string& backend, int kPerSchema, MaskOracle which) {
  if (which == MaskOracle::kXgrammar) test::install_grammar_packages();
  Demo demo(backend);
  std::optional<test::XgrammarOracle> oracle;
  if (which == MaskOracle::kXgrammar) {
    oracle.emplace();
    oracle->load_vocabulary("demo", demo.tokenizer, demo.engine->config().vocab_size, demo.stops);
  }
  int total = 0, finished = 0;
  for (const char* schema : kSchemas) {
    auto compiled = std::make_shared<const CompiledGrammar>(grammar::json_schema_grammar(schema), demo.vocabulary);
    std::vector<SchedulerRequest> requests;
    for (int i = 0; i < kPerSchema; ++i) requests.push_back(constrained(demo, compiled, total + i));
    Scheduler scheduler(demo.engine->runner());
    std::vector<RequestId> ids;
    const std::map<RequestId, Generated> got = run_all(scheduler, requests, ids);
    std::vector<uint32_t> ours(size_t(demo.vocabulary->mask_words()));
    for (size_t i = 0; i < ids.size(); ++i) {
      const Generated& g = got.at(ids[i]);
      if (oracle) oracle->compile(schema);
      GrammarMatcher matcher(compiled);
      for (size_t step = 0; step < g.tokens.size(); ++step) {
        matcher.fill_next_token_mask(ours.data());
        if (oracle) {
          ASSERT_EQ(ours, oracle->mask(*demo.vocabulary)) << backend << ", schema " << schema << ", request " << i
                                                          << ", step " << step;
          ASSERT_TRUE(oracle->accept(g.tokens[step]).first);
        }
        const int32_t t = g.tokens[step];
        ASSERT_TRUE((ours[size_t(t) >> 5] >> (t & 31)) & 1)
            << "token " << t << " drawn outside the grammar: schema " << schema << ", request " << i << ", step " << step;
        ASSERT_TRUE(matcher.accept_token(t));
      }
      if (g.stop == StopReason::kStopToken) {
        ++finished;
        test::expect_valid_json(schema, demo.tokenizer.decode(std::span(g.tokens).first(g.tokens.size() - 1)));
      } else {
        EXPECT_EQ(g.stop, StopReason::kMaxTokens);
      }
    }
    total += kPerSchema;
  }
  std::printf("%s: %d constrained generations, %d ended by their grammar\n", backend.c_str(), total, finished);
  EXPECT_GE(finished, total / 3) << "too few generations finished their JSON";
}

// 600 generations; 80 under the sanitizers, which check memory, not statistics.
TEST(ConstrainedDecoding, DrawsStayInTheGrammarAndMasksAreXgrammars) {
  expect_draws_in_the_grammar("cpu", test::kSanitizerBuild ? 16 : 120, MaskOracle::kXgrammar);
}

// The device's masks (Backend::mask_logits on CUDA) under the same checks.
TEST(ConstrainedDecoding, DrawsStayInTheGrammarOnCuda) {
  G4_SKIP_OR_FAIL_WITHOUT_GPU(cuda_available());
  expect_draws_in_the_grammar("cuda", 80, MaskOracle::kG4Matcher);
}

// A constrained request changes nothing for its neighbours: unconstrained requests batched with
// constrained ones draw what they draw alone.
TEST(ConstrainedDecoding, UnconstrainedNeighboursDrawAsAlone) {
  Demo demo;
  auto compiled = std::make_shared<const CompiledGrammar>(grammar::json_schema_grammar(kSchemas[3]), demo.vocabulary);
  std::vector<SchedulerRequest> plain, mixed;
  for (int i = 0; i < 8; ++i) {
    SchedulerRequest r = constrained(demo, nullptr, i);
    r.stop_ids = {};
    plain.push_back(r);
    mixed.push_back(r);
    mixed.push_back(constrained(demo, compiled, 100 + i));
  }
  std::vector<std::vector<int32_t>> alone;
  for (const SchedulerRequest& r : plain) {
    Scheduler scheduler(demo.engine->runner());
    std::vector<RequestId> ids;
    alone.push_back(run_all(scheduler, {r}, ids).at(ids[0]).tokens);
  }
  Scheduler scheduler(demo.engine->runner());
  std::vector<RequestId> ids;
  const auto got = run_all(scheduler, mixed, ids);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(got.at(ids[2 * i]).tokens, alone[i]) << "request " << i;
}

// With the demo's trained assistant drafting, each verify row is masked as the draw at its position
// (the grammar after the drafts before it): every draw stays in the grammar, greedy text is the
// undrafted scheduler's, and drafts stand (a row masked as the round's first would let a draft
// through that the grammar refuses there, and the planner would fail the request).
void expect_drafted_rounds_in_the_grammar(const std::string& backend) {
  Demo demo;
  EngineOptions o;
  o.model_path = test::embedded_demo_path();
  o.backend = backend;
  o.max_seq_len = kMaxSeqLen;
  o.max_batch_sequences = 16;
  o.draft_model = std::string(G4_SOURCE_DIR) + "/models/demo-assistant.gguf";
  Engine engine(o);
  std::vector<SchedulerRequest> requests;
  std::vector<std::shared_ptr<const CompiledGrammar>> grammars;
  for (int schema : {0, 3}) {
    auto compiled = std::make_shared<const CompiledGrammar>(grammar::json_schema_grammar(kSchemas[schema]), demo.vocabulary);
    for (int i = 0; i < 6; ++i) {
      requests.push_back(constrained(demo, compiled, 10 * schema + i));
      grammars.push_back(compiled);
    }
  }
  SchedulerOptions drafting;
  drafting.draft = engine.draft_options();
  Scheduler with(engine.runner(), drafting), without(engine.runner());
  std::vector<RequestId> ids, plain_ids;
  const std::map<RequestId, Generated> got = run_all(with, requests, ids);
  const std::map<RequestId, Generated> plain = run_all(without, requests, plain_ids);
  const SpeculationStats& stats = with.speculation_stats();
  EXPECT_GT(stats.accepted, 0) << "no draft stood in " << stats.rounds << " rounds: the later rows' masks were not exercised";
  for (size_t i = 0; i < requests.size(); ++i) {
    const Generated& g = got.at(ids[i]);
    GrammarMatcher matcher(grammars[i]);
    for (size_t step = 0; step < g.tokens.size(); ++step)
      ASSERT_TRUE(matcher.accept_token(g.tokens[step])) << "request " << i << ", token " << step << " outside the grammar";
    if (requests[i].sampling.temperature == 0.0f)
      EXPECT_EQ(g.tokens, plain.at(plain_ids[i]).tokens) << "greedy request " << i;
  }
}

TEST(ConstrainedDecoding, DraftedRoundsMaskEachRowAsItsDraw) { expect_drafted_rounds_in_the_grammar("cpu"); }

TEST(ConstrainedDecoding, DraftedRoundsMaskEachRowAsItsDrawOnCuda) {
  G4_SKIP_OR_FAIL_WITHOUT_GPU(cuda_available());
  expect_drafted_rounds_in_the_grammar("cuda");
}

TEST(ConstrainedDecoding, AGrammarMustEndOnTheRequestsStopTokens) {
  Demo demo;
  SchedulerRequest r = constrained(
      demo, std::make_shared<const CompiledGrammar>(grammar::json_object_grammar(), demo.vocabulary), 0);
  r.stop_ids = {1};
  Scheduler scheduler(demo.engine->runner());
  try {
    scheduler.add(r);
    FAIL() << "accepted a grammar that ends on tokens the request does not stop at";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("stop tokens"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace g4
