// g4 serve (docs/DESIGN.md §8): the server runs in-process on a free port over the demo model and
// is driven with httplib's client and raw sockets: the routes, a chat completion equal to what g4
// run generates, streaming equal to the whole answer, stop strings, concurrent requests equal to
// each alone, the API key, a 400 naming the field for each kind of bad input and for fields g4 does
// not implement, 404/405/413/429, request bodies parsed in linear time, tool messages rendered as
// the template's tool responses, the model's thoughts and calls read back, logprobs, /metrics;
// connections: slow clients, bursts, keep-alive, abandoned requests; stop() with its drain deadline
// and SIGTERM on the binary; the binary at --tp 2 answering as --tp 1, freeing every rank's session
// when a client leaves, and a failing rank stopping rank 0 (docs/DESIGN.md §9); a request with NaN
// logits failing alone (500, or an error event when streamed). ReplyText's hold-back rules (whole
// UTF-8 characters, partial stop strings) are tested on byte tokens.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/engine.h"
#include "runtime/generator.h"
#include "runtime/rank_inputs.h"
#include "sampling/sampling_settings.h"
#include "serve/engine_worker.h"
#include "serve/openai_api.h"
#include "serve/reply_text.h"
#include "serve/server.h"
#include "support/build_kind.h"
#include "support/fixtures.h"
#include "support/running_server.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace g4 {
namespace {

using nlohmann::json;

constexpr int64_t kContext = 256;
constexpr size_t kBodyLimit = 64 << 10;
const std::string kKey = "test-key";
const std::vector<int32_t> kStopIds = {1, 106, 50};
const json kTools = json::array({{{"type", "function"},
                                  {"function",
                                   {{"name", "get_weather"},
                                    {"description", "The weather in a city"},
                                    {"parameters",
                                     {{"type", "object"},
                                      {"properties", {{"city", {{"type", "string"}, {"description", "The city"}}}}},
                                      {"required", {"city"}}}}}}}});

EngineOptions demo_options() { return test::demo_serve_options(kContext); }

// The data: payloads of an SSE body, in order ("[DONE]" included).
std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> out;
  for (size_t at = 0; at < body.size();) {
    const size_t end = body.find("\n\n", at);
    EXPECT_NE(end, std::string::npos) << "an event without its blank line";
    if (end == std::string::npos) break;
    const std::string event = body.substr(at, end - at);
    EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
    out.push_back(event.substr(6));
    at = end + 2;
  }
  return out;
}

// One server for the whole suite (loading is the slow part).
class Serve : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    serve::ServerOptions so;
    so.api_key = kKey;
    so.stop_ids = kStopIds;
    so.max_body_bytes = kBodyLimit;
    running_ = new test::RunningServer(kContext, {.max_sessions = 2, .max_waiting = 8}, so);
    worker_ = &running_->worker();
    tokenizer_ = &running_->tokenizer();
    port_ = running_->port();
  }
  static void TearDownTestSuite() { delete running_; }

  static httplib::Client client(bool with_key = true) {
    httplib::Client c = test::loopback_client(port_);
    if (with_key) c.set_bearer_token_auth(kKey);
    return c;
  }
  static json post(const std::string& path, const json& body, int expected_status = 200) {
    httplib::Result r = client().Post(path, body.dump(), "application/json");
    EXPECT_TRUE(r) << "no answer from " << path;
    if (!r) return {};
    EXPECT_EQ(r->status, expected_status) << r->body;
    return json::parse(r->body);
  }
  // The data: payloads of a streamed answer, in order ("[DONE]" included).
  static std::vector<std::string> events(const std::string& path, const json& body) {
    httplib::Result r = client().Post(path, body.dump(), "application/json");
    EXPECT_TRUE(r && r->status == 200);
    if (!r) return {};
    EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
    return sse_payloads(r->body);
  }
  static json chat(const std::string& prompt, int64_t max_tokens) {
    return {{"model", "g4-demo"},
            {"messages", json::array({{{"role", "user"}, {"content", prompt}}})},
            {"max_tokens", max_tokens},
            {"temperature", 0}};
  }

  static inline test::RunningServer* running_ = nullptr;
  static inline serve::EngineWorker* worker_ = nullptr;
  static inline const Tokenizer* tokenizer_ = nullptr;
  static inline int port_ = 0;
};

// What g4 run prints for the prompt: the chat template, greedy, on a session of its own.
std::string g4_run_text(const Tokenizer& tokenizer, const std::string& prompt, int64_t max_tokens) {
  Engine engine(demo_options());
  auto session = engine.create_session();
  GenerationRequest request;
  request.prompt = encode_prompt(tokenizer, prompt, /*raw_prompt=*/false, 2);
  request.sampler = Sampler(SamplingParams{.temperature = 0.0f});
  request.max_new_tokens = max_tokens;
  request.stop_ids = kStopIds;
  return tokenizer.decode(generate(*session, request).tokens, /*skip_special=*/true);
}

TEST_F(Serve, HealthAndModels) {
  httplib::Result health = client(/*with_key=*/false).Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(json::parse(health->body), json({{"status", "ok"}}));
  httplib::Result models = client().Get("/v1/models");
  ASSERT_TRUE(models);
  ASSERT_EQ(models->status, 200);
  const json list = json::parse(models->body);
  EXPECT_EQ(list["object"], "list");
  ASSERT_EQ(list["data"].size(), 1u);
  EXPECT_EQ(list["data"][0]["id"], "g4-demo");
}

TEST_F(Serve, ChatCompletionEqualsG4Run) {
  const std::string prompt = "Tell me a fortune about computers.";
  const json answer = post("/v1/chat/completions", chat(prompt, 12));
  EXPECT_EQ(answer["object"], "chat.completion");
  EXPECT_EQ(answer["model"], "g4-demo");
  EXPECT_EQ(answer["choices"][0]["message"]["role"], "assistant");
  const std::string content = answer["choices"][0]["message"]["content"];
  EXPECT_EQ(content, g4_run_text(*tokenizer_, prompt, 12));
  EXPECT_FALSE(content.empty());
  const json& usage = answer["usage"];
  EXPECT_EQ(usage["prompt_tokens"], encode_prompt(*tokenizer_, prompt, false, 2).size());
  EXPECT_EQ(usage["total_tokens"], usage["prompt_tokens"].get<int>() + usage["completion_tokens"].get<int>());
  if (answer["choices"][0]["finish_reason"] == "length") EXPECT_EQ(usage["completion_tokens"], 12);
}

TEST_F(Serve, StreamingEqualsTheWholeAnswer) {
  for (const char* path : {"/v1/chat/completions", "/v1/completions"}) {
    SCOPED_TRACE(path);
    json body = std::string(path) == "/v1/completions"
                    ? json{{"prompt", "Once upon a time"}, {"max_tokens", 10}, {"temperature", 0}}
                    : chat("Write a poem about the sea.", 10);
    const json whole = post(path, body);
    const json& choice = whole["choices"][0];
    const std::string text = choice.contains("message") ? choice["message"]["content"] : choice["text"];
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    const std::vector<std::string> stream = events(path, body);
    ASSERT_GE(stream.size(), 3u);
    EXPECT_EQ(stream.back(), "[DONE]");
    const json usage_chunk = json::parse(stream[stream.size() - 2]);
    EXPECT_TRUE(usage_chunk["choices"].empty());
    EXPECT_EQ(usage_chunk["usage"], whole["usage"]);
    std::string streamed, finish;
    for (size_t i = 0; i + 2 < stream.size(); ++i) {
      const json chunk = json::parse(stream[i]);
      EXPECT_EQ(chunk["id"], json::parse(stream[0])["id"]);
      const json& c = chunk["choices"][0];
      streamed += c.contains("delta") ? c["delta"].value("content", "") : c["text"].get<std::string>();
      if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
    }
    EXPECT_EQ(streamed, text);
    EXPECT_EQ(finish, choice["finish_reason"]);
  }
}

// A list of prompts answers one choice per prompt, each as that prompt alone; token ids answer as
// the text they encode; echo puts the prompt before the reply; streamed, the choices come one
// after another, each chunk naming its index. Token ids outside the vocabulary are a 400.
TEST_F(Serve, CompletionsTakeListsOfPromptsTokenIdsAndEcho) {
  const json base = {{"max_tokens", 8}, {"temperature", 0}};
  auto text_of = [&](json prompt, bool echo = false) {
    json body = base;
    body["prompt"] = std::move(prompt);
    body["echo"] = echo;
    return post("/v1/completions", body);
  };
  const std::string once = text_of("Once upon a time")["choices"][0]["text"];
  const std::string dragon = text_of("The dragon")["choices"][0]["text"];
  const json both = text_of({"Once upon a time", "The dragon"});
  ASSERT_EQ(both["choices"].size(), 2u);
  EXPECT_EQ(both["choices"][0]["index"], 0);
  EXPECT_EQ(both["choices"][0]["text"], once);
  EXPECT_EQ(both["choices"][1]["index"], 1);
  EXPECT_EQ(both["choices"][1]["text"], dragon);
  EXPECT_EQ(both["usage"]["completion_tokens"], 16);

  const std::vector<int32_t> ids = encode_prompt(*tokenizer_, "Once upon a time", /*raw_prompt=*/true, 2);
  EXPECT_EQ(text_of(ids)["choices"][0]["text"], once);
  EXPECT_EQ(text_of(json::array({ids, ids}))["choices"][1]["text"], once);
  EXPECT_EQ(text_of("Once upon a time", /*echo=*/true)["choices"][0]["text"], "Once upon a time" + once);

  json streamed = base;
  streamed["prompt"] = {"Once upon a time", "The dragon"};
  streamed["echo"] = true;
  streamed["stream"] = true;
  std::map<int, std::string> texts;
  std::vector<int> order;
  for (const std::string& e : events("/v1/completions", streamed)) {
    if (e == "[DONE]") continue;
    const json chunk = json::parse(e);
    const json& c = chunk["choices"][0];
    texts[c["index"].get<int>()] += c["text"].get<std::string>();
    if (order.empty() || order.back() != c["index"].get<int>()) order.push_back(c["index"]);
  }
  EXPECT_EQ(order, (std::vector<int>{0, 1})) << "one choice after the other";
  EXPECT_EQ(texts[0], "Once upon a time" + once);
  EXPECT_EQ(texts[1], "The dragon" + dragon);

  json outside = base;
  outside["prompt"] = {2, int32_t(tokenizer_->vocab_size())};
  const json error = post("/v1/completions", outside, 400)["error"];
  EXPECT_EQ(error["param"], "prompt");
  EXPECT_EQ(serve::EngineGauges(worker_->gauges()).running, 0u);
}

