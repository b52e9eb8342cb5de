// Speculative decoding's verdict on drafted tokens (docs/DESIGN.md §4, "Speculative sampling"): the
// target model's logits at the K + 1 positions a verify forward computes decide how many of K drafted
// tokens stand and which token follows them, so that the text has exactly the distribution of
// sampling the target alone (Leviathan et al. and Chen et al., 2023):
//  * greedy: the longest prefix of drafts equal to the target's argmax, then the target's argmax;
//  * sampled: draft i (drawn from the drafter's distribution q_i) stands with probability
//    min(1, p_i(x) / q_i(x)), p and q being the kept distributions of §4 (temperature, top-k, top-p
//    and min-p applied to each model's logits); at the first rejection the token is drawn from the
//    normalised max(p_i − q_i, 0); when every draft stands, the bonus token is drawn from p_K.
// Exact and the same on every backend: p and q are the sampler's integer weights, the test and the
// correction use integer arithmetic, and their uniforms come from the token's seed (philox.h:
// philox_accept_bits, philox_correction_bits), token i of the verify using seed + i as without
// drafting. A drafter that draws its tokens with those seeds from p itself has every draft accepted,
// and the text is bit for bit the text of sampling the target alone.
#pragma once
#include <cstdint>
#include <span>

#include "sampling/sampling_params.h"

namespace g4 {

struct DraftVerdict {
  int64_t accepted = 0;  // drafts[0, accepted) stand
  int64_t token = -1;    // then this token: the correction, or the bonus when every draft stands
                         // (kNanLogitsToken when the target's logits at that position hold a NaN)
};

// target_logits: [drafts.size() + 1][vocab] F32 (position i's logits predict the token after draft
// i - 1); draft_logits: [drafts.size()][vocab], the logits each draft was drawn from (unused when
// greedy); params.seed is the seed of the token at the first drafted position. Throws
// Error(kInvalidArgument) for a draft its own distribution could not have given.
DraftVerdict judge_drafts(std::span<const float> target_logits, std::span<const float> draft_logits,
                          std::span<const int32_t> drafts, int64_t vocab, const SamplingParams& params);

// A backend's verdict (Backend::judge_drafts) holds, in place of the token, one of these codes for
// drafts the rule cannot judge, where judge_drafts throws.
inline constexpr int64_t kDraftNotAToken = -2;               // a draft id outside the vocabulary
inline constexpr int64_t kDraftLogitsNan = -3;               // the drafter's logits hold a NaN
inline constexpr int64_t kDraftOutsideItsDistribution = -4;  // a draft its own distribution could not give
inline constexpr int64_t kNoResidualMass = -5;               // a rejection left no mass to draw from
// A backend's verdict {accepted, token}: judge_drafts's error for a code, else the verdict.
DraftVerdict verdict_from(int64_t accepted, int64_t token);

// The greedy verdict from the target's own greedy draws at the K + 1 positions (kNanLogitsToken for
// a position whose logits hold a NaN): the longest prefix of drafts equal to them, then the target's
// token after it. judge_drafts's greedy verdict, without the logits on the host.
DraftVerdict judge_greedy_draws(std::span<const int32_t> target_tokens, std::span<const int32_t> drafts);

}  // namespace g4
