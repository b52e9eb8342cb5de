// The draft half of speculative decoding (docs/DESIGN.md §7, "Speculative decoding"): an MTP
// assistant's draft steps for many sequences at once. Each sequence brings its pending token x at
// position P, the target's final-normed hidden state of the position that drew x, its caches and the
// parameters of x's successor's draw; step i runs every sequence's row through the assistant at P and
// draws draft i + 1 from its logits with seed + i (the seed the target would use for that token), so
// a session's drafts do not depend on the other sequences of the batch.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "model/assistant.h"
#include "runtime/model_runner.h"
#include "sampling/sampling_params.h"

namespace g4 {

class DecodeBatchGraphs;

// A benchmark's control of acceptance (`g4 bench --draft_accept`): the assistant drafts as
// always, then a greedy round's drafts are replaced so that a chosen number stand — the first ones by
// the target's own greedy continuation, the next by a token that differs from it — round r taking
// floor((r + 1)·A) − floor(r·A) of them (at most its drafts), so that A stand a round on average.
// What decoding at a given acceptance costs, with a real assistant's work, on any weights.
struct ForcedAcceptance {
  std::vector<int32_t> continuation;  // the target's greedy tokens, by token index
  double accepted_per_round = 0;      // A
  // The drafts of round `round` whose first draft is token index j, given the drafter's.
  void force(std::vector<int32_t>& drafts, int64_t j, int64_t round, int64_t vocab) const;
};

// Drafting for a generation: none without an assistant.
struct DraftOptions {
  const Gemma4Assistant* assistant = nullptr;
  int64_t draft_tokens = kDefaultDraftTokens;  // K, the most drafts of a round
  const ForcedAcceptance* forced = nullptr;  // benchmarks, greedy only; null: the drafts stand as drafted
};

struct SpeculationStats {
  int64_t rounds = 0, drafted = 0, accepted = 0;
  double draft_seconds = 0, verify_seconds = 0;
  // Tokens a round gives on average: its accepted drafts and the verdict's token.
  double tokens_per_round() const { return rounds > 0 ? double(accepted + rounds) / double(rounds) : 0.0; }
  double acceptance() const { return drafted > 0 ? double(accepted) / double(drafted) : 0.0; }
  // Milliseconds a draft step and a verify took on average.
  double draft_step_ms() const { return drafted > 0 ? draft_seconds / double(drafted) * 1e3 : 0.0; }
  double verify_ms() const { return rounds > 0 ? verify_seconds / double(rounds) * 1e3 : 0.0; }
  // The rounds after `earlier` (an earlier copy of these counts).
  SpeculationStats since(const SpeculationStats& earlier) const {
    return {rounds - earlier.rounds, drafted - earlier.drafted, accepted - earlier.accepted,
            draft_seconds - earlier.draft_seconds, verify_seconds - earlier.verify_seconds};
  }
};

// One sequence's round of drafts.
struct DraftRequest {
  // The target's, holding positions < position, their tables uploaded (KvPool::prepare).
  const std::vector<KvCache>* caches = nullptr;
  int32_t pending = 0;                           // x, drawn and not yet fed
  int64_t position = 0;                          // P, where x goes
  std::span<const uint8_t> hidden;               // the target's final-normed hidden row that drew x (activation dtype)
  SamplingParams params;                         // the draw of the token after x; draft i uses seed + i
  int64_t drafts = 0;                            // how many to draft (>= 1)
};

struct Drafts {
  // The drafted tokens, at most DraftRequest::drafts: fewer when the assistant's logits held a NaN
  // (the drafts stop before it).
  std::vector<int32_t> tokens;
  // Where the drafts and the logits each was drawn from lie in backend memory, until the drafter's
  // next draft(): Backend::judge_drafts reads them there.
  DraftRows rows;
};

class Drafter {
 public:
  // Runs up to max_rows sequences in one assistant step (more run in groups), up to max_requests in
  // one draft() call, up to max_drafts steps. Every step's logits rows stay in backend memory for the
  // verdict: max_drafts × max_requests rows of the vocabulary (4 MiB a sequence for the 31B at K = 4).
  Drafter(const Gemma4Assistant& assistant, ModelRunner& runner, int64_t max_rows, int64_t max_requests,
          int64_t max_drafts);
  ~Drafter();
  // Whether a group's draft steps replay a recording of themselves (CUDA graphs; throws on a backend
  // without them): a step is a few dozen small launches, whose host cost a replay drops (7 % of the
  // 31B assistant's step on an H100; docs/DESIGN.md). One recording per (group, steps) and
  // cache layout, made the second time that key drafts (the first sizes the backend's buffers
  // eagerly), as DecodeBatchGraphs does.
  void replay_steps(bool on);
  // Groups whose steps replayed a recording (replay_steps), over the drafter's life.
  int64_t replayed_groups() const { return replayed_groups_; }
  const Gemma4Assistant& assistant() const { return assistant_; }
  // The drafts of every request, in order.
  std::vector<Drafts> draft(std::span<const DraftRequest> requests);

 private:
  void draft_group(std::span<const DraftRequest> requests, int64_t first, int64_t steps);

  const Gemma4Assistant& assistant_;
  ModelRunner& runner_;
  DraftBuffers buf_;
  int64_t max_requests_, max_drafts_;
  Tensor ids_, positions_, h_;
  // Request r's step i: row i·max_requests + r of each.
  Tensor logits_, tokens_;
  SamplingRows params_;
  std::unique_ptr<DecodeBatchGraphs> graphs_;  // with replay_steps
  int64_t replayed_groups_ = 0;
};

}  // namespace g4