// n asks for several samples of one prompt. Choice j samples as a request of one with seed
// choice_seed(seed, j) (choice 0: the request's own seed), so each is reproducible alone and they
// differ; usage counts the prompt once and every choice's tokens; streamed, each choice's chunks
// (its role chunk too) carry its index and add up to its whole reply; greedy choices are equal.
// More choices than the server runs and queues at once (2 + 8 here) is a 400 naming n.
TEST_F(Serve, NAsksForSeveralSamplesOfOnePrompt) {
  json body = chat("Tell me a story.", 12);
  body["temperature"] = 1.0;
  auto content = [](const json& choice) { return choice["message"]["content"].get<std::string>(); };
  std::vector<std::string> alone;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  for (uint64_t j = 0; j < 3; ++j) {
    body["seed"] = choice_seed(42, j);
    const json one = post("/v1/chat/completions", body);
    alone.push_back(content(one["choices"][0]));
    prompt_tokens = one["usage"]["prompt_tokens"];
    completion_tokens += one["usage"]["completion_tokens"].get<int64_t>();
  }
  body["seed"] = 42;
  body["n"] = 3;
  const json three = post("/v1/chat/completions", body);
  ASSERT_EQ(three["choices"].size(), 3u);
  for (size_t j = 0; j < 3; ++j) {
    EXPECT_EQ(three["choices"][j]["index"], j);
    EXPECT_EQ(content(three["choices"][j]), alone[j]) << "choice " << j;
  }
  EXPECT_GE(std::set<std::string>(alone.begin(), alone.end()).size(), 2u) << "the choices sampled alike";
  EXPECT_EQ(three["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(three["usage"]["completion_tokens"], completion_tokens);

  body["stream"] = true;
  std::map<int, std::string> streamed;
  std::set<int> roles;
  for (const std::string& e : events("/v1/chat/completions", body)) {
    if (e == "[DONE]") continue;
    const json chunk = json::parse(e);
    const json& c = chunk["choices"][0];
    const int index = c["index"];
    if (c["delta"].contains("role")) roles.insert(index);
    streamed[index] += c["delta"].value("content", "");
  }
  EXPECT_EQ(roles, (std::set<int>{0, 1, 2}));
  for (int j = 0; j < 3; ++j) EXPECT_EQ(streamed[j], alone[size_t(j)]) << "choice " << j;

  json greedy = chat("Tell me a story.", 8);
  greedy["n"] = 2;
  const json two = post("/v1/chat/completions", greedy);
  ASSERT_EQ(two["choices"].size(), 2u);
  EXPECT_EQ(content(two["choices"][0]), content(two["choices"][1]));

  greedy["n"] = 11;
  const json error = post("/v1/chat/completions", greedy, 400)["error"];
  EXPECT_EQ(error["param"], "n");
  EXPECT_NE(error["message"].get<std::string>().find("11 choices"), std::string::npos) << error["message"];
  EXPECT_EQ(serve::EngineGauges(worker_->gauges()).running, 0u);
}

// logit_bias and penalties change what a request draws: a -100 bias on the greedy first token
// takes another; a +100 bias makes a token the greedy choice; a penalty changes the text; a token
// outside the vocabulary is a 400. With tools declared and tool_choice "none", the call marker is
// never drawn, even with a +100 bias asking for it.
TEST_F(Serve, LogitBiasAndPenaltiesChangeTheDraws) {
  const json base = {{"prompt", "Once upon a time"}, {"max_tokens", 6}, {"temperature", 0}, {"logprobs", 1}};
  const json plain = post("/v1/completions", base);
  const std::string first = plain["choices"][0]["logprobs"]["tokens"][0];
  const std::vector<int32_t> first_ids = tokenizer_->encode(first, false);
  ASSERT_EQ(first_ids.size(), 1u) << first;
  json biased = base;
  biased["logit_bias"] = {{std::to_string(first_ids[0]), -100}};
  const json avoided = post("/v1/completions", biased);
  EXPECT_NE(avoided["choices"][0]["logprobs"]["tokens"][0], first);
  const int32_t forced = 4000;
  biased["logit_bias"] = {{std::to_string(forced), 100}};
  const json chosen = post("/v1/completions", biased);
  EXPECT_EQ(chosen["choices"][0]["logprobs"]["tokens"][0], tokenizer_->decode(std::vector<int32_t>{forced}));
  json penalized = base;
  penalized["frequency_penalty"] = 2;
  penalized["presence_penalty"] = 2;
  penalized["max_tokens"] = 24;
  json unpenalized = base;
  unpenalized["max_tokens"] = 24;
  EXPECT_NE(post("/v1/completions", penalized)["choices"][0]["text"],
            post("/v1/completions", unpenalized)["choices"][0]["text"]);
  biased["logit_bias"] = {{std::to_string(tokenizer_->vocab_size()), 1}};
  EXPECT_EQ(post("/v1/completions", biased, 400)["error"]["param"], "logit_bias");

  const std::optional<int32_t> call = tokenizer_->token_id("<|tool_call>");
  ASSERT_TRUE(call);
  json tools = chat("What is the weather in Paris?", 4);
  tools["tools"] = kTools;
  tools["logit_bias"] = {{std::to_string(*call), 100}};
  tools["logprobs"] = true;
  auto first_token = [&](const json& body) {
    return post("/v1/chat/completions", body)["choices"][0]["logprobs"]["content"][0]["token"].get<std::string>();
  };
  EXPECT_EQ(first_token(tools), "<|tool_call>") << "the bias alone makes the call marker the greedy choice";
  tools["tool_choice"] = "none";
  EXPECT_NE(first_token(tools), "<|tool_call>") << "tool_choice none bans it";
}

TEST_F(Serve, StopStringCutsTheText) {
  const json whole = post("/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}});
  const std::string text = whole["choices"][0]["text"];
  ASSERT_GE(text.size(), 8u) << "the demo should say more than this: '" << text << "'";
  const std::string stop = text.substr(text.size() / 2, 3);
  const std::string expected = text.substr(0, text.find(stop));
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "whole");
    const json body = {{"prompt", "Once upon a time"},
                       {"max_tokens", 24},
                       {"temperature", 0},
                       {"stop", json::array({"no such text", stop})},
                       {"stream", stream}};
    if (!stream) {
      const json cut = post("/v1/completions", body);
      EXPECT_EQ(cut["choices"][0]["text"], expected);
      EXPECT_EQ(cut["choices"][0]["finish_reason"], "stop");
      continue;
    }
    std::string streamed, finish;
    for (const std::string& e : events("/v1/completions", body)) {
      if (e == "[DONE]") continue;
      const json c = json::parse(e)["choices"][0];
      streamed += c["text"].get<std::string>();
      if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
    }
    EXPECT_EQ(streamed, expected);
    EXPECT_EQ(finish, "stop");
  }
}

TEST_F(Serve, ConcurrentRequestsEqualEachAlone) {
  const std::vector<json> bodies = {
      {{"prompt", "The sea"}, {"max_tokens", 16}, {"temperature", 1.0}, {"seed", 7}},
      {{"prompt", "A quiet village in the hills"}, {"max_tokens", 12}, {"temperature", 0.8}, {"top_k", 20}, {"seed", 99}}};
  std::vector<json> alone;
  for (const json& b : bodies) alone.push_back(post("/v1/completions", b)["choices"][0]);
  std::vector<json> together(bodies.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < bodies.size(); ++i)
    threads.emplace_back([&, i] { together[i] = post("/v1/completions", bodies[i])["choices"][0]; });
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < bodies.size(); ++i) EXPECT_EQ(together[i], alone[i]) << "request " << i;
}

// A streamed completion, greedy, max_tokens (by default) left to the context's room: a long reply
// that only a cancel ends early (the disconnect tests hang up in its middle).
httplib::Request long_streamed_completion(std::optional<int64_t> max_tokens = std::nullopt) {
  httplib::Request request;
  request.method = "POST";
  request.path = "/v1/completions";
  request.headers = {{"Content-Type", "application/json"}};
  json body = {{"prompt", "Once upon a time"}, {"temperature", 0}, {"stream", true}};
  if (max_tokens) body["max_tokens"] = *max_tokens;
  request.body = body.dump();
  return request;
}

TEST_F(Serve, ClientDisconnectCancelsTheStream) {
  const uint64_t cancelled_before = worker_->cancelled();
  httplib::Client c = client();
  httplib::Request request = long_streamed_completion();
  int chunks = 0;
  request.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 2; };
  c.send(request);  // the client hangs up after its second chunk
  EXPECT_GE(chunks, 2);
  for (int i = 0; i < 500 && worker_->cancelled() == cancelled_before; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(worker_->cancelled(), cancelled_before + 1) << "the request ran on after its client left";
  // Its sessions are free again: as many requests as sessions run at once.
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i)
    threads.emplace_back([&] { post("/v1/completions", {{"prompt", "The sea"}, {"max_tokens", 4}}); });
  for (std::thread& t : threads) t.join();
}

