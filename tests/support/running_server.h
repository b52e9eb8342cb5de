// A g4 serve server over the demo model (or another), running in-process on a free loopback port
// (the serve tests; header-only because only they link the g4_serve library).
#pragma once
#include <httplib.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/engine.h"
#include "serve/engine_worker.h"
#include "serve/server.h"
#include "support/demo_engine.h"
#include "tokenizer/tokenizer.h"

namespace g4::test {

// A client of a test server on `port`, waiting as long as a whole answer may take under a sanitizer
// on a loaded machine (httplib's default, 5 s, is shorter than a non-streamed ASan answer there).
inline httplib::Client loopback_client(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);
  return c;
}

inline EngineOptions demo_serve_options(int64_t max_seq_len, const std::string& model_path = embedded_demo_path()) {
  EngineOptions o;
  o.model_path = model_path;
  o.max_seq_len = max_seq_len;
  return o;
}

class RunningServer {
 public:
  // options.stop_ids etc. as given; the tokenizer is the model's own.
  RunningServer(int64_t max_seq_len, serve::WorkerOptions worker_options, serve::ServerOptions options,
                const std::string& model_path = embedded_demo_path()) {
    auto take_tokenizer = [&](Engine& engine) {
      tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::from_json(*engine.tokenizer_json()));
    };
    worker_ = std::make_unique<serve::EngineWorker>(demo_serve_options(max_seq_len, model_path), worker_options,
                                                    take_tokenizer);
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

// `g4 serve` as a process of its own (the binary, G4_BINARY), on a free loopback port: what its
// signals and --tp do end to end. The port comes from its "listening on" line on stderr.
class ServeProcess {
 public:
  explicit ServeProcess(const std::vector<std::string>& arguments) {
    int err[2];
    if (pipe(err) != 0) return;
    const pid_t test_pid = getpid();
    pid_ = fork();
    if (pid_ == 0) {
      // The server dies with the test: a test process that aborts (an assertion, a sanitizer
      // report) must not leave a server holding ctest's output pipe open until the timeout.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != test_pid) _exit(127);  // the test died before prctl
      dup2(err[1], 2);
      close(err[0]);
      std::vector<std::string> args = {G4_BINARY, "serve", "--port", "0"};
      args.insert(args.end(), arguments.begin(), arguments.end());
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(G4_BINARY, argv.data());
      _exit(127);
    }
    close(err[1]);
    err_ = err[0];
    const std::string marker = "listening on http://127.0.0.1:";
    char buffer[512];
    for (ssize_t n; port_ == 0 && (n = read(err_, buffer, sizeof buffer)) > 0;) {
      log_.append(buffer, size_t(n));
      if (const size_t at = log_.find(marker); at != std::string::npos && log_.find('\n', at) != std::string::npos)
        port_ = std::stoi(log_.substr(at + marker.size()));
    }
  }
  ~ServeProcess() {
    if (pid_ > 0 && !waited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (err_ >= 0) close(err_);
  }
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  int port() const { return port_; }  // 0 when it never listened: log() says why
  const std::string& log() const { return log_; }
  httplib::Client client() const { return loopback_client(port_); }

  // Sends `signal_number` (none: 0, for a process that ends by itself), reads the rest of the log
  // and returns the exit status (-1 when it did not exit normally).
  int stop(int signal_number = SIGTERM) {
    if (signal_number != 0) kill(pid_, signal_number);
    char buffer[512];
    for (ssize_t n; (n = read(err_, buffer, sizeof buffer)) > 0;) log_.append(buffer, size_t(n));
    int status = 0;
    waitpid(pid_, &status, 0);
    waited_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  pid_t pid_ = -1;
  int err_ = -1, port_ = 0;
  bool waited_ = false;
  std::string log_;
};

}  // namespace g4::test
