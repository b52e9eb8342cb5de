// g4 serve: an OpenAI-compatible HTTP server (docs/DESIGN.md §8). The generation flags of g4 run
// are the defaults of requests that leave a field out.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "commands.h"
#include "generation_flags.h"
#include "util/error.h"
#if G4_WITH_SERVER
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <thread>

#include "runtime/rank_inputs.h"
#include "serve/engine_worker.h"
#include "serve/server.h"
#endif

namespace g4::cli {

namespace {

struct ServeOptions {
  GenerationFlags gen;
  std::string host = "127.0.0.1", api_key;
  int port = 8080;
  int64_t max_sessions = 4, max_waiting = 64;
  int64_t max_body_bytes = 8 << 20;
  int64_t max_connections = 0;    // serve::ServerOptions::max_connections
  double request_timeout_s = 30;  // serve::ServerOptions::request_deadline
  double drain_timeout_s = 30;    // serve::ServerOptions::drain_deadline
  int64_t keep_alive_requests = 10000, keep_alive_timeout_s = 5;  // serve::ServerOptions::keep_alive_*
  bool batch_invariant = true;
};

#if G4_WITH_SERVER
// SIGINT and SIGTERM stop the server gracefully (docs/DESIGN.md §8) without work in a signal
// handler: the signals are blocked in every thread (threads inherit the mask, so it is set before
// any starts) and one thread waits for them with sigwait, then calls the stop function.
class ShutdownSignals {
 public:
  ShutdownSignals() {
    sigemptyset(&signals_);
    sigaddset(&signals_, SIGINT);
    sigaddset(&signals_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals_, &previous_);
  }
  ~ShutdownSignals() {
    if (waiter_.joinable()) {
      finished_ = true;
      pthread_kill(waiter_.native_handle(), SIGTERM);  // wakes the waiter if no signal came
      waiter_.join();
    }
    pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
  }
  ShutdownSignals(const ShutdownSignals&) = delete;
  ShutdownSignals& operator=(const ShutdownSignals&) = delete;

  void on_signal(std::function<void()> stop) {
    stop_ = std::move(stop);
    waiter_ = std::thread([this] {
      int received = 0;
      sigwait(&signals_, &received);
      if (finished_) return;
      std::fprintf(stderr, "g4 serve: %s: finishing the requests in flight (up to --drain_timeout), then stopping\n",
                   received == SIGINT ? "SIGINT" : "SIGTERM");
      std::lock_guard lock(stop_mutex_);
      if (stop_) stop_();
    });
  }
  // What the stop function stops is going away (a split run's rank 0 ends before main does): a
  // later signal stops nothing.
  void forget() {
    std::lock_guard lock(stop_mutex_);
    stop_ = nullptr;
  }

