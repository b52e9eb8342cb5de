// Graph decoding (docs/DESIGN.md §7): a decode step — forward, logits, on-device draws — recorded
// once on the backend (a CUDA graph) and replayed per token, its inputs uploaded into backend
// memory before each replay. A recording bakes in the addresses of the caches it ran over and of
// the backend's scratch buffers, so it is recorded again (a CUDA graph updated in place) when the
// caches change or the backend replaced a scratch (Backend::replayable).
//
// DecodeGraph: one Session's step plus the device-side advance (next input id = the sampled token,
// position + 1): token and position never leave the device; each step reads back only the 8-byte
// sampled token. The sampler advances the seed in device memory, so replays follow the seed
// schedule (docs/DESIGN.md §4).
//
//   session.prefill(prompt);
//   int64_t token = session.sample(sampler, 0);        // seed s
//   DecodeGraph graph(session);
//   graph.start(int32_t(token), sampler, 1);           // the first replay draws token 1: seed s + 1
//   while (...) token = graph.next();                  // seeds s+1, s+2, ...
//
// Session::next() does this itself for a generation begun with graph = true. The session must
// outlive the DecodeGraph.
//
// DecodeBatchGraphs: the scheduler's decode steps of B sequences (one token each), one recording
// per B, and a drafter's steps (runtime/drafter.h); see its comment.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "runtime/session.h"
#include "sampling/sampler.h"

namespace g4 {

// What a recording bakes in of some sequences' caches: every layer's K and V addresses and page table.
std::vector<uintptr_t> cache_layout(std::span<const std::vector<KvCache>* const> sequences);

// Throws unless the runner's backend records steps. A rank of a split model records its step's
// collectives too (docs/DESIGN.md, "Tensor parallel").
void check_graphs_run(const ModelRunner& runner);

class DecodeGraph {
 public:
  explicit DecodeGraph(Session& session);
  DecodeGraph(const DecodeGraph&) = delete;
  DecodeGraph& operator=(const DecodeGraph&) = delete;

  // Sets the next step's input token (fed at the session's position) and the draw's parameters,
  // those of token j of `sampler`. Records the step when the last recording cannot be replayed.
  void start(int32_t token, const Sampler& sampler, int64_t j = 0);
  // Runs one recorded step and returns the sampled token, which becomes the next step's input.
  int64_t next();

 private:
  void record();

  Session& session_;
  std::unique_ptr<Backend::RecordedStep> recorded_;
  std::vector<uintptr_t> recorded_caches_;  // cache_layout of the caches the recording runs over
  bool started_ = false;
  int32_t input_ = -1;  // the token the next replay feeds
};

// The scheduler's pure-decode forwards on a backend with graphs: the forward of B sequences, one
// token each, and the draws of its B rows, recorded once per (forward of the step, B) and replayed
// with ids, positions and sampling parameters uploaded before each replay
// (ModelRunner::forward_and_sample). The recording bakes in the sequences' cache addresses, so a
// forward whose sequences differ from the recording's (or after the backend replaced a scratch)
// records again, updating the CUDA graph in place. The first forward of each key runs eagerly: it
// sizes whatever backend buffers that forward needs (a capture cannot allocate).
class DecodeBatchGraphs {
 public:
  explicit DecodeBatchGraphs(const ModelRunner& runner);
  DecodeBatchGraphs(const DecodeBatchGraphs&) = delete;
  DecodeBatchGraphs& operator=(const DecodeBatchGraphs&) = delete;

  // Runs `work` — the enqueued forward and draws of the decode rows of `sequences`, in row order,
  // the step's forward number `forward` — eagerly, or as the recording for (forward, their count),
  // recording it first when needed. Returns whether it replayed a recording.
  bool run(int64_t forward, std::span<const std::vector<KvCache>* const> sequences, const std::function<void()>& work);

 private:
  struct Recording {
    std::unique_ptr<Backend::RecordedStep> step;
    std::vector<uintptr_t> caches;  // cache_layout of the sequences `step` runs over
  };
  Backend& backend_;
  // By (forward of the step, rows): an entry exists once that forward ran eagerly. Decode rows come
  // first in a step, so a steady batch's forwards keep their numbers from step to step.
  std::map<std::pair<int64_t, size_t>, Recording> recordings_;
};

}  // namespace g4
