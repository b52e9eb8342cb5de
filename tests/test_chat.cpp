// g4 chat and what it stands on: a generation that continues the session's cache (the next
// turn, given the whole history, prefills only its new tokens and generates what a fresh prefill
// of the whole history would), the stop flag a Ctrl-C sets, and three turns through the binary's standard input.
#include <gtest/gtest.h>

#include <atomic>
#include <regex>
#include <string>
#include <vector>

#include "model/hf_checkpoint.h"
#include "model/gguf_export.h"
#include "model/gguf_model.h"
#include "runtime/engine.h"
#include "runtime/generator.h"
#include "support/fixtures.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace g4 {
namespace {

const std::string kDemo = std::string(G4_SOURCE_DIR) + "/models/demo.gguf";

std::string sampling_model() {
  return test::shared_artifact("chat-sample.gguf", [](const std::string& path) {
    ExportOptions o;
    o.use_sampling = true;
    export_gguf(HfCheckpoint(test::fixture_dir("tiny-31b-style")), path, o);
  });
}

GenerationRequest greedy(std::vector<int32_t> prompt, int64_t max_new_tokens) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.sampler = Sampler(SamplingParams{.temperature = 0.0f});
  r.max_new_tokens = max_new_tokens;
  r.stop_ids = {};
  return r;
}

TEST(Chat, ContinuingTheCacheMatchesAFreshPrefill) {
  EngineOptions eo;
  eo.model_path = sampling_model();
  eo.kv_budget_bytes = 2 * Engine(eo).kv_pool().budget_bytes();  // room for the fresh session below
  Engine engine(eo);
  auto session = engine.create_session();
  const std::vector<int32_t> first = {2, 17, 30, 41, 5}, second = {9, 77, 12, 3};

  // Turn 1, then turn 2 with the whole history: only what the cache lacks is prefilled.
  GenerationResult one = generate(*session, greedy(first, 6));
  ASSERT_EQ(one.tokens.size(), 6u);
  EXPECT_EQ(one.prefilled, int64_t(first.size()));
  std::vector<int32_t> history = first;
  history.insert(history.end(), one.tokens.begin(), one.tokens.end());
  const int64_t cached = session->position();
  EXPECT_EQ(cached, int64_t(history.size()) - 1) << "the token that hit max_new_tokens is not fed yet";
  std::vector<int32_t> whole = history;
  whole.insert(whole.end(), second.begin(), second.end());
  const GenerationResult continued = generate(*session, greedy(whole, 6));
  EXPECT_EQ(continued.prefilled, int64_t(whole.size()) - cached) << "the new turn and the reply's last token";
  EXPECT_EQ(session->position(), int64_t(whole.size()) + 5);

  // The whole conversation prefilled at once from position 0 in a fresh session.
  auto fresh_session = engine.create_session();
  ASSERT_EQ(fresh_session->position(), 0);
  const GenerationResult fresh = generate(*fresh_session, greedy(whole, 6));
  EXPECT_EQ(fresh.prefilled, int64_t(whole.size()));
  EXPECT_EQ(continued.tokens, fresh.tokens);
}

TEST(Chat, StopFlagEndsTheReplyAfterTheCurrentToken) {
  EngineOptions eo;
  eo.model_path = sampling_model();
  Engine engine(eo);
  auto session = engine.create_session();
  std::atomic<bool> stop{true};
  GenerationRequest r = greedy({2, 17, 30}, 10);
  r.stop = &stop;
  const GenerationResult result = generate(*session, r);
  EXPECT_TRUE(result.stopped);
  EXPECT_EQ(result.tokens.size(), 1u);
  stop = false;
  EXPECT_EQ(generate(*session, r).tokens.size(), 10u);
}

struct TurnLine {
  int64_t prefilled, cache, generated;
};

// The per-turn lines g4 chat writes on stderr: "[prefilled N tokens (cache M) in ...; K tokens, ...".
std::vector<TurnLine> turn_lines(const std::string& output) {
  static const std::regex line(R"(\[prefilled (\d+) tokens \(cache (\d+)\) in [0-9.]+ s; (\d+) tokens)");
  std::vector<TurnLine> turns;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line); it != std::sregex_iterator(); ++it)
    turns.push_back({std::stoll((*it)[1]), std::stoll((*it)[2]), std::stoll((*it)[3])});
  return turns;
}

