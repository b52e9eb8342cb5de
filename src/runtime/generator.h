// Text generation over an Engine: prefill, then one token at a time, with the seed schedule of
// docs/DESIGN.md §4 (token j is drawn with seed base + j) and the stop tokens.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/engine.h"

namespace g4 {

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams params;  // params.seed is the base seed
  int64_t max_new_tokens = 128;
  std::vector<int32_t> stop_ids{1};
  bool graph = false;  // replay one recorded decode step per token (needs a sampling program)
  // Feed the prompt after what the engine's session already holds (a conversation's next turn:
  // only the new tokens are prefilled) instead of starting the session again at position 0.
  bool continue_session = false;
  // Checked after every generated token; once true, generation ends there (e.g. set by a SIGINT
  // handler, so Ctrl-C stops one reply without ending the program).
  const std::atomic<bool>* stop = nullptr;
};

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated, without the stop token
  int32_t stop_token = -1;      // the stop token that ended generation, -1 if none
  bool context_full = false;    // ended because the context had no room for another token
  bool stopped = false;         // ended because *request.stop became true
  double prefill_seconds = 0;   // prompt in, first token out (time to first token)
  double decode_seconds = 0;    // every later token
};

// Calls on_token for each generated token (not for the stop token) as soon as it is known.
GenerationResult generate(Engine& engine, const GenerationRequest& request,
                          const std::function<void(int32_t)>& on_token = {});

}  // namespace g4
