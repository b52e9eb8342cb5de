// g4 bench --held N: N long sequences held in the KV pool at once, and a decode step over all of
// them timed — the memory of many long conversations side by side (docs/DESIGN.md, "Quantized KV").
#pragma once
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "model/gemma4.h"
#include "model/kv_types.h"

namespace g4::cli {

struct HeldBench {
  std::vector<int64_t> sequences;  // counts held at once, each measured on its own
  std::vector<int32_t> prompt;  // the context each holds before decoding
  int64_t steps = 0;             // greedy decode steps over all of them
  KvTypes kv_types;
};

// One prefill fills the first sequence; for each count N, N copies of its caches are swapped in,
// each into pages of its own (KvPool::swap_out, then swap_in of each copy), so the pool holds N
// whole contexts as N users' conversations would, without N long prefills. Throws Error(kResourceExhausted) naming the
// capacity when the pool cannot hold N. Reports the pool's capacity in such sequences, the bytes
// held, and the decode step's time. Every sequence's first logits must be the bits the first sequence
// computed before it was copied (same caches, batch-invariant kernels): a copy that lost a bit fails.
nlohmann::json bench_held(const Gemma4& model, Backend& backend, const HeldBench& bench);

}  // namespace g4::cli