// A connected socket to the loopback server on `port` that has sent `bytes`, or -1.
int raw_connection(int port, const std::string& bytes) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(uint16_t(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) != ssize_t(bytes.size())) {
    close(fd);
    return -1;
  }
  return fd;
}

// Whether the server closed `fd` (a read sees the end or an error) within `wait`.
bool closed_by_server(int fd, std::chrono::milliseconds wait) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, int(wait.count())) <= 0) return false;
  char byte = 0;
  return recv(fd, &byte, 1, MSG_DONTWAIT) <= 0;
}

// A non-streamed request whose client hangs up is cancelled as a stream's is: the request does not
// run on to max_tokens for nobody, and its session is free again.
TEST_F(Serve, AnAbandonedWholeRequestIsCancelled) {
  const uint64_t cancelled_before = worker_->cancelled();
  const std::string body = json{{"prompt", "Once upon a time"}, {"temperature", 0}, {"max_tokens", 200}}.dump();
  const int fd = raw_connection(port_, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + kKey +
                                           "\r\nContent-Type: application/json\r\nContent-Length: " +
                                           std::to_string(body.size()) + "\r\n\r\n" + body);
  ASSERT_GE(fd, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the request is read and admitted
  close(fd);
  for (int i = 0; i < 500 && worker_->cancelled() == cancelled_before; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(worker_->cancelled(), cancelled_before + 1) << "the whole request ran on after its client left";
}

// Every session streams at once: no request waits for an HTTP thread while sessions are free. 20
// greedy streams of 64 tokens ("Once upon a time" does not end sooner) all start before any ends;
// with httplib's default pool (one thread per core, at least 8) the ninth or the sixteenth would
// start only when an earlier one ended.
TEST(ServeThreads, EverySessionStreamsAtOnce) {
  constexpr int kStreams = 20;
  test::RunningServer server(kContext, {.max_sessions = kStreams, .max_waiting = 0}, {});
  using Clock = std::chrono::steady_clock;
  std::vector<Clock::time_point> first(kStreams), end(kStreams);
  std::vector<int> chunks(kStreams, 0);
  std::vector<std::thread> clients;
  for (int i = 0; i < kStreams; ++i)
    clients.emplace_back([&, i] {
      httplib::Client c = test::loopback_client(server.port());
      httplib::Request request = long_streamed_completion(64);
      request.content_receiver = [&, i](const char*, size_t, uint64_t, uint64_t) {
        if (chunks[size_t(i)]++ == 0) first[size_t(i)] = Clock::now();
        return true;
      };
      c.send(request);
      end[size_t(i)] = Clock::now();
    });
  for (std::thread& t : clients) t.join();
  for (int i = 0; i < kStreams; ++i) ASSERT_GT(chunks[size_t(i)], 1) << "stream " << i << " got no answer";
  const Clock::time_point last_start = *std::max_element(first.begin(), first.end());
  const Clock::time_point first_end = *std::min_element(end.begin(), end.end());
  EXPECT_LT(last_start, first_end) << "a stream started only after another had ended: "
                                   << std::chrono::duration<double>(last_start - first_end).count() << " s later";
}

// tools/gpu/serve_load.py, the load client of the H200 serve check (docs/PERF.md "g4 serve under
// load"), against the demo: every request answered, the tokens counted from the usage chunks.
// Slow clients hold only their own connections: 200 connections that send a header's first bytes
// and no more leave /health answered at once, and each is closed when its request deadline passes.
TEST(ServeThreads, SlowHeadersNeitherStarveOthersNorStayOpen) {
  serve::ServerOptions so;
  so.request_deadline = std::chrono::milliseconds(1500);
  test::RunningServer server(kContext, {.max_sessions = 2, .max_waiting = 4}, so);
  std::vector<int> slow;
  for (int i = 0; i < 200; ++i) {
    const int fd = raw_connection(server.port(), "POST /v1/chat/completions HTTP/1.1\r\nHo");
    ASSERT_GE(fd, 0) << "connection " << i;
    slow.push_back(fd);
  }
  httplib::Client c("127.0.0.1", server.port());
  c.set_connection_timeout(1, 0);
  c.set_read_timeout(1, 0);
  const auto start = std::chrono::steady_clock::now();
  const httplib::Result health = c.Get("/health");
  EXPECT_TRUE(health && health->status == 200) << "/health went unanswered beside 200 slow connections";
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  int closed = 0;
  for (int fd : slow) closed += closed_by_server(fd, std::chrono::milliseconds(4000));
  for (int fd : slow) close(fd);
  EXPECT_EQ(closed, 200) << "connections that never sent a whole request stayed open past the deadline";
}

// A burst of 256 connections at once all get their answer (httplib's listen backlog of 5 made the
// clients beyond it wait for SYN retransmission, or reset them), and one connection carries many
// requests (httplib closed it after 5).
TEST(ServeThreads, ABurstOf256ConnectionsIsAnsweredAndKeepAliveLasts) {
  test::RunningServer server(kContext, {.max_sessions = 2, .max_waiting = 4}, {});
  std::vector<int> sockets;
  for (int i = 0; i < 256; ++i) sockets.push_back(raw_connection(server.port(), "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
  int answered = 0;
  for (int fd : sockets) {
    char buffer[64] = {};
    pollfd p{fd, POLLIN, 0};
    if (fd >= 0 && poll(&p, 1, 5000) > 0 && recv(fd, buffer, sizeof buffer - 1, 0) > 0 &&
        std::string(buffer).rfind("HTTP/1.1 200", 0) == 0)
      ++answered;
    if (fd >= 0) close(fd);
  }
  EXPECT_EQ(answered, 256);
  httplib::Client c = test::loopback_client(server.port());
  c.set_keep_alive(true);
  for (int i = 0; i < 12; ++i) {
    const httplib::Result r = c.Get("/health");
    ASSERT_TRUE(r && r->status == 200) << "request " << i;
    EXPECT_NE(r->get_header_value("Connection"), "close") << "the server closed the connection after request " << i;
  }
}

// The connection flags' bad values are clear errors.
TEST(ServeCli, BadConnectionFlagsAreClearErrors) {
  for (const auto& [flags, message] : std::vector<std::pair<std::string, std::string>>{
           {"--request_timeout 0", "--request_timeout must be in (0, 86400] seconds"},
           {"--drain_timeout -1", "--drain_timeout must be in [0, 86400] seconds"},
           {"--keep_alive_requests 0", "--keep_alive_requests must be >= 1"},
           {"--keep_alive_timeout 0", "--keep_alive_timeout must be in [1, 3600] seconds"},
           {"--max_connections -2", "--max_connections must be >= 0"},
           {"--max_connections 3 --max_sessions 2 --max_waiting 4", "max_connections (3) must exceed the requests in flight (6)"}}) {
    const test::CommandResult r = test::run_g4("serve --port 0 " + flags);
    EXPECT_NE(r.exit_code, 0) << flags;
    EXPECT_NE(r.output.find(message), std::string::npos) << flags << ": " << r.output;
  }
}

// Request bodies parse in time linear in their size: an array of N small objects (nlohmann's
// callback parser rescans a container at each child's end, O(N²)); a body of the server's default
// size limit made of them is answered (a 400: too many objects) in well under a second.
TEST(ServeRequests, ParsingIsLinearInTheBody) {
  auto seconds_for = [](size_t objects) {
    std::string body = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"metadata\":[";
    for (size_t i = 0; i < objects; ++i) body += i ? ",{}" : "{}";
    body += "]}";
    const auto start = std::chrono::steady_clock::now();
    try {
      serve::parse_completion_request(body, serve::Endpoint::kChat);
    } catch (const serve::ApiError& e) {
      EXPECT_EQ(e.status, 400) << e.what();
      if (objects > (size_t(1) << 18))
        EXPECT_NE(std::string(e.what()).find("holds more than 262144 objects and arrays"), std::string::npos) << e.what();
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  // The fastest of three (tests run beside each other). Linear: 16× the time for 16× the objects,
  // plus cache effects; quadratic parsing took ~25 s for 160 000 objects in this build.
  auto fastest = [&](size_t objects) { return std::min({seconds_for(objects), seconds_for(objects), seconds_for(objects)}); };
  // ASan slows every allocation; quadratic parsing took minutes there.
  const double slack = test::kSanitizerBuild ? 5.0 : 0.5, limit_s = test::kSanitizerBuild ? 10.0 : 1.0;
  const double small = fastest(10000), large = fastest(160000);
  EXPECT_LT(large, 64 * std::max(small, 1e-3) + slack) << "10 000 objects " << small << " s, 160 000 " << large << " s";
  EXPECT_LT(seconds_for((size_t(8) << 20) / 3), limit_s);  // 8 MiB of ",{}"
}

// A field g4 does not implement is a 400 unsupported_parameter naming it, never ignored; fields
// whose value asks for nothing g4 lacks (a zero penalty, plain text, a user id) pass.
TEST(ServeRequests, UnimplementedFieldsAreRefusedNotIgnored) {
  const json chat = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  auto refusal = [](const json& body, serve::Endpoint endpoint) {
    try {
      serve::parse_completion_request(body.dump(), endpoint);
    } catch (const serve::ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.code, "unsupported_parameter") << e.what();
      return e.param + ": " + e.what();
    }
    return std::string("accepted");
  };
  auto with = [&](const char* name, const json& value) {
    json body = chat;
    body[name] = value;
    return refusal(body, serve::Endpoint::kChat);
  };
  EXPECT_EQ(with("response_format", {{"type", "json_object"}, {"schema", json::object()}}),
            "response_format.schema: 'response_format.schema' is not supported by g4 serve");
  EXPECT_EQ(with("reasoning_effort", "low"), "reasoning_effort: 'reasoning_effort' is not supported by g4 serve");
  EXPECT_EQ(with("prompt", "x"), "prompt: 'prompt' is not supported by g4 serve on this endpoint");
  EXPECT_EQ(with("response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", json::object()}, {"pattern", "x"}}}}),
            "response_format.json_schema.pattern: 'response_format.json_schema.pattern' is not supported by g4 serve");
  for (const auto& [name, value] : std::vector<std::pair<const char*, json>>{{"presence_penalty", 0},
                                                                           {"frequency_penalty", 0.0},
                                                                           {"logit_bias", json::object()},
                                                                           {"logit_bias", {{"720", -100}}},
                                                                           {"frequency_penalty", 1.5},
                                                                           {"repetition_penalty", 1.2},
                                                                           {"response_format", {{"type", "text"}}},
                                                                           {"response_format", {{"type", "json_object"}}},
                                                                           {"user", "someone"},
                                                                           {"echo", nullptr}})
    EXPECT_EQ(with(name, value), "accepted") << name;
  EXPECT_EQ(refusal({{"prompt", "x"}, {"echo", true}}, serve::Endpoint::kCompletion), "accepted");
  EXPECT_EQ(refusal({{"prompt", "x"}, {"echo", true}, {"logprobs", 2}}, serve::Endpoint::kCompletion),
            "echo: 'echo' with 'logprobs' asks for the prompt's log-probabilities, which g4 serve does not compute");
  EXPECT_EQ(refusal({{"prompt", "x"}, {"suffix", "}"}}, serve::Endpoint::kCompletion),
            "suffix: 'suffix' asks for fill-in-the-middle, and Gemma 4 has no fill-in-the-middle prompt format");
  EXPECT_EQ(refusal({{"prompt", "x"}, {"suffix", ""}}, serve::Endpoint::kCompletion), "accepted");
  EXPECT_EQ(refusal({{"prompt", "x"}, {"tools", json::array()}}, serve::Endpoint::kCompletion),
            "tools: 'tools' is not supported by g4 serve on this endpoint");
}

// "prompt" is a string, a list of strings, token ids or lists of token ids (one choice each); any
// other shape, an empty prompt or more than kMaxPrompts are 400s naming "prompt".
TEST(ServeRequests, PromptsAreStringsOrTokenIdsOrListsOfThem) {
  auto prompts = [](const json& prompt) {
    return serve::parse_completion_request(json{{"prompt", prompt}}.dump(), serve::Endpoint::kCompletion).prompts;
  };
  auto refused = [](const json& prompt) {
    try {
      serve::parse_completion_request(json{{"prompt", prompt}}.dump(), serve::Endpoint::kCompletion);
    } catch (const serve::ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, "prompt") << e.what();
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  ASSERT_EQ(prompts("Once").size(), 1u);
  EXPECT_EQ(prompts("Once")[0].text, "Once");
  const auto two = prompts({"a", "b"});
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[1].text, "b");
  const auto ids = prompts({2, 17, 30});
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_EQ(ids[0].ids, (std::vector<int32_t>{2, 17, 30}));
  const auto lists = prompts({{2, 17}, {2, 30, 31}});
  ASSERT_EQ(lists.size(), 2u);
  EXPECT_EQ(lists[1].ids, (std::vector<int32_t>{2, 30, 31}));
  for (const json& bad : {json(""), json::array(), json{"a", 2}, json{{2}, "b"}, json{2, -1}, json{json::array()},
                          json{{"x", 1}}, json(3), json{true}})
    EXPECT_NE(refused(bad), "accepted") << bad.dump();
  EXPECT_EQ(refused(json(std::vector<std::string>(serve::kMaxPrompts + 1, "a"))),
            "'prompt' holds 129 prompts; the most is 128");
}

// logit_bias and the penalties out of OpenAI's ranges (vLLM's for repetition_penalty) are 400s
// naming the field.
TEST(ServeRequests, PenaltiesOutOfRangeAre400sNamingTheField) {
  auto refused = [](const char* name, const json& value) {
    try {
      serve::parse_completion_request(json{{"prompt", "x"}, {name, value}}.dump(), serve::Endpoint::kCompletion);
    } catch (const serve::ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, name);
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(refused("frequency_penalty", 3), "'frequency_penalty' must be in [-2, 2], got 3");
  EXPECT_EQ(refused("presence_penalty", -2.5), "'presence_penalty' must be in [-2, 2], got -2.5");
  EXPECT_EQ(refused("repetition_penalty", 0), "'repetition_penalty' must be in (0, 2], got 0");
  EXPECT_EQ(refused("frequency_penalty", "1"), "'frequency_penalty' must be a number");
  EXPECT_EQ(refused("logit_bias", {{"720", 101}}), "'logit_bias' values must be numbers in [-100, 100], got 101 for 720");
  EXPECT_EQ(refused("logit_bias", {{"x", 1}}), "'logit_bias' keys must be token ids (decimal integers), got 'x'");
  EXPECT_EQ(refused("logit_bias", json::array()), "'logit_bias' must be an object of token ids to numbers");
  json many = json::object();
  for (size_t i = 0; i <= kMaxLogitBias; ++i) many[std::to_string(i)] = 1;
  EXPECT_EQ(refused("logit_bias", many), "'logit_bias' holds 1025 tokens; the most is 1024");
  EXPECT_EQ(refused("frequency_penalty", 2), "accepted");
}

// tool_choice "required" and a named function force calls, response_format json_object and
// json_schema force JSON (ReplyConstraint); choices that cannot be met are 400s naming the field:
// "required" or a name without tools, a name the tools do not declare, a malformed response_format,
// and both at once.
TEST(ServeRequests, ToolChoiceAndResponseFormatBecomeConstraints) {
  const json messages = {{{"role", "user"}, {"content", "hi"}}};
  auto parse = [&](json body) {
    body["messages"] = messages;
    return serve::parse_completion_request(body.dump(), serve::Endpoint::kChat);
  };
  auto refused = [&](const json& body) {
    try {
      parse(body);
    } catch (const serve::ApiError& e) {
      EXPECT_EQ(e.status, 400);
      return e.param + ": " + e.what();
    }
    return std::string("accepted");
  };
  using Kind = serve::ReplyConstraint::Kind;
  const serve::CompletionRequest required = parse({{"tools", kTools}, {"tool_choice", "required"}});
  EXPECT_EQ(required.constraint.kind, Kind::kToolCalls);
  EXPECT_EQ(required.constraint.function, "");
  EXPECT_TRUE(required.parse_tool_calls);
  const json named = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  EXPECT_EQ(parse({{"tools", kTools}, {"tool_choice", named}}).constraint.function, "get_weather");
  EXPECT_EQ(parse({{"tools", kTools}, {"tool_choice", "auto"}}).constraint.kind, Kind::kNone);
  EXPECT_EQ(parse({{"tools", kTools}, {"tool_choice", "none"}}).parse_tool_calls, false);
  EXPECT_EQ(parse({{"response_format", {{"type", "json_object"}}}}).constraint.schema, R"({"type":"object"})");
  const json schema = {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}};
  const serve::CompletionRequest json_schema =
      parse({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "a"}, {"schema", schema}, {"strict", true}}}}}});
  EXPECT_EQ(json_schema.constraint.kind, Kind::kJson);
  EXPECT_EQ(json::parse(json_schema.constraint.schema), schema);

  EXPECT_EQ(refused({{"tool_choice", "required"}}), "tool_choice: 'tool_choice' \"required\" needs 'tools' to choose from");
  EXPECT_EQ(refused({{"tool_choice", named}}), "tool_choice: 'tool_choice' naming 'get_weather' needs 'tools' to choose from");
  EXPECT_EQ(refused({{"tools", kTools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_time"}}}}}}),
            "tool_choice: 'tool_choice' names the function 'get_time', which 'tools' does not declare");
  EXPECT_EQ(refused({{"tools", kTools}, {"tool_choice", "always"}}).rfind("tool_choice: 'tool_choice' must be", 0), 0u);
  EXPECT_EQ(refused({{"response_format", {{"type", "yaml"}}}}),
            "response_format.type: 'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", got \"yaml\"");
  EXPECT_EQ(refused({{"response_format", {{"type", "json_schema"}}}}),
            "response_format.json_schema: 'response_format.json_schema' must be an object with 'name' and 'schema'");
  EXPECT_EQ(refused({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "a"}}}}}}),
            "response_format.json_schema.schema: 'response_format.json_schema.schema' must be a JSON Schema object");
  EXPECT_EQ(refused({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", schema}}}}}}),
            "response_format.json_schema.name: response_format.json_schema.name must be a string");
  EXPECT_EQ(refused({{"tools", kTools}, {"tool_choice", "required"}, {"response_format", {{"type", "json_object"}}}}),
            "response_format: 'response_format' and a 'tool_choice' that forces a call cannot both shape the reply");
}

// Counts beyond the request limits are 400s that name the limit.
TEST(ServeRequests, TooManyMessagesToolsOrPartsAreRefused) {
  auto error_of = [](const json& body) {
    try {
      serve::parse_completion_request(body.dump(), serve::Endpoint::kChat);
    } catch (const serve::ApiError& e) {
      EXPECT_EQ(e.status, 400);
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const json message = {{"role", "user"}, {"content", "hi"}};
  json many = json::array();
  for (int i = 0; i < 8193; ++i) many.push_back(message);
  EXPECT_NE(error_of({{"messages", many}}).find("'messages' has 8193 messages; at most 8192"), std::string::npos);
  json parts = json::array();
  for (int i = 0; i < 1025; ++i) parts.push_back({{"type", "text"}, {"text", "a"}});
  EXPECT_NE(error_of({{"messages", {{{"role", "user"}, {"content", parts}}}}}).find("has 1025 parts; at most 1024"),
            std::string::npos);
  json tools = json::array();
  for (int i = 0; i < 513; ++i)
    tools.push_back({{"type", "function"}, {"function", {{"name", "f" + std::to_string(i)}}}});
  EXPECT_NE(error_of({{"messages", {message}}, {"tools", tools}}).find("'tools' has 513 tools; at most 512"),
            std::string::npos);
}

TEST(ServeThreads, TheLoadClientMeasuresEveryRequest) {
  std::string python;
  if (test::run_command("command -v python3", &python) != 0)
    GTEST_SKIP() << "no python3 to run tools/gpu/serve_load.py";
  test::RunningServer server(kContext, {.max_sessions = 4, .max_waiting = 8}, {});
  std::string output;
  const int status = test::run_command("python3 '" + std::string(G4_SOURCE_DIR) + "/tools/gpu/serve_load.py' --url " +
                                           server.base_url() + " --clients 4 --requests 6 --prompt_chars 20 --max_tokens 8",
                                       &output);
  ASSERT_EQ(status, 0) << output;
  const json report = json::parse(output);
  EXPECT_EQ(report["requests"], 6);
  EXPECT_EQ(report["failed"], 0) << report.dump();
  EXPECT_GT(report["generated_tokens"].get<int>(), 6);  // at least the first token of each, most run to 8
  EXPECT_LE(report["generated_tokens"].get<int>(), 6 * 8);
  EXPECT_LE(report["ttft_p50_s"].get<double>(), report["ttft_p99_s"].get<double>());
  EXPECT_GT(report["aggregate_tok_s"].get<double>(), 0.0);
}

TEST_F(Serve, AFullQueueIsBusy429WithRetryAfter) {
  // One session, no queue: while a request runs, the next is refused at once.
  serve::ServerOptions so;
  so.stop_ids = {};  // the first request runs to its max_new_tokens
  test::RunningServer server(kContext, {.max_sessions = 1, .max_waiting = 0}, so);
  serve::EngineWorker& worker = server.worker();
  const int port = server.port();
  SchedulerRequest running;
  running.prompt = {2, 17, 30};
  running.sampling = SamplingParams{.temperature = 0.0f};
  running.max_new_tokens = kContext - 4;
  running.stop_ids = {};
  const std::shared_ptr<serve::RequestChannel> first = worker.submit(running);
  ASSERT_TRUE(first);
  EXPECT_EQ(test::error_kind_of([&] { worker.submit(running); }), ErrorKind::kBusy)
      << "a second request with no room must be refused";
  httplib::Client c = test::loopback_client(port);
  // (The socket listens from bind() on: a request before listen() waits in the backlog.)
  const httplib::Result busy = c.Post("/v1/completions", json{{"prompt", "hi"}}.dump(), "application/json");
  ASSERT_TRUE(busy);
  EXPECT_EQ(busy->status, 429) << busy->body;
  EXPECT_EQ(busy->get_header_value("Retry-After"), "1");
  EXPECT_EQ(json::parse(busy->body)["error"]["type"], "rate_limit_error");
  EXPECT_EQ(json::parse(busy->body)["error"]["code"], "server_busy");
  // Once the first request has ended, there is room again.
  EXPECT_FALSE(first->wait_admitted());
  for (bool last = false; !last;)
    for (const SequenceEvent& t : first->take()) last = last || t.drawn.last();
  // (The count drops before the last token goes out, so the room is there at once.)
  const httplib::Result next = c.Post("/v1/completions", json{{"prompt", "hi"}, {"max_tokens", 2}}.dump(), "application/json");
  ASSERT_TRUE(next);
  EXPECT_EQ(next->status, 200) << next->body;
}

TEST_F(Serve, ApiKeyIsRequired) {
  for (const std::optional<std::string>& key : {std::optional<std::string>{}, std::optional<std::string>{"wrong"}}) {
    httplib::Client c = client(/*with_key=*/false);
    if (key) c.set_bearer_token_auth(*key);
    httplib::Result r = c.Post("/v1/completions", json{{"prompt", "hi"}, {"max_tokens", 1}}.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401);
    EXPECT_EQ(json::parse(r->body)["error"]["type"], "invalid_request_error");
    httplib::Result models = c.Get("/v1/models");
    ASSERT_TRUE(models);
    EXPECT_EQ(models->status, 401);
  }
}

TEST_F(Serve, BadInputIsA400NamingTheField) {
  const json user = json::array({{{"role", "user"}, {"content", "hi"}}});
  std::string long_prompt;
  for (int i = 0; i < 600; ++i) long_prompt += "word" + std::to_string(i) + " ";
  struct Case {
    std::string path;
    std::string body;
    std::string param;  // "" = none
  };
  const std::vector<Case> cases = {
      {"/v1/chat/completions", "{not json", ""},
      {"/v1/chat/completions", "[1, 2]", ""},
      {"/v1/chat/completions", json{{"max_tokens", 4}}.dump(), "messages"},
      {"/v1/chat/completions", json{{"messages", json::array()}}.dump(), "messages"},
      {"/v1/chat/completions", json{{"messages", {{{"role", "robot"}, {"content", "hi"}}}}}.dump(), "messages[0].role"},
      {"/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", 5}}}}}.dump(), "messages[0].content"},
      {"/v1/chat/completions", json{{"messages", user}, {"temperature", 3.5}}.dump(), "temperature"},
      {"/v1/chat/completions", json{{"messages", user}, {"temperature", "hot"}}.dump(), "temperature"},
      {"/v1/chat/completions", json{{"messages", user}, {"top_p", 0}}.dump(), "top_p"},
      {"/v1/chat/completions", json{{"messages", user}, {"top_k", -1}}.dump(), "top_k"},
      {"/v1/chat/completions", json{{"messages", user}, {"min_p", 1.5}}.dump(), "min_p"},
      {"/v1/chat/completions", json{{"messages", user}, {"seed", -3}}.dump(), "seed"},
      {"/v1/chat/completions", json{{"messages", user}, {"max_tokens", 0}}.dump(), "max_tokens"},
      {"/v1/chat/completions", json{{"messages", user}, {"stop", 7}}.dump(), "stop"},
      {"/v1/chat/completions", json{{"messages", user}, {"stop", {""}}}.dump(), "stop"},
      {"/v1/chat/completions", json{{"messages", user}, {"stream", "yes"}}.dump(), "stream"},
      {"/v1/chat/completions", json{{"messages", user}, {"n", 0}}.dump(), "n"},
      {"/v1/chat/completions", json{{"messages", user}, {"n", 129}}.dump(), "n"},
      {"/v1/chat/completions", json{{"messages", user}, {"n", 1.5}}.dump(), "n"},
      {"/v1/completions", json{{"prompt", {"a", "b", "c"}}, {"n", 43}}.dump(), "n"},
      {"/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", long_prompt}}}}}.dump(), "messages"},
      {"/v1/chat/completions", json{{"messages", {{{"role", "tool"}, {"content", "42"}}}}}.dump(), "messages[0].role"},
      {"/v1/chat/completions",
       json{{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}, {"image_url", "x"}}}}}}}}.dump(),
       "messages[0].content"},
      {"/v1/chat/completions",
       json{{"messages", {{{"role", "assistant"}, {"tool_calls", {{{"function", {{"name", 3}}}}}}}}}}.dump(),
       "messages[0].tool_calls[0].function.name"},
      {"/v1/chat/completions", json{{"messages", user}, {"tools", {{{"type", "code"}}}}}.dump(), "tools[0]"},
      {"/v1/chat/completions", json{{"messages", user}, {"tools", kTools}, {"tool_choice", "always"}}.dump(), "tool_choice"},
      {"/v1/chat/completions", json{{"messages", user}, {"chat_template_kwargs", {{"enable_thinking", "on"}}}}.dump(),
       "chat_template_kwargs.enable_thinking"},
      {"/v1/chat/completions", json{{"messages", user}, {"logprobs", true}, {"top_logprobs", 21}}.dump(), "top_logprobs"},
      {"/v1/chat/completions", json{{"messages", user}, {"top_logprobs", 2}}.dump(), "top_logprobs"},
      {"/v1/completions", json{{"prompt", "hi"}, {"logprobs", -1}}.dump(), "logprobs"},
      {"/v1/completions", json{{"max_tokens", 4}}.dump(), "prompt"},
      {"/v1/completions", json{{"prompt", long_prompt}}.dump(), "prompt"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.path + " " + c.body.substr(0, 120));
    httplib::Result r = client().Post(c.path, c.body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    const json error = json::parse(r->body)["error"];
    EXPECT_EQ(error["type"], "invalid_request_error");
    EXPECT_FALSE(error["message"].get<std::string>().empty());
    EXPECT_EQ(error["param"], c.param.empty() ? json(nullptr) : json(c.param));
  }
  // The server goes on serving.
  EXPECT_EQ(post("/v1/chat/completions", chat("hi", 2))["object"], "chat.completion");
}

