#include "bench_concurrency.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <random>

#include "runtime/model_runner.h"
#include "runtime/scheduler.h"
#include "util/error.h"

namespace g4::cli {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// The q-quantile of `v` (nearest rank).
double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size())))];
}

// N requests admitted at once, run to the end: the scheduler's throughput and latencies.
nlohmann::json run_requests(const Gemma4& model, Backend& backend, const ConcurrencyBench& b, int64_t n) {
  const ModelConfig& c = model.config();
  RunnerOptions ro;
  ro.max_seq_len = std::max(min_max_seq_len(c), std::min(c.max_position_embeddings, b.prompt_len + b.gen + 8));
  ro.max_batch_sequences = b.draft.assistant ? std::max(n, b.draft.draft_tokens + 1) : n;
  ro.kv_budget_sequences = n;
  ro.kv_types = b.kv_types;
  ModelRunner runner(model, backend, ro);
  Scheduler scheduler(runner, SchedulerOptions{.max_waiting = size_t(n), .batch_invariant = b.batch_invariant,
                                               .cuda_graphs = b.cuda_graphs, .draft = b.draft});
  std::mt19937 rng(unsigned(b.seed));
  std::map<RequestId, Clock::time_point> first, last;
  std::map<RequestId, int64_t> tokens;
  const Clock::time_point start = Clock::now();
  for (int64_t i = 0; i < n; ++i) {
    SchedulerRequest r;
    r.prompt.resize(size_t(b.prompt_len));
    for (int32_t& id : r.prompt) id = int32_t(rng() % uint32_t(c.vocab_size));
    r.sampling = SamplingParams{.temperature = 1.0f, .top_p = 0.95f, .top_k = 64, .seed = b.seed + uint64_t(i)};
    r.max_new_tokens = b.gen;
    r.stop_ids = {};  // every sequence generates exactly `gen` tokens, unless its grammar ends it
    if (b.grammar) {
      r.grammar = b.grammar;
      r.stop_ids = b.grammar->vocabulary().stop_tokens();
    }
    scheduler.add(r);
  }
  // Full decode steps: every sequence running and none of them prefilling (each step's event is a
  // sequence's second or later token): the steady state that gen >> the admission steps approaches.
  int64_t steps = 0, full_decode_steps = 0, full_decode_tokens = 0, replayed_steps = 0;
  double full_decode_s = 0;
  Clock::time_point step_start = start;
  // Past a few full decode steps (the steady state), the next profile_steps are bracketed for a
  // profiler (Backend::set_profiling; ncu --profile-from-start off).
  constexpr int64_t kUnprofiledSteps = 4;
  int64_t profiled_steps = 0, most_running = 0, most_pages_in_use = 0, most_pages_shared = 0;
  const KvPool& pool = runner.kv_pool();
  while (!scheduler.idle()) {
    const bool profiling = full_decode_steps >= kUnprofiledSteps && profiled_steps < b.profile_steps;
    if (profiling && profiled_steps == 0) backend.set_profiling(true);
    const std::vector<SequenceEvent> events = scheduler.step();
    backend.synchronize();
    if (profiling && ++profiled_steps == b.profile_steps) backend.set_profiling(false);
    const Clock::time_point now = Clock::now();
    ++steps;
    most_running = std::max(most_running, int64_t(scheduler.running()));
    most_pages_in_use = std::max(most_pages_in_use, pool.pages_in_use());
    most_pages_shared = std::max(most_pages_shared, pool.pages_shared());
    replayed_steps += scheduler.last_step().replayed_forwards > 0 ? 1 : 0;
    // (A draft round gives a sequence several tokens a step.)
    std::set<RequestId> ids;
    for (const SequenceEvent& e : events) ids.insert(e.id);
    const bool full_decode = int64_t(ids.size()) == n && std::all_of(events.begin(), events.end(), [&](const SequenceEvent& e) {
                               return first.count(e.id) > 0;
                             });
    if (full_decode) {
      ++full_decode_steps;
      full_decode_tokens += int64_t(events.size());
      full_decode_s += seconds_between(step_start, now);
    }
    step_start = now;
    for (const SequenceEvent& e : events) {
      if (!first.count(e.id)) first[e.id] = now;
      last[e.id] = now;
      ++tokens[e.id];
    }
  }
  if (profiled_steps > 0 && profiled_steps < b.profile_steps) backend.set_profiling(false);  // the run ended first
  const double wall = seconds_between(start, Clock::now());
  std::vector<double> ttft, per_sequence;
  int64_t generated = 0;
  for (const auto& [id, t] : first) {
    ttft.push_back(seconds_between(start, t));
    generated += tokens[id];
    const double decode_s = seconds_between(t, last[id]);
    if (tokens[id] > 1 && decode_s > 0) per_sequence.push_back(double(tokens[id] - 1) / decode_s);
  }
  G4_CHECK(b.grammar ? generated <= n * b.gen : generated == n * b.gen,
           "bench: " + std::to_string(generated) + " tokens generated, expected " + std::to_string(n * b.gen));
  double mean_decode = 0;
  for (double v : per_sequence) mean_decode += v / double(per_sequence.size());
  nlohmann::json run = {{"concurrency", n},
          {"generated_tokens", generated},
          {"wall_s", wall},
          {"steps", steps},
          {"aggregate_tok_s", double(generated) / wall},
          {"per_sequence_decode_tok_s", mean_decode},
          {"ttft_p50_s", quantile(ttft, 0.5)},
          {"ttft_p99_s", quantile(ttft, 0.99)},
          {"full_decode_steps", full_decode_steps},
          {"replayed_steps", replayed_steps},
          {"most_running", most_running},
          {"preemptions", scheduler.preemptions()},
          {"kv_page_bytes", pool.page_bytes()},
          {"kv_pages_total", pool.pages_total()},
          {"kv_most_pages_in_use", most_pages_in_use},
          {"kv_most_pages_shared", most_pages_shared}};
  run.update(kv_cache_json(pool));
  if (b.profile_steps > 0) run["profiled_steps"] = profiled_steps;
  if (b.draft.assistant) {
    const SpeculationStats& s = scheduler.speculation_stats();
    run["draft_rounds"] = s.rounds;
    run["draft_acceptance"] = s.acceptance();
    run["draft_tokens_per_round"] = s.tokens_per_round();
    run["draft_s"] = s.draft_seconds;
    run["verify_s"] = s.verify_seconds;
  }
  if (full_decode_steps > 0) {
    run["full_decode_step_ms"] = 1e3 * full_decode_s / double(full_decode_steps);
    run["full_decode_tok_s"] = double(full_decode_tokens) / full_decode_s;
  } else {
    run["full_decode_missing"] = "no step decoded every one of the " + std::to_string(n) +
                                 " sequences: the first ended before the last was admitted (raise --gen), or "
                                 "the KV pool holds fewer (most_running)";
  }
  return run;
}

