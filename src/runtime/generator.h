// Text generation on a Session: the prompt (only what the session and the prefix cache do not hold
// is prefilled), then one token at a time with the seed schedule of docs/DESIGN.md §4 (token j is
// drawn with seed base + j) and the stop tokens.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/session.h"
#include "sampling/logit_penalties.h"
#include "sampling/sampler.h"

namespace g4 {

struct GenerationRequest {
  // The whole sequence to continue: a conversation's next turn passes the history too, and the
  // session prefills only what its caches (or the pool's prefix cache) do not hold.
  std::vector<int32_t> prompt;
  Sampler sampler{SamplingParams{}};  // its base seed draws token 0
  int64_t max_new_tokens = 128;       // 0: nothing runs
  std::vector<int32_t> stop_ids{1};
  bool graph = false;  // replay one recorded decode step per token (a backend with graphs)
  // Logit bias and penalties; with any, decode steps run eagerly (their lists change every token).
  LogitPenalties penalties;
  // An assistant drafting tokens in rounds (runtime/speculation.h): none by default.
  DraftOptions draft;
  // Checked after every generated token; once true, generation ends there (e.g. set by a SIGINT
  // handler, so Ctrl-C stops one reply without ending the program).
  const std::atomic<bool>* stop = nullptr;
};

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated, without the stop token
  int32_t stop_token = -1;      // the stop token that ended generation, -1 if none
  bool context_full = false;    // ended because the context had no room for another token
  bool stopped = false;         // ended because *request.stop became true
  int64_t prefilled = 0;        // prompt tokens prefilled (the others were held already)
  double prefill_seconds = 0;   // prompt in, first token out (time to first token)
  double decode_seconds = 0;    // every later token
};

// Calls on_token for each generated token (not for the stop token) as soon as it is known.
GenerationResult generate(Session& session, const GenerationRequest& request,
                          const std::function<void(int32_t)>& on_token = {});

}  // namespace g4
