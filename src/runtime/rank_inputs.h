// Inputs from outside a tensor-parallel run — a chat line, a server request and its cancellation —
// handed from rank 0 to the other ranks in order (docs/DESIGN.md §9, "Front ends"). Every rank
// must make the same decisions at the same step, so rank 0, the one that reads stdin or serves
// HTTP, publishes each input here before acting on it, and every other rank takes the same inputs
// in the same order at the same point of its loop (between two steps). The ranks are threads of
// one process, so this is a shared log under a mutex, not a collective.
//
// It never deadlocks: a rank that fails aborts the log (run_with_inputs does so), which wakes
// every rank waiting in next() with PeerFailure, as the communicator's abort contract does.
#pragma once
#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backend/comm/communicator.h"
#include "runtime/scheduler.h"
#include "runtime/tensor_parallel.h"

namespace g4 {

template <typename Event>
class RankInputs {
 public:
  explicit RankInputs(int ranks) : taken_(size_t(ranks > 1 ? ranks - 1 : 0), 0) {}
  RankInputs(const RankInputs&) = delete;
  RankInputs& operator=(const RankInputs&) = delete;

  // Rank 0: appends an event every other rank will take, in this order.
  void publish(Event event) {
    {
      std::lock_guard lock(mutex_);
      events_.push_back(std::move(event));
    }
    changed_.notify_all();
  }

  // Rank `rank` (>= 1): its next event, waiting for rank 0 to publish it. Throws PeerFailure once
  // the log was aborted, even with events left: a failed group does no more steps.
  Event next(int rank) {
    std::unique_lock lock(mutex_);
    uint64_t& taken = taken_.at(size_t(rank - 1));
    changed_.wait(lock, [&] { return !failure_.empty() || taken < first_ + events_.size(); });
    if (!failure_.empty()) throw PeerFailure(failure_);
    Event event = events_[size_t(taken - first_)];
    ++taken;
    drop_taken();
    return event;
  }

  // Rank `rank` failed because of `what`: every waiting or later next() throws PeerFailure naming
  // it, and on_abort runs once (rank 0's way to stop taking inputs). The first failure stays.
  void abort(int rank, const std::string& what) {
    {
      std::lock_guard lock(mutex_);
      if (!failure_.empty()) return;
      failure_ = "tensor parallel: rank " + std::to_string(rank) + " failed: " + what;
      // Under the lock, so that clear_on_abort() returns only once no hook runs any more.
      if (on_abort_) std::exchange(on_abort_, {})(what);
    }
    changed_.notify_all();
  }

  // Called once, on the failing rank's thread and under this log's lock (so it must not call
  // back into the log), when the log is aborted: rank 0's way to stop taking inputs (a server's
  // stop). clear_on_abort() before what the hook touches goes away.
  void on_abort(std::function<void(const std::string& what)> hook) {
    std::lock_guard lock(mutex_);
    on_abort_ = std::move(hook);
  }
  void clear_on_abort() { on_abort({}); }

 private:
  // Events every rank has taken are dropped, so a long run holds only what some rank is behind on.
  void drop_taken() {
    uint64_t slowest = first_ + events_.size();
    for (uint64_t t : taken_) slowest = std::min(slowest, t);
    while (first_ < slowest) {
      events_.pop_front();
      ++first_;
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Event> events_;
  uint64_t first_ = 0;           // the index of events_.front() in the whole log
  std::vector<uint64_t> taken_;  // per rank 1..N-1: events taken so far
  std::string failure_;
  std::function<void(const std::string&)> on_abort_;
};

// run_tensor_parallel(options, body), where a rank whose body throws also aborts `inputs`, so no
// rank waits for an input that will never come (a follower waiting in next() while rank 0 fails,
// or the other way round through on_abort).
template <typename Event>
void run_with_inputs(const EngineOptions& options, RankInputs<Event>& inputs, const std::function<void(Engine&)>& body) {
  run_tensor_parallel(options, [&](Engine& engine) {
    try {
      body(engine);
    } catch (const std::exception& e) {
      inputs.abort(engine.tp_rank(), e.what());
      throw;
    }
  });
}

// ---- a scheduler split over ranks (g4 serve --tp N) ----

// What rank 0's engine thread did for one step: the requests it added (in order, accepted or
// not: add() decides the same on every rank), the ids it cancelled, and the step it planned (empty
// when it ran none); or the end of the run. Every other rank applies the same inputs and runs rank
// 0's plan (Scheduler::follow), so the ranks run the same forwards; the draws are the same on every
// rank, and so is what ends (docs/DESIGN.md §9, "Front ends").
struct SchedulerInputs {
  std::vector<SchedulerRequest> added;
  std::vector<RequestId> cancelled;
  StepPlan plan;
  bool stop = false;
};

// One rank's load after its last step: what rank 0's /metrics shows of the others.
struct RankLoad {
  size_t running = 0, kv_bytes_in_use = 0;
};

// What rank 0's engine thread shares with the other ranks of a split scheduler.
class ScheduledRanks {
 public:
  explicit ScheduledRanks(int ranks) : inputs(ranks), loads_(size_t(ranks)) {}
  RankInputs<SchedulerInputs> inputs;

  void set_load(int rank, RankLoad load);
  // Every rank's load (rank 0's slot as rank 0 last set it).
  std::vector<RankLoad> loads() const;

 private:
  mutable std::mutex mutex_;
  std::vector<RankLoad> loads_;
};

// A rank other than 0: runs a Scheduler over its engine, applying rank 0's inputs and running its
// plan each step, discarding the tokens (rank 0 answers), until rank 0 publishes the end. Throws
// PeerFailure when the group or the inputs fail.
void follow_scheduler(Engine& engine, const SchedulerOptions& options, ScheduledRanks& ranks);

}  // namespace g4