// The sampler alone on `rows` rows of logits (top-k 64, top-p 0.95), back to back.
double sampler_seconds(Backend& backend, int64_t rows, int64_t vocab) {
  const Tensor logits = backend.alloc(DType::F32, rows, vocab), tokens = backend.alloc(DType::I64, rows, 1);
  const SamplingRows params = backend.alloc_sampling_rows(rows);
  backend.fill_uniform(logits, 0.0f, 8.0f, 7);
  std::vector<SamplingParams> p(size_t(rows), SamplingParams{.temperature = 1.0f, .top_p = 0.95f, .top_k = 64, .seed = 3});
  backend.upload_sampling_rows(p, params);
  backend.sample(logits, params, tokens);
  backend.synchronize();
  const int reps = 50;
  const Clock::time_point t = Clock::now();
  for (int i = 0; i < reps; ++i) backend.sample(logits, params, tokens);
  backend.synchronize();
  return seconds_between(t, Clock::now()) / reps;
}

}  // namespace

nlohmann::json kv_cache_json(const KvPool& pool) {
  return {{"kv_type", kv_type_name(pool.types().full)},
          {"kv_sliding_type", kv_type_name(pool.types().sliding)},
          {"kv_bytes_per_token_full", pool.bytes_per_token().full},
          {"kv_bytes_per_token_sliding", pool.bytes_per_token().sliding}};
}

nlohmann::json bench_concurrency(const Gemma4& model, Backend& backend, const ConcurrencyBench& b) {
  G4_CHECK(!b.concurrency.empty(), "--concurrency: give sequence counts, e.g. 1,8,32,64");
  for (int64_t n : b.concurrency) G4_CHECK(n >= 1, "--concurrency: counts must be >= 1, got " + std::to_string(n));
  // One short request first, not reported: one-time work (batch-invariant CUDA rearranges Q4_0
  // weights when invariance is turned on; recordings are made) stays out of the timed steps.
  ConcurrencyBench warm_up = b;
  warm_up.prompt_len = 1;
  warm_up.gen = 2;
  run_requests(model, backend, warm_up, 1);
  nlohmann::json runs = nlohmann::json::array();
  for (int64_t n : b.concurrency) runs.push_back(run_requests(model, backend, b, n));
  const int64_t widest = *std::max_element(b.concurrency.begin(), b.concurrency.end());
  return {{"backend", backend.name()},
          {"prompt_len", b.prompt_len},
          {"batch_invariant", b.batch_invariant},
          {"cuda_graphs", b.cuda_graphs},
          {"constrained", b.grammar != nullptr},
          {"gen", b.gen},
          {"runs", runs},
          {"sampler_rows", widest},
          {"sampler_us", 1e6 * sampler_seconds(backend, widest, model.config().vocab_size)}};
}

}  // namespace g4::cli
