#include "sampling/logit_penalties.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>
#include <string>

#include "util/error.h"

namespace g4 {

namespace {

// A value as people write it: 2, -0.5, 1e+30.
std::string shown(float v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

void check_range(const char* name, float v, float lo, float hi) {
  G4_CHECK(std::isfinite(v) && v >= lo && v <= hi,
           std::string(name) + " must be in [" + shown(lo) + ", " + shown(hi) + "], got " + shown(v));
}

}  // namespace

void check_penalties(const LogitPenalties& p, int64_t vocab) {
  check_range("presence_penalty", p.presence, -2.0f, 2.0f);
  check_range("frequency_penalty", p.frequency, -2.0f, 2.0f);
  G4_CHECK(std::isfinite(p.repetition) && p.repetition > 0.0f && p.repetition <= 2.0f,
           "repetition_penalty must be in (0, 2], got " + shown(p.repetition));
  G4_CHECK(p.bias.size() <= kMaxLogitBias, "logit_bias holds " + std::to_string(p.bias.size()) +
                                               " tokens; the most is " + std::to_string(kMaxLogitBias));
  for (const auto& [token, bias] : p.bias) {
    G4_CHECK(token >= 0 && token < vocab, "logit_bias names token " + std::to_string(token) +
                                              ", outside the vocabulary [0, " + std::to_string(vocab) + ")");
    check_range("a logit_bias value", bias, -100.0f, 100.0f);
  }
  for (int32_t token : p.banned)
    G4_ASSERT(token >= 0 && token < vocab, "banned token " + std::to_string(token) + " outside the vocabulary");
}

PenaltyState::PenaltyState(LogitPenalties penalties, std::span<const int32_t> prompt)
    : penalties_(std::move(penalties)) {
  if (penalties_.repetition != 1.0f) prompt_.insert(prompt.begin(), prompt.end());
}

void PenaltyState::record(int32_t drawn) {
  if (!empty()) ++counts_[drawn];
}

std::vector<LogitAdjustment> PenaltyState::adjustments() const { return adjustments_with(counts_); }

std::vector<std::vector<LogitAdjustment>> PenaltyState::adjustments_along(std::span<const int32_t> drafts) const {
  if (empty()) return {};
  std::vector<std::vector<LogitAdjustment>> rows;
  std::unordered_map<int32_t, int32_t> counts = counts_;
  for (size_t i = 0; i <= drafts.size(); ++i) {
    rows.push_back(adjustments_with(counts));
    if (i < drafts.size()) ++counts[drafts[i]];
  }
  return rows;
}

std::vector<LogitAdjustment> PenaltyState::adjustments_with(const std::unordered_map<int32_t, int32_t>& counts) const {
  if (empty()) return {};
  std::map<int32_t, LogitAdjustment> by_token;  // ordered: the same list on every run
  auto at = [&](int32_t token) -> LogitAdjustment& {
    LogitAdjustment& a = by_token[token];
    a.token = token;
    return a;
  };
  for (const auto& [token, bias] : penalties_.bias) at(token).bias += bias;
  for (int32_t token : penalties_.banned) at(token).bias = -std::numeric_limits<float>::infinity();
  for (int32_t token : prompt_) at(token).repetition = penalties_.repetition;
  for (const auto& [token, count] : counts) {
    LogitAdjustment& a = at(token);
    a.repetition = penalties_.repetition;
    a.subtract = penalties_.frequency * float(count) + penalties_.presence;
  }
  std::vector<LogitAdjustment> out;
  out.reserve(by_token.size());
  for (const auto& [token, a] : by_token) out.push_back(a);
  return out;
}

void apply_adjustments(std::span<float> logits, std::span<const LogitAdjustment> adjustments) {
  for (const LogitAdjustment& a : adjustments) {
    G4_ASSERT(a.token >= 0 && size_t(a.token) < logits.size(), "a logit adjustment outside the row");
    logits[size_t(a.token)] = adjusted_logit(logits[size_t(a.token)], a);
  }
}

}  // namespace g4
