#include "sampling/cpu_sampler.h"

#include <algorithm>
#include <functional>
#include <vector>

#include "sampling/sampling_math.h"
#include "util/error.h"

namespace g4 {

namespace {

using namespace sampling;

// A token that can still be drawn: within kMaxLogGap of the max and inside the top-k cut.
struct LiveToken {
  uint64_t rank;
  uint64_t weight;
};

// Buckets of the top 12 key bits (an eighth of a binade of the logit), highest logits last.
constexpr int kBucketShift = 20;
constexpr int kBuckets = 1 << (32 - kBucketShift);
int bucket_of(uint64_t rank) { return int(rank >> (32 + kBucketShift)); }

// The rank at which the cumulative weight of the live tokens, taken in rank order, first reaches
// `target` (at most their total weight). Buckets by logit first, then sorts only the bucket that
// holds the crossing.
uint64_t top_p_cut(const std::vector<LiveToken>& live, uint64_t target) {
  thread_local std::vector<uint64_t> bucket_weight(kBuckets);
  std::fill(bucket_weight.begin(), bucket_weight.end(), 0);
  for (const LiveToken& t : live) bucket_weight[size_t(bucket_of(t.rank))] += t.weight;
  uint64_t above = 0;
  int bucket = kBuckets - 1;
  while (above + bucket_weight[size_t(bucket)] < target) above += bucket_weight[size_t(bucket--)];

  thread_local std::vector<LiveToken> candidates;
  candidates.clear();
  for (const LiveToken& t : live) {
    if (bucket_of(t.rank) == bucket) candidates.push_back(t);
  }
  std::sort(candidates.begin(), candidates.end(), [](const LiveToken& a, const LiveToken& b) { return a.rank > b.rank; });
  for (const LiveToken& t : candidates) {
    above += t.weight;
    if (above >= target) return t.rank;
  }
  throw Error(ErrorKind::kInternal, "sampler: top-p target exceeds the kept weight");  // unreachable: target <= total
}

// The ranks of the k best tokens (0 < k < vocab), in no particular order. Keeps a pool of the best
// ranks seen so far; whenever it fills, trims it to the k best, and the k-th of those becomes a
// floor that rejects most of the remaining tokens with one comparison.
const std::vector<uint64_t>& top_k_ranks(const float* logits, int64_t vocab, int64_t k) {
  thread_local std::vector<uint64_t> pool;
  pool.clear();
  const size_t capacity = size_t(2 * k + 1024);
  auto trim = [&] {
    std::nth_element(pool.begin(), pool.begin() + (k - 1), pool.end(), std::greater<uint64_t>());
    pool.resize(size_t(k));
    return pool[size_t(k - 1)];
  };
  uint64_t floor = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    const uint64_t rank = rank_of(logit_key(logits[i]), uint32_t(i));
    if (rank < floor) continue;
    pool.push_back(rank);
    if (pool.size() == capacity) floor = trim();
  }
  trim();
  return pool;
}

struct RowMax {
  uint32_t key;
  uint32_t id;
  bool has_nan;  // then key and id mean nothing
};

// The largest logit key and its lowest id, or that a logit is NaN. The first loop vectorises.
RowMax find_max(const float* logits, int64_t vocab) {
  uint32_t max_key = 0;
  uint32_t has_nan = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    has_nan |= uint32_t(logits[i] != logits[i]);
    max_key = std::max(max_key, logit_key(logits[i]));
  }
  if (has_nan) return {0, 0, true};
  int64_t id = 0;
  while (logit_key(logits[id]) != max_key) ++id;
  return {max_key, uint32_t(id), false};
}

}  // namespace

uint64_t kept_tokens(const float* logits, int64_t vocab, const SamplingParams& params, std::vector<KeptToken>& kept) {
  G4_CHECK(vocab >= 1 && vocab <= kMaxVocab, "sampler: vocab size " + std::to_string(vocab) + " out of range");
  kept.clear();
  const RowMax max = find_max(logits, vocab);
  G4_ASSERT(!max.has_nan && !is_greedy(params), "kept_tokens: a sampled row without NaN");

  // The tokens that can still be drawn (the top-k set, weight > 0) in id order, with their weights.
  const float z_max = key_logit(max.key);
  const float inv_temperature = inverse_temperature(params.temperature);
  thread_local std::vector<LiveToken> live;
  live.clear();
  if (params.top_k > 0 && params.top_k < vocab) {
    for (const uint64_t rank : top_k_ranks(logits, vocab, params.top_k)) {
      const uint64_t weight = token_weight(logits[rank_id(rank)], z_max, inv_temperature);
      if (weight > 0) live.push_back({rank, weight});
    }
    std::sort(live.begin(), live.end(),
              [](const LiveToken& a, const LiveToken& b) { return rank_id(a.rank) < rank_id(b.rank); });
  } else {  // scaled_token_weight in three loops that vectorise
    thread_local std::vector<float> scaled_weights;
    scaled_weights.resize(size_t(vocab));
    float* w = scaled_weights.data();
    for (int64_t i = 0; i < vocab; ++i) w[i] = weight_exponent(logits[i], z_max, inv_temperature);
    for (int64_t i = 0; i < vocab; ++i) w[i] = scaled_exp_nonpositive(w[i]);
    for (int64_t i = 0; i < vocab; ++i) w[i] = finish_weight(logits[i], z_max, inv_temperature, w[i]);
    for (int64_t i = 0; i < vocab; ++i) {
      const uint64_t weight = uint64_t(scaled_weights[size_t(i)]);
      if (weight > 0) live.push_back({rank_of(logit_key(logits[i]), uint32_t(i)), weight});
    }
  }
  uint64_t top_k_weight = 0;
  for (const LiveToken& t : live) top_k_weight += t.weight;

  const uint64_t cut = params.top_p < 1.0f ? top_p_cut(live, top_p_target(params.top_p, top_k_weight)) : kKeepAllRanks;
  const uint64_t weight_floor = min_p_floor(params.min_p);
  uint64_t total = 0;
  for (const LiveToken& t : live)
    if (t.rank >= cut && t.weight >= weight_floor) {
      kept.push_back({int32_t(rank_id(t.rank)), t.weight});
      total += t.weight;
    }
  return total;
}

int64_t sample_row(const float* logits, int64_t vocab, const SamplingParams& params) {
  G4_CHECK(vocab >= 1 && vocab <= kMaxVocab, "sampler: vocab size " + std::to_string(vocab) + " out of range");
  const RowMax max = find_max(logits, vocab);
  if (max.has_nan) return kNanLogitsToken;
  if (is_greedy(params)) return max.id;
  thread_local std::vector<KeptToken> kept;
  const uint64_t target = draw_target(params.seed, kept_tokens(logits, vocab, params, kept));
  uint64_t cumulative = 0;
  for (const KeptToken& t : kept) {
    cumulative += t.weight;
    if (cumulative >= target) return t.id;
  }
  throw Error(ErrorKind::kInternal, "sampler: draw target exceeds the kept weight");  // unreachable: target <= total
}

bool has_nan(const float* logits, int64_t vocab) { return find_max(logits, vocab).has_nan; }

int64_t argmax(const float* logits, int64_t vocab) { return find_max(logits, vocab).id; }

}  // namespace g4
