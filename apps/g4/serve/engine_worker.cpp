#include "serve/engine_worker.h"

#include <utility>

#include "util/error.h"

namespace g4::serve {

namespace {

// An exception as a g4::Error: its own kind, or kInternal for anything that is not a g4::Error.
Error as_error(const std::exception& e) {
  if (const auto* error = dynamic_cast<const Error*>(&e)) return *error;
  return Error(ErrorKind::kInternal, e.what());
}

}  // namespace

std::optional<Error> RequestChannel::wait_admitted() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return decided_; });
  if (admitted_) return std::nullopt;
  return failure_;
}

std::vector<SequenceEvent> RequestChannel::take() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !tokens_.empty() || failure_.has_value(); });
  std::vector<SequenceEvent> out(std::make_move_iterator(tokens_.begin()), std::make_move_iterator(tokens_.end()));
  tokens_.clear();
  return out;
}

std::optional<Error> RequestChannel::failure() const {
  std::lock_guard lock(mutex_);
  return failure_;
}

void RequestChannel::admit() {
  std::lock_guard lock(mutex_);
  decided_ = admitted_ = true;
  changed_.notify_all();
}

void RequestChannel::push(SequenceEvent token) {
  std::lock_guard lock(mutex_);
  tokens_.push_back(std::move(token));
  changed_.notify_all();
}

void RequestChannel::fail(Error why) {
  std::lock_guard lock(mutex_);
  decided_ = true;
  failure_ = std::move(why);
  changed_.notify_all();
}

EngineOptions EngineWorker::engine_options(EngineOptions engine_options, const WorkerOptions& options) {
  G4_CHECK(options.max_sessions >= 1, "--max_sessions must be >= 1, got " + std::to_string(options.max_sessions));
  G4_CHECK(options.max_waiting >= 0, "the waiting queue bound must be >= 0");
  // One sequence's bytes depend on the model, the context, the backend and the rank's heads: the
  // engine counts them.
  engine_options.kv_budget_bytes = 0;
  engine_options.kv_budget_sequences = options.max_sessions;
  engine_options.max_batch_sequences = options.max_sessions;
  return engine_options;
}

SchedulerOptions EngineWorker::scheduler_options(const WorkerOptions& options) {
  SchedulerOptions so;
  // submit() bounds the queue first, so add() never answers "busy".
  so.max_waiting = size_t(options.max_sessions + options.max_waiting);
  so.batch_invariant = options.batch_invariant;
  so.cuda_graphs = options.cuda_graphs;
  return so;
}

EngineWorker::EngineWorker(EngineOptions engine_options, WorkerOptions options,
                           const std::function<void(Engine&)>& on_loaded) {
  owned_ = std::make_unique<Engine>(EngineWorker::engine_options(std::move(engine_options), options));
  engine_ = owned_.get();
  if (on_loaded) on_loaded(*engine_);
  start(options);
}

EngineWorker::EngineWorker(Engine& rank0, WorkerOptions options, ScheduledRanks& ranks)
    : engine_(&rank0), ranks_(&ranks) {
  start(options);
}

void EngineWorker::start(const WorkerOptions& options) {
  max_seq_len_ = engine_->runner().max_seq_len();
  vocab_size_ = engine_->config().vocab_size;
  max_in_flight_ = size_t(options.max_sessions + options.max_waiting);
  SchedulerOptions so = scheduler_options(options);
  so.draft = engine_->draft_options();  // every request the rounds can serve drafts (--draft_model)
  scheduler_ = std::make_unique<Scheduler>(engine_->runner(), so);
  update_gauges();
  thread_ = std::thread([this] { run(); });
}

EngineWorker::~EngineWorker() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_.notify_all();
  thread_.join();
}

