// A g4 serve server over the demo model, running in-process on a free loopback port (the serve
// tests; header-only because only they link the g4_serve library).
#pragma once
#include <httplib.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "runtime/engine.h"
#include "serve/engine_worker.h"
#include "serve/server.h"
#include "tokenizer/tokenizer.h"

namespace g4::test {

inline EngineOptions demo_serve_options(int64_t max_seq_len) {
  EngineOptions o;
  o.model_path = std::string(G4_SOURCE_DIR) + "/models/demo.gguf";
  o.max_seq_len = max_seq_len;
  return o;
}

class RunningServer {
 public:
  // options.stop_ids etc. as given; the tokenizer is the model's own.
  RunningServer(int64_t max_seq_len, serve::WorkerOptions worker_options, serve::ServerOptions options) {
    worker_ = std::make_unique<serve::EngineWorker>(demo_serve_options(max_seq_len), worker_options, [&](Engine& engine) {
      tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::from_json(*engine.tokenizer_json()));
    });
    server_ = std::make_unique<serve::Server>(*worker_, *tokenizer_, options);
    port_ = server_->bind("127.0.0.1", 0);
    thread_ = std::thread([this] { server_->listen(); });
    httplib::Client c("127.0.0.1", port_);
    for (int i = 0; i < 200 && !c.Get("/health"); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ~RunningServer() { stop(); }
  RunningServer(const RunningServer&) = delete;
  RunningServer& operator=(const RunningServer&) = delete;

  // Stops the server (requests in flight finish) and waits for listen() to return.
  void stop() {
    if (!thread_.joinable()) return;
    server_->stop();
    thread_.join();
  }

  int port() const { return port_; }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  serve::EngineWorker& worker() { return *worker_; }
  serve::Server& server() { return *server_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }

 private:
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<serve::EngineWorker> worker_;
  std::unique_ptr<serve::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace g4::test
