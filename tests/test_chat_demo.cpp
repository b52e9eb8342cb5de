// The embedded demo (models/demo.gguf, trained by tools/demo/train_demo.py, installed by
// tools/demo/install_demo.sh; docs/DESIGN.md §6 "Demo model") chats and calls tools: greedy decoding of
// the Paris weather request writes Gemma 4's tool call, and after the tool's response an answer
// that uses it. Its oracle is transformers on the bf16 checkpoint (tests/fixtures/demo-chat/
// golden.json): the quantized file (Q4_K, Q8_0 embedding) must pick transformers' greedy token
// wherever transformers' top-2 margin is clear.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "format/gguf.h"
#include "model/loader.h"
#include "runtime/engine.h"
#include "runtime/generator.h"
#include "runtime/session.h"
#include "support/demo_engine.h"
#include "support/fixtures.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace g4 {
namespace {

// What Gemma 4's template writes for get_weather(location="Paris"); generation stops on the
// <|tool_response> after it, where the caller appends the tool's response (docs/DESIGN.md §8).
constexpr const char* kParisCall = "<|tool_call>call:get_weather{location:<|\"|>Paris<|\"|>}<tool_call|>";

nlohmann::json golden() {
  return nlohmann::json::parse(std::ifstream(std::string(G4_FIXTURES_DIR) + "/demo-chat/golden.json"));
}

nlohmann::json continuation(const nlohmann::json& g, const std::string& name) {
  for (const auto& c : g["continuations"])
    if (c["name"] == name) return c;
  ADD_FAILURE() << "golden.json has no continuation " << name;
  return {};
}

std::unique_ptr<Engine> embedded_engine() {
  EngineOptions o;
  o.model_path = test::embedded_demo_path();
  return std::make_unique<Engine>(o);
}

Tokenizer tokenizer_of(const Engine& engine) { return Tokenizer::from_json(*engine.tokenizer_json()); }

// g4's greedy reply to `prompt_text` (tokenized by the model's tokenizer), up to a Gemma 4 stop
// token (kept, as text, so the test sees where generation ended).
std::string greedy_reply(Engine& engine, const std::string& prompt_text, int64_t max_new_tokens = 96) {
  const Tokenizer tok = tokenizer_of(engine);
  GenerationRequest r;
  r.prompt = tok.encode(prompt_text, true);
  r.sampler = Sampler(SamplingParams{.temperature = 0.0f});
  r.max_new_tokens = max_new_tokens;
  r.stop_ids.assign(kGemma4StopTokenIds.begin(), kGemma4StopTokenIds.end());
  GenerationResult result = generate(*engine.create_session(), r);
  if (result.stop_token >= 0) result.tokens.push_back(result.stop_token);
  return tok.decode(result.tokens);
}

TEST(ChatDemo, ShipsAsAQuantizedSamplingProgramUnder16MB) {
  const std::string path = test::embedded_demo_path();
  EXPECT_LT(std::filesystem::file_size(path), 16'000'000u);
  const GgufFile file(path);
  EXPECT_TRUE(file.metadata().get_bool("g4.use_sampling"));
  const GgufTensorInfo* embedding = file.find_tensor("token_embd.weight");
  ASSERT_NE(embedding, nullptr);
  EXPECT_EQ(embedding->dtype, DType::Q8_0) << "--weights q4_k (tools/demo/install_demo.sh)";
  for (const GgufTensorInfo& t : file.tensors())
    if (t.shape().size() == 2 && t.name != "token_embd.weight") EXPECT_EQ(t.dtype, DType::Q4_K) << t.name;
}

TEST(ChatDemo, TokenizerMatchesTransformers) {
  auto engine = embedded_engine();
  const Tokenizer tok = tokenizer_of(*engine);
  const nlohmann::json g = golden();
  for (const auto& probe : g["tokenizer_probe"])
    EXPECT_EQ(tok.encode(probe["text"].get<std::string>(), true), probe["ids"].get<std::vector<int32_t>>())
        << probe["text"];
  for (const auto& c : g["continuations"])
    EXPECT_EQ(tok.encode(c["prompt_text"].get<std::string>(), true), c["prompt_ids"].get<std::vector<int32_t>>())
        << c["name"];
}

// The user turns g4 renders natively are the template's (tools/demo/demo_chat_corpus.py rendered these
// prompts; its check proves them equal to the official template under @huggingface/jinja).
TEST(ChatDemo, PlainPromptsAreWhatTheChatRendererWrites) {
  const nlohmann::json g = golden();
  EXPECT_EQ(continuation(g, "greeting")["prompt_text"], format_gemma4_prompt("Hello! Who are you?"));
  EXPECT_EQ(continuation(g, "fact")["prompt_text"], format_gemma4_prompt("What is the capital of France?"));
  EXPECT_EQ(continuation(g, "chat")["prompt_text"], format_gemma4_prompt("Tell me a fortune about computers."));
}

TEST(ChatDemo, CallsTheWeatherToolForParis) {
  auto engine = embedded_engine();
  const std::string prompt = continuation(golden(), "tool_call")["prompt_text"];
  ASSERT_NE(prompt.find("<|tool>declaration:get_weather{"), std::string::npos) << prompt;
  ASSERT_NE(prompt.find("What is the weather in Paris? Use the tool."), std::string::npos) << prompt;
  EXPECT_EQ(greedy_reply(*engine, prompt), std::string(kParisCall) + "<|tool_response>");
}

TEST(ChatDemo, AnswersInWordsFromTheToolResponse) {
  auto engine = embedded_engine();
  const std::string prompt = continuation(golden(), "tool_answer")["prompt_text"];
  // The history holds the call and the response {temperature: 18, condition: "sunny"}.
  ASSERT_NE(prompt.find(std::string(kParisCall) + "<|tool_response>response:get_weather{"), std::string::npos);
  const std::string reply = greedy_reply(*engine, prompt);
  EXPECT_TRUE(reply.ends_with("<turn|>")) << reply;
  EXPECT_NE(reply.find("Paris"), std::string::npos) << reply;
  EXPECT_NE(reply.find("18"), std::string::npos) << reply;
  EXPECT_NE(reply.find("sunny"), std::string::npos) << reply;
  EXPECT_EQ(reply.find("<|tool_call>"), std::string::npos) << reply;
}

// Teacher-forced on transformers' greedy continuation, the quantized file picks transformers' token
// at every step whose top-2 margin (in transformers' float32 run of the bf16 checkpoint) exceeds
// kClearMargin.
TEST(ChatDemo, GreedyTokensAgreeWithTransformersWhereClear) {
  CpuBackend cpu(2);
  auto model = load_model(test::embedded_demo_path(), cpu);
  const nlohmann::json g = golden();
  for (const auto& c : g["continuations"]) {
    const auto prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    const auto want = c["greedy_ids"].get<std::vector<int32_t>>();
    const auto margins = c["top2_margins"].get<std::vector<double>>();
    std::vector<int32_t> tokens = prompt;
    tokens.insert(tokens.end(), want.begin(), want.end() - 1);
    SessionOptions o;
    o.max_seq_len = std::max<int64_t>(int64_t(tokens.size()) + 1, 256);  // at least the sliding window (128)
    Session s(*model, cpu, o);
    const std::vector<float> logits = s.logits_all(tokens);
    const int64_t V = s.vocab_size();
    int clear = 0, agreed = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      if (margins[i] <= test::kClearMargin) continue;
      const float* row = logits.data() + (prompt.size() - 1 + i) * size_t(V);
      const int32_t got = int32_t(std::max_element(row, row + V) - row);
      ++clear;
      agreed += got == want[i];
      EXPECT_EQ(got, want[i]) << c["name"] << " step " << i << " (transformers' margin " << margins[i] << ")";
    }
    std::printf("  chat demo %s: %d of %d clear greedy tokens agree with transformers\n",
                c["name"].get<std::string>().c_str(), agreed, clear);
    EXPECT_GT(clear, 0) << c["name"];
  }
}

}  // namespace
}  // namespace g4