std::shared_ptr<RequestChannel> EngineWorker::submit(SchedulerRequest request) {
  auto channel = std::make_shared<RequestChannel>();
  {
    std::lock_guard lock(mutex_);
    if (!failure_.empty()) throw Error(ErrorKind::kUnavailable, "the engine failed: " + failure_);
    G4_REQUIRE(kUnavailable, !stopping_, "the server is stopping");
    G4_REQUIRE(kBusy, in_flight_ < max_in_flight_,
               "the server is busy: every session is running and the queue is full; try again later");
    ++in_flight_;
    submitted_.emplace_back(std::move(request), channel);
  }
  work_.notify_all();
  return channel;
}

void EngineWorker::cancel(const std::shared_ptr<RequestChannel>& channel) {
  {
    std::lock_guard lock(mutex_);
    cancelled_.push_back(channel);
  }
  work_.notify_all();
}

void EngineWorker::fail_in_flight(const Error& why) {
  {
    std::lock_guard lock(mutex_);
    fail_in_flight_ = why;
  }
  work_.notify_all();
}

void EngineWorker::ended(size_t requests) {
  if (requests == 0) return;
  std::lock_guard lock(mutex_);
  in_flight_ -= requests;
}

void EngineWorker::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    work_.wait(lock, [&] {
      return stopping_ || !submitted_.empty() || !cancelled_.empty() || !requests_.empty() || fail_in_flight_.has_value();
    });
    if (stopping_) break;
    auto submitted = std::move(submitted_);
    auto cancelled = std::move(cancelled_);
    const std::optional<Error> fail_why = std::move(fail_in_flight_);
    submitted_.clear();
    cancelled_.clear();
    fail_in_flight_.reset();
    lock.unlock();
    if (fail_why) {  // the cancelled ones are among those failed
      fail_everything(submitted, *fail_why);
      lock.lock();
      continue;
    }

    size_t ended_now = 0;
    // The last tokens go out after the count drops, so a client that sends its next request as
    // soon as it has its answer finds the room its last one left.
    std::vector<std::pair<std::shared_ptr<RequestChannel>, SequenceEvent>> last_tokens;
    // What the other ranks of a split model apply before the same step (none unsplit).
    SchedulerInputs published;
    // Admissions first, so that a request cancelled as soon as it was submitted is found.
    for (auto& [request, channel] : submitted) {
      if (ranks_) published.added.push_back(request);
      try {
        channel->id_ = scheduler_->add(request);
        requests_[channel->id_] = channel;
        channel->admit();
      } catch (const std::exception& e) {
        channel->fail(as_error(e));
        ++ended_now;
      }
    }
    for (const auto& channel : cancelled) {
      auto it = requests_.find(channel->id_);
      if (channel->id_ == 0 || it == requests_.end() || it->second != channel) continue;  // ended already
      scheduler_->cancel(channel->id_);
      if (ranks_) published.cancelled.push_back(channel->id_);
      requests_.erase(it);
      last_tokens.emplace_back(channel, SequenceEvent{channel->id_, DecodedToken{-1, StopReason::kCancelled}, {}, {}});
      ++ended_now;
      ++cancelled_count_;
    }
    if (!scheduler_->idle()) {
      try {
        const StepPlan plan = scheduler_->plan();
        if (ranks_) {
          published.plan = plan;
          publish(std::exchange(published, {}));
        }
        for (SequenceEvent& event : scheduler_->execute(plan)) {
          auto it = requests_.find(event.id);
          if (it == requests_.end()) continue;
          if (!event.drawn.last()) {
            it->second->push(std::move(event));
            continue;
          }
          last_tokens.emplace_back(it->second, std::move(event));
          requests_.erase(it);
          ++ended_now;
        }
      } catch (const std::exception& e) {
        // A fault of the engine, not of one request: every request in the scheduler fails (HTTP 500).
        ended_now += requests_.size();
        const Error cause = as_error(e);
        fail_all(Error(cause.kind(), std::string("the engine failed: ") + e.what()));
        if (ranks_) fail_group(e.what());
      }
    } else if (ranks_) {
      publish(std::move(published));
    }
    update_gauges();
    ended(ended_now);
    for (auto& [channel, token] : last_tokens) finish(*channel, std::move(token));
    lock.lock();
  }
  lock.unlock();
  ended(requests_.size());
  const Error stopping(ErrorKind::kUnavailable, "the server is stopping");
  fail_all(stopping);
  for (auto& [request, channel] : submitted_) channel->fail(stopping);
  if (ranks_ && failure().empty()) {
    SchedulerInputs stop;
    stop.stop = true;
    publish(std::move(stop));
  }
}

