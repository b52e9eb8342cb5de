#include "runtime/scheduler.h"

#include <algorithm>
#include <functional>

#include "sampling/sampler.h"
#include "util/error.h"

namespace g4 {

int64_t PlannedForward::rows() const {
  int64_t n = 0;
  for (const PlannedChunk& c : chunks) n += int64_t(c.tokens.size());
  return n;
}

int64_t PlannedForward::draws() const {
  return int64_t(std::count_if(chunks.begin(), chunks.end(), [](const PlannedChunk& c) { return c.draw.has_value(); }));
}

bool PlannedForward::decodes_only() const {
  return std::all_of(chunks.begin(), chunks.end(), [](const PlannedChunk& c) { return c.decode; });
}

// ---- StepPlanner ----

StepPlanner::StepPlanner(KvPool& pool, const SchedulerLimits& limits) : pool_(pool), limits_(limits) {
  G4_ASSERT(limits.max_seq_len >= 1 && limits.prefill_tokens_per_step >= 1 && limits.forward_rows >= 1 &&
                limits.forward_draws >= 1,
            "scheduler limits must be positive");
}

RequestId StepPlanner::add(const SchedulerRequest& request) {
  G4_CHECK(!request.prompt.empty(), "no tokens to run (an empty prompt)");
  G4_CHECK(int64_t(request.prompt.size()) <= limits_.max_seq_len,
           "context full (" + std::to_string(limits_.max_seq_len) + " tokens): 0 used, " +
               std::to_string(request.prompt.size()) + " more requested");
  Generation generation(Sampler(request.sampling), GenerationLimits{request.max_new_tokens, request.stop_ids});
  const size_t bytes = pool_.sequence_bytes(limits_.max_seq_len);
  G4_REQUIRE(kResourceExhausted, bytes <= pool_.budget_bytes(),
             "out of KV memory: " + std::to_string(bytes) + " bytes requested, more than the whole budget of " +
                 std::to_string(pool_.budget_bytes()) + " bytes");
  G4_CHECK(request.top_logprobs >= -1 && request.top_logprobs <= kMaxTopLogprobs,
           "top_logprobs must be in [0, " + std::to_string(kMaxTopLogprobs) + "] (or -1: none), got " +
               std::to_string(request.top_logprobs));
  G4_REQUIRE(kBusy, waiting_.size() < limits_.max_waiting,
             "busy: " + std::to_string(waiting_.size()) + " requests are waiting (the queue's bound); try again later");
  if (request.grammar)
    for (int32_t stop : request.grammar->vocabulary().stop_tokens())
      G4_CHECK(std::find(request.stop_ids.begin(), request.stop_ids.end(), stop) != request.stop_ids.end(),
               "the grammar ends on token " + std::to_string(stop) + ", which is not among the request's stop tokens");
  waiting_.push_back(Sequence{next_id_, request.prompt, std::move(generation), KvSequence{}, 0, -1, false,
                              request.top_logprobs, PenaltyState(request.penalties, request.prompt),
                              request.grammar ? std::make_shared<grammar::GrammarMatcher>(request.grammar) : nullptr});
  return next_id_++;
}

bool StepPlanner::cancel(RequestId id) {
  auto is_id = [id](const Sequence& s) { return s.id == id; };
  if (auto it = std::find_if(waiting_.begin(), waiting_.end(), is_id); it != waiting_.end()) {
    waiting_.erase(it);
    return true;
  }
  if (auto it = std::find_if(running_.begin(), running_.end(), is_id); it != running_.end()) {
    it->kv.forget();  // nothing kept: the memory is freed with the sequence
    running_.erase(it);
    return true;
  }
  return false;
}

StepPlanner::Sequence& StepPlanner::running(RequestId id) {
  auto it = std::find_if(running_.begin(), running_.end(), [id](const Sequence& s) { return s.id == id; });
  G4_ASSERT(it != running_.end(), "request " + std::to_string(id) + " is not running");
  return *it;
}

KvSequence& StepPlanner::kv(RequestId id) { return running(id).kv; }

void StepPlanner::start_front(KvSequence kv) {
  running_.push_back(std::move(waiting_.front()));
  waiting_.pop_front();
  Sequence& s = running_.back();
  s.kv = std::move(kv);
  s.position = s.kv.position();  // a kept prefix taken over is already there
}

PlannedChunk StepPlanner::chunk(const Sequence& s, int64_t tokens) const {
  PlannedChunk c;
  c.id = s.id;
  c.position = s.position;
  c.decode = s.pending >= 0;
  if (c.decode) {
    c.tokens = {s.pending};
  } else {
    const auto first = s.prompt.begin() + s.position;
    c.tokens.assign(first, first + tokens);
  }
  if (c.decode || s.position + tokens == int64_t(s.prompt.size())) {
    c.draw = s.generation.next_params();
    c.top_logprobs = s.top_logprobs;
    c.adjustments = s.penalties.adjustments();
    if (s.matcher) c.mask = std::make_shared<const DrawMask>(s.matcher);
  }
  return c;
}

// A sequence's prompt chunk is min(what is left of its prompt, prefill_tokens_per_step) — never cut
// by other sequences, so its chunking depends only on its own prompt — and it runs this step if it
// fits in what is left of the step's budget. Waiting requests start, in arrival order, when the KV
// pool has room (taking over a kept prefix when one fits).
StepPlan StepPlanner::plan() {
  StepPlan plan;
  std::vector<PlannedChunk> chunks;
  for (const Sequence& s : running_)
    if (s.pending >= 0) chunks.push_back(chunk(s, 1));
  int64_t budget = limits_.prefill_tokens_per_step;
  auto take = [&](const Sequence& s) {
    const int64_t n = std::min(int64_t(s.prompt.size()) - s.position, limits_.prefill_tokens_per_step);
    if (n > budget) return false;
    chunks.push_back(chunk(s, n));
    budget -= n;
    return true;
  };
  bool room = true;
  for (const Sequence& s : running_)
    if (s.pending < 0 && !(room = take(s))) break;
  while (room && !waiting_.empty() && budget > 0) {
    std::optional<KvSequence> kv = pool_.try_acquire(limits_.max_seq_len, waiting_.front().prompt);
    if (!kv) break;  // the memory of running sequences comes back as they end
    plan.admitted.push_back(waiting_.front().id);
    start_front(std::move(*kv));
    room = take(running_.back());
  }
  plan.forwards = pack(std::move(chunks));
  return plan;
}

// Packed in order into forwards of at most forward_rows rows and forward_draws draws; a chunk larger
// than forward_rows runs in a forward of its own.
std::vector<PlannedForward> StepPlanner::pack(std::vector<PlannedChunk> chunks) const {
  std::vector<PlannedForward> forwards;
  int64_t rows = 0, draws = 0;
  for (PlannedChunk& c : chunks) {
    const int64_t n = int64_t(c.tokens.size()), d = c.draw ? 1 : 0;
    if (forwards.empty() || rows + n > limits_.forward_rows || draws + d > limits_.forward_draws) {
      forwards.emplace_back();
      rows = 0, draws = 0;
    }
    rows += n;
    draws += d;
    forwards.back().chunks.push_back(std::move(c));
  }
  return forwards;
}

void StepPlanner::admit(std::span<const RequestId> ids) {
  for (RequestId id : ids) {
    G4_ASSERT(!waiting_.empty() && waiting_.front().id == id,
              "the plan starts request " + std::to_string(id) + ", which is not the next waiting here");
    std::optional<KvSequence> kv = pool_.try_acquire(limits_.max_seq_len, waiting_.front().prompt);
    G4_ASSERT(kv.has_value(), "the plan starts request " + std::to_string(id) + ", for which this KV pool has no room");
    start_front(std::move(*kv));
  }
}

std::vector<SequenceEvent> StepPlanner::update(const StepPlan& plan, const StepResult& result) {
  G4_ASSERT(result.forwards.size() == plan.forwards.size(), "one result per planned forward");
  std::vector<SequenceEvent> events;
  for (size_t f = 0; f < plan.forwards.size(); ++f) {
    const ForwardDraws& out = result.forwards[f];
    size_t row = 0;  // among the forward's draws
    for (const PlannedChunk& c : plan.forwards[f].chunks) {
      Sequence& s = running(c.id);
      s.position += int64_t(c.tokens.size());
      if (!c.draw) continue;
      G4_ASSERT(row < out.tokens.size(), "a token for every draw");
      const int32_t token = out.tokens[row];
      if (token == kNanLogitsToken) {
        events.push_back(fail(s, kNanLogitsError));
        ++row;
        continue;
      }
      if (s.matcher && !s.matcher->accept_token(token)) {  // the mask allowed it: the backend broke the mask
        events.push_back(fail(s, "internal error: token " + std::to_string(token) + " was drawn outside the grammar"));
        ++row;
        continue;
      }
      const StopReason stop = s.generation.record(token, s.position, limits_.max_seq_len);
      s.penalties.record(token);
      s.ended = stop != StopReason::kNone;
      s.pending = s.ended ? -1 : token;
      SequenceEvent event{s.id, DecodedToken{token, stop}, std::nullopt, {}};
      if (c.top_logprobs >= 0) {
        const std::span<const float> logits(out.logits.data() + row * size_t(out.vocab), size_t(out.vocab));
        event.logprobs = token_logprobs(logits, token, c.top_logprobs);
      }
      events.push_back(std::move(event));
      ++row;
    }
  }
  // Sequences that ended leave; their caches stay in the pool, keyed by their tokens (a failed
  // one's are freed: it has no tokens).
  running_.remove_if([](const Sequence& s) { return s.ended; });
  return events;
}

SequenceEvent StepPlanner::fail(Sequence& s, const std::string& error) {
  s.ended = true;
  s.pending = -1;
  s.kv.forget();  // nothing kept: the memory is freed when the sequence leaves
  return SequenceEvent{s.id, DecodedToken{-1, StopReason::kFailed}, std::nullopt, error};
}

// ---- StepExecutor ----

StepExecutor::StepExecutor(ModelRunner& runner, bool cuda_graphs)
    : runner_(runner), graphs_(cuda_graphs ? std::make_unique<DecodeBatchGraphs>(runner) : nullptr) {}

StepResult StepExecutor::run(const StepPlan& plan, StepPlanner& sequences) {
  StepResult result;
  for (size_t f = 0; f < plan.forwards.size(); ++f)
    result.forwards.push_back(run_forward(int64_t(f), plan.forwards[f], sequences));
  return result;
}

ForwardDraws StepExecutor::run_forward(int64_t index, const PlannedForward& forward, StepPlanner& sequences) {
  std::vector<SequenceChunk> chunks;
  std::vector<SamplingParams> params;
  std::vector<std::vector<LogitAdjustment>> adjustments;  // per draw, when any draw has some
  std::vector<const DrawMask*> masks;                     // per draw, when any draw has one
  bool logprobs = false, adjusts = false, masked = false;
  for (const PlannedChunk& c : forward.chunks) {
    KvSequence& kv = sequences.kv(c.id);
    G4_ASSERT(kv.position() == c.position, "request " + std::to_string(c.id) + "'s caches hold " +
                                               std::to_string(kv.position()) + " positions; its chunk starts at " +
                                               std::to_string(c.position));
    chunks.push_back(SequenceChunk{&kv, c.tokens, c.draw ? 1 : 0});
    if (c.draw) {
      params.push_back(*c.draw);
      adjustments.push_back(c.adjustments);
      adjusts = adjusts || !c.adjustments.empty();
      masks.push_back(c.mask.get());
      masked = masked || c.mask;
    }
    logprobs = logprobs || (c.draw && c.top_logprobs >= 0);
  }
  ForwardDraws out;
  if (params.empty()) {
    runner_.forward(chunks, runner_.workspace_logits(1));
    return out;
  }
  // A forward that only decodes may replay a recording of itself; one that adjusts or masks logits
  // runs eagerly (its lists and masks change every step; a recording holds none).
  if (!adjusts) adjustments.clear();
  if (!masked) masks.clear();
  auto run = [&](const std::function<void()>& work) {
    if (!graphs_ || !forward.decodes_only() || adjusts || masked) return work();
    std::vector<const std::vector<KvCache>*> caches;
    for (const SequenceChunk& c : chunks) caches.push_back(&c.kv->caches());
    out.replayed = graphs_->run(index, caches, work);
  };
  out.tokens = runner_.forward_and_sample(chunks, params, adjustments, masks, run);
  if (logprobs) {  // as the draws saw them (after any logit bias and penalties)
    const Tensor logits = runner_.workspace_logits(int64_t(params.size())).logits;
    out.vocab = logits.cols;
    out.logits.resize(size_t(logits.numel()));
    runner_.download_result(logits, out.logits.data());
  }
  return out;
}

// ---- Scheduler ----

namespace {

SchedulerLimits limits_of(const ModelRunner& runner, const SchedulerOptions& options) {
  const int64_t chunk = runner.max_prefill_chunk();
  const int64_t per_step = options.prefill_tokens_per_step > 0 ? options.prefill_tokens_per_step : chunk;
  G4_CHECK(per_step <= chunk, "prefill_tokens_per_step " + std::to_string(per_step) +
                                  " exceeds the forward workspace (" + std::to_string(chunk) +
                                  " rows, max_prefill_chunk)");
  return SchedulerLimits{
      .max_seq_len = runner.max_seq_len(),
      .prefill_tokens_per_step = per_step,
      .forward_rows = options.batch_invariant ? std::min(runner.backend().batch_invariant_rows(), chunk) : chunk,
      .forward_draws = runner.max_batch_sequences(),
      .max_waiting = options.max_waiting,
  };
}

ModelRunner& with_batch_invariance(ModelRunner& runner, bool batch_invariant) {
  runner.backend().set_batch_invariant(batch_invariant);
  return runner;
}

}  // namespace

Scheduler::Scheduler(ModelRunner& runner, SchedulerOptions options)
    : runner_(with_batch_invariance(runner, options.batch_invariant)),
      planner_(runner.kv_pool(), limits_of(runner, options)),
      executor_(runner, options.cuda_graphs) {}

RequestId Scheduler::add(const SchedulerRequest& request) {
  runner_.check_tokens(request.prompt, 0, runner_.max_seq_len());
  check_penalties(request.penalties, runner_.config().vocab_size);
  if (request.grammar)
    G4_CHECK(request.grammar->vocabulary().size() <= runner_.config().vocab_size,
             "the grammar's vocabulary has " + std::to_string(request.grammar->vocabulary().size()) +
                 " tokens, more than the model's " + std::to_string(runner_.config().vocab_size));
  return planner_.add(request);
}

std::vector<SequenceEvent> Scheduler::execute(const StepPlan& plan) {
  stats_ = {};
  const StepResult result = executor_.run(plan, planner_);
  for (size_t f = 0; f < plan.forwards.size(); ++f) {
    bool decodes = false, prefills = false;
    for (const PlannedChunk& c : plan.forwards[f].chunks) {
      (c.decode ? stats_.decode_rows : stats_.prefill_rows) += int64_t(c.tokens.size());
      (c.decode ? decodes : prefills) = true;
    }
    stats_.decode_forwards += decodes ? 1 : 0;
    stats_.prefill_forwards += prefills ? 1 : 0;
    stats_.replayed_forwards += result.forwards[f].replayed ? 1 : 0;
    ++stats_.forwards;
  }
  return planner_.update(plan, result);
}

std::vector<SequenceEvent> Scheduler::follow(const StepPlan& plan) {
  planner_.admit(plan.admitted);
  return execute(plan);
}

}  // namespace g4
