#include "runtime/scheduler.h"

#include <algorithm>
#include <functional>

#include "sampling/sampler.h"
#include "util/error.h"

namespace g4 {

Scheduler::Scheduler(ModelRunner& runner, SchedulerOptions options)
    : runner_(runner),
      prefill_per_step_(options.prefill_tokens_per_step > 0 ? options.prefill_tokens_per_step
                                                            : runner.max_prefill_chunk()),
      max_waiting_(options.max_waiting),
      graphs_(options.cuda_graphs ? std::make_unique<DecodeBatchGraphs>(runner) : nullptr) {
  runner.backend().set_batch_invariant(options.batch_invariant);
  forward_rows_ = options.batch_invariant ? std::min(runner.backend().batch_invariant_rows(), runner.max_prefill_chunk())
                                          : runner.max_prefill_chunk();
  G4_CHECK(prefill_per_step_ <= runner.max_prefill_chunk(),
           "prefill_tokens_per_step " + std::to_string(prefill_per_step_) + " exceeds the forward workspace (" +
               std::to_string(runner.max_prefill_chunk()) + " rows, max_prefill_chunk)");
}

RequestId Scheduler::add(const SchedulerRequest& request) {
  runner_.check_tokens(request.prompt, 0, runner_.max_seq_len());
  Generation generation(Sampler(request.sampling), GenerationLimits{request.max_new_tokens, request.stop_ids});
  const KvPool& pool = runner_.kv_pool();
  const size_t bytes = pool.sequence_bytes(runner_.max_seq_len());
  G4_CHECK(bytes <= pool.budget_bytes(), "out of KV memory: " + std::to_string(bytes) +
                                             " bytes requested, more than the whole budget of " +
                                             std::to_string(pool.budget_bytes()) + " bytes");
  G4_CHECK(request.top_logprobs >= -1 && request.top_logprobs <= kMaxTopLogprobs,
           "top_logprobs must be in [0, " + std::to_string(kMaxTopLogprobs) + "] (or -1: none), got " +
               std::to_string(request.top_logprobs));
  G4_CHECK(waiting_.size() < max_waiting_,
           "busy: " + std::to_string(waiting_.size()) + " requests are waiting (the queue's bound); try again later");
  waiting_.push_back(
      Sequence{next_id_, request.prompt, std::move(generation), KvSequence{}, -1, false, request.top_logprobs});
  return next_id_++;
}

bool Scheduler::cancel(RequestId id) {
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

std::vector<SequenceEvent> Scheduler::step() {
  stats_ = {};
  std::vector<SequenceEvent> events;
  std::vector<Work> work;  // decode rows first, in arrival order, then the step's prefill chunks
  for (Sequence& s : running_)
    if (s.pending >= 0) work.push_back(Work{&s, 1});
  for (const Work& chunk : plan_prefill()) work.push_back(chunk);
  // Packed in order into forwards of at most forward_rows_ rows and max_batch_sequences outputs;
  // a chunk larger than forward_rows_ runs in a forward of its own.
  size_t first = 0;
  int64_t rows = 0, outputs = 0;
  for (size_t i = 0; i < work.size(); ++i) {
    const int64_t n = work[i].tokens, out = work[i].ends_prompt_or_decodes() ? 1 : 0;
    if (i > first && (rows + n > forward_rows_ || outputs + out > runner_.max_batch_sequences())) {
      run_forward(std::span(work).subspan(first, i - first), events);
      first = i, rows = 0, outputs = 0;
    }
    rows += n;
    outputs += out;
  }
  if (first < work.size()) run_forward(std::span(work).subspan(first), events);
  drop_ended();
  return events;
}

std::vector<float> Scheduler::logprob_rows(std::span<Sequence* const> rows, const Tensor& logits) {
  const bool wanted = std::any_of(rows.begin(), rows.end(), [](const Sequence* s) { return s->top_logprobs >= 0; });
  if (!wanted) return {};
  std::vector<float> host(size_t(logits.numel()));
  runner_.download_result(logits, host.data());
  return host;
}

void Scheduler::record_draws(std::span<Sequence* const> rows, std::span<const int32_t> tokens,
                             std::vector<SequenceEvent>& events) {
  const Tensor logits = runner_.workspace_logits(int64_t(rows.size())).logits;
  const std::vector<float> host_logits = logprob_rows(rows, logits);  // the draws left them as they were
  for (size_t i = 0; i < rows.size(); ++i) {
    Sequence& s = *rows[i];
    if (tokens[i] == kNanLogitsToken) {
      events.push_back(fail(s, kNanLogitsError));
      continue;
    }
    const StopReason stop = s.generation.record(tokens[i], s.kv.position(), s.kv.max_seq_len());
    s.ended = stop != StopReason::kNone;
    s.pending = s.ended ? -1 : tokens[i];
    SequenceEvent event{s.id, DecodedToken{tokens[i], stop}, std::nullopt, {}};
    if (s.top_logprobs >= 0) {
      const std::span<const float> row(host_logits.data() + i * size_t(logits.cols), size_t(logits.cols));
      event.logprobs = token_logprobs(row, tokens[i], s.top_logprobs);
    }
    events.push_back(std::move(event));
  }
}

SequenceEvent Scheduler::fail(Sequence& s, const std::string& error) {
  s.ended = true;
  s.pending = -1;
  s.kv.forget();  // nothing kept: the memory is freed when the sequence leaves
  return SequenceEvent{s.id, DecodedToken{-1, StopReason::kFailed}, std::nullopt, error};
}

// Sequences that ended leave; their caches stay in the pool, keyed by their tokens (a failed one's
// are freed: it has no tokens).
void Scheduler::drop_ended() {
  running_.remove_if([](const Sequence& s) { return s.ended; });
}

// A sequence's chunk is min(what is left of its prompt, prefill_tokens_per_step) — never cut by
// other sequences, so its chunking depends only on its own prompt — and it runs this step if it
// fits in what is left of the step's budget. Waiting requests start, in arrival order, when the
// KV pool has room (taking over a kept prefix when one fits).
std::vector<Scheduler::Work> Scheduler::plan_prefill() {
  std::vector<Work> plan;
  int64_t budget = prefill_per_step_;
  auto take = [&](Sequence& s) {
    const int64_t left = int64_t(s.prompt.size()) - s.kv.position();
    const int64_t n = std::min(left, prefill_per_step_);
    if (n > budget) return false;
    plan.push_back(Work{&s, n});
    budget -= n;
    return true;
  };
  for (Sequence& s : running_)
    if (s.pending < 0 && !take(s)) return plan;
  while (!waiting_.empty() && budget > 0) {
    std::optional<KvSequence> kv = runner_.kv_pool().try_acquire(runner_.max_seq_len(), waiting_.front().prompt);
    if (!kv) break;  // the memory of running sequences comes back as they end
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    running_.back().kv = std::move(*kv);
    if (!take(running_.back())) break;
  }
  return plan;
}

void Scheduler::run_forward(std::span<const Work> work, std::vector<SequenceEvent>& events) {
  std::vector<SequenceChunk> chunks;
  std::vector<Sequence*> drawing;  // decode rows and the sequences whose prompt ends here, in order
  bool decodes = false, prefills = false;
  for (const Work& w : work) {
    Sequence& s = *w.sequence;
    const bool decode = s.pending >= 0;
    const std::span<const int32_t> tokens =
        decode ? std::span<const int32_t>(&s.pending, 1)
               : std::span<const int32_t>(s.prompt).subspan(size_t(s.kv.position()), size_t(w.tokens));
    const bool draws = w.ends_prompt_or_decodes();
    chunks.push_back(SequenceChunk{&s.kv, tokens, draws ? 1 : 0});
    if (draws) drawing.push_back(&s);
    (decode ? stats_.decode_rows : stats_.prefill_rows) += w.tokens;
    (decode ? decodes : prefills) = true;
  }
  if (drawing.empty()) {
    runner_.forward(chunks, runner_.workspace_logits(1));
  } else {
    std::vector<SamplingParams> params;
    for (const Sequence* s : drawing) params.push_back(s->generation.next_params());
    // A forward that only decodes may replay a recording of itself (stats_.forwards: this forward's
    // number in the step).
    auto run = [&](const std::function<void()>& work) {
      if (!graphs_ || prefills) return work();
      std::vector<const std::vector<KvCache>*> caches;
      for (const SequenceChunk& c : chunks) caches.push_back(&c.kv->caches());
      if (graphs_->run(stats_.forwards, caches, work)) ++stats_.replayed_forwards;
    };
    record_draws(drawing, runner_.forward_and_sample(chunks, params, run), events);
  }
  stats_.decode_forwards += decodes ? 1 : 0;
  stats_.prefill_forwards += prefills ? 1 : 0;
  ++stats_.forwards;
}

}  // namespace g4
