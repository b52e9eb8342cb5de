#include "sampling/speculative.h"

#include <algorithm>
#include <string>
#include <vector>

#include "sampling/cpu_sampler.h"
#include "sampling/philox.h"
#include "sampling/speculative_math.h"
#include "util/error.h"

namespace g4 {

namespace {

using namespace sampling;

uint64_t weight_of(const std::vector<KeptToken>& kept, int32_t id) {
  const auto it = std::lower_bound(kept.begin(), kept.end(), id, [](const KeptToken& t, int32_t v) { return t.id < v; });
  return it != kept.end() && it->id == id ? it->weight : 0;
}

// The correction after a rejected draft: the draw from max(p - q, 0) (speculative_math.h), ids
// ascending.
int64_t correction(const std::vector<KeptToken>& p, uint64_t p_total, const std::vector<KeptToken>& q,
                   uint64_t q_total, uint64_t seed) {
  auto residual = [&](const KeptToken& t) { return residual_weight(t.weight, p_total, weight_of(q, t.id), q_total); };
  u128 total = 0;
  for (const KeptToken& t : p) total += residual(t);
  if (total == 0) return kNoResidualMass;  // unreachable: a rejection means p(x) < q(x) for some x
  const u128 target = draw_target_128(philox_correction_bits(seed), total);
  u128 cumulative = 0;
  for (const KeptToken& t : p) {
    cumulative += residual(t);
    if (cumulative >= target) return t.id;
  }
  throw Error(ErrorKind::kInternal, "speculative: correction target exceeds the residual mass");
}

}  // namespace

DraftVerdict judge_drafts(std::span<const float> target_logits, std::span<const float> draft_logits,
                          std::span<const int32_t> drafts, int64_t vocab, const SamplingParams& params) {
  const size_t k = drafts.size();
  G4_CHECK(target_logits.size() == (k + 1) * size_t(vocab), "judge_drafts: the target's logits need K + 1 rows");
  G4_CHECK(is_greedy(params) || draft_logits.size() == k * size_t(vocab), "judge_drafts: the drafter's logits need K rows");
  std::vector<KeptToken> p, q;
  for (size_t i = 0; i <= k; ++i) {
    const float* target = target_logits.data() + i * size_t(vocab);
    SamplingParams token = params;
    token.seed = params.seed + i;
    if (i == k || has_nan(target, vocab)) return {int64_t(i), sample_row(target, vocab, token)};
    const int32_t x = drafts[i];
    if (x < 0 || x >= vocab) return verdict_from(int64_t(i), kDraftNotAToken);
    if (is_greedy(params)) {
      const int64_t best = argmax(target, vocab);
      if (x != best) return {int64_t(i), best};
      continue;
    }
    const uint64_t p_total = kept_tokens(target, vocab, token, p);
    const float* draft = draft_logits.data() + i * size_t(vocab);
    if (has_nan(draft, vocab)) return verdict_from(int64_t(i), kDraftLogitsNan);
    const uint64_t q_total = kept_tokens(draft, vocab, token, q);
    const uint64_t wp = weight_of(p, x), wq = weight_of(q, x);
    if (wq == 0) return verdict_from(int64_t(i), kDraftOutsideItsDistribution);
    if (!draft_stands(philox_accept_bits(token.seed), wp, p_total, wq, q_total))
      return verdict_from(int64_t(i), correction(p, p_total, q, q_total, token.seed));
  }
  throw Error(ErrorKind::kInternal, "judge_drafts: no verdict");  // unreachable: row K always returns
}

DraftVerdict verdict_from(int64_t accepted, int64_t token) {
  switch (token) {
    case kDraftNotAToken:
      throw Error(ErrorKind::kInvalidArgument, "judge_drafts: draft " + std::to_string(accepted) + " is not a token id");
    case kDraftLogitsNan:
      throw Error(ErrorKind::kInvalidArgument, "judge_drafts: the drafter's logits hold a NaN");
    case kDraftOutsideItsDistribution:
      throw Error(ErrorKind::kInvalidArgument, "judge_drafts: draft " + std::to_string(accepted) +
                                                   " lies outside the distribution it was drawn from");
    case kNoResidualMass:
      throw Error(ErrorKind::kInternal, "speculative: a rejection leaves no residual mass");
    default:
      return {accepted, token};
  }
}

DraftVerdict judge_greedy_draws(std::span<const int32_t> target_tokens, std::span<const int32_t> drafts) {
  G4_CHECK(target_tokens.size() == drafts.size() + 1, "judge_greedy_draws: the target's draws need K + 1 rows");
  size_t a = 0;
  while (a < drafts.size() && drafts[a] == target_tokens[a]) ++a;
  return {int64_t(a), target_tokens[a]};
}

}  // namespace g4
