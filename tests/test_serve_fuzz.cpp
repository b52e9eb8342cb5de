// Fuzzing of what g4 serve reads from the outside (docs/DESIGN.md §8), in the house style of
// test_fuzz.cpp (seeded, fixed run counts; G4_FUZZ_RUNS / G4_FUZZ_SEED for long runs):
// - request bodies (valid requests mutated as JSON and as bytes, and hand-made nasties: malformed
//   JSON, wrong types, huge numbers, deep nesting, invalid UTF-8), parsed and rendered in process
//   and posted to a running server: always a 4xx or a well-formed answer, never a crash or a 5xx;
// - raw HTTP bytes (valid requests mutated as bytes: request lines, headers, lengths, bodies) sent
//   over a socket: always a well-formed HTTP answer other than a 5xx, or a closed connection;
// - the tool-call parser and the incremental output parser on mutated calls and random text: no
//   crash, arguments that are valid JSON objects, and the same result however the text is split.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>

#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/openai_api.h"
#include "support/fuzz.h"
#include "support/running_server.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/gemma4_output_parser.h"
#include "util/error.h"

namespace g4 {
namespace {

using nlohmann::json;

const json kTools = json::array({{{"type", "function"},
                                  {"function",
                                   {{"name", "get_weather"},
                                    {"parameters",
                                     {{"type", "object"},
                                      {"properties", {{"city", {{"type", "string"}}}, {"days", {{"type", "integer"}}}}},
                                      {"required", {"city"}}}}}}}});

// Valid requests that reach every part of the parser.
std::vector<std::pair<std::string, json>> seed_requests() {
  const json conversation = json::array(
      {{{"role", "system"}, {"content", "Be brief."}},
       {{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "Weather?"}}})}},
       {{"role", "assistant"},
        {"content", nullptr},
        {"reasoning_content", "Use the tool."},
        {"tool_calls",
         {{{"id", "c1"}, {"type", "function"}, {"function", {{"name", "get_weather"}, {"arguments", "{\"city\":\"Oslo\"}"}}}}}}},
       {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "{\"temp\": -3}"}}});
  return {
      {"/v1/chat/completions",
       {{"model", "g4-demo"}, {"messages", conversation}, {"tools", kTools}, {"tool_choice", "auto"},
        {"max_tokens", 3}, {"temperature", 0.7}, {"top_p", 0.9}, {"top_k", 20}, {"min_p", 0.05}, {"seed", 7},
        {"stop", {"\n", "zz"}}, {"logprobs", true}, {"top_logprobs", 2}, {"chat_template_kwargs", {{"enable_thinking", true}}},
        {"n", 1}}},
      {"/v1/chat/completions",
       {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2}, {"stream", true},
        {"stream_options", {{"include_usage", true}}}}},
      {"/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 3}, {"logprobs", 3}, {"stop", "e"}, {"seed", 1}}},
  };
}

// Inputs no mutation is likely to reach.
std::vector<std::pair<std::string, std::string>> nasty_requests() {
  const std::string deep_array = std::string(100000, '[') + std::string(100000, ']');
  const std::string deep_object = [] {
    std::string s;
    for (int i = 0; i < 20000; ++i) s += "{\"a\":";
    return s + "1" + std::string(20000, '}');
  }();
  const std::string chat = "/v1/chat/completions";
  return {
      {chat, ""},
      {chat, "{"},
      {chat, "null"},
      {chat, "{\"messages\": " + deep_array + "}"},
      {chat, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": " + deep_array + "}"},
      {chat, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"chat_template_kwargs\": " + deep_object + "}"},
      {chat, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 1e400}"},
      {chat, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 123456789012345678901234567890}"},
      {chat, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"seed\": 18446744073709551616}"},
      {chat, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"temperature\": -0.0, \"max_tokens\": 1}"},
      {chat, "{\"messages\": [{\"role\": \"user\", \"content\": \"h\xC3\x28i\"}], \"max_tokens\": 1}"},
      {chat, "{\"messages\": [{\"role\": \"user\", \"content\": \"\\ud800\"}], \"max_tokens\": 1}"},
      {chat, "{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": \"" +
                 std::string(5000, '[') + "\"}}]}, {\"role\": \"tool\", \"content\": \"" + std::string(5000, '{') +
                 "\"}], \"max_tokens\": 1}"},
      {chat, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": [{\"type\": \"function\", \"function\": "
             "{\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"properties\": " + deep_object + "}}}], \"max_tokens\": 1}"},
      {"/v1/completions", "{\"prompt\": \"\xFF\xFE\", \"max_tokens\": 1}"},
      {"/v1/completions", "{\"prompt\": [1, 2, 3]}"},
  };
}