TEST_F(Serve, UnknownModelIs404AndAnOversizedBodyIs413) {
  httplib::Result r = client().Post("/v1/chat/completions", json{{"model", "gpt-9"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}}.dump(),
                                    "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "model_not_found");
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "model");
  r = client().Post("/v1/completions", json{{"prompt", std::string(kBodyLimit + 1, 'a')}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "request_too_large");
  EXPECT_EQ(post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 1}, {"model", "g4-demo"}})["object"], "text_completion");
}

// GET /v1/models/{id}: the model, or 404 for another id; a known route with another method is a
// 405 with Allow, an unknown route a 404.
TEST_F(Serve, ModelByIdAndWrongMethodsAre405) {
  httplib::Result r = client().Get("/v1/models/g4-demo");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body)["id"], "g4-demo");
  r = client().Get("/v1/models/gpt-9");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "model_not_found");
  r = client().Get("/v1/chat/completions");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "POST");
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "method_not_allowed");
  r = client().Post("/health", "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "GET");
  r = client().Delete("/v1/completions");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  r = client().Get("/v1/nothing");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
}

const json kToolRoundTrip = json::array(
    {{{"role", "system"}, {"content", "You answer briefly."}},
     {{"role", "user"}, {"content", "What is the weather in Paris?"}},
     {{"role", "assistant"},
      {"content", nullptr},
      {"tool_calls",
       {{{"id", "call_1"}, {"type", "function"}, {"function", {{"name", "get_weather"}, {"arguments", "{\"city\":\"Paris\"}"}}}}}}},
     {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "{\"temperature\": 21, \"sky\": \"clear\"}"}}});

