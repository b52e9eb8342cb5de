// What a request asks of its logits beyond the sampling parameters (docs/DESIGN.md §4, "Logit
// bias and penalties"): OpenAI's logit_bias, presence_penalty and frequency_penalty, and
// repetition_penalty (vLLM's, as in transformers). Applied to a row's logits before temperature,
// top-k, top-p and min-p, in this order for a token t:
//   v = logit[t] + bias[t]
//   v = v > 0 ? v / repetition : v * repetition   (when t is in the prompt or the output)
//   v -= frequency * count[t] + presence * (count[t] > 0)   (count: t's draws in the output)
// Only the tokens a row names (biased or seen) change, so a row's change is a short list of
// LogitAdjustments the backend applies in place.
#pragma once
#include <cstdint>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "util/host_device.h"

namespace g4 {

inline constexpr size_t kMaxLogitBias = 1024;  // entries of one request's logit_bias

struct LogitPenalties {
  float presence = 0.0f;    // [-2, 2]
  float frequency = 0.0f;   // [-2, 2]
  float repetition = 1.0f;  // (0, 2]; 1 = off
  std::vector<std::pair<int32_t, float>> bias;  // (token, [-100, 100]), at most kMaxLogitBias
  // Tokens never drawn (their logits become -infinity): g4's own, e.g. a tool call's opening marker
  // when the request forbids calls.
  std::vector<int32_t> banned;
  bool empty() const {
    return presence == 0.0f && frequency == 0.0f && repetition == 1.0f && bias.empty() && banned.empty();
  }
};

// Throws g4::Error (kInvalidArgument) naming the value out of its range, or a biased token outside
// [0, vocab).
void check_penalties(const LogitPenalties& p, int64_t vocab);

// One token's change: plain data with one layout on host and device.
struct LogitAdjustment {
  int32_t token = 0;
  float bias = 0.0f;
  float repetition = 1.0f;  // 1 unless the token was seen
  float subtract = 0.0f;    // frequency · count + presence · (count > 0)
};

G4_HOST_DEVICE float adjusted_logit(float logit, const LogitAdjustment& a) {
  float v = logit + a.bias;
  v = v > 0.0f ? v / a.repetition : v * a.repetition;
  return v - a.subtract;
}

// A sequence's tokens as its penalties see them: the prompt's (for repetition) and each output
// token's count.
class PenaltyState {
 public:
  PenaltyState() = default;
  PenaltyState(LogitPenalties penalties, std::span<const int32_t> prompt);
  bool empty() const { return penalties_.empty(); }
  void record(int32_t drawn);  // a token of the output
  // The adjustments of the next draw, by token, each token once (none when empty()).
  std::vector<LogitAdjustment> adjustments() const;
  // The adjustments of the next drafts.size() + 1 draws of a speculative round: row i as the draw
  // after drafts[0, i) were drawn (none when empty()).
  std::vector<std::vector<LogitAdjustment>> adjustments_along(std::span<const int32_t> drafts) const;

 private:
  std::vector<LogitAdjustment> adjustments_with(const std::unordered_map<int32_t, int32_t>& counts) const;

  LogitPenalties penalties_;
  std::unordered_set<int32_t> prompt_;
  std::unordered_map<int32_t, int32_t> counts_;
};

// Applies one row's adjustments to its logits (the CPU's way, and the reference of the device's).
void apply_adjustments(std::span<float> logits, std::span<const LogitAdjustment> adjustments);

}  // namespace g4
