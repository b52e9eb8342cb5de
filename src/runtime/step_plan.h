// One engine step as data (docs/DESIGN.md §7, "Plan, execute, update"): what the scheduler
// decided (StepPlan), what running it produced (StepResult). The scheduler plans, an executor runs
// the plan, and the results update the scheduler's state; a split model's other ranks run rank 0's
// plan instead of deciding again. All plain values but a constrained draw's mask, which is filled in
// while the forward runs (DrawMask).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "runtime/draw_mask.h"
#include "sampling/logit_penalties.h"
#include "sampling/sampling_params.h"

namespace g4 {

using RequestId = uint64_t;

// A sequence's part of one forward: its pending token (a decode row) or a chunk of its prompt.
struct PlannedChunk {
  RequestId id = 0;
  int64_t position = 0;          // the sequence's position before the chunk
  std::vector<int32_t> tokens;   // the ids fed at [position, position + tokens.size())
  bool decode = false;           // a decode row (its one pending token), else a prompt chunk
  // Set when the forward draws a token for this chunk (a decode row, or the chunk that ends the
  // prompt): the parameters of that draw.
  std::optional<SamplingParams> draw;
  int32_t top_logprobs = -1;     // with a draw: -1, or the log-probabilities asked for
  std::vector<LogitAdjustment> adjustments;  // with a draw: its logit bias and penalties (often none)
  // With a draw under a grammar: the tokens it may draw (computed while the forward runs; null: any).
  std::shared_ptr<const DrawMask> mask;
  // Speculative decoding (runtime/drafter.h). `drafting`: the sequence drafts, so the executor keeps
  // the target's hidden row of this chunk's draw for its next round. `drafts` > 0 makes a decode row
  // a verify chunk: the executor drafts that many tokens after the pending one, the forward runs
  // them all and draws every row (drafts + 1), and the acceptance rule keeps a prefix of the drafts.
  bool drafting = false;
  int64_t drafts = 0;
  int64_t rows() const { return int64_t(tokens.size()) + drafts; }
  int64_t draw_rows() const { return draw ? 1 + drafts : 0; }
};

// One batched forward: its chunks in row order (decode rows first, in arrival order).
struct PlannedForward {
  std::vector<PlannedChunk> chunks;
  int64_t rows() const;
  int64_t draws() const;  // the forward's output rows: a row per chunk with a draw, drafts + 1 per verify chunk
  bool decodes_only() const;  // one pending token a chunk, no verify chunk
};

// Membership changes happen before the forwards, in this order: preempted (their caches swapped out
// to host memory), resumed (swapped back in), admitted.
struct StepPlan {
  std::vector<RequestId> preempted;        // youngest first
  std::vector<RequestId> resumed;          // oldest first
  std::vector<RequestId> admitted;         // started this step, in arrival order
  std::vector<PlannedForward> forwards;    // run in order
  bool empty() const { return preempted.empty() && resumed.empty() && admitted.empty() && forwards.empty(); }
};

// What a chunk with a draw gave.
struct ChunkDraw {
  int32_t token = 0;                     // drawn (kNanLogitsToken: NaN logits); a verify chunk: the verdict's
  std::vector<int32_t> accepted_drafts;  // a verify chunk: the drafts that stand, fed before `token`
  int64_t drafted = 0;                   // a verify chunk: the drafts it checked
  // A drafting sequence: the target's final-normed hidden row that drew `token` (activation dtype).
  std::vector<uint8_t> hidden;
  // When the chunk asked for log-probabilities: the logits each token was drawn from (the accepted
  // drafts', then the token's), row-major [accepted_drafts.size() + 1, vocab]; else empty.
  std::vector<float> logits;
};

// What running one planned forward gave.
struct ForwardDraws {
  std::vector<ChunkDraw> draws;  // one per chunk with a draw, in chunk order
  bool replayed = false;         // replayed a recording of itself (CUDA graphs)
};

struct StepResult {
  std::vector<ForwardDraws> forwards;  // one per planned forward, in order
};

}  // namespace g4
