#include "bench_held.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <span>
#include <vector>

#include "bench_concurrency.h"
#include "runtime/model_runner.h"
#include "util/error.h"

namespace g4::cli {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void run_now(const std::function<void()>& work) { work(); }

// The last forward's logits, `rows` rows.
std::vector<float> logits_of(const ModelRunner& runner, int64_t rows) {
  const Tensor logits = runner.workspace_logits(rows).logits;
  std::vector<float> out(size_t(rows * logits.cols));
  runner.download_result(logits, out.data());
  return out;
}

// A sequence holding `prompt`, prefilled in the runner's largest chunks.
KvSequence prefilled(ModelRunner& runner, std::span<const int32_t> prompt) {
  KvSequence kv = runner.kv_pool().start(runner.max_seq_len(), prompt);
  const LogitsOutput last = runner.workspace_logits(1);
  const int64_t chunk = runner.max_prefill_chunk(), end = int64_t(prompt.size());
  for (int64_t at = kv.position(); at < end; at += chunk) {  // after a cached prefix, if any
    const int64_t n = std::min(end - at, chunk);
    const SequenceChunk part{&kv, prompt.subspan(size_t(at), size_t(n)), at + n == end ? 1 : 0};
    runner.forward(std::span(&part, 1), last);
  }
  return kv;
}

// n copies of `image` swapped in, each into pages of its own, and `steps` greedy decode steps over
// them (the first fed `input`); the first step's logits must be `expected` in every row.
nlohmann::json decode_held(ModelRunner& runner, const SwappedSequence& image, int64_t n, int64_t steps, int32_t input,
                           const std::vector<float>& expected) {
  KvPool& pool = runner.kv_pool();
  Clock::time_point t = Clock::now();
  std::vector<KvSequence> held;
  for (int64_t i = 0; i < n; ++i) held.push_back(pool.swap_in(image));
  runner.backend().synchronize();
  const double copy_s = seconds_since(t);
  const size_t bytes_held = pool.bytes_in_use();

  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const std::vector<SamplingParams> params(size_t(n), greedy);
  std::vector<int32_t> next(size_t(n), input);
  std::vector<double> step_s;
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<SequenceChunk> chunks;
    for (size_t i = 0; i < held.size(); ++i) chunks.push_back({&held[i], std::span<const int32_t>(&next[i], 1), 1});
    t = Clock::now();
    next = runner.forward_and_sample(chunks, params, {}, {}, run_now);
    step_s.push_back(seconds_since(t));
    G4_CHECK(std::all_of(next.begin(), next.end(), [&](int32_t id) { return id == next[0]; }),
             "--held: sequences holding copies of one context drew different tokens");
    if (step > 0) continue;
    const std::vector<float> logits = logits_of(runner, n);
    for (size_t row = 0; row < size_t(n); ++row)
      G4_CHECK(std::equal(expected.begin(), expected.end(), logits.begin() + ptrdiff_t(row * expected.size())),
               "--held: sequence " + std::to_string(row) + " holds a copy of the first sequence's caches, but its "
               "logits differ from the first's");
  }
  // The first step is a warm-up (kernel selection, lazily built tables).
  std::sort(step_s.begin() + 1, step_s.end());
  const double median_s = step_s[1 + (step_s.size() - 1) / 2];
  return {{"held_sequences", n},
          {"kv_bytes_held", bytes_held},
          {"copy_s", copy_s},
          {"decode_step_ms_median", median_s * 1e3},
          {"decode_tok_s", double(n) / median_s}};
}

}  // namespace

nlohmann::json bench_held(const Gemma4& model, Backend& backend, const HeldBench& b) {
  const ModelConfig& c = model.config();
  G4_CHECK(!b.sequences.empty(), "--held: give sequence counts, e.g. 1,32");
  for (int64_t n : b.sequences) G4_CHECK(n >= 1, "--held: counts must be >= 1, got " + std::to_string(n));
  const int64_t most = *std::max_element(b.sequences.begin(), b.sequences.end());
  G4_CHECK(!b.prompt.empty() && b.steps >= 2, "--held needs --prompt_len >= 1 and --gen >= 2");
  const int64_t context = int64_t(b.prompt.size());
  const int64_t max_seq_len = std::max(min_max_seq_len(c), context + b.steps + 8);
  check_max_seq_len(c, max_seq_len);
  RunnerOptions ro;
  ro.max_seq_len = max_seq_len;
  ro.max_batch_sequences = most;
  ro.kv_budget_sequences = most;  // the budget is then cut to what the device has free
  ro.kv_types = b.kv_types;
  ModelRunner runner(model, backend, ro);
  backend.set_batch_invariant(true);  // as the scheduler serves by default
  KvPool& pool = runner.kv_pool();

  const Clock::time_point t = Clock::now();
  KvSequence first = prefilled(runner, b.prompt);
  backend.synchronize();
  const double prefill_s = seconds_since(t);

  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const std::vector<SamplingParams> params(1, greedy);
  // The first step's input (any token times the same): the prompt's last. The first sequence's own
  // logits for it, against which its copies' are checked (batch invariance makes them the same bits
  // in a batch of any size); that position is then dropped again.
  const int32_t input = b.prompt.back();
  const SequenceChunk probe{&first, std::span<const int32_t>(&input, 1), 1};
  runner.forward_and_sample(std::span(&probe, 1), params, {}, {}, run_now);
  const std::vector<float> expected = logits_of(runner, 1);
  first.truncate(context);
  pool.release_unread(first);
  // A decoding sequence holds its full layers' pages and its sliding layers' windows (a prefill's
  // larger ring is given back as the window moves): what the first holds now, and what its
  // decode steps may add.
  const int64_t per_sequence = first.pages_held() + pool.pages_to_reach(first, context + b.steps + 1);
  const int64_t capacity = pool.pages_total() / per_sequence;
  G4_REQUIRE(kResourceExhausted, capacity >= most,
             "--held " + std::to_string(most) + ": the KV pool (" + std::to_string(pool.pages_total()) +
                 " pages of " + std::to_string(pool.page_bytes()) + " bytes) holds " + std::to_string(capacity) +
                 " decoding sequences of " + std::to_string(context) + " positions");

  const SwappedSequence image = pool.swap_out(std::move(first));
  nlohmann::json runs = nlohmann::json::array();
  for (const int64_t n : b.sequences) runs.push_back(decode_held(runner, image, n, b.steps, input, expected));
  nlohmann::json r = {{"backend", backend.name()},
                      {"context", context},
                      {"max_seq_len", max_seq_len},
                      {"sequences_that_fit", capacity},
                      {"kv_page_bytes", pool.page_bytes()},
                      {"kv_pages_total", pool.pages_total()},
                      {"kv_pages_per_sequence", per_sequence},
                      {"prefill_s", prefill_s},
                      {"decode_steps", b.steps},
                      {"runs", runs}};
  r.update(kv_cache_json(pool));
  return r;
}

}  // namespace g4::cli
