#include "runtime/rank_inputs.h"

namespace g4 {

void ScheduledRanks::set_load(int rank, RankLoad load) {
  std::lock_guard lock(mutex_);
  loads_.at(size_t(rank)) = load;
}

std::vector<RankLoad> ScheduledRanks::loads() const {
  std::lock_guard lock(mutex_);
  return loads_;
}

namespace {

// Rank 0's inputs, applied as rank 0 applied them: a request rank 0's add() refused is refused
// here too (the same checks on the same request), so the ids stay in step.
void apply(Scheduler& scheduler, const SchedulerInputs& in) {
  for (const SchedulerRequest& request : in.added) {
    try {
      scheduler.add(request);
    } catch (const std::exception&) {
    }
  }
  for (RequestId id : in.cancelled) scheduler.cancel(id);
}

}  // namespace

void follow_scheduler(Engine& engine, const SchedulerOptions& options, ScheduledRanks& ranks) {
  Scheduler scheduler(engine.runner(), options);
  const int rank = engine.tp_rank();
  for (;;) {
    const SchedulerInputs in = ranks.inputs.next(rank);
    if (in.stop) return;
    apply(scheduler, in);
    scheduler.follow(in.plan);
    ranks.set_load(rank, {scheduler.running(), engine.kv_pool().bytes_in_use()});
  }
}

}  // namespace g4
