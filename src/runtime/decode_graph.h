// Graph decoding: one decode step of a Session — forward of one token, its logits, on-device
// sampling, and the device-side advance (next input id = the sampled token, position + 1) — is
// recorded once on the backend and replayed per token. Token and position never leave the device;
// each step reads back only the 8-byte sampled token. The sampler advances the seed in device
// memory, so token j of the graph uses params.seed + j, as the seed schedule asks (docs/DESIGN.md §4).
//
//   session.prefill(prompt);
//   int64_t token = session.sample(params);           // seed s
//   DecodeGraph graph(session);
//   graph.start(int32_t(token), params_with_seed_s_plus_1);
//   while (...) token = graph.next();                  // seeds s+1, s+2, ...
//
// Needs a backend with graphs (CUDA); a backend holds one recorded step, so use one DecodeGraph per
// backend at a time. The session must outlive the DecodeGraph.
#pragma once
#include <cstdint>

#include "runtime/session.h"
#include "sampling/sampling_params.h"

namespace g4 {

class DecodeGraph {
 public:
  explicit DecodeGraph(Session& session) : session_(session) {}

  // Sets the next step's input token (fed at the session's position) and sampling parameters
  // (params.seed = the seed of the token the next step samples). Records the step on first use.
  void start(int32_t token, const SamplingParams& params);
  // Runs one recorded step and returns the sampled token, which becomes the next step's input.
  int64_t next();

 private:
  void record();

  Session& session_;
  bool recorded_ = false, started_ = false;
};

}  // namespace g4