// A request that failed alone (SequenceEvent::error, e.g. NaN logits) fails with that message, an
// internal failure: the handler answers HTTP 500 (docs/DESIGN.md §8).
void EngineWorker::finish(RequestChannel& channel, SequenceEvent last) {
  if (last.error.empty()) {
    channel.push(std::move(last));
  } else {
    channel.fail(Error(ErrorKind::kInternal, last.error));
  }
}

void EngineWorker::publish(SchedulerInputs inputs) { ranks_->inputs.publish(std::move(inputs)); }

// A split engine that failed a step cannot step again (its peers are mid-collective or gone): the
// group is aborted, so no rank waits for this one, and the worker stops taking requests; the
// inputs' abort hook stops the server (cmd_serve.cpp), and rank 0 then reports failure().
void EngineWorker::fail_group(const std::string& why) {
  if (Communicator* comm = engine_->communicator()) comm->abort(why);
  {
    std::lock_guard lock(mutex_);
    failure_ = why;
    stopping_ = true;
  }
  ranks_->inputs.abort(0, why);
}

std::string EngineWorker::failure() const {
  std::lock_guard lock(mutex_);
  return failure_;
}

void EngineWorker::update_gauges() {
  EngineGauges g;
  g.waiting = scheduler_->waiting();
  g.running = scheduler_->running();
  const KvPool& pool = engine_->kv_pool();
  g.preempted = scheduler_->preempted();
  g.preemptions = scheduler_->preemptions();
  g.drafting = engine_->draft_options().assistant != nullptr;
  g.speculation = scheduler_->speculation_stats();
  g.kv_bytes_in_use = pool.bytes_in_use();
  g.kv_bytes_cached = pool.bytes_cached();
  g.kv_budget_bytes = pool.budget_bytes();
  g.kv_pages_total = pool.pages_total();
  g.kv_pages_free = pool.pages_free();
  g.kv_pages_in_use = pool.pages_in_use();
  g.kv_pages_cached = pool.pages_cached();
  g.kv_pages_shared = pool.pages_shared();
  g.kv_bytes_per_token = pool.bytes_per_token();
  if (ranks_) ranks_->set_load(0, {g.running, g.kv_bytes_in_use});
  std::lock_guard lock(gauges_mutex_);
  gauges_ = g;
}

EngineGauges EngineWorker::gauges() const {
  std::lock_guard lock(gauges_mutex_);
  EngineGauges g = gauges_;
  if (ranks_) g.ranks = ranks_->loads();
  {
    std::lock_guard queue(mutex_);
    g.waiting += submitted_.size();  // handed over, not yet in the scheduler
  }
  return g;
}

void EngineWorker::fail_everything(std::vector<std::pair<SchedulerRequest, std::shared_ptr<RequestChannel>>>& submitted,
                                   const Error& why) {
  for (auto& [request, channel] : submitted) channel->fail(why);
  ended(submitted.size() + requests_.size());
  SchedulerInputs published;  // the other ranks of a split model drop the same sequences
  for (const auto& [id, channel] : requests_) published.cancelled.push_back(id);
  if (ranks_) publish(std::move(published));
  fail_all(why);
  update_gauges();
}

void EngineWorker::fail_all(const Error& why) {
  for (auto& [id, channel] : requests_) {
    scheduler_->cancel(id);
    channel->fail(why);
  }
  requests_.clear();
}

}  // namespace g4::serve
