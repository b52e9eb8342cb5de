#include "runtime/speculation.h"

#include <chrono>

#include "sampling/speculative.h"
#include "util/error.h"
#include "util/seconds.h"

namespace g4 {

Speculation::Speculation(const Gemma4Assistant& assistant, ModelRunner& runner, int64_t draft_tokens,
                         int64_t max_chunk)
    : runner_(runner), k_(draft_tokens), drafter_(assistant, runner, 1, 1, draft_tokens) {
  G4_CHECK(k_ >= 1 && k_ + 1 <= max_chunk, "--draft_tokens must be in [1, " + std::to_string(max_chunk - 1) +
                                               "] (the drafts and the pending token run in one forward of at most " +
                                               std::to_string(max_chunk) + " tokens), got " + std::to_string(k_));
  Backend& be = runner.backend();
  // A verify is K + 1 rows of one sequence. Batch-invariant kernels read each weight once for up to
  // 8 rows (CUDA's Q4_0 records: 8 rows cost ~1.15 one row's time, the packed kernels ~2.2 times;
  // docs/PERF.md), so a session that drafts asks the backend for them.
  be.set_batch_invariant(true);
  const ModelConfig& c = runner.config();
  const DType act = be.activation_dtype();
  verify_normed_ = be.alloc(act, k_ + 1, c.hidden_size);
  verify_act_ = be.alloc(act, k_ + 1, c.vocab_size);
  verify_logits_ = be.alloc(DType::F32, k_ + 1, c.vocab_size);
  verify_tokens_ = be.alloc(DType::I64, k_ + 1, 1);
  verify_verdict_ = be.alloc(DType::I64, 2, 1);
  verify_params_ = be.alloc_sampling_rows(k_ + 1);
}

void Speculation::take_hidden(const Tensor& normed_row) {
  hidden_.resize(normed_row.row_size());
  runner_.download_result(normed_row, hidden_.data());
}

void Speculation::upload_verify_params(const Sampler& sampler, int64_t j, int64_t n) {
  std::vector<SamplingParams> params;
  for (int64_t i = 0; i < n; ++i) params.push_back(sampler.for_token(j + i));
  runner_.backend().upload_sampling_rows(params, verify_params_);
}

DraftVerdict Speculation::judge_by_target_draws(int64_t n, std::span<const int32_t> drafts) {
  runner_.backend().sample(verify_logits_.rows_view(0, n), verify_params_.first(n), verify_tokens_.rows_view(0, n));
  std::vector<int64_t> drawn(static_cast<size_t>(n));
  runner_.download_result(verify_tokens_.rows_view(0, n), drawn.data());
  return judge_greedy_draws(std::vector<int32_t>(drawn.begin(), drawn.end()), drafts);
}

DraftVerdict Speculation::judge_sampled(int64_t n, const Drafts& drafted) {
  runner_.backend().judge_drafts(verify_logits_.rows_view(0, n), drafted.rows, verify_params_.first(n), verify_verdict_);
  int64_t verdict[2];
  runner_.download_result(verify_verdict_, verdict);
  return verdict_from(verdict[0], verdict[1]);
}

void Speculation::adjust_verify_logits(const PenaltyState& penalties, std::span<const int32_t> drafts, int64_t n) {
  if (penalties.empty()) return;
  G4_ASSERT(int64_t(drafts.size()) + 1 == n, "a verify round's rows are its drafts and one more");
  const AdjustmentRows staged = runner_.stage_adjustments(penalties.adjustments_along(drafts));
  if (staged.rows > 0) runner_.backend().adjust_logits(verify_logits_.rows_view(0, n), staged);
}

std::vector<int32_t> Speculation::round(KvSequence& kv, int32_t pending, const Sampler& sampler, int64_t j,
                                        int64_t k, const PenaltyState& penalties) {
  G4_CHECK(k >= 1 && k <= k_, "a draft round of " + std::to_string(k) + " tokens (at most " + std::to_string(k_) + ")");
  const int64_t P = kv.position(), V = runner_.config().vocab_size;

  // The drafts: every step at position P, over the caches of the tokens before x (their pages and
  // tables prepared for the verify first: the assistant reads through the tables).
  auto t0 = std::chrono::steady_clock::now();
  runner_.kv_pool().prepare(kv, k + 1);
  const DraftRequest request{&kv.caches(), pending, P, hidden_, sampler.for_token(j), k};
  Drafts drafted = std::move(drafter_.draft(std::span(&request, 1))[0]);
  if (forced_) {
    G4_CHECK(sampler.greedy(), "forced acceptance needs greedy decoding");
    forced_->force(drafted.tokens, j, stats_.rounds, V);
  }
  std::vector<int32_t> tokens{pending};
  tokens.insert(tokens.end(), drafted.tokens.begin(), drafted.tokens.end());
  const int64_t n = int64_t(tokens.size());
  stats_.draft_seconds += seconds_since(t0);

  // The verify: x and the drafts in one forward, the logits of every position.
  t0 = std::chrono::steady_clock::now();
  const SequenceChunk chunk{&kv, tokens, n};
  runner_.forward(std::span(&chunk, 1), LogitsOutput{verify_normed_.rows_view(0, n), verify_act_.rows_view(0, n),
                                                     verify_logits_.rows_view(0, n)});
  const std::span<const int32_t> drafts(tokens.data() + 1, size_t(n - 1));
  adjust_verify_logits(penalties, drafts, n);
  upload_verify_params(sampler, j, n);
  const DraftVerdict verdict =
      sampler.greedy() || drafts.empty() ? judge_by_target_draws(n, drafts) : judge_sampled(n, drafted);
  kv.truncate(P + verdict.accepted + 1);
  take_hidden(verify_normed_.rows_view(verdict.accepted, 1));
  stats_.verify_seconds += seconds_since(t0);
  ++stats_.rounds;
  stats_.drafted += n - 1;
  stats_.accepted += verdict.accepted;

  std::vector<int32_t> out(drafts.begin(), drafts.begin() + verdict.accepted);
  out.push_back(int32_t(checked_token(verdict.token)));
  return out;
}

}  // namespace g4