// Parses and renders a body as the server does; anything but success or an ApiError (4xx) or a
// g4::Error (the server's 400) is a defect.
void parse_and_render(const std::string& path, const std::string& body, const Tokenizer& tokenizer) {
  const serve::Endpoint endpoint = path == "/v1/completions" ? serve::Endpoint::kCompletion : serve::Endpoint::kChat;
  try {
    const serve::CompletionRequest r = serve::parse_completion_request(body, endpoint);
    if (endpoint == serve::Endpoint::kChat) tokenizer.encode(format_gemma4_chat(r.messages, r.chat), true);
  } catch (const serve::ApiError& e) {
    EXPECT_GE(e.status, 400);
    EXPECT_LT(e.status, 500) << e.what();
  } catch (const Error&) {
  }
}

// Posts a body; the answer must be a 4xx with an OpenAI error body or a 200 with a well-formed one.
void post_and_check(httplib::Client& client, const std::string& path, const std::string& body) {
  const httplib::Result r = client.Post(path, body, "application/json");
  ASSERT_TRUE(r) << "no answer (the server died?) to " << body.substr(0, 200);
  ASSERT_TRUE(r->status == 200 || (r->status >= 400 && r->status < 500)) << r->status << " " << r->body;
  if (r->status != 200) {
    const json error = json::parse(r->body, nullptr, false);
    ASSERT_FALSE(error.is_discarded()) << r->body;
    EXPECT_TRUE(error["error"]["message"].is_string()) << r->body;
    return;
  }
  if (r->get_header_value("Content-Type") == "text/event-stream") {
    EXPECT_NE(r->body.find("data: [DONE]"), std::string::npos) << r->body;
    return;
  }
  const json answer = json::parse(r->body, nullptr, false);
  ASSERT_FALSE(answer.is_discarded()) << r->body;
  EXPECT_EQ(answer["choices"].size(), 1u) << r->body;
}

TEST(ServeFuzz, RequestBodiesGetA4xxOrAWellFormedAnswer) {
  serve::ServerOptions so;
  so.stop_ids = {1, 106, 50};
  so.max_body_bytes = 1 << 20;
  test::RunningServer server(256, {.max_sessions = 2, .max_waiting = 16}, so);
  httplib::Client client = test::loopback_client(server.port());
  for (const auto& [path, body] : nasty_requests()) {
    SCOPED_TRACE(body.substr(0, 160));
    parse_and_render(path, body, server.tokenizer());
    post_and_check(client, path, body);
  }
  test::Mutator mutator(test::fuzz_seed(17));
  const std::vector<std::pair<std::string, json>> seeds = seed_requests();
  const uint64_t runs = test::fuzz_runs(400);
  for (uint64_t run = 0; run < runs; ++run) {
    const auto& [path, seed] = seeds[mutator.pick(seeds.size())];
    json doc = seed;
    mutator.mutate_json(doc);
    std::string body = doc.dump(-1, ' ', false, json::error_handler_t::replace);
    if (run % 3 == 0) {  // bytes too: broken syntax, invalid UTF-8
      std::vector<uint8_t> bytes(body.begin(), body.end());
      mutator.mutate_bytes(bytes);
      body.assign(bytes.begin(), bytes.end());
    }
    SCOPED_TRACE("run " + std::to_string(run) + ": " + body.substr(0, 300));
    parse_and_render(path, body, server.tokenizer());
    if (run % 4 == 0) post_and_check(client, path, body);  // a quarter go over HTTP (generation is the slow part)
  }
  // Still serving, and nothing left running.
  post_and_check(client, "/v1/completions", json{{"prompt", "hi"}, {"max_tokens", 2}}.dump());
}

