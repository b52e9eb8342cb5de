// Constrained replies through g4 serve (docs/DESIGN.md §4 "Constrained decoding", §8): seeded
// requests of the embedded demo, whole and streamed, with response_format json_object and
// json_schema (valid against their schema, valijson), and with tool_choice "required" (a call of a
// declared function, its arguments valid against that function's parameters) or naming a function
// (a call of that one, never the other). A schema outside the subset is a 400 naming the field.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/server.h"
#include "support/build_kind.h"
#include "support/grammar_oracle.h"
#include "support/running_server.h"

namespace g4 {
namespace {

using nlohmann::json;

constexpr int64_t kContext = 256;
const std::vector<int32_t> kStopIds = {1, 106, 50};

const json kWeatherParameters = {{"type", "object"},
                                 {"properties",
                                  {{"city", {{"type", "string"}, {"description", "The city"}}},
                                   {"unit", {{"enum", {"celsius", "fahrenheit"}}}}}},
                                 {"required", {"city"}},
                                 {"additionalProperties", false}};
const json kTimeParameters = {{"type", "object"},
                              {"properties", {{"zone", {{"type", "string"}, {"maxLength", 20}}}, {"hour24", {{"type", "boolean"}}}}},
                              {"required", {"zone"}},
                              {"additionalProperties", false}};
const json kTools = json::array({{{"type", "function"},
                                  {"function", {{"name", "get_weather"}, {"description", "The weather in a city"}, {"parameters", kWeatherParameters}}}},
                                 {{"type", "function"},
                                  {"function", {{"name", "get_time"}, {"description", "The time in a time zone"}, {"parameters", kTimeParameters}}}}});

const char* const kSchemas[] = {
    R"({"type":"object","properties":{"answer":{"type":"string","maxLength":16},"confidence":{"type":"number"},
        "sources":{"type":"array","items":{"type":"integer"},"maxItems":3}},"required":["answer"],"additionalProperties":false})",
    R"({"type":"array","items":{"enum":["yes","no",1,null]},"minItems":1,"maxItems":4})",
    R"({"type":"object","properties":{"name":{"type":"string"},"tags":{"type":"array","items":{"type":"string"}}},
        "required":["name","tags"]})",
};

class ServeConstrained : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    serve::ServerOptions so;
    so.stop_ids = kStopIds;
    running_ = new test::RunningServer(kContext, {.max_sessions = 16, .max_waiting = 64}, so);
  }
  static void TearDownTestSuite() { delete running_; }
  static inline test::RunningServer* running_ = nullptr;
};

// One request and what its reply must be.
struct Case {
  json body;
  std::string schema;        // response_format: the reply's content is JSON valid against it
  std::string forced;        // tool_choice: "*" any declared function, else that one
};

