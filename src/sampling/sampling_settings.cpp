#include "sampling/sampling_settings.h"

#include <random>

#include "util/uniform_hash.h"

namespace g4 {

namespace {

template <typename T>
SettingFrom take(const std::optional<T>& given, const std::optional<T>& model, T& value) {
  if (given) {
    value = *given;
    return SettingFrom::kGiven;
  }
  if (model) {
    value = *model;
    return SettingFrom::kModel;
  }
  return SettingFrom::kDefault;
}

}  // namespace

ResolvedSampling resolve_sampling(const SamplingChoices& given, std::optional<uint64_t> seed,
                                  const SamplingChoices& model, const SamplingParams& defaults) {
  ResolvedSampling r;
  SamplingParams p = defaults;
  r.temperature_from = take(given.temperature, model.temperature, p.temperature);
  r.top_k_from = take(given.top_k, model.top_k, p.top_k);
  r.top_p_from = take(given.top_p, model.top_p, p.top_p);
  r.min_p_from = take(given.min_p, model.min_p, p.min_p);
  r.random_seed = !seed;
  if (seed) {
    p.seed = *seed;
  } else if (!is_greedy(p)) {
    p.seed = draw_seed();
  }
  r.sampler = Sampler(p);  // checks every value, the model's too
  return r;
}

uint64_t choice_seed(uint64_t seed, uint64_t choice) { return choice == 0 ? seed : hash_bits(seed, choice); }

uint64_t draw_seed() {
  thread_local std::mt19937_64 random{(uint64_t(std::random_device{}()) << 32) ^ std::random_device{}()};
  return random();
}

}  // namespace g4