// Whether `answer` holds a whole HTTP response: its head, then Content-Length bytes or every chunk.
bool whole_response(const std::string& answer) {
  const size_t head_end = answer.find("\r\n\r\n");
  if (head_end == std::string::npos) return false;
  std::string head = answer.substr(0, head_end);
  std::transform(head.begin(), head.end(), head.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (head.find("transfer-encoding: chunked") != std::string::npos)
    return answer.find("\r\n0\r\n\r\n", head_end) != std::string::npos;
  const size_t length = head.find("content-length: ");
  return length != std::string::npos && answer.size() >= head_end + 4 + std::stoul(head.substr(length + 16));
}

// Sends `bytes` on a new loopback connection to `port` and returns what the server wrote: its
// first whole response, or all it wrote before it closed (waiting at most 30 s in all).
std::string exchange_raw(int port, const std::string& bytes) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(uint16_t(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string answer;
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) {
    send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    char buffer[4096];
    while (std::chrono::steady_clock::now() < deadline && !whole_response(answer)) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 1000) <= 0) continue;
      const ssize_t n = recv(fd, buffer, sizeof buffer, 0);
      if (n <= 0) break;
      answer.append(buffer, size_t(n));
    }
  }
  close(fd);
  return answer;
}

std::vector<std::string> seed_raw_requests() {
  const std::string body = json{{"prompt", "Once"}, {"max_tokens", 2}, {"temperature", 0}}.dump();
  const std::string chat =
      json{{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 2}, {"stream", true}}.dump();
  auto post = [](const std::string& path, const std::string& b) {
    return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
           std::to_string(b.size()) + "\r\n\r\n" + b;
  };
  return {"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
          "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
          "GET /v1/models HTTP/1.0\r\n\r\n",
          post("/v1/completions", body),
          post("/v1/chat/completions", chat),
          "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
              [&] {
                std::ostringstream hex;
                hex << std::hex << body.size();
                return hex.str();
              }() +
              "\r\n" + body + "\r\n0\r\n\r\n",
          post("/v1/completions", body) + "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"};
}

// Raw bytes on the wire: httplib's request-line, header, length and chunk parsing, then the routes.
TEST(ServeFuzz, RawHttpBytesGetAWellFormedAnswerOrAClose) {
  serve::ServerOptions so;
  so.stop_ids = {1, 106, 50};
  so.max_body_bytes = 64 << 10;
  so.request_deadline = std::chrono::milliseconds(100);  // a request cut short is closed soon
  test::RunningServer server(256, {.max_sessions = 2, .max_waiting = 16}, so);
  test::Mutator mutator(test::fuzz_seed(19));
  const std::vector<std::string> seeds = seed_raw_requests();
  const uint64_t runs = test::fuzz_runs(150);
  for (uint64_t run = 0; run < runs; ++run) {
    std::string request = seeds[run < seeds.size() ? run : mutator.pick(seeds.size())];
    if (run >= seeds.size()) {
      std::vector<uint8_t> bytes(request.begin(), request.end());
      mutator.mutate_bytes(bytes);
      request.assign(bytes.begin(), bytes.end());
    }
    SCOPED_TRACE("run " + std::to_string(run) + ": " + request.substr(0, 200));
    const std::string answer = exchange_raw(server.port(), request);
    if (answer.empty() && run >= seeds.size()) continue;  // closed without an answer: bytes that are no request
    ASSERT_EQ(answer.rfind("HTTP/1.1 ", 0), 0u) << answer.substr(0, 200);
    const int status = std::atoi(answer.substr(9, 3).c_str());
    EXPECT_TRUE(status >= 200 && status < 500) << answer.substr(0, 300);
    if (run < seeds.size()) EXPECT_EQ(status, 200) << answer.substr(0, 200);
  }
  httplib::Client client = test::loopback_client(server.port());
  const httplib::Result health = client.Get("/health");
  EXPECT_TRUE(health && health->status == 200);
}

// A well-formed call body in Gemma's syntax with random values (the chat format's own writer).
json random_value(test::Mutator& m, int depth) {
  switch (m.pick(depth < 3 ? 7 : 5)) {
    case 0: return std::string("s") + std::to_string(m.next() % 1000) + (m.pick(2) ? " <|\"|" : " {x:[1]}");
    case 1: return int64_t(m.next() % 2000001) - 1000000;
    case 2: return double(m.next() % 100000) / 7.0;
    case 3: return m.pick(2) == 0;
    case 4: return nullptr;
    case 5: {
      json list = json::array();
      for (size_t i = m.pick(4); i > 0; --i) list.push_back(random_value(m, depth + 1));
      return list;
    }
    default: {
      json object = json::object();
      for (size_t i = m.pick(4); i > 0; --i) object["k" + std::to_string(m.pick(10))] = random_value(m, depth + 1);
      return object;
    }
  }
}