// OpenAI's tool messages become the tool responses of the call they answer, as the template
// writes them: the model's turn stays open for its answer.
TEST_F(Serve, ToolResultsReachTheTemplateAsToolResponses) {
  const json body = {{"messages", kToolRoundTrip}, {"tools", kTools}, {"max_tokens", 3}, {"temperature", 0}};
  const serve::CompletionRequest request = serve::parse_completion_request(body.dump(), serve::Endpoint::kChat);
  EXPECT_TRUE(request.parse_tool_calls);
  const std::string rendered = format_gemma4_chat(request.messages, request.chat);
  const std::string expected =
      "<bos><|turn>system\nYou answer briefly.<|tool>declaration:get_weather{description:<|\"|>The weather in a "
      "city<|\"|>,parameters:{properties:{city:{description:<|\"|>The city<|\"|>,type:<|\"|>STRING<|\"|>}},"
      "required:[<|\"|>city<|\"|>],type:<|\"|>OBJECT<|\"|>}}<tool|><turn|>\n<|turn>user\nWhat is the weather in "
      "Paris?<turn|>\n<|turn>model\n<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>"
      "<|tool_response>response:get_weather{sky:<|\"|>clear<|\"|>,temperature:21}<tool_response|>"
      "<|channel>thought\n<channel|>";
  EXPECT_EQ(rendered, expected);
  const json answer = post("/v1/chat/completions", body);
  EXPECT_EQ(answer["usage"]["prompt_tokens"], tokenizer_->encode(expected, /*parse_special=*/true).size());
  EXPECT_EQ(answer["choices"][0]["message"]["role"], "assistant");
  // Thinking on: "<|think|>" in the system turn, no empty thought channel.
  json thinking = body;
  thinking["chat_template_kwargs"] = {{"enable_thinking", true}};
  const serve::CompletionRequest on = serve::parse_completion_request(thinking.dump(), serve::Endpoint::kChat);
  const std::string with_thinking = format_gemma4_chat(on.messages, on.chat);
  EXPECT_EQ(with_thinking.rfind("<bos><|turn>system\n<|think|>\nYou answer briefly.", 0), 0u);
  EXPECT_EQ(with_thinking.find("<|channel>thought\n<channel|>"), std::string::npos);
  EXPECT_EQ(post("/v1/chat/completions", thinking)["object"], "chat.completion");
}

