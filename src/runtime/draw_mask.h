// One draw's token mask under a grammar (constrained decoding, docs/DESIGN.md §4): the tokens that
// keep a sequence's output inside its grammar's language, as the backend's mask_logits reads them.
// Computed once, on first use — by the executor after it has enqueued the forward, so that the host
// works while the device runs it; on a split model by whichever rank asks first, the others reading
// the same words — from the matcher's state before the step. The planner advances the matcher only
// when the step's tokens come back (StepPlanner::update), after every rank has read the mask.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "grammar/matcher.h"

namespace g4 {

class DrawMask {
 public:
  explicit DrawMask(std::shared_ptr<grammar::GrammarMatcher> matcher) : matcher_(std::move(matcher)) {}
  // The mask's words (grammar/matcher.h's layout); thread-safe.
  const std::vector<uint32_t>& words() const {
    std::call_once(once_, [this] {
      words_.resize(size_t(matcher_->compiled().vocabulary().mask_words()));
      matcher_->fill_next_token_mask(words_.data());
    });
    return words_;
  }
  int64_t word_count() const { return matcher_->compiled().vocabulary().mask_words(); }

 private:
  std::shared_ptr<grammar::GrammarMatcher> matcher_;
  mutable std::once_flag once_;
  mutable std::vector<uint32_t> words_;
};

}  // namespace g4
