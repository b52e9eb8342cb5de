// The server's engine thread (docs/DESIGN.md §8). The engine is single-threaded: one thread owns
// the Engine and a Scheduler and runs step() while there is work; HTTP handler threads hand it
// requests through a queue guarded by a mutex and a condition variable, and each request gets its
// tokens back through its own channel.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/engine.h"
#include "runtime/scheduler.h"
#include "serve/metrics.h"

namespace g4::serve {

// One request's side of the engine thread: first admitted or refused, then its tokens, the last
// of which says why it ended (or a failure message when the engine itself failed).
class RequestChannel {
 public:
  // ---- the handler's side ----
  // Blocks until the engine thread took the request; nullopt when admitted, else why not.
  std::optional<std::string> wait_admitted();
  // Blocks until there are tokens or a failure; returns the tokens since the last call. An empty
  // result means the engine failed: failure() says why.
  std::vector<SequenceEvent> take();
  std::string failure() const;

  // ---- the engine thread's side ----
  void admit();
  void push(SequenceEvent token);
  // Refused before admission (wait_admitted() returns why) or failed after it (take() returns
  // nothing, failure() says why).
  void fail(std::string why);

 private:
  friend class EngineWorker;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  bool decided_ = false, admitted_ = false;
  std::string failure_;
  std::deque<SequenceEvent> tokens_;
  RequestId id_ = 0;  // the scheduler's id; only the engine thread reads or writes it
};

struct WorkerOptions {
  int64_t max_sessions = 4;  // sequences running at once (their KV caches are reserved)
  int64_t max_waiting = 64;  // requests waiting beyond those; more get "busy" (HTTP 429)
};

class EngineWorker {
 public:
  // Loads the engine with a KV budget of max_sessions sequences of its max_seq_len, calls
  // on_loaded with it (on this thread, before the engine thread starts: the one time another
  // thread may read the engine, e.g. its tokenizer and generation defaults), then starts the
  // engine thread. Throws g4::Error when the model cannot be loaded or on_loaded throws.
  EngineWorker(EngineOptions engine_options, WorkerOptions options,
               const std::function<void(Engine&)>& on_loaded = {});
  ~EngineWorker();  // stops the thread; requests still running fail with "server stopping"
  EngineWorker(const EngineWorker&) = delete;
  EngineWorker& operator=(const EngineWorker&) = delete;

  // Fixed once loaded, so handler threads may read it without touching the engine.
  int64_t max_seq_len() const { return max_seq_len_; }
  // Requests cancelled while running or waiting so far (a stop string, a client that went away).
  uint64_t cancelled() const { return cancelled_count_.load(); }
  // Queue depth, running sequences and KV bytes, as of the engine thread's last step.
  EngineGauges gauges() const;

  // Queues a request for the engine thread, or returns nullptr when max_sessions + max_waiting
  // requests are already in flight (the caller answers "busy").
  std::shared_ptr<RequestChannel> submit(SchedulerRequest request);
  // Ends the request (a client that went away, a stop string); its KV memory comes back at once.
  void cancel(const std::shared_ptr<RequestChannel>& channel);

 private:
  void run();
  void start_submitted(std::vector<std::pair<SchedulerRequest, std::shared_ptr<RequestChannel>>>& submitted);
  void fail_all(const std::string& why);
  void ended(size_t requests);  // that many requests left the engine: room for others
  void update_gauges();

  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Scheduler> scheduler_;
  int64_t max_seq_len_ = 0;
  size_t max_in_flight_ = 0;
  std::atomic<uint64_t> cancelled_count_{0};

  mutable std::mutex mutex_;  // guards what follows
  std::condition_variable work_;
  bool stopping_ = false;
  size_t in_flight_ = 0;
  std::vector<std::pair<SchedulerRequest, std::shared_ptr<RequestChannel>>> submitted_;
  std::vector<std::shared_ptr<RequestChannel>> cancelled_;

  // The requests in the scheduler (waiting or running), by id: the engine thread's own.
  std::map<RequestId, std::shared_ptr<RequestChannel>> requests_;
  mutable std::mutex gauges_mutex_;
  EngineGauges gauges_;
  std::thread thread_;
};

}  // namespace g4::serve
