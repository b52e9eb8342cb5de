// g4 bench --concurrency: many sequences through the continuous-batching scheduler
// (docs/DESIGN.md §7): aggregate generated tok/s, per-sequence decode tok/s and time to first token.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "grammar/matcher.h"
#include "model/gemma4.h"
#include "runtime/drafter.h"
#include "runtime/kv_pool.h"
#include "model/kv_types.h"

namespace g4::cli {

struct ConcurrencyBench {
  std::vector<int64_t> concurrency;  // sequence counts, each measured on its own
  int64_t prompt_len = 0, gen = 0;   // per sequence
  uint64_t seed = 1;
  bool batch_invariant = true;       // SchedulerOptions::batch_invariant
  bool cuda_graphs = false;          // SchedulerOptions::cuda_graphs
  KvTypes kv_types;                  // the caches' row types
  int64_t profile_steps = 0;         // > 0: each run's full decode steps 5.. 4 + this, bracketed for a profiler
  // Non-null: every sequence is constrained by this grammar (docs/DESIGN.md §4) and ends on its stop
  // tokens; else each generates exactly `gen` tokens.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  DraftOptions draft{nullptr, 0};  // with an assistant: every sequence decodes in draft rounds
};

// The caches' types and what a position costs in them (every bench report carries it).
nlohmann::json kv_cache_json(const KvPool& pool);

// One JSON object per sequence count; every sequence samples with top-k 64 / top-p 0.95 and its own seed.
nlohmann::json bench_concurrency(const Gemma4& model, Backend& backend, const ConcurrencyBench& bench);

}  // namespace g4::cli
