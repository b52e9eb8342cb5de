// Draft-and-verify decoding of one sequence with an MTP assistant (docs/DESIGN.md, "Speculative
// decoding"). A round starts from the sequence's pending token x (drawn, not yet fed) at position P
// and the target's final-normed hidden state of the position that drew it: the assistant drafts up
// to K tokens d_1..d_K (draft i drawn from its logits with the seed of its token index, as the
// target would draw it), the target runs x, d_1..d_K in one forward, and judge_drafts
// (sampling/speculative.h) keeps d_1..d_a and gives the token y after them. The caches then hold x
// and d_1..d_a exactly as if one token had been fed at a time (the rejected positions are cut off:
// KvSequence::truncate), y is the new pending token, and the verify forward's hidden state of d_a's
// position (x's when a = 0) is the next round's. The text has exactly the distribution of the
// target alone, and greedy text is the target's own.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "model/assistant.h"
#include "runtime/drafter.h"
#include "runtime/model_runner.h"
#include "sampling/logit_penalties.h"
#include "sampling/sampler.h"
#include "sampling/speculative.h"

namespace g4 {

class Speculation {
 public:
  // Throws unless the assistant belongs to the runner's model and K + 1 tokens fit one forward of
  // `max_chunk` rows.
  Speculation(const Gemma4Assistant& assistant, ModelRunner& runner, int64_t draft_tokens, int64_t max_chunk);
  // The acceptance a benchmark forces on the rounds that follow (null: none); greedy rounds only.
  void force(const ForcedAcceptance* forced) { forced_ = forced; }
  const Gemma4Assistant& assistant() const { return drafter_.assistant(); }
  // Whether the rounds' draft steps replay recordings of themselves (Drafter::replay_steps); the
  // verify forward runs eagerly either way.
  void replay_draft_steps(bool on) { drafter_.replay_steps(on); }
  int64_t draft_tokens() const { return k_; }
  // Keeps a host copy of the target's final-normed hidden state (one row, the activation dtype) of
  // the position whose logits drew the pending token.
  void take_hidden(const Tensor& normed_row);
  // One round of k <= draft_tokens() drafts for `kv`, whose next position is the pending token's;
  // the drafts are token indices j, j + 1, ... of `sampler` (the pending token's is j - 1), and
  // `penalties` (the generation's logit bias and penalties, over its tokens up to the pending one)
  // adjust each verify row's logits as the draw at that position would see them: row i's after
  // drafts 1..i too. The drafts themselves come from the assistant's unadjusted logits, which the
  // verdict weighs as drawn. Returns the accepted drafts, then the verdict's token (checked_token:
  // NaN logits throw).
  std::vector<int32_t> round(KvSequence& kv, int32_t pending, const Sampler& sampler, int64_t j, int64_t k,
                             const PenaltyState& penalties);
  const SpeculationStats& stats() const { return stats_; }

 private:
  // The verdict on the verify's n rows (in verify_logits_) for `drafts`, drawn with token indices j....
  // Greedy (or no drafts): from the target's own draws of the rows, only their ids leave the device.
  DraftVerdict judge_by_target_draws(int64_t n, std::span<const int32_t> drafts);
  // Sampled: the acceptance rule on the device (Backend::judge_drafts), only the verdict leaves it.
  DraftVerdict judge_sampled(int64_t n, const Drafts& drafted);
  // Uploads the draws of verify rows 0..n-1 (token indices j....) into verify_params_.
  void upload_verify_params(const Sampler& sampler, int64_t j, int64_t n);
  // The penalties of verify rows 0..n-1 applied to verify_logits_ (row i: after drafts[0, i)).
  void adjust_verify_logits(const PenaltyState& penalties, std::span<const int32_t> drafts, int64_t n);

  ModelRunner& runner_;
  int64_t k_;
  Drafter drafter_;
  std::vector<uint8_t> hidden_;  // take_hidden's row
  const ForcedAcceptance* forced_ = nullptr;
  Tensor verify_normed_, verify_act_, verify_logits_, verify_tokens_;  // [K + 1, ...]
  Tensor verify_verdict_;                                              // I64 [2, 1]
  SamplingRows verify_params_;                                         // K + 1 rows
  SpeculationStats stats_;
};

}  // namespace g4
