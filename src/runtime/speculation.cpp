#include "runtime/speculation.h"

#include <chrono>

#include "sampling/speculative.h"
#include "util/error.h"
#include "util/seconds.h"

namespace g4 {

Speculation::Speculation(const Gemma4Assistant& assistant, ModelRunner& runner, int64_t draft_tokens,
                         int64_t max_chunk)
    : assistant_(assistant), runner_(runner), k_(draft_tokens), buf_(assistant.config(), runner.backend(), 1) {
  assistant_cache_layers(runner.config(), assistant.config());
  G4_CHECK(k_ >= 1 && k_ + 1 <= max_chunk, "--draft_tokens must be in [1, " + std::to_string(max_chunk - 1) +
                                               "] (the drafts and the pending token run in one forward of at most " +
                                               std::to_string(max_chunk) + " tokens), got " + std::to_string(k_));
  Backend& be = runner.backend();
  const ModelConfig& c = runner.config();
  const DType act = be.activation_dtype();
  ids_ = be.alloc(DType::I32, 1, 1);
  positions_ = be.alloc(DType::I32, 1, 1);
  target_h_ = be.alloc(act, 1, c.hidden_size);
  h_ = be.alloc(act, 1, c.hidden_size);
  draft_logits_ = be.alloc(DType::F32, k_, c.vocab_size);
  token_ = be.alloc(DType::I64, 1, 1);
  params_ = be.alloc_sampling_rows(1);
  verify_normed_ = be.alloc(act, k_ + 1, c.hidden_size);
  verify_act_ = be.alloc(act, k_ + 1, c.vocab_size);
  verify_logits_ = be.alloc(DType::F32, k_ + 1, c.vocab_size);
}

void Speculation::take_hidden(const Tensor& normed_row) {
  runner_.backend().concat_cols(std::span(&normed_row, 1), target_h_);
}

int32_t Speculation::draw_draft(const Sampler& sampler, int64_t j, int64_t i) {
  Backend& be = runner_.backend();
  const SamplingParams params = sampler.for_token(j + i);
  be.upload_sampling_rows({&params, 1}, params_);
  be.sample(draft_logits_.rows_view(i, 1), params_, token_);
  int64_t drawn = 0;
  runner_.download_result(token_, &drawn);
  return int32_t(checked_token(drawn));
}

std::vector<int32_t> Speculation::round(KvSequence& kv, int32_t pending, const Sampler& sampler, int64_t j,
                                        int64_t k) {
  G4_CHECK(k >= 1 && k <= k_, "a draft round of " + std::to_string(k) + " tokens (at most " + std::to_string(k_) + ")");
  Backend& be = runner_.backend();
  const ModelConfig& c = runner_.config();
  const int64_t P = kv.position(), V = c.vocab_size;

  // The drafts: every step at position P, over the caches of the tokens before x.
  auto t0 = std::chrono::steady_clock::now();
  std::vector<int32_t> tokens{pending};
  const int32_t position = int32_t(P);
  be.upload(&position, positions_);
  const DraftRow rows[] = {{&kv.caches()}};
  for (int64_t i = 0; i < k; ++i) {
    be.upload(&tokens.back(), ids_);
    assistant_.step(be, buf_, runner_.model(), rows, ids_, positions_, i == 0 ? target_h_ : h_,
                    draft_logits_.rows_view(i, 1), h_);
    tokens.push_back(draw_draft(sampler, j, i));
  }
  stats_.draft_seconds += seconds_since(t0);

  // The verify: x and the drafts in one forward, the logits of every position.
  t0 = std::chrono::steady_clock::now();
  const SequenceChunk chunk{&kv, tokens, k + 1};
  runner_.forward(std::span(&chunk, 1), LogitsOutput{verify_normed_.rows_view(0, k + 1),
                                                     verify_act_.rows_view(0, k + 1), verify_logits_.rows_view(0, k + 1)});
  std::vector<float> target(size_t((k + 1) * V)), draft;
  runner_.download_result(verify_logits_.rows_view(0, k + 1), target.data());
  if (!sampler.greedy()) {
    draft.resize(size_t(k * V));
    be.download(draft_logits_.rows_view(0, k), draft.data());
  }
  const std::span<const int32_t> drafts(tokens.data() + 1, size_t(k));
  const DraftVerdict verdict = judge_drafts(target, draft, drafts, V, sampler.for_token(j));
  kv.truncate(P + verdict.accepted + 1);
  take_hidden(verify_normed_.rows_view(verdict.accepted, 1));
  stats_.verify_seconds += seconds_since(t0);
  ++stats_.rounds;
  stats_.drafted += k;
  stats_.accepted += verdict.accepted;

  std::vector<int32_t> out(drafts.begin(), drafts.begin() + verdict.accepted);
  out.push_back(int32_t(checked_token(verdict.token)));
  return out;
}

}  // namespace g4
