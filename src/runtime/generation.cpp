#include "runtime/generation.h"

#include <algorithm>
#include <string>

#include "util/error.h"

namespace g4 {

const char* stop_reason_name(StopReason reason) {
  switch (reason) {
    case StopReason::kNone: return "none";
    case StopReason::kStopToken: return "stop token";
    case StopReason::kMaxTokens: return "max tokens";
    case StopReason::kContextFull: return "context full";
    case StopReason::kCancelled: return "cancelled";
    case StopReason::kFailed: return "failed";
  }
  return "?";
}

Generation::Generation(Sampler sampler, GenerationLimits limits) : sampler_(sampler), limits_(std::move(limits)) {
  G4_CHECK(limits_.max_new_tokens >= 1,
           "max_new_tokens must be >= 1, got " + std::to_string(limits_.max_new_tokens));
}

StopReason Generation::record(int32_t token, int64_t position, int64_t max_seq_len) {
  ++drawn_;
  const auto& stops = limits_.stop_ids;
  if (std::find(stops.begin(), stops.end(), token) != stops.end()) return StopReason::kStopToken;
  if (++output_ >= limits_.max_new_tokens) return StopReason::kMaxTokens;
  if (position >= max_seq_len) return StopReason::kContextFull;
  return StopReason::kNone;
}

}  // namespace g4
