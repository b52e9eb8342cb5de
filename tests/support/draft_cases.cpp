#include "support/draft_cases.h"

#include <random>

#include "sampling/cpu_sampler.h"

namespace g4::test {

std::vector<SamplingParams> DraftCase::verify_rows() const {
  std::vector<SamplingParams> rows(size_t(k + 1), params);
  for (int64_t i = 0; i <= k; ++i) rows[size_t(i)].seed = params.seed + uint64_t(i);
  return rows;
}

DraftCase make_draft_case(int64_t k, int64_t vocab, int64_t first, int64_t step, const SamplingParams& params,
                          float noise, uint32_t seed) {
  DraftCase c{k, vocab, first, step, params};
  std::mt19937 rng(seed);
  std::normal_distribution<float> spread(0.0f, 3.0f), jitter(0.0f, noise);
  c.draft_logits.resize(size_t(k * step * vocab));
  for (float& z : c.draft_logits) z = spread(rng);
  c.draft_tokens.assign(size_t(k * step), -1);
  c.target.resize(size_t((k + 1) * vocab));
  const std::vector<SamplingParams> rows = c.verify_rows();
  for (int64_t i = 0; i < k; ++i) {
    const int64_t row = first + i * step;
    const float* q = c.draft_logits.data() + row * vocab;
    c.draft_tokens[size_t(row)] = sample_row(q, vocab, rows[size_t(i)]);
    for (int64_t v = 0; v < vocab; ++v) c.target[size_t(i * vocab + v)] = q[v] + jitter(rng);
  }
  for (int64_t v = 0; v < vocab; ++v) c.target[size_t(k * vocab + v)] = spread(rng);
  return c;
}

DraftCaseVerdict judge_on(Backend& be, const DraftCase& c) {
  const int64_t rows = c.k * c.step;
  Tensor target = be.alloc(DType::F32, c.k + 1, c.vocab), logits = be.alloc(DType::F32, rows, c.vocab);
  Tensor tokens = be.alloc(DType::I64, rows, 1), verdict = be.alloc(DType::I64, 2, 1);
  be.upload(c.target.data(), target);
  be.upload(c.draft_logits.data(), logits);
  be.upload(c.draft_tokens.data(), tokens);
  SamplingRows params = be.alloc_sampling_rows(c.k + 1);
  be.upload_sampling_rows(c.verify_rows(), params);
  be.judge_drafts(target, DraftRows{tokens, logits, c.first, c.step, c.k}, params, verdict);
  int64_t out[2];
  be.download(verdict, out);
  return {out[0], out[1]};
}

}  // namespace g4::test