TEST(Chat, ThreeTurnsThroughStdinPrefillOnlyTheNewTokens) {
  const std::vector<std::string> turns = {"Tell me a fortune.", "Another one, please.", "Now one about computers."};
  const std::string flags = " --temperature 0 --max_new_tokens 200";
  std::string output;
  const int status = test::run_command("printf '" + turns[0] + "\\n" + turns[1] + "\\n" + turns[2] + "\\n' | " +
                                           std::string(G4_BINARY) + " chat" + flags,
                                       &output);
  ASSERT_EQ(status, 0) << output;
  const std::vector<TurnLine> lines = turn_lines(output);
  ASSERT_EQ(lines.size(), 3u) << output;
  ASSERT_EQ(output.find("--max_new_tokens reached"), std::string::npos) << "every reply ends its turn\n" << output;

  const GgufModel demo(kDemo);
  const Tokenizer tokenizer = Tokenizer::from_json(*demo.tokenizer_json());
  auto count = [&](const std::string& text) { return int64_t(tokenizer.encode(text, true).size()); };
  // Turn 1: <bos> and the turn. Later turns: the close of the previous reply and the new turn.
  EXPECT_EQ(lines[0].cache, 0);
  EXPECT_EQ(lines[0].prefilled, 1 + count(format_gemma4_user_turn(turns[0])));
  for (size_t k = 1; k < 3; ++k) {
    EXPECT_EQ(lines[k].cache, lines[k - 1].cache + lines[k - 1].prefilled + lines[k - 1].generated)
        << "turn " << k + 1 << " reuses everything before it\n" << output;
    EXPECT_EQ(lines[k].prefilled, count(std::string(kGemma4TurnEnd) + format_gemma4_user_turn(turns[k])))
        << "turn " << k + 1 << " prefills only its new tokens\n" << output;
    EXPECT_GT(lines[k].generated, 0);
  }

  // The first reply is what g4 run answers to the same prompt.
  std::string run_text;
  ASSERT_EQ(test::run_command("( " + std::string(G4_BINARY) + " run --prompt '" + turns[0] + "'" + flags +
                                  " 2>/dev/null )",
                              &run_text),
            0);
  ASSERT_GT(run_text.size(), 1u);
  std::string chat_text;
  ASSERT_EQ(test::run_command("( printf '" + turns[0] + "\\n" + turns[1] + "\\n' | " + std::string(G4_BINARY) +
                                  " chat" + flags + " 2>/dev/null )",
                              &chat_text),
            0);
  EXPECT_EQ(chat_text.rfind(run_text, 0), 0u) << "chat:\n" << chat_text << "\nrun:\n" << run_text;
  EXPECT_GT(chat_text.size(), run_text.size()) << "a second reply follows";
}

TEST(Chat, ResetExitAndUnknownCommands) {
  std::string output;
  const int status = test::run_command("printf 'Hello.\\n/reset\\nHello.\\n/frobnicate\\n/exit\\nNever read.\\n' | " +
                                           std::string(G4_BINARY) + " chat --temperature 0 --max_new_tokens 20",
                                       &output);
  ASSERT_EQ(status, 0) << output;
  const std::vector<TurnLine> lines = turn_lines(output);
  ASSERT_EQ(lines.size(), 2u) << "/exit ends the chat before the last line\n" << output;
  EXPECT_EQ(lines[1].cache, 0) << "/reset starts the cache again";
  EXPECT_EQ(lines[1].prefilled, lines[0].prefilled);
  EXPECT_NE(output.find("unknown chat command '/frobnicate'"), std::string::npos) << output;
}

TEST(Chat, FlagsAreRunsFlags) {
  std::string output;
  EXPECT_NE(test::run_command("printf 'hi\\n' | " + std::string(G4_BINARY) + " chat --temperature 3", &output), 0);
  EXPECT_NE(output.find("temperature must be in [0, 2] or -1"), std::string::npos) << output;
  EXPECT_NE(test::run_command("printf 'hi\\n' | " + std::string(G4_BINARY) + " chat --cuda_graph", &output), 0);
  EXPECT_NE(output.find("--cuda_graph needs --backend cuda"), std::string::npos) << output;
  EXPECT_NE(test::run_command("printf 'hi\\n' | " + std::string(G4_BINARY) + " chat -m " +
                                  test::fixture_dir("tiny-31b-style"),
                              &output),
            0);
  EXPECT_NE(output.find("chat needs a tokenizer"), std::string::npos) << output;
}

}  // namespace
}  // namespace g4