ParsedOutput parse_in_pieces(const std::string& text, size_t cut) {
  Gemma4OutputParser parser;
  ParsedOutput out = parser.push(text.substr(0, cut));
  out.append(parser.push(text.substr(cut)));
  out.append(parser.finish());
  return out;
}

// A body nested a million levels deep (5 MB: within a server's 8 MiB body limit) is a 400 before
// anything copies or renders it recursively, which would overflow a handler thread's stack; 64
// levels, as deep as a request may nest, still parse. Tool arguments and tool responses given as
// JSON text that nests deeper are kept as text.
TEST(ServeFuzz, NestingDeeperThan64LevelsIsA400NotARecursion) {
  auto nested = [](int levels) {
    std::string s;
    for (int i = 0; i < levels; ++i) s += "{\"a\":";
    return s + "1" + std::string(size_t(levels), '}');
  };
  auto with_kwargs = [](const std::string& value) {
    return "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"chat_template_kwargs\": " + value + "}";
  };
  try {
    serve::parse_completion_request(with_kwargs(nested(1000000)), serve::Endpoint::kChat);
    ADD_FAILURE() << "a body nested a million levels deep was accepted";
  } catch (const serve::ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(std::string(e.what()).find("nests deeper than 64 levels"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(serve::parse_completion_request(with_kwargs(nested(63)), serve::Endpoint::kChat));
  const std::string deep_text = nlohmann::json(nested(100000)).dump();
  const std::string body = "{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"c\", \"function\": "
                           "{\"name\": \"f\", \"arguments\": " + deep_text + "}}]}, {\"role\": \"tool\", "
                           "\"tool_call_id\": \"c\", \"content\": " + deep_text + "}]}";
  const serve::CompletionRequest r = serve::parse_completion_request(body, serve::Endpoint::kChat);
  EXPECT_EQ(r.messages.size(), 1u);
}

TEST(ServeFuzz, ToolCallParserNeverCrashesAndIsSplitInvariant) {
  test::Mutator mutator(test::fuzz_seed(18));
  const uint64_t runs = test::fuzz_runs(3000);
  int parsed = 0;
  for (uint64_t run = 0; run < runs; ++run) {
    json arguments = json::object();
    for (size_t i = mutator.pick(4); i > 0; --i) arguments["a" + std::to_string(i)] = random_value(mutator, 0);
    std::string body = "call:f" + std::to_string(run % 7) + format_gemma4_value(arguments, mutator.pick(2) == 0);
    std::vector<uint8_t> bytes(body.begin(), body.end());
    if (run % 2 == 1) mutator.mutate_bytes(bytes);
    body.assign(bytes.begin(), bytes.end());
    SCOPED_TRACE("run " + std::to_string(run) + ": " + body.substr(0, 300));
    if (const std::optional<ParsedToolCall> call = parse_gemma4_tool_call(body)) {
      ++parsed;
      ASSERT_TRUE(call->arguments.is_object());
      EXPECT_NO_THROW(call->arguments.dump()) << "arguments must be valid JSON (UTF-8 strings)";
      if (run % 2 == 0) EXPECT_EQ(call->arguments, arguments) << "an unmutated call reads back as written";
    } else {
      EXPECT_EQ(run % 2, 1u) << "an unmutated call must parse";
    }
    const std::string text = "a<|tool_call>" + body + "<tool_call|>b<|channel>thought\nc" + body.substr(body.size() / 2);
    const ParsedOutput whole = parse_in_pieces(text, text.size());
    const ParsedOutput split = parse_in_pieces(text, mutator.pick(text.size() + 1));
    EXPECT_EQ(whole.content, split.content);
    EXPECT_EQ(whole.reasoning, split.reasoning);
    EXPECT_EQ(whole.tool_calls.size(), split.tool_calls.size());
  }
  EXPECT_GT(parsed, int(runs / 3)) << "the fuzzer should mostly make calls that parse";
}

}  // namespace
}  // namespace g4
