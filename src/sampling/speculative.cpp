#include "sampling/speculative.h"

#include <algorithm>
#include <string>
#include <vector>

#include "sampling/cpu_sampler.h"
#include "sampling/philox.h"
#include "sampling/sampling_math.h"
#include "util/error.h"

namespace g4 {

namespace {

using u128 = unsigned __int128;

uint64_t weight_of(const std::vector<KeptToken>& kept, int32_t id) {
  const auto it = std::lower_bound(kept.begin(), kept.end(), id, [](const KeptToken& t, int32_t v) { return t.id < v; });
  return it != kept.end() && it->id == id ? it->weight : 0;
}

// u · b < a for u = bits / 2^64, exactly: bits · b < a · 2^64, both sides as (high 128, low 64) bits.
bool uniform_times_below(uint64_t bits, u128 b, u128 a) {
  const u128 low = u128(bits) * uint64_t(b), high = u128(bits) * uint64_t(b >> 64) + (low >> 64);
  return high < a;  // a · 2^64 has low 64 bits 0, so bits · b is below it iff its high part is below a
}

// floor(u · total) + 1 for u = bits / 2^64: the draw's target in 1..total.
u128 draw_target_128(uint64_t bits, u128 total) {
  const u128 low = u128(bits) * uint64_t(total);
  return u128(bits) * uint64_t(total >> 64) + (low >> 64) + 1;
}

// The correction after draft x of weight (wq of Wq) was rejected: the draw from max(p - q, 0),
// the residual of token t being wp(t) · Wq - wq(t) · Wp in integers (both sides over Wp · Wq).
int64_t correction(const std::vector<KeptToken>& p, uint64_t p_total, const std::vector<KeptToken>& q,
                   uint64_t q_total, uint64_t seed) {
  auto residual = [&](const KeptToken& t) {
    const u128 plus = u128(t.weight) * q_total, minus = u128(weight_of(q, t.id)) * p_total;
    return plus > minus ? plus - minus : u128(0);
  };
  u128 total = 0;
  for (const KeptToken& t : p) total += residual(t);
  G4_ASSERT(total > 0, "speculative: a rejection leaves no residual mass");  // p(x) < q(x) for some x
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
    G4_CHECK(x >= 0 && x < vocab, "judge_drafts: draft " + std::to_string(x) + " is not a token id");
    if (is_greedy(params)) {
      const int64_t best = argmax(target, vocab);
      if (x != best) return {int64_t(i), best};
      continue;
    }
    const uint64_t p_total = kept_tokens(target, vocab, token, p);
    const float* draft = draft_logits.data() + i * size_t(vocab);
    G4_CHECK(!has_nan(draft, vocab), "judge_drafts: the drafter's logits hold a NaN");
    const uint64_t q_total = kept_tokens(draft, vocab, token, q);
    const uint64_t wp = weight_of(p, x), wq = weight_of(q, x);
    G4_CHECK(wq > 0, "judge_drafts: draft " + std::to_string(x) + " lies outside the distribution it was drawn from");
    // Stands with probability min(1, (wp / Wp) / (wq / Wq)): u · wq · Wp < wp · Wq.
    if (!uniform_times_below(philox_accept_bits(token.seed), u128(wq) * p_total, u128(wp) * q_total))
      return {int64_t(i), correction(p, p_total, q, q_total, token.seed)};
  }
  throw Error(ErrorKind::kInternal, "judge_drafts: no verdict");  // unreachable: row K always returns
}

DraftVerdict judge_greedy_draws(std::span<const int32_t> target_tokens, std::span<const int32_t> drafts) {
  G4_CHECK(target_tokens.size() == drafts.size() + 1, "judge_greedy_draws: the target's draws need K + 1 rows");
  size_t a = 0;
  while (a < drafts.size() && drafts[a] == target_tokens[a]) ++a;
  return {int64_t(a), target_tokens[a]};
}

}  // namespace g4
