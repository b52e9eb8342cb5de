// The arithmetic of speculative sampling's verdict (speculative.h), shared by the host's
// judge_drafts and the CUDA verdict kernel so that both keep the same drafts and draw the same
// token: integer weights (sampling_math.h), the acceptance test and the correction's draw in exact
// 128-bit integer arithmetic.
#pragma once
#include <cstdint>

#include "sampling/sampling_math.h"
#include "util/host_device.h"

namespace g4::sampling {

using u128 = unsigned __int128;

// A kept distribution (after temperature, top-k, top-p and min-p) as one description: the token
// `id` of logit z is kept with weight kept_weight(...) when its rank reaches `cut` and its weight
// `weight_floor`; `total` is the kept weight. kept_tokens() (cpu_sampler.h) lists the same tokens.
struct KeptSet {
  uint64_t cut = kKeepAllRanks;
  uint64_t weight_floor = 0;
  uint64_t total = 0;
  float z_max = 0;
  float inv_temperature = 1;
};

G4_HOST_DEVICE uint64_t kept_weight(const KeptSet& s, float z, uint32_t id) {
  if (rank_of(logit_key(z), id) < s.cut) return 0;
  const uint64_t weight = token_weight(z, s.z_max, s.inv_temperature);
  return weight >= s.weight_floor ? weight : 0;
}

// u · b < a for u = bits / 2^64, exactly: bits · b < a · 2^64, both sides as (high 128, low 64) bits.
G4_HOST_DEVICE bool uniform_times_below(uint64_t bits, u128 b, u128 a) {
  const u128 low = u128(bits) * uint64_t(b), high = u128(bits) * uint64_t(b >> 64) + (low >> 64);
  return high < a;  // a · 2^64 has low 64 bits 0, so bits · b is below it iff its high part is below a
}

// floor(u · total) + 1 for u = bits / 2^64: a draw's target in 1..total.
G4_HOST_DEVICE u128 draw_target_128(uint64_t bits, u128 total) {
  const u128 low = u128(bits) * uint64_t(total);
  return u128(bits) * uint64_t(total >> 64) + (low >> 64) + 1;
}

// Whether a draft of weight wp (of p_total) under the target and wq (of q_total, wq > 0) under the
// drafter stands: with probability min(1, (wp / p_total) / (wq / q_total)), i.e. u · wq · p_total
// < wp · q_total, u from the token's acceptance bits.
G4_HOST_DEVICE bool draft_stands(uint64_t accept_bits, uint64_t wp, uint64_t p_total, uint64_t wq, uint64_t q_total) {
  return uniform_times_below(accept_bits, u128(wq) * p_total, u128(wp) * q_total);
}

// A token's mass in max(p − q, 0) after a rejection, over the common denominator p_total · q_total:
// wp · q_total − wq · p_total where positive.
G4_HOST_DEVICE u128 residual_weight(uint64_t wp, uint64_t p_total, uint64_t wq, uint64_t q_total) {
  const u128 plus = u128(wp) * q_total, minus = u128(wq) * p_total;
  return plus > minus ? plus - minus : u128(0);
}

}  // namespace g4::sampling
