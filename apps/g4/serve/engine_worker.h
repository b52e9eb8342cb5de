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
#include "runtime/rank_inputs.h"
#include "runtime/scheduler.h"
#include "serve/metrics.h"
#include "util/error.h"

namespace g4::serve {

// One request's side of the engine thread: first admitted or refused, then its tokens, the last
// of which says why it ended (or a failure message when the request or the engine failed).
class RequestChannel {
 public:
  // ---- the handler's side ----
  // Blocks until the engine thread took the request; nullopt when admitted, else why not.
  std::optional<Error> wait_admitted();
  // Blocks until there are tokens or a failure; returns the tokens since the last call. An empty
  // result means the request failed: failure() says why.
  std::vector<SequenceEvent> take();
  std::optional<Error> failure() const;

  // ---- the engine thread's side ----
  void admit();
  void push(SequenceEvent token);
  // Refused before admission (wait_admitted() returns why) or failed after it (take() returns
  // nothing, failure() says why).
  void fail(Error why);

 private:
  friend class EngineWorker;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  bool decided_ = false, admitted_ = false;
  std::optional<Error> failure_;
  std::deque<SequenceEvent> tokens_;
  RequestId id_ = 0;  // the scheduler's id; only the engine thread reads or writes it
};

struct WorkerOptions {
  int64_t max_sessions = 4;  // sequences running at once (their KV caches are reserved)
  int64_t max_waiting = 64;  // requests waiting beyond those; more get "busy" (HTTP 429)
  bool batch_invariant = true;  // SchedulerOptions::batch_invariant
  bool cuda_graphs = false;     // SchedulerOptions::cuda_graphs
};

class EngineWorker {
 public:
  // Loads the engine with a KV budget of max_sessions sequences of its max_seq_len, calls
  // on_loaded with it (on this thread, before the engine thread starts: the one time another
  // thread may read the engine, e.g. its tokenizer and generation defaults), then starts the
  // engine thread. Throws g4::Error when the model cannot be loaded or on_loaded throws.
  EngineWorker(EngineOptions engine_options, WorkerOptions options,
               const std::function<void(Engine&)>& on_loaded = {});
  // Rank 0 of a split model (docs/DESIGN.md §9, "Front ends"): the engine is rank 0's, loaded
  // with engine_options(…) by run_tensor_parallel; before each step the engine thread publishes
  // what it added and cancelled to `ranks`, whose other ranks run follow_scheduler with
  // scheduler_options(options), and the end when it stops. A failed step fails the whole group
  // (failure() says why) instead of only the requests running.
  EngineWorker(Engine& rank0, WorkerOptions options, ScheduledRanks& ranks);
  // The engine options for `options`: a KV budget of max_sessions sequences (of each rank's
  // heads), as many rows per decode batch.
  static EngineOptions engine_options(EngineOptions engine_options, const WorkerOptions& options);
  static SchedulerOptions scheduler_options(const WorkerOptions& options);
  ~EngineWorker();  // stops the thread; requests still running fail with "server stopping"
  EngineWorker(const EngineWorker&) = delete;
  EngineWorker& operator=(const EngineWorker&) = delete;

  // Fixed once loaded, so handler threads may read it without touching the engine.
  int64_t max_seq_len() const { return max_seq_len_; }
  int64_t vocab_size() const { return vocab_size_; }  // the model's
  // Requests it takes at once, running and waiting (max_sessions + max_waiting); submit refuses more.
  size_t max_in_flight() const { return max_in_flight_; }
  // Requests cancelled while running or waiting so far (a stop string, a client that went away).
  uint64_t cancelled() const { return cancelled_count_.load(); }
  // Queue depth, running sequences and KV bytes, as of the engine thread's last step.
  EngineGauges gauges() const;
  // Why a split engine failed (its group is aborted and the thread has stopped); empty otherwise.
  std::string failure() const;

  // Queues a request for the engine thread. Throws Error(kBusy) when max_sessions + max_waiting
  // requests are already in flight, Error(kUnavailable) when stopping or failed.
  std::shared_ptr<RequestChannel> submit(SchedulerRequest request);
  // Ends the request (a client that went away, a stop string); its KV memory comes back at once.
  void cancel(const std::shared_ptr<RequestChannel>& channel);
  // Fails every request in flight, running or waiting, with `why` (their handlers answer its
  // kind's status, or end their streams with an error event); later requests run as usual.
  void fail_in_flight(const Error& why);

 private:
  void start(const WorkerOptions& options);
  void run();
  void publish(SchedulerInputs inputs);
  void fail_group(const std::string& why);
  void start_submitted(std::vector<std::pair<SchedulerRequest, std::shared_ptr<RequestChannel>>>& submitted);
  void fail_all(const Error& why);
  // fail_in_flight on the engine thread: `submitted` (not yet added) and every request in the
  // scheduler fail with `why`.
  void fail_everything(std::vector<std::pair<SchedulerRequest, std::shared_ptr<RequestChannel>>>& submitted,
                       const Error& why);
  void ended(size_t requests);  // that many requests left the engine: room for others
  // Hands a request's last event to its channel: its last token, or its failure.
  static void finish(RequestChannel& channel, SequenceEvent last);
  void update_gauges();

  std::unique_ptr<Engine> owned_;  // unsplit: the worker's own engine
  Engine* engine_ = nullptr;
  ScheduledRanks* ranks_ = nullptr;  // split: rank 0 publishes to the others
  std::unique_ptr<Scheduler> scheduler_;
  int64_t max_seq_len_ = 0, vocab_size_ = 0;
  size_t max_in_flight_ = 0;
  std::atomic<uint64_t> cancelled_count_{0};

  mutable std::mutex mutex_;  // guards what follows
  std::condition_variable work_;
  bool stopping_ = false;
  std::string failure_;
  size_t in_flight_ = 0;
  std::vector<std::pair<SchedulerRequest, std::shared_ptr<RequestChannel>>> submitted_;
  std::vector<std::shared_ptr<RequestChannel>> cancelled_;
  std::optional<Error> fail_in_flight_;  // set: the engine thread fails every request in flight with it

  // The requests in the scheduler (waiting or running), by id: the engine thread's own.
  std::map<RequestId, std::shared_ptr<RequestChannel>> requests_;
  mutable std::mutex gauges_mutex_;
  EngineGauges gauges_;
  std::thread thread_;
};

}  // namespace g4::serve