Case make_case(int i) {
  json body = {{"messages", {{{"role", "user"}, {"content", "Request number " + std::to_string(i) + ", please answer."}}}},
               {"max_tokens", 64},
               {"seed", 500 + i},
               {"temperature", i % 7 == 0 ? 0.0 : 1.2},
               {"stream", i % 2 == 1}};
  Case c;
  switch (i % 6) {
    case 0:
      c.schema = R"({"type":"object"})";
      body["response_format"] = {{"type", "json_object"}};
      break;
    case 1: case 2: case 3:
      c.schema = kSchemas[i % 6 - 1];
      body["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "reply"}, {"schema", json::parse(c.schema)}, {"strict", true}}}};
      break;
    case 4:
      c.forced = "*";
      body["tools"] = kTools;
      body["tool_choice"] = "required";
      break;
    default:
      c.forced = "get_time";
      body["tools"] = kTools;
      body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_time"}}}};
  }
  c.body = body;
  return c;
}

// The reply's content, tool calls and finish reason, whole or assembled from the stream.
struct Reply {
  std::string content, finish;
  std::map<size_t, json> calls;  // by index: {"name", "arguments"}
};

Reply ask(httplib::Client& client, const json& body) {
  httplib::Result r = client.Post("/v1/chat/completions", body.dump(), "application/json");
  Reply out;
  EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no answer");
  if (!r || r->status != 200) return out;
  if (!body["stream"].get<bool>()) {
    const json answer = json::parse(r->body);
    const json& choice = answer["choices"][0];
    out.finish = choice["finish_reason"];
    if (choice["message"]["content"].is_string()) out.content = choice["message"]["content"];
    if (choice["message"].contains("tool_calls"))
      for (size_t k = 0; k < choice["message"]["tool_calls"].size(); ++k)
        out.calls[k] = choice["message"]["tool_calls"][k]["function"];
    return out;
  }
  for (size_t at = 0; at < r->body.size();) {
    const size_t end = r->body.find("\n\n", at);
    const std::string data = r->body.substr(at + 6, end - at - 6);
    at = end + 2;
    if (data == "[DONE]") break;
    const json chunk = json::parse(data);
    if (!chunk.contains("choices") || !chunk["choices"].is_array() || chunk["choices"].empty()) {
      ADD_FAILURE() << "a stream event without a choice: " << data;
      break;
    }
    const json& choice = chunk["choices"][0];
    const json& delta = choice["delta"];
    if (delta.contains("content") && delta["content"].is_string()) out.content += delta["content"].get<std::string>();
    if (delta.contains("tool_calls"))
      for (const json& call : delta["tool_calls"]) {
        json& mine = out.calls[call["index"].get<size_t>()];
        if (call["function"].contains("name")) mine["name"] = call["function"]["name"];
        mine["arguments"] = mine.value("arguments", "") + call["function"].value("arguments", "");
      }
    if (!choice["finish_reason"].is_null()) out.finish = choice["finish_reason"];
  }
  return out;
}

void check(const Case& c, const Reply& reply, int i) {
  SCOPED_TRACE("request " + std::to_string(i) + ": " + c.body.dump());
  if (!c.schema.empty()) {
    EXPECT_TRUE(reply.calls.empty());
    if (reply.finish == "stop") test::expect_valid_json(c.schema, reply.content);
    else EXPECT_EQ(reply.finish, "length");
    return;
  }
  if (reply.finish == "length") return;  // cut inside a call: nothing to check but that it is no other text
  EXPECT_EQ(reply.finish, "tool_calls");
  EXPECT_EQ(reply.content, "");
  ASSERT_FALSE(reply.calls.empty());
  for (const auto& [index, call] : reply.calls) {
    const std::string name = call["name"];
    if (c.forced != "*") EXPECT_EQ(name, c.forced);
    ASSERT_TRUE(name == "get_weather" || name == "get_time") << name;
    test::expect_valid_json((name == "get_weather" ? kWeatherParameters : kTimeParameters).dump(),
                            call["arguments"].get<std::string>());
  }
}

// 420 replies; 60 under the sanitizers, which check memory, not statistics.
TEST_F(ServeConstrained, RepliesHoldTheirSchemasAndForcedCalls) {
  constexpr int kRequests = test::kSanitizerBuild ? 60 : 420, kClients = 12;
  std::atomic<int> next{0};
  std::mutex mutex;
  std::map<std::string, int> finished;  // by kind: replies that ended by their grammar
  std::vector<std::thread> clients;
  for (int k = 0; k < kClients; ++k)
    clients.emplace_back([&] {
      httplib::Client client = test::loopback_client(running_->port());
      for (int i; (i = next++) < kRequests;) {
        const Case c = make_case(i);
        const Reply reply = ask(client, c.body);
        std::lock_guard lock(mutex);
        check(c, reply, i);
        if (reply.finish != "length") ++finished[c.schema.empty() ? "calls" : "json"];
      }
    });
  for (std::thread& t : clients) t.join();
  std::printf("%d constrained replies: %d JSON and %d calls ended by their grammar\n", kRequests, finished["json"],
              finished["calls"]);
  EXPECT_GE(finished["json"], kRequests / 3 / 2);
  EXPECT_GE(finished["calls"], kRequests / 3 / 2);
}

TEST_F(ServeConstrained, SchemasOutsideTheSubsetAre400sNamingTheField) {
  httplib::Client client = test::loopback_client(running_->port());
  auto error = [&](const json& extra) {
    json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 4}};
    body.update(extra);
    httplib::Result r = client.Post("/v1/chat/completions", body.dump(), "application/json");
    EXPECT_TRUE(r && r->status == 400) << (r ? r->body : "no answer");
    return r ? json::parse(r->body)["error"] : json();
  };
  const json pattern_schema = {{"type", "string"}, {"pattern", "^a+$"}};
  const json response_format = {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", pattern_schema}}}};
  const json pattern = error({{"response_format", response_format}});
  EXPECT_EQ(pattern["param"], "response_format");
  EXPECT_EQ(pattern["code"], "unsupported_parameter");
  EXPECT_NE(pattern["message"].get<std::string>().find("pattern"), std::string::npos) << pattern.dump();
  json tools = kTools;
  tools[0]["function"]["parameters"]["properties"]["city"]["format"] = "uri";
  const json format = error({{"tools", tools}, {"tool_choice", "required"}});
  EXPECT_EQ(format["param"], "tools");
  EXPECT_NE(format["message"].get<std::string>().find("format"), std::string::npos) << format.dump();
}

}  // namespace
}  // namespace g4
