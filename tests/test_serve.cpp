// g4 serve (docs/DESIGN.md §8): the server runs in-process on a free port over the demo model and
// is driven with httplib's client: the routes, a chat completion equal to what g4 run generates,
// streaming equal to the whole answer, stop strings, concurrent requests equal to each alone, the
// API key, and a 400 naming the field for each kind of bad input. ReplyText's hold-back rules
// (whole UTF-8 characters, partial stop strings) are tested on byte tokens.
#include <gtest/gtest.h>
#include <httplib.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/engine.h"
#include "runtime/generator.h"
#include "serve/engine_worker.h"
#include "serve/reply_text.h"
#include "serve/server.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace g4 {
namespace {

using nlohmann::json;

const std::string kDemo = std::string(G4_SOURCE_DIR) + "/models/demo.gguf";
constexpr int64_t kContext = 96;
const std::string kKey = "test-key";
const std::vector<int32_t> kStopIds = {1, 106, 50};

EngineOptions demo_options() {
  EngineOptions o;
  o.model_path = kDemo;
  o.max_seq_len = kContext;
  return o;
}

// One server for the whole suite (loading is the slow part).
class Serve : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    serve::ServerOptions so;
    so.api_key = kKey;
    so.stop_ids = kStopIds;
    worker_ = new serve::EngineWorker(demo_options(), {.max_sessions = 2, .max_waiting = 8}, [&](Engine& engine) {
      tokenizer_ = new Tokenizer(Tokenizer::from_json(*engine.tokenizer_json()));
    });
    server_ = new serve::Server(*worker_, *tokenizer_, so);
    port_ = server_->bind("127.0.0.1", 0);
    thread_ = new std::thread([] { server_->listen(); });
    for (int i = 0; i < 200 && !client().Get("/health"); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  static void TearDownTestSuite() {
    server_->stop();
    thread_->join();
    delete thread_;
    delete server_;
    delete worker_;
    delete tokenizer_;
  }

  static httplib::Client client(bool with_key = true) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
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
  // The data: payloads of an SSE body, in order ("[DONE]" included).
  static std::vector<std::string> events(const std::string& path, const json& body) {
    httplib::Result r = client().Post(path, body.dump(), "application/json");
    EXPECT_TRUE(r && r->status == 200);
    std::vector<std::string> out;
    if (!r) return out;
    EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
    for (size_t at = 0; at < r->body.size();) {
      const size_t end = r->body.find("\n\n", at);
      EXPECT_NE(end, std::string::npos) << "an event without its blank line";
      if (end == std::string::npos) break;
      const std::string event = r->body.substr(at, end - at);
      EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
      out.push_back(event.substr(6));
      at = end + 2;
    }
    return out;
  }
  static json chat(const std::string& prompt, int64_t max_tokens) {
    return {{"model", "g4-demo"},
            {"messages", json::array({{{"role", "user"}, {"content", prompt}}})},
            {"max_tokens", max_tokens},
            {"temperature", 0}};
  }

  static inline serve::EngineWorker* worker_ = nullptr;
  static inline serve::Server* server_ = nullptr;
  static inline Tokenizer* tokenizer_ = nullptr;
  static inline std::thread* thread_ = nullptr;
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

TEST_F(Serve, ClientDisconnectCancelsTheStream) {
  const uint64_t cancelled_before = worker_->cancelled();
  httplib::Client c = client();
  httplib::Request request;
  request.method = "POST";
  request.path = "/v1/completions";
  request.headers = {{"Content-Type", "application/json"}};
  // Greedy, max_tokens left to the context's room: a long reply that only a cancel ends early.
  request.body = json{{"prompt", "Once upon a time"}, {"temperature", 0}, {"stream", true}}.dump();
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

TEST_F(Serve, AFullQueueIsBusy) {
  // One session, no queue: while a request runs, the next is refused at once.
  serve::EngineWorker worker(demo_options(), {.max_sessions = 1, .max_waiting = 0});
  serve::ServerOptions so;
  so.stop_ids = {};  // the first request runs to its max_new_tokens
  serve::Server server(worker, *tokenizer_, so);
  const int port = server.bind("127.0.0.1", 0);
  std::thread listening([&] { server.listen(); });
  SchedulerRequest running;
  running.prompt = {2, 17, 30};
  running.sampling = SamplingParams{.temperature = 0.0f};
  running.max_new_tokens = kContext - 4;
  running.stop_ids = {};
  const std::shared_ptr<serve::RequestChannel> first = worker.submit(running);
  ASSERT_TRUE(first);
  EXPECT_FALSE(worker.submit(running)) << "a second request with no room must be refused";
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  // (The socket listens from bind() on: a request before listen() waits in the backlog.)
  const httplib::Result busy = c.Post("/v1/completions", json{{"prompt", "hi"}}.dump(), "application/json");
  ASSERT_TRUE(busy);
  EXPECT_EQ(busy->status, 503) << busy->body;
  EXPECT_EQ(json::parse(busy->body)["error"]["type"], "server_busy");
  // Once the first request has ended, there is room again.
  EXPECT_FALSE(first->wait_admitted());
  for (bool last = false; !last;)
    for (const DecodedToken& t : first->take()) last = last || t.last();
  // (The count drops before the last token goes out, so the room is there at once.)
  const httplib::Result next = c.Post("/v1/completions", json{{"prompt", "hi"}, {"max_tokens", 2}}.dump(), "application/json");
  ASSERT_TRUE(next);
  EXPECT_EQ(next->status, 200) << next->body;
  server.stop();
  listening.join();
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
  for (int i = 0; i < 200; ++i) long_prompt += "word" + std::to_string(i) + " ";
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
      {"/v1/chat/completions", json{{"messages", user}, {"n", 2}}.dump(), "n"},
      {"/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", long_prompt}}}}}.dump(), "messages"},
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
  for (int32_t id : byte_ids(*tokenizer_, "a\xE2\x98\x83" "b")) pieces.push_back(text.push(id));  // a☃b
  EXPECT_EQ(pieces, (std::vector<std::string>{"a", "", "", "\xE2\x98\x83", "b"}));
  EXPECT_EQ(text.finish(), "");
}

TEST_F(Serve, ReplyTextHoldsBackAPartialStopString) {
  serve::ReplyText cut(*tokenizer_, {"XYZ"});
  std::string sent;
  for (int32_t id : byte_ids(*tokenizer_, "abXY")) sent += cut.push(id);
  EXPECT_EQ(sent, "ab") << "XY may begin the stop string";
  EXPECT_EQ(cut.push(byte_ids(*tokenizer_, "Z")[0]), "");
  EXPECT_TRUE(cut.stopped());
  EXPECT_EQ(cut.push(byte_ids(*tokenizer_, "q")[0]), "") << "nothing after the stop string";

  serve::ReplyText released(*tokenizer_, {"XYZ"});
  sent.clear();
  for (int32_t id : byte_ids(*tokenizer_, "abXYq")) sent += released.push(id);
  EXPECT_EQ(sent, "abXYq") << "XYq cannot begin the stop string: all of it goes";
  EXPECT_FALSE(released.stopped());

  serve::ReplyText ended(*tokenizer_, {"XYZ"});
  sent.clear();
  for (int32_t id : byte_ids(*tokenizer_, "abX")) sent += ended.push(id);
  EXPECT_EQ(sent + ended.finish(), "abX") << "at the end a partial match is plain text";
}

}  // namespace
}  // namespace g4
