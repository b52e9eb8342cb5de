#include "serve/metrics.h"

#include <algorithm>
#include <cstdio>
#include <initializer_list>

namespace g4::serve {

namespace {

std::string number(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.9g", v);
  return buffer;
}

std::string header(const std::string& name, const char* type, const char* help) {
  return "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

std::string sample(const std::string& name, double value) { return name + " " + number(value) + "\n"; }

// Metrics of one unlabelled sample each: their headers and values.
struct Sample {
  const char* name;
  const char* type;
  const char* help;
  double value;
};
std::string samples(std::initializer_list<Sample> list) {
  std::string out;
  for (const Sample& m : list) out += header(m.name, m.type, m.help) + sample(m.name, m.value);
  return out;
}

// Label values here are route paths and status codes; escaped anyway, as the format asks.
std::string label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const size_t bucket = size_t(std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

std::string Histogram::render(const std::string& name) const {
  std::string out;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += name + "_bucket{le=\"" + number(bounds_[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count_) + "\n";
  return out + sample(name + "_sum", sum_) + name + "_count " + std::to_string(count_) + "\n";
}

Metrics::Metrics()
    : time_to_first_token_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}),
      decode_token_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}) {}

void Metrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard lock(mutex_);
  ++requests_[{endpoint, status}];
}

void Metrics::count_tokens(int64_t prompt, int64_t generated) {
  std::lock_guard lock(mutex_);
  prompt_tokens_ += uint64_t(prompt);
  generated_tokens_ += uint64_t(generated);
}

void Metrics::observe_time_to_first_token(double seconds) {
  std::lock_guard lock(mutex_);
  time_to_first_token_.observe(seconds);
}

void Metrics::observe_decode_token(double seconds) {
  std::lock_guard lock(mutex_);
  decode_token_.observe(seconds);
}

std::string Metrics::render(const EngineGauges& engine) const {
  std::lock_guard lock(mutex_);
  std::string out = header("g4_requests_total", "counter", "HTTP requests answered, by endpoint and status.");
  for (const auto& [key, count] : requests_)
    out += "g4_requests_total{endpoint=\"" + label_value(key.first) + "\",status=\"" + std::to_string(key.second) +
           "\"} " + std::to_string(count) + "\n";
  out +=
      samples({{"g4_prompt_tokens_total", "counter", "Prompt tokens of completed generations.", double(prompt_tokens_)},
               {"g4_generated_tokens_total", "counter", "Tokens generated.", double(generated_tokens_)},
               {"g4_queue_depth", "gauge", "Requests waiting to start or to resume.", double(engine.waiting)},
               {"g4_running_sequences", "gauge", "Sequences generating now.", double(engine.running)},
               {"g4_preempted_sequences", "gauge",
                "Sequences preempted (KV pages swapped to host memory), waiting to resume.", double(engine.preempted)},
               {"g4_preemptions_total", "counter", "Sequences preempted because running ones needed their KV pages.",
                double(engine.preemptions)},
               {"g4_kv_bytes_in_use", "gauge", "KV-cache bytes of the pages live sequences hold.",
                double(engine.kv_bytes_in_use)},
               {"g4_kv_bytes_cached", "gauge", "KV-cache bytes of cached prefix pages no sequence holds (reclaimable).",
                double(engine.kv_bytes_cached)},
               {"g4_kv_bytes_budget", "gauge", "The KV pool's budget in bytes.", double(engine.kv_budget_bytes)}});
  out += header("g4_kv_bytes_per_token", "gauge",
                "KV-cache bytes one position takes, K and V, in the full-attention or the sliding layers.");
  out += "g4_kv_bytes_per_token{layers=\"full\"} " + std::to_string(engine.kv_bytes_per_token.full) + "\n";
  out += "g4_kv_bytes_per_token{layers=\"sliding\"} " + std::to_string(engine.kv_bytes_per_token.sliding) + "\n";
  out +=
      samples({{"g4_kv_pages_total", "gauge", "The KV pool's pages.", double(engine.kv_pages_total)},
               {"g4_kv_pages_in_use", "gauge", "KV pages live sequences hold.", double(engine.kv_pages_in_use)},
               {"g4_kv_pages_shared", "gauge", "KV pages two or more live sequences hold (a common prefix held once).",
                double(engine.kv_pages_shared)},
               {"g4_kv_pages_cached", "gauge", "KV pages of cached prefixes no sequence holds (reclaimable).",
                double(engine.kv_pages_cached)},
               {"g4_kv_pages_free", "gauge", "KV pages that hold nothing.", double(engine.kv_pages_free)}});
  if (engine.drafting) {
    const SpeculationStats& s = engine.speculation;
    out += samples(
        {{"g4_draft_rounds_total", "counter", "Draft-and-verify rounds of the assistant (--draft_model).",
          double(s.rounds)},
         {"g4_draft_tokens_total", "counter", "Tokens the assistant drafted.", double(s.drafted)},
         {"g4_draft_tokens_accepted_total", "counter", "Drafted tokens the target accepted.", double(s.accepted)},
         {"g4_draft_tokens_per_round", "gauge",
          "Mean tokens a round gives: its accepted drafts and the target's own token (1 without drafts).",
          s.tokens_per_round()},
         {"g4_draft_seconds_total", "counter", "Time the assistant spent drafting.", s.draft_seconds},
         {"g4_verify_seconds_total", "counter", "Time of the forwards that verified drafts.", s.verify_seconds}});
  }
  if (!engine.ranks.empty()) {
    out += header("g4_rank_running_sequences", "gauge", "Sequences generating now on each tensor-parallel rank.");
    for (size_t r = 0; r < engine.ranks.size(); ++r)
      out += "g4_rank_running_sequences{rank=\"" + std::to_string(r) + "\"} " +
             std::to_string(engine.ranks[r].running) + "\n";
    out += header("g4_rank_kv_bytes_in_use", "gauge",
                  "KV-cache bytes held by live sequences on each tensor-parallel rank.");
    for (size_t r = 0; r < engine.ranks.size(); ++r)
      out += "g4_rank_kv_bytes_in_use{rank=\"" + std::to_string(r) + "\"} " +
             std::to_string(engine.ranks[r].kv_bytes_in_use) + "\n";
  }
  out += header("g4_time_to_first_token_seconds", "histogram", "From a request's arrival to its first token.");
  out += time_to_first_token_.render("g4_time_to_first_token_seconds");
  out += header("g4_decode_token_seconds", "histogram", "Between successive tokens of a request.");
  out += decode_token_.render("g4_decode_token_seconds");
  return out;
}

}  // namespace g4::serve
