// g4 serve's /metrics in Prometheus' text format (docs/DESIGN.md §8): requests by endpoint and
// status, prompt and generated tokens, time to first token and per-token decode latency
// histograms; the engine's gauges (queue depth, running sequences, KV bytes) come from the worker.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/drafter.h"
#include "model/kv_types.h"
#include "runtime/rank_inputs.h"

namespace g4::serve {

// A cumulative histogram with fixed upper bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  // "name_bucket{le=…} n" lines, then name_sum and name_count.
  std::string render(const std::string& name) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative), the last one +Inf
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

// What the engine thread reports (EngineWorker::stats()).
struct EngineGauges {
  size_t waiting = 0, running = 0, preempted = 0;
  int64_t preemptions = 0;  // since the server started
  size_t kv_bytes_in_use = 0, kv_bytes_cached = 0, kv_budget_bytes = 0;
  int64_t kv_pages_total = 0, kv_pages_free = 0, kv_pages_in_use = 0, kv_pages_cached = 0, kv_pages_shared = 0;
  KvBytesPerToken kv_bytes_per_token;  // by layer kind, fixed by --kv_type and --kv_sliding_type
  bool drafting = false;               // --draft_model: requests decode in draft rounds
  SpeculationStats speculation;        // the rounds since the server started
  // A split model (--tp N): each rank's running sequences and live KV bytes, rank 0 first (the
  // gauges above are rank 0's); empty unsplit.
  std::vector<RankLoad> ranks;
};

class Metrics {
 public:
  Metrics();
  void count_request(const std::string& endpoint, int status);
  void count_tokens(int64_t prompt, int64_t generated);
  void observe_time_to_first_token(double seconds);
  void observe_decode_token(double seconds);
  // The whole exposition, with the engine's gauges.
  std::string render(const EngineGauges& engine) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  uint64_t prompt_tokens_ = 0, generated_tokens_ = 0;
  Histogram time_to_first_token_, decode_token_;
};

}  // namespace g4::serve