// The model's side of a tool call, token by token through ReplyText as the server reads replies:
// thoughts become reasoning, the call a parsed call, other special tokens are dropped.
TEST_F(Serve, ModelOutputBecomesReasoningAndToolCalls) {
  std::vector<int32_t> ids = tokenizer_->encode(
      "<|channel>thought\nThe user wants weather.<channel|>Let me check.<bos><|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,"
      "days:2}<tool_call|>",
      /*parse_special=*/true);
  serve::ReplyText text(*tokenizer_, {}, OutputParserOptions{.parse_tool_calls = true});
  ParsedOutput all;
  for (int32_t id : ids) all.append(text.push(id));
  all.append(text.finish());
  EXPECT_EQ(all.reasoning, "The user wants weather.");
  EXPECT_EQ(all.content, "Let me check.");
  ASSERT_EQ(all.tool_calls.size(), 1u);
  EXPECT_EQ(all.tool_calls[0].name, "get_weather");
  EXPECT_EQ(all.tool_calls[0].arguments, (json{{"city", "Paris"}, {"days", 2}}));
  // A malformed call is content, as written.
  serve::ReplyText malformed(*tokenizer_, {}, OutputParserOptions{.parse_tool_calls = true});
  ParsedOutput kept;
  for (int32_t id : tokenizer_->encode("<|tool_call>call:get_weather{city:Paris}<tool_call|>", true)) kept.append(malformed.push(id));
  kept.append(malformed.finish());
  EXPECT_TRUE(kept.tool_calls.empty());
  EXPECT_EQ(kept.content, "<|tool_call>call:get_weather{city:Paris}<tool_call|>");
}

void expect_logprob_entry(const json& entry, size_t top) {
  EXPECT_LE(entry["logprob"].get<double>(), 0.0);
  EXPECT_TRUE(entry["bytes"].is_array());
  ASSERT_EQ(entry["top_logprobs"].size(), top);
  for (size_t i = 1; i < top; ++i)
    EXPECT_GE(entry["top_logprobs"][i - 1]["logprob"].get<double>(), entry["top_logprobs"][i]["logprob"].get<double>());
  // Greedy: the drawn token is the most likely one.
  EXPECT_EQ(entry["token"], entry["top_logprobs"][0]["token"]);
  EXPECT_DOUBLE_EQ(entry["logprob"].get<double>(), entry["top_logprobs"][0]["logprob"].get<double>());
}

TEST_F(Serve, LogprobsOfEveryGeneratedToken) {
  json body = chat("Tell me a fortune.", 6);
  body["logprobs"] = true;
  body["top_logprobs"] = 3;
  const json answer = post("/v1/chat/completions", body);
  const json& content = answer["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), answer["usage"]["completion_tokens"].get<size_t>());
  for (const json& entry : content) expect_logprob_entry(entry, 3);
  body["stream"] = true;
  size_t streamed = 0;
  for (const std::string& e : events("/v1/chat/completions", body)) {
    if (e == "[DONE]") continue;
    const json c = json::parse(e)["choices"];
    const json logprobs = c.empty() ? json() : c[0].value("logprobs", json());
    if (logprobs.is_null()) continue;
    for (const json& entry : logprobs["content"]) {
      expect_logprob_entry(entry, 3);
      ++streamed;
    }
  }
  EXPECT_EQ(streamed, content.size());
  const json completion = post("/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 5}, {"temperature", 0}, {"logprobs", 2}});
  const json& lp = completion["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), completion["usage"]["completion_tokens"].get<size_t>());
  ASSERT_EQ(lp["token_logprobs"].size(), lp["tokens"].size());
  ASSERT_EQ(lp["top_logprobs"].size(), lp["tokens"].size());
  ASSERT_EQ(lp["text_offset"].size(), lp["tokens"].size());
  for (const json& top : lp["top_logprobs"]) EXPECT_GE(top.size(), 1u);
  EXPECT_TRUE(post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 1}})["choices"][0]["logprobs"].is_null());
}

double metric(const std::string& text, const std::string& name) {
  const size_t at = text.find("\n" + name + " ");
  EXPECT_NE(at, std::string::npos) << name << " not in\n" << text;
  return at == std::string::npos ? -1 : std::stod(text.substr(at + name.size() + 2));
}

TEST_F(Serve, MetricsCountRequestsTokensAndShowEverySessionFreed) {
  const json answer = post("/v1/chat/completions", chat("hi", 3));
  const std::string counted = "g4_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"}";
  std::string text;
  for (int i = 0; i < 200 && text.find(counted) == std::string::npos; ++i) {
    httplib::Result r = client(/*with_key=*/false).Get("/metrics");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200);
    text = r->body;
  }
  EXPECT_NE(text.find(counted), std::string::npos) << text;
  EXPECT_GE(metric(text, "g4_generated_tokens_total"), answer["usage"]["completion_tokens"].get<double>());
  EXPECT_GE(metric(text, "g4_prompt_tokens_total"), answer["usage"]["prompt_tokens"].get<double>());
  EXPECT_EQ(metric(text, "g4_running_sequences"), 0);
  EXPECT_EQ(metric(text, "g4_queue_depth"), 0);
  EXPECT_EQ(metric(text, "g4_kv_bytes_in_use"), 0);
  EXPECT_GT(metric(text, "g4_kv_bytes_budget"), 0);
  EXPECT_GT(metric(text, "g4_kv_pages_total"), 0);
  EXPECT_GT(metric(text, "g4_kv_pages_free"), 0);
  EXPECT_LE(metric(text, "g4_kv_pages_free"), metric(text, "g4_kv_pages_total"));
  // The finished request's written pages stay cached for prefix reuse; none is held or shared.
  EXPECT_EQ(metric(text, "g4_kv_pages_in_use"), 0);
  EXPECT_EQ(metric(text, "g4_kv_pages_shared"), 0);
  EXPECT_EQ(metric(text, "g4_kv_pages_free") + metric(text, "g4_kv_pages_cached"), metric(text, "g4_kv_pages_total"));
  EXPECT_EQ(metric(text, "g4_kv_bytes_cached") > 0, metric(text, "g4_kv_pages_cached") > 0);
  EXPECT_EQ(metric(text, "g4_preempted_sequences"), 0);
  EXPECT_EQ(metric(text, "g4_preemptions_total"), 0);
  // The demo on the CPU, float32 caches: two full layers of one 128-dim K=V head, six sliding
  // layers of two 64-dim heads; K and V.
  EXPECT_EQ(metric(text, "g4_kv_bytes_per_token{layers=\"full\"}"), 2 * 2 * 128 * 4);
  EXPECT_EQ(metric(text, "g4_kv_bytes_per_token{layers=\"sliding\"}"), 6 * 2 * 2 * 64 * 4);
  EXPECT_GE(metric(text, "g4_time_to_first_token_seconds_count"), 1);
  EXPECT_GE(metric(text, "g4_decode_token_seconds_count"), 1);
  for (const char* type : {"# TYPE g4_requests_total counter", "# TYPE g4_time_to_first_token_seconds histogram",
                           "g4_decode_token_seconds_bucket{le=\"+Inf\"}", "# TYPE g4_kv_bytes_in_use gauge"})
    EXPECT_NE(text.find(type), std::string::npos) << type;
}