 private:
  sigset_t signals_{}, previous_{};
  std::atomic<bool> finished_{false};
  std::mutex stop_mutex_;
  std::function<void()> stop_;
  std::thread waiter_;
};
#endif

#if !G4_WITH_SERVER
void serve(const ServeOptions&) {
  throw Error(ErrorKind::kUnsupported, "this g4 was built without cpp-httplib, so g4 serve is not available: install it "
              "(Debian: apt install libcpp-httplib-dev) and rebuild");
}
#else
// What the server takes from the loaded engine (rank 0's when split): the tokenizer and the
// defaults of requests that leave a field out. The one time a thread other than the engine's
// reads the engine (docs/DESIGN.md §8).
void take_defaults(const ServeOptions& o, const Engine& engine, serve::ServerOptions& so,
                   std::optional<Tokenizer>& tokenizer) {
  check_token_flags(o.gen, engine);
  tokenizer = open_tokenizer(o.gen, engine);
  G4_CHECK(tokenizer, "serve needs a tokenizer: the model has none embedded; pass --tokenizer_path");
  note_foreign_chat_template(engine);
  // --seed -1 means a fresh seed per request, not one drawn (and printed) now.
  GenerationFlags defaults = o.gen;
  if (defaults.seed == "-1") defaults.seed = "0";
  const ResolvedSampling sampling = effective_sampling(defaults, engine.generation_defaults());
  so.default_sampler = sampling.sampler;
  so.random_seed = o.gen.seed == "-1";
  so.stop_ids = stop_ids(o.gen, engine);
  std::fprintf(stderr, "g4 serve: request defaults: %s%s\n", describe_sampling(sampling).c_str(),
               so.random_seed ? " (a request without a seed gets a random one)" : "");
}

// The server options that come from the flags alone.
void take_flags(const ServeOptions& o, serve::ServerOptions& so) {
  so.model_id = o.gen.model_path.empty() ? "g4-demo" : std::filesystem::path(o.gen.model_path).filename().string();
  so.api_key = o.api_key;
  so.bos_id = o.gen.bos_id;
  so.default_max_tokens = o.gen.max_new_tokens;
  G4_CHECK(o.max_body_bytes >= 1024, "--max_body_bytes must be >= 1024, got " + std::to_string(o.max_body_bytes));
  so.max_body_bytes = size_t(o.max_body_bytes);
  G4_CHECK(so.default_max_tokens >= 1, "--max_new_tokens (the default max_tokens) must be >= 1");
  G4_CHECK(o.max_connections >= 0, "--max_connections must be >= 0 (0 = automatic), got " + std::to_string(o.max_connections));
  so.max_connections = size_t(o.max_connections);
  G4_CHECK(o.request_timeout_s > 0 && o.request_timeout_s <= 86400,
           "--request_timeout must be in (0, 86400] seconds, got " + std::to_string(o.request_timeout_s));
  so.request_deadline = std::chrono::milliseconds(int64_t(o.request_timeout_s * 1000));
  G4_CHECK(o.drain_timeout_s >= 0 && o.drain_timeout_s <= 86400,
           "--drain_timeout must be in [0, 86400] seconds, got " + std::to_string(o.drain_timeout_s));
  so.drain_deadline = std::chrono::milliseconds(int64_t(o.drain_timeout_s * 1000));
  G4_CHECK(o.keep_alive_requests >= 1, "--keep_alive_requests must be >= 1, got " + std::to_string(o.keep_alive_requests));
  G4_CHECK(o.keep_alive_timeout_s >= 1 && o.keep_alive_timeout_s <= 3600,
           "--keep_alive_timeout must be in [1, 3600] seconds, got " + std::to_string(o.keep_alive_timeout_s));
  so.keep_alive_requests = size_t(o.keep_alive_requests);
  so.keep_alive_idle = std::chrono::seconds(o.keep_alive_timeout_s);
}

// Binds, says where, and serves until SIGINT or SIGTERM (or server.stop()).
void listen(const ServeOptions& o, const serve::ServerOptions& so, const serve::EngineWorker& worker,
            serve::Server& server, ShutdownSignals& signals) {
  const int port = server.bind(o.host, o.port);
  std::fprintf(stderr, "g4 serve: model %s, %lld sessions of %lld tokens%s; listening on http://%s:%d\n",
               so.model_id.c_str(), static_cast<long long>(o.max_sessions),
               static_cast<long long>(worker.max_seq_len()),
               o.gen.tp > 1 ? (", tensor parallel over " + std::to_string(o.gen.tp) + " ranks").c_str() : "",
               o.host.c_str(), port);
  signals.on_signal([&server] { server.stop(); });
  server.listen();
  signals.forget();
}

serve::WorkerOptions worker_options(const ServeOptions& o) {
  return {o.max_sessions, o.max_waiting, o.batch_invariant, o.gen.cuda_graph};
}

void serve_one_rank(const ServeOptions& o, ShutdownSignals& signals) {
  serve::ServerOptions so;
  std::optional<Tokenizer> tokenizer;
  serve::EngineWorker worker(engine_options(o.gen), worker_options(o),
                             [&](Engine& engine) { take_defaults(o, engine, so, tokenizer); });
  take_flags(o, so);
  serve::Server server(worker, *tokenizer, so);
  listen(o, so, worker, server, signals);
}

// Rank 0 of a split model: the HTTP server and the engine thread, which hands every request and
// cancellation to the other ranks before the step that applies it (docs/DESIGN.md §9).
void serve_rank0(const ServeOptions& o, Engine& engine, ScheduledRanks& ranks, ShutdownSignals& signals) {
  serve::ServerOptions so;
  std::optional<Tokenizer> tokenizer;
  take_defaults(o, engine, so, tokenizer);
  take_flags(o, so);
  serve::EngineWorker worker(engine, worker_options(o), ranks);
  serve::Server server(worker, *tokenizer, so);
  // A failed rank stops the server (requests in flight end with the failure), then the run
  // reports the failing rank's error.
  ranks.inputs.on_abort([&server](const std::string&) { server.stop(); });
  try {
    listen(o, so, worker, server, signals);
  } catch (...) {
    ranks.inputs.clear_on_abort();
    throw;
  }
  ranks.inputs.clear_on_abort();
  const std::string failure = worker.failure();
  G4_CHECK(failure.empty(), "the engine failed: " + failure);
}

// Every rank runs the same scheduler steps; only rank 0 listens and answers.
void serve_split(const ServeOptions& o, ShutdownSignals& signals) {
  ScheduledRanks ranks(o.gen.tp);
  const EngineOptions eo = serve::EngineWorker::engine_options(engine_options(o.gen), worker_options(o));
  run_with_inputs<SchedulerInputs>(eo, ranks.inputs, [&](Engine& engine) {
    if (engine.tp_rank() == 0) return serve_rank0(o, engine, ranks, signals);
    follow_scheduler(engine, serve::EngineWorker::scheduler_options(worker_options(o)), ranks);
  });
}

void serve(const ServeOptions& o) {
  check_generation_flags(o.gen);
  G4_CHECK(o.port >= 0 && o.port <= 65535, "--port must be in [0, 65535] (0 = any free port), got " + std::to_string(o.port));
  G4_CHECK(o.max_waiting >= 0, "--max_waiting must be >= 0, got " + std::to_string(o.max_waiting));

  ShutdownSignals signals;  // before any thread starts
  if (o.gen.tp == 1)
    serve_one_rank(o, signals);
  else
    serve_split(o, signals);
  std::fprintf(stderr, "g4 serve: stopped\n");
}
#endif

}  // namespace

void add_serve_command(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  o->gen.max_new_tokens = 256;  // a request's max_tokens when it gives none
  CLI::App* cmd = app.add_subcommand("serve", "Serve the model over an OpenAI-compatible HTTP API");
  add_generation_flags(*cmd, o->gen);
  cmd->add_option("--host", o->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", o->port, "Port to listen on (0 = any free port)")->capture_default_str();
  cmd->add_option("--api-key,--api_key", o->api_key, "Require 'Authorization: Bearer KEY' on /v1 requests");
  cmd->add_option("--max_sessions,--max-sessions", o->max_sessions,
                  "Requests generated at once (each holds a KV cache of --max_seq_len)")
      ->capture_default_str();
  cmd->add_option("--max_waiting,--max-waiting", o->max_waiting,
                  "Requests queued beyond those; more are answered 429 (busy, with Retry-After)")
      ->capture_default_str();
  cmd->add_option("--batch_invariant,--batch-invariant", o->batch_invariant,
                  "false: requests running together share whole forwards (more tokens/s on CUDA, but for Q4_0 "
                  "weights; a request's tokens may then depend on the others)")
      ->capture_default_str();
  cmd->add_option("--max_body_bytes,--max-body-bytes", o->max_body_bytes,
                  "Larger request bodies are answered 413")
      ->capture_default_str();
  cmd->add_option("--max_connections,--max-connections", o->max_connections,
                  "Connections served at once, a thread each; more wait (0 = 1024, or twice the requests in "
                  "flight and 64 more when larger)")
      ->capture_default_str();
  cmd->add_option("--request_timeout,--request-timeout", o->request_timeout_s,
                  "Seconds a connection has to deliver a whole request (headers and body) after it opens or "
                  "after its last answer; then it is closed")
      ->capture_default_str();
  cmd->add_option("--keep_alive_requests,--keep-alive-requests", o->keep_alive_requests,
                  "Requests one keep-alive connection may carry")
      ->capture_default_str();
  cmd->add_option("--keep_alive_timeout,--keep-alive-timeout", o->keep_alive_timeout_s,
                  "Seconds an idle keep-alive connection waits for its next request")
      ->capture_default_str();
  cmd->add_option("--drain_timeout,--drain-timeout", o->drain_timeout_s,
                  "Seconds SIGINT/SIGTERM lets the requests in flight run on; then they fail and every connection "
                  "is closed")
      ->capture_default_str();
  cmd->footer("Sampling flags set the defaults of requests that leave a field out; -n is the default max_tokens.\n"
              "Example: curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' "
              "-d '{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}'");
  cmd->callback([o] { serve(*o); });
}

}  // namespace g4::cli
