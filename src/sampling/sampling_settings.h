// Sampling settings resolved once (docs/DESIGN.md §4), for g4 run, g4 chat and every request of
// g4 serve alike: the values a caller gave (flags, a request's fields) over the model's generation
// config over the defaults, and the base seed — given, or drawn here.
#pragma once
#include <cstdint>
#include <optional>
#include <string_view>

#include "sampling/sampler.h"

namespace g4 {

// The sampling values one layer of settings sets; an unset one is left to the layer below.
struct SamplingChoices {
  std::optional<float> temperature, top_p, min_p;
  std::optional<int32_t> top_k;
};

enum class SettingFrom { kGiven, kModel, kDefault };

struct ResolvedSampling {
  Sampler sampler{SamplingParams{}};  // its base seed draws token 0 (Sampler::for_token: seed + j)
  SettingFrom temperature_from = SettingFrom::kDefault, top_k_from = SettingFrom::kDefault,
              top_p_from = SettingFrom::kDefault, min_p_from = SettingFrom::kDefault;
  bool random_seed = false;  // no seed was given: a fresh random one (none for greedy decoding)
};

// Each value `given` sets wins, then `model`'s, then `defaults`'. The base seed is `seed` when
// given; otherwise a fresh random one (draw_seed), unless decoding is greedy (no seed is used; the
// defaults' then stays). Throws g4::Error naming the first value out of range.
ResolvedSampling resolve_sampling(const SamplingChoices& given, std::optional<uint64_t> seed,
                                  const SamplingChoices& model, const SamplingParams& defaults);

// A fresh random base seed (std::random_device once per thread; any thread may call it).
uint64_t draw_seed();

// The base seed of choice `choice` of a request whose base seed is `seed`, when one request asks for
// several samples of one prompt: `seed` itself for choice 0 (one choice samples as a request of one),
// a mixed one for the others. Not seed + choice: token j draws with base + j, so choice 1 would
// repeat choice 0's draws a token later.
uint64_t choice_seed(uint64_t seed, uint64_t choice);

}  // namespace g4