// stop() (what SIGINT/SIGTERM trigger in g4 serve) lets a stream in flight finish, then listen()
// returns.
// Stops a server of options `so` (one session, no queue) once a stream of `request` has begun;
// returns what the stream received.
std::string stream_until_stopped(serve::ServerOptions so, const httplib::Request& request) {
  so.stop_ids = {};
  test::RunningServer running(kContext, {.max_sessions = 1, .max_waiting = 0}, so);
  std::atomic<bool> started{false};
  std::string body;
  std::thread streaming([&] {
    httplib::Client c = test::loopback_client(running.port());
    httplib::Request r = request;
    r.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      body.append(data, n);
      started = true;
      return true;
    };
    c.send(r);
  });
  for (int i = 0; i < 1000 && !started; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_TRUE(started);
  running.stop();  // returns once listen() has returned
  streaming.join();
  return body;
}

TEST_F(Serve, StopFinishesTheRequestsInFlight) {
  const std::string body = stream_until_stopped({}, long_streamed_completion(40));
  EXPECT_NE(body.find("data: [DONE]"), std::string::npos) << "the stream in flight was cut:\n" << body;
  EXPECT_NE(body.find("\"finish_reason\":\"length\""), std::string::npos);
}

// A request still running at the drain deadline fails (a stream ends with an error event), and
// stop() returns then instead of waiting for it to end.
TEST_F(Serve, StopFailsWhatRunsPastTheDrainDeadline) {
  serve::ServerOptions so;
  so.drain_deadline = std::chrono::milliseconds(50);
  const std::string body = stream_until_stopped(so, long_streamed_completion(240));
  EXPECT_NE(body.find("requests still running at its drain deadline are cancelled"), std::string::npos) << body;
  EXPECT_EQ(body.find("\"finish_reason\":\"length\""), std::string::npos) << "the stream ran to its end";
}

