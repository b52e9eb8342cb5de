// Log-probabilities of a drawn token and its most likely alternatives (docs/DESIGN.md §8): the
// log-softmax of the model's final, soft-capped logits — the model's distribution, before
// temperature, top-k, top-p or min-p shape what is drawn (OpenAI's logprobs are the model's too).
#pragma once
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace g4 {

// The most top_logprobs a request may ask for (OpenAI's bound).
inline constexpr int kMaxTopLogprobs = 20;

struct TokenLogprobs {
  float logprob = 0.0f;                         // of the drawn token
  std::vector<std::pair<int32_t, float>> top;   // the top_n most likely (id, logprob), most likely first
};

// From one row of logits: log p(token) = z[token] − max z − log Σ exp(z − max z) (in double), and
// the top_n largest (ties: lower id first). top_n is clipped to the vocabulary; NaN logits are an
// error ("model produced NaN logits", as for sampling).
TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, int top_n);

}  // namespace g4
