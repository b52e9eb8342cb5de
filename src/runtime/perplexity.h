// Perplexity of a text and the KL divergence of a model's next-token distributions from a base
// model's (e.g. a quantized file against its bf16 original), measured exactly as llama.cpp's
// llama-perplexity measures them, so the two programs' numbers for the same file compare
// (docs/DESIGN.md §6, "Perplexity"): the tokens are cut into chunks of n_ctx, each chunk is
// evaluated from an empty cache with its first token replaced by BOS, and the positions of the
// second half of each chunk are scored (each predicts the next token of the chunk).
#pragma once
#include <cstdint>
#include <optional>
#include <span>

#include "runtime/session.h"

namespace g4 {

struct PerplexityOptions {
  int64_t n_ctx = 512;
  int64_t max_chunks = 0;  // 0 = every whole chunk of the text
  int32_t bos_id = 2;
};

struct PerplexityResult {
  int64_t chunks = 0, scored = 0;  // chunks evaluated, positions scored
  double perplexity = 0, perplexity_error = 0;  // exp(mean negative log-likelihood) ± its standard error
  // Against the base model (when one was given): mean KL(base || model) in nats with its standard
  // error, and the share of positions whose most likely token is the base model's; the same share
  // over the clear positions, where the base's top two logits are more than kClearTopMargin apart
  // (closer ones may part under rounding alone: docs/DESIGN.md §6, "Tolerances"), and how many.
  std::optional<double> mean_kl, mean_kl_error, same_top_token, same_top_token_clear;
  int64_t clear_positions = 0;
};

inline constexpr double kClearTopMargin = 1.0;

// `model` (and `base`) must be sessions with max_seq_len >= n_ctx; they are reset per chunk.
// Throws g4::Error when the text is shorter than one chunk or an option is out of range.
PerplexityResult measure_perplexity(Session& model, Session* base, std::span<const int32_t> tokens,
                                    const PerplexityOptions& options);

}  // namespace g4
