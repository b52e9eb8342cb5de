// g4 serve driven by real clients over loopback (docs/DESIGN.md §8): the official `openai` npm
// client (pinned, installed once into the build tree's cache like @huggingface/jinja) runs
// tests/serve/openai_client.js against a server started here — the conformance checks, then a
// bounded load test (32 concurrent streaming clients, 500 requests, random parameters and hang-ups)
// after which every session must be free and the server's memory about where it was.
// No node, npm or network makes these tests fail with the npm error, never pass silently.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "support/npm_reference.h"
#include "support/running_server.h"

namespace g4 {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kOpenAiPackage = "openai@6.30.1";
const std::string kKey = "client-test-key";
constexpr int64_t kContext = 256;

fs::path cache_dir() { return fs::path(G4_CACHE_DIR) / "openai-client"; }
fs::path driver() { return fs::path(G4_SOURCE_DIR) / "tests" / "serve" / "openai_client.js"; }

fs::path node_modules() {
  const test::DirectoryLock lock(cache_dir());
  test::npm_install_pinned(cache_dir() / "npm", {kOpenAiPackage});
  return cache_dir() / "npm" / "node_modules";
}

// Runs the driver; returns its output (throws with the output's tail when it fails).
std::string run_driver(const test::RunningServer& server, const std::string& arguments, const std::string& log_name) {
  const fs::path modules = node_modules();
  const fs::path log = cache_dir() / log_name;
  test::run_or_throw("node '" + driver().string() + "' '" + modules.string() + "' '" + server.base_url() + "' '" + kKey +
                         "' " + arguments,
                     log, "the openai client (node " + driver().string() + " " + arguments + ")");
  return test::read_text_file(log);
}

serve::ServerOptions options() {
  serve::ServerOptions so;
  so.api_key = kKey;
  so.stop_ids = {1, 106, 50};
  so.max_body_bytes = 64 << 10;
  return so;
}

// The resident set of this process (the server runs in it), in bytes.
size_t resident_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmRSS:", 0) == 0) return size_t(std::stoull(line.substr(6))) * 1024;
  return 0;
}

double metric(const std::string& text, const std::string& name) {
  const size_t at = text.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::stod(text.substr(at + name.size() + 2));
}

TEST(OpenAiClient, ChatCompletionsToolsSeedsLogprobsAndErrors) {
  // Two sessions and two queue places: the driver's burst of 24 requests meets a full queue.
  test::RunningServer server(kContext, {.max_sessions = 2, .max_waiting = 2}, options());
  std::string transcript;
  ASSERT_NO_THROW(transcript = run_driver(server, "conformance", "conformance.log"));
  std::printf("%s", transcript.c_str());
  for (const char* check : {"chat:", "completions:", "tool round trip:", "seeds:", "choices:", "logprobs:", "errors:"})
    EXPECT_NE(transcript.find(check), std::string::npos) << check;
}

TEST(OpenAiClient, LoadOf32StreamingClientsFreesEverySession) {
  test::RunningServer server(kContext, {.max_sessions = 8, .max_waiting = 64}, options());
  httplib::Client c("127.0.0.1", server.port());
  c.set_bearer_token_auth(kKey);
  for (int i = 0; i < 8; ++i)  // the KV pool and the workspaces reach their working size
    c.Post("/v1/completions", json{{"prompt", "warm up"}, {"max_tokens", 8}}.dump(), "application/json");
  const size_t rss_before = resident_bytes();
  const auto start = std::chrono::steady_clock::now();
  std::string output;
  ASSERT_NO_THROW(output = run_driver(server, "load 32 500 20261201", "load.log"));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const json summary = json::parse(output.substr(output.rfind('{')));
  EXPECT_EQ(summary["failures"], 0) << summary.dump();
  EXPECT_EQ(summary["completed"].get<int>() + summary["abandoned"].get<int>(), 500) << summary.dump();
  EXPECT_GT(summary["abandoned"].get<int>(), 0) << "the load includes hang-ups";

  // Every session freed: nothing running or queued, no KV bytes held by live sequences.
  std::string metrics;
  for (int i = 0; i < 500; ++i) {
    metrics = c.Get("/metrics")->body;
    if (metric(metrics, "g4_running_sequences") == 0 && metric(metrics, "g4_queue_depth") == 0 &&
        metric(metrics, "g4_kv_bytes_in_use") == 0)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(metric(metrics, "g4_running_sequences"), 0) << metrics;
  EXPECT_EQ(metric(metrics, "g4_queue_depth"), 0);
  EXPECT_EQ(metric(metrics, "g4_kv_bytes_in_use"), 0);
  const size_t rss_after = resident_bytes();
  std::printf("load: %s in %.1f s; server RSS before %.1f MiB, after %.1f MiB; generated tokens %.0f\n",
              summary.dump().c_str(), seconds, double(rss_before) / (1 << 20), double(rss_after) / (1 << 20),
              metric(metrics, "g4_generated_tokens_total"));
  EXPECT_LT(double(rss_after), double(rss_before) + 64.0 * (1 << 20)) << "the server's memory grew under load";
}

}  // namespace
}  // namespace g4
