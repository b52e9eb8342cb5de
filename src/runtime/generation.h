// Where one generation stands — its sampler (and so each token's seed), how many tokens it drew,
// and the rules that end it — shared by Session and Scheduler, so a sequence stops for the same
// reasons whether it runs alone or in a batch.
#pragma once
#include <cstdint>
#include <vector>

#include "sampling/sampler.h"

namespace g4 {

struct GenerationLimits {
  int64_t max_new_tokens = 128;     // >= 1; the stop token is not counted
  std::vector<int32_t> stop_ids{1};  // a drawn stop id ends the generation (and is not output)
};

enum class StopReason {
  kNone,         // the generation goes on
  kStopToken,    // the token drawn is one of the stop ids
  kMaxTokens,    // the token drawn is the max_new_tokens-th
  kContextFull,  // the token drawn cannot be fed: the sequence holds max_seq_len positions
  kCancelled,    // cancelled before this draw (no token)
  kFailed,       // the draw failed for this sequence alone (no token; SequenceEvent::error says why)
};
const char* stop_reason_name(StopReason reason);

// A drawn token and whether the generation ends with it. token is -1 when cancelled or failed; a stop
// token is reported (so the caller knows which) but is not part of the output.
struct DecodedToken {
  int32_t token = -1;
  StopReason stop = StopReason::kNone;
  bool last() const { return stop != StopReason::kNone; }
};

class Generation {
 public:
  // Throws g4::Error when max_new_tokens < 1.
  Generation(Sampler sampler, GenerationLimits limits);

  const Sampler& sampler() const { return sampler_; }
  const GenerationLimits& limits() const { return limits_; }
  int64_t drawn() const { return drawn_; }  // tokens drawn so far, the stop token included
  // The parameters of the next draw: token index drawn(), seed = base + drawn().
  SamplingParams next_params() const { return sampler_.for_token(drawn_); }
  // Records the token just drawn by a sequence that holds `position` of its `max_seq_len`
  // positions (the token itself not yet fed); says why the generation ends with it.
  StopReason record(int32_t token, int64_t position, int64_t max_seq_len);

 private:
  Sampler sampler_;
  GenerationLimits limits_;
  int64_t drawn_ = 0, output_ = 0;
};

}  // namespace g4
