// Graph decoding: a Session's decode step (Session::enqueue_decode_step — forward of one token,
// its logits, on-device sampling) plus the device-side advance (next input id = the sampled
// token, position + 1) is recorded once on the backend and replayed per token. Token and position
// never leave the device; each step reads back only the 8-byte sampled token. The sampler advances
// the seed in device memory, so replays follow the seed schedule (docs/DESIGN.md §4).
//
//   session.prefill(prompt);
//   int64_t token = session.sample(sampler, 0);        // seed s
//   DecodeGraph graph(session);
//   graph.start(int32_t(token), sampler, 1);           // the first replay draws token 1: seed s + 1
//   while (...) token = graph.next();                  // seeds s+1, s+2, ...
//
// Session::next() does this itself for a generation begun with graph = true. Needs a backend with
// graphs (CUDA). The backend holds one recorded step: a DecodeGraph records again when another
// graph (or other caches) took its place. The session must outlive the DecodeGraph.
#pragma once
#include <cstdint>

#include "runtime/session.h"
#include "sampling/sampler.h"

namespace g4 {

class DecodeGraph {
 public:
  // Throws for a rank of a split model: capturing the NCCL collectives is not verified on two GPUs
  // yet (docs/DESIGN.md, "Tensor parallel").
  explicit DecodeGraph(Session& session);
  ~DecodeGraph();
  DecodeGraph(const DecodeGraph&) = delete;
  DecodeGraph& operator=(const DecodeGraph&) = delete;

  // Sets the next step's input token (fed at the session's position) and the draw's parameters,
  // those of token j of `sampler`. Records the step when the backend does not hold it.
  void start(int32_t token, const Sampler& sampler, int64_t j = 0);
  // Runs one recorded step and returns the sampled token, which becomes the next step's input.
  int64_t next();

 private:
  void record();

  Session& session_;
  const void* recorded_caches_ = nullptr;  // the session's caches the recorded step runs over
  bool started_ = false;
  int32_t input_ = -1;  // the token the next replay feeds
};

}  // namespace g4