// A whole (not streamed) request still running at the drain deadline is answered 503: the server
// is unavailable, not broken (the status comes from the failure's kind, ErrorKind::kUnavailable).
TEST_F(Serve, AWholeRequestPastTheDrainDeadlineIs503) {
  serve::ServerOptions so;
  so.stop_ids = {};
  so.drain_deadline = std::chrono::milliseconds(50);
  test::RunningServer running(kContext, {.max_sessions = 1, .max_waiting = 0}, so);
  std::optional<httplib::Result> answer;
  std::thread whole([&] {
    httplib::Client c = test::loopback_client(running.port());
    answer.emplace(c.Post("/v1/completions", json{{"prompt", "Once upon a time"}, {"max_tokens", 240}}.dump(),
                          "application/json"));
  });
  for (int i = 0; i < 1000 && running.worker().gauges().running == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(running.worker().gauges().running, 1u) << "the request never started";
  running.stop();
  whole.join();
  ASSERT_TRUE(answer && *answer);
  const httplib::Response& r = **answer;
  EXPECT_EQ(r.status, 503) << r.body;
  const json error = json::parse(r.body)["error"];
  EXPECT_EQ(error["type"], "server_error");
  EXPECT_NE(error["message"].get<std::string>().find("drain deadline"), std::string::npos) << r.body;
}

// The binary: SIGTERM (and SIGINT) stop g4 serve gracefully, with exit status 0 — split too, where
// every rank must stop.
TEST(ServeCli, SigtermStopsTheServerWithExitStatusZero) {
  for (const char* tp : {"1", "2"})
    for (int signal_number : {SIGTERM, SIGINT}) {
      SCOPED_TRACE(std::string("--tp ") + tp + ", signal " + std::to_string(signal_number));
      test::ServeProcess server({"--max_seq_len", "256", "--tp", tp});
      ASSERT_GT(server.port(), 0) << server.log();
      const httplib::Result health = server.client().Get("/health");
      ASSERT_TRUE(health);
      EXPECT_EQ(health->status, 200);
      EXPECT_EQ(server.stop(signal_number), 0) << server.log();
      EXPECT_NE(server.log().find("g4 serve: stopped"), std::string::npos) << server.log();
    }
}

// ---- g4 serve --tp 2 (docs/DESIGN.md §9, "Front ends") ----

// The reply's text and finish reason, from a whole answer or the chunks of a stream.
std::string reply_of(const test::ServeProcess& server, const std::string& path, const json& body) {
  httplib::Client c = server.client();
  const httplib::Result r = c.Post(path, body.dump(), "application/json");
  if (!r || r->status != 200) return "HTTP error " + (r ? std::to_string(r->status) + ": " + r->body : "(no answer)");
  std::string text, finish;
  auto read_choice = [&](const json& choice) {
    if (choice.contains("message")) text += choice["message"].value("content", "");
    if (choice.contains("delta")) text += choice["delta"].value("content", "");
    if (choice.contains("text")) text += choice["text"].get<std::string>();
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
  };
  if (!body.value("stream", false)) {
    read_choice(json::parse(r->body)["choices"][0]);
  } else {
    std::istringstream lines(r->body);
    for (std::string line; std::getline(lines, line);)
      if (line.rfind("data: {", 0) == 0) {
        const json chunk = json::parse(line.substr(6));  // named: a temporary would die before the loop body
        for (const json& choice : chunk["choices"]) read_choice(choice);
      }
  }
  return text + " [" + finish + "]";
}

// Four requests sent to `batched` at once answer as each does alone on `alone`.
void expect_batched_answers_alone(const test::ServeProcess& alone, const test::ServeProcess& batched) {
  std::vector<std::string> want(4), got(4);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < 4; ++i) {
    const json body = {{"prompt", "Request " + std::to_string(i)}, {"max_tokens", 16 + 4 * int(i)},
                       {"temperature", 1.0}, {"seed", int(i)}, {"stream", i % 2 == 1}};
    want[i] = reply_of(alone, "/v1/completions", body);
    clients.emplace_back([&, i, body] { got[i] = reply_of(batched, "/v1/completions", body); });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(got, want);
}

TEST(ServeCli, SplitServerAnswersAsOneRank) {
  test::ServeProcess one({"--max_seq_len", "256"}), two({"--max_seq_len", "256", "--tp", "2"});
  ASSERT_GT(one.port(), 0) << one.log();
  ASSERT_GT(two.port(), 0) << two.log();
  const json message = json::array({{{"role", "user"}, {"content", "Tell me a story about the sea."}}});
  for (const json& sampling : {json{{"temperature", 0}}, json{{"temperature", 1.0}, {"top_k", 40}, {"seed", 7}}})
    for (bool stream : {false, true}) {
      SCOPED_TRACE(sampling.dump() + (stream ? " streamed" : ""));
      json body = {{"messages", message}, {"max_tokens", 24}, {"stream", stream}};
      body.update(sampling);
      const std::string want = reply_of(one, "/v1/chat/completions", body);
      EXPECT_EQ(reply_of(two, "/v1/chat/completions", body), want);
      body.erase("messages");
      body["prompt"] = "Once upon a time";
      EXPECT_EQ(reply_of(two, "/v1/completions", body), reply_of(one, "/v1/completions", body));
    }
  // Requests arriving together are batched by every rank's scheduler alike: each answer is its own.
  expect_batched_answers_alone(one, two);
  EXPECT_EQ(two.stop(), 0) << two.log();
}

// --batch_invariant false packs requests into whole forwards; the CPU computes every row alone at
// any row count, so the answers stay those of each request alone.
TEST(ServeCli, BatchInvariantFalseAnswersAloneOnTheCpu) {
  test::ServeProcess one({"--max_seq_len", "256"}), packed({"--max_seq_len", "256", "--batch_invariant", "false"});
  ASSERT_GT(one.port(), 0) << one.log();
  ASSERT_GT(packed.port(), 0) << packed.log();
  expect_batched_answers_alone(one, packed);
  EXPECT_EQ(packed.stop(), 0) << packed.log();
}

std::string metrics_of(const test::ServeProcess& server) {
  httplib::Client c = server.client();
  const httplib::Result r = c.Get("/metrics");
  return r ? r->body : "";
}

// --draft_model: requests decode in the assistant's draft rounds, batched with each other (the fortune
// demo and its random assistant, tests/fixtures/assistant). Greedy answers are the plain server's,
// sampled ones the same batched as alone, and /metrics counts the rounds.
TEST(ServeCli, DraftingServerAnswersAsThePlainOneAndCountsItsRounds) {
  const std::vector<std::string> model = {"--model_path", test::fortune_demo_path(), "--max_seq_len", "256"};
  std::vector<std::string> drafting_flags = model;
  for (const char* flag : {"--draft_model", G4_FIXTURES_DIR "/assistant/hf", "--draft_tokens", "3"})
    drafting_flags.push_back(flag);
  test::ServeProcess plain(model), drafting(drafting_flags);
  ASSERT_GT(plain.port(), 0) << plain.log();
  ASSERT_GT(drafting.port(), 0) << drafting.log();
  for (bool stream : {false, true}) {
    const json body = {{"prompt", "The sea"}, {"max_tokens", 24}, {"temperature", 0}, {"stream", stream}};
    EXPECT_EQ(reply_of(drafting, "/v1/completions", body), reply_of(plain, "/v1/completions", body));
  }
  expect_batched_answers_alone(drafting, drafting);
  const std::string text = metrics_of(drafting);
  EXPECT_GT(metric(text, "g4_draft_rounds_total"), 0) << text;
  EXPECT_GT(metric(text, "g4_draft_tokens_total"), metric(text, "g4_draft_tokens_accepted_total")) << text;
  EXPECT_GE(metric(text, "g4_draft_tokens_per_round"), 1.0) << text;
  EXPECT_EQ(metrics_of(plain).find("g4_draft_rounds_total"), std::string::npos) << "a plain server drafts nothing";
  EXPECT_EQ(drafting.stop(), 0) << drafting.log();
}

TEST(ServeCli, SplitServerFreesEveryRanksSessionWhenTheClientLeaves) {
  test::ServeProcess two({"--max_seq_len", "256", "--tp", "2"});
  ASSERT_GT(two.port(), 0) << two.log();
  const std::string running1 = "g4_rank_running_sequences{rank=\"1\"}", kv1 = "g4_rank_kv_bytes_in_use{rank=\"1\"}";
  httplib::Client c = two.client();
  httplib::Request request = long_streamed_completion();
  double running_on_rank1 = 0;
  request.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
    // While the stream runs, rank 1 runs the same sequence (it reports after its step).
    for (int i = 0; i < 500 && running_on_rank1 == 0; ++i) {
      running_on_rank1 = metric(metrics_of(two), running1);
      if (running_on_rank1 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;  // then the client hangs up
  };
  c.send(request);
  EXPECT_EQ(running_on_rank1, 1);
  std::string text;
  for (int i = 0; i < 500; ++i) {
    text = metrics_of(two);
    if (metric(text, "g4_running_sequences") == 0 && metric(text, running1) == 0 && metric(text, kv1) == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(metric(text, "g4_running_sequences"), 0) << text;
  EXPECT_EQ(metric(text, "g4_kv_bytes_in_use"), 0) << text;
  EXPECT_EQ(metric(text, running1), 0) << text;
  EXPECT_EQ(metric(text, kv1), 0) << text;
  EXPECT_EQ(metric(text, "g4_rank_kv_bytes_in_use{rank=\"0\"}"), 0) << text;
  EXPECT_EQ(two.stop(), 0) << two.log();
}

TEST(ServeCli, ASplitTheModelCannotTakeIsAClearError) {
  test::ServeProcess four({"--tp", "4"});  // the demo's Q4_K blocks do not fall on a quarter of its MLP
  EXPECT_EQ(four.port(), 0);
  EXPECT_EQ(four.stop(0), 1) << four.log();
  EXPECT_NE(four.log().find("cannot be split"), std::string::npos) << four.log();
}

// Rank 1 dies as the first request reaches it: the request fails naming it, the worker stops
// (failure()), rank 0's hook runs (g4 serve's stops the server) and the run reports rank 1's own
// error — no rank waits.
TEST(ServeSplit, AFailingRankFailsTheRequestAndStopsRankZero) {
  const serve::WorkerOptions wo{2, 4};
  EngineOptions split = serve::EngineWorker::engine_options(test::demo_serve_options(256), wo);
  split.tp = 2;
  ScheduledRanks ranks(2);
  std::string hooked, request_failure, worker_failure;
  const std::string error = test::error_of([&] {
    run_with_inputs<SchedulerInputs>(split, ranks.inputs, [&](Engine& engine) {
      if (engine.tp_rank() == 1) {
        ranks.inputs.next(1);
        throw Error("simulated failure on rank 1");
      }
      ranks.inputs.on_abort([&](const std::string& what) { hooked = what; });
      serve::EngineWorker worker(engine, wo, ranks);
      SchedulerRequest request;
      request.prompt = {2, 9, 10, 11};
      request.max_new_tokens = 8;
      const std::shared_ptr<serve::RequestChannel> channel = worker.submit(request);
      ASSERT_TRUE(channel);
      EXPECT_EQ(channel->wait_admitted(), std::nullopt);
      // The step never ends on rank 0 (rank 1 is gone): no token comes, only the failure.
      EXPECT_TRUE(channel->take().empty());
      ASSERT_TRUE(channel->failure());
      request_failure = channel->failure()->what();
      EXPECT_EQ(channel->failure()->kind(), ErrorKind::kPeerFailure);
      for (int i = 0; i < 500 && worker.failure().empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      worker_failure = worker.failure();
      EXPECT_EQ(test::error_kind_of([&] { worker.submit(request); }), ErrorKind::kUnavailable)
          << "a failed split worker takes no more requests";
    });
  });
  EXPECT_EQ(error, "simulated failure on rank 1");
  EXPECT_EQ(request_failure, "the engine failed: tensor parallel: rank 1 failed: simulated failure on rank 1");
  EXPECT_EQ(worker_failure, "tensor parallel: rank 1 failed: simulated failure on rank 1");
  EXPECT_EQ(hooked, "simulated failure on rank 1");
}

// A request whose logits hold a NaN fails alone — whole, HTTP 500 with the OpenAI error
// body; streamed (the headers are out), an error event, then [DONE] — while a request running
// beside it answers as it does alone. The fault is real: the request's prompt holds a token whose
// embedding row is NaN (test::nan_embedding_demo_path).
TEST(ServeNan, ANanRequestFailsAloneWholeAndStreamed) {
  constexpr int32_t kPoisoned = 4095;
  test::RunningServer running(kContext, {.max_sessions = 2, .max_waiting = 2}, serve::ServerOptions{},
                              test::nan_embedding_demo_path(kPoisoned));
  const json poisoned = {{"prompt", "Overfiend>"}, {"max_tokens", 8}, {"temperature", 0}};
  const std::vector<int32_t> ids = encode_prompt(running.tokenizer(), "Overfiend>", /*raw_prompt=*/true, 2);
  ASSERT_NE(std::find(ids.begin(), ids.end(), kPoisoned), ids.end()) << "the prompt holds the poisoned token";
  const json good = {{"prompt", "Once upon a time"}, {"max_tokens", 48}, {"temperature", 0.8}, {"seed", 5}};
  httplib::Client c = test::loopback_client(running.port());
  auto post = [&](const json& body) { return c.Post("/v1/completions", body.dump(), "application/json"); };
  const httplib::Result alone = post(good);
  ASSERT_TRUE(alone && alone->status == 200);
  const json nan_error = {{"error",
                           {{"message", "model produced NaN logits"},
                            {"type", "server_error"},
                            {"param", nullptr},
                            {"code", nullptr}}}};
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "whole");
    json beside;
    std::thread good_request([&] {
      httplib::Client other = test::loopback_client(running.port());
      const httplib::Result r = other.Post("/v1/completions", good.dump(), "application/json");
      beside = r && r->status == 200 ? json::parse(r->body) : json();
    });
    json body = poisoned;
    body["stream"] = stream;
    const httplib::Result failed = post(body);
    good_request.join();
    EXPECT_EQ(beside["choices"], json::parse(alone->body)["choices"]) << "the request beside it answers as alone";
    ASSERT_TRUE(failed);
    if (!stream) {
      EXPECT_EQ(failed->status, 500);
      EXPECT_EQ(json::parse(failed->body), nan_error);
      continue;
    }
    EXPECT_EQ(failed->status, 200) << "the headers went out before the failure";
    const std::vector<std::string> events = sse_payloads(failed->body);
    ASSERT_EQ(events.size(), 2u) << failed->body;
    EXPECT_EQ(json::parse(events[0]), nan_error);
    EXPECT_EQ(events[1], "[DONE]");
  }
  const serve::EngineGauges gauges = running.worker().gauges();
  EXPECT_EQ(gauges.running, 0u);
  EXPECT_EQ(gauges.kv_bytes_in_use, 0u) << "the failed requests' KV memory came back";
}

// ---- ReplyText, on byte-fallback tokens (one byte each) ----

std::vector<int32_t> byte_ids(const Tokenizer& tokenizer, const std::string& bytes) {
  std::vector<int32_t> ids;
  for (unsigned char b : bytes) {
    char piece[8];
    std::snprintf(piece, sizeof piece, "<0x%02X>", b);
    const std::optional<int32_t> id = tokenizer.token_id(piece);
    EXPECT_TRUE(id) << piece;
    ids.push_back(id.value_or(0));
  }
  return ids;
}

TEST_F(Serve, ReplyTextNeverSplitsACharacter) {
  serve::ReplyText text(*tokenizer_, {});
  std::vector<std::string> pieces;
  for (int32_t id : byte_ids(*tokenizer_, "a\xE2\x98\x83" "b")) pieces.push_back(text.push(id).content);  // a☃b
  EXPECT_EQ(pieces, (std::vector<std::string>{"a", "", "", "\xE2\x98\x83", "b"}));
  EXPECT_EQ(text.finish().content, "");
}

TEST_F(Serve, ReplyTextHoldsBackAPartialStopString) {
  serve::ReplyText cut(*tokenizer_, {"XYZ"});
  std::string sent;
  for (int32_t id : byte_ids(*tokenizer_, "abXY")) sent += cut.push(id).content;
  EXPECT_EQ(sent, "ab") << "XY may begin the stop string";
  EXPECT_EQ(cut.push(byte_ids(*tokenizer_, "Z")[0]).content, "");
  EXPECT_TRUE(cut.stopped());
  EXPECT_EQ(cut.push(byte_ids(*tokenizer_, "q")[0]).content, "") << "nothing after the stop string";

  serve::ReplyText released(*tokenizer_, {"XYZ"});
  sent.clear();
  for (int32_t id : byte_ids(*tokenizer_, "abXYq")) sent += released.push(id).content;
  EXPECT_EQ(sent, "abXYq") << "XYq cannot begin the stop string: all of it goes";
  EXPECT_FALSE(released.stopped());

  serve::ReplyText ended(*tokenizer_, {"XYZ"});
  sent.clear();
  for (int32_t id : byte_ids(*tokenizer_, "abX")) sent += ended.push(id).content;
  EXPECT_EQ(sent + ended.finish().content, "abX") << "at the end a partial match is plain text";
}

}  // namespace
}  // namespace g4
