// A sampler: the sampling parameters of one request, validated once when it is built, and its
// seed schedule (docs/DESIGN.md §4): token j of a generation is drawn with seed + j. Sessions,
// the scheduler and the CLI hold one; nothing downstream validates again.
#pragma once
#include <cstdint>

#include "sampling/sampling_params.h"

namespace g4 {

class Sampler {
 public:
  // Throws g4::Error naming the parameter when one is out of range or not finite (the table of
  // docs/DESIGN.md §4). params.seed is the base seed: the seed of token 0.
  explicit Sampler(const SamplingParams& params);

  const SamplingParams& params() const { return params_; }
  bool greedy() const { return is_greedy(params_); }
  // The parameters that draw token j of the generation: seed + j (uint64 wrap).
  SamplingParams for_token(int64_t j) const;
  // Token j drawn on the host from `vocab` float32 logits (throws kNanLogitsError on NaN logits).
  int64_t sample_host(const float* logits, int64_t vocab, int64_t j) const;
  // The same parameters with token j as token 0: a generation that continues this one's seed
  // schedule (a conversation's next reply).
  Sampler starting_at(int64_t j) const;

 private:
  struct Validated {};
  Sampler(const SamplingParams& params, Validated) : params_(params) {}
  SamplingParams params_;
};

// A token one sequence drew: `token`, or g4::Error(kNanLogitsError) for kNanLogitsToken. Where one
// sequence is all there is (a session, a decode graph), its NaN row fails the call.
int64_t checked_token(int64_t token);

}  // namespace g4
