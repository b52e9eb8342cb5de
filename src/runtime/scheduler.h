// Continuous batching (docs/DESIGN.md §7): requests join at any time; every step() runs the decode
// tokens of all running sequences and a bounded prefill budget of arriving ones, packed into
// batched forwards (of at most the rows the backend computes row by row alike:
// batch_invariant_rows, unless SchedulerOptions::batch_invariant is false), and draws each
// sequence's token with its own parameters and seed on the backend. Sequences join and leave
// between steps. A sequence's tokens do not depend on what else is in the batch. With cuda_graphs,
// steps that only decode replay a recording of themselves (DecodeBatchGraphs).
//
//   Scheduler scheduler(engine.runner());
//   RequestId id = scheduler.add({prompt, params, max_new_tokens, stop_ids});
//   while (!scheduler.idle()) for (const SequenceEvent& e : scheduler.step()) use(e);
#pragma once
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/decode_graph.h"
#include "runtime/generation.h"
#include "runtime/kv_pool.h"
#include "runtime/model_runner.h"
#include "sampling/logprobs.h"
#include "sampling/sampling_params.h"

namespace g4 {

struct SchedulerRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;           // validated by add(); sampling.seed draws token 0
  int64_t max_new_tokens = 128;      // >= 1
  std::vector<int32_t> stop_ids{1};
  // -1: no log-probabilities; 0..kMaxTopLogprobs: each drawn token's, and that many alternatives
  // (docs/DESIGN.md §8: the model's distribution, read back from the logits the token was drawn from).
  int32_t top_logprobs = -1;
};

using RequestId = uint64_t;

// One token drawn for one request; drawn.last() says the request ended with it (and left the
// scheduler; its caches are kept for prefix reuse). A request that failed ends with no token
// (StopReason::kFailed) and the reason in `error`; it keeps no caches.
struct SequenceEvent {
  RequestId id = 0;
  DecodedToken drawn;
  std::optional<TokenLogprobs> logprobs;  // when the request asked for them
  std::string error;                      // why the request failed; empty when it did not
};

struct SchedulerOptions {
  int64_t prefill_tokens_per_step = 0;  // prompt tokens one step prefills; 0 = the runner's max_prefill_chunk
  size_t max_waiting = 256;             // requests waiting to start; add() past it answers "busy"
  // true: the backend is asked for batch invariance (Backend::set_batch_invariant) and forwards
  // hold at most its batch_invariant_rows(), so a sequence's tokens do not depend on its batch.
  // false: the fastest kernels, and a decode batch (and prefill chunks) fill whole forwards of up
  // to the workspace's rows; a sequence's tokens may then depend on what runs beside it where large
  // matmuls run differently from small ones (CUDA) (docs/DESIGN.md §7).
  bool batch_invariant = true;
  // Steps that only decode replay a recorded forward per batch size (DecodeBatchGraphs: CUDA
  // graphs; a backend with graphs, one device), with the tokens of eager steps.
  bool cuda_graphs = false;
};

// What the last step ran (for tests and reports); a forward with decode and prefill rows counts in
// both forward counts.
struct StepStats {
  int64_t decode_rows = 0, decode_forwards = 0, prefill_rows = 0, prefill_forwards = 0, forwards = 0;
  int64_t replayed_forwards = 0;  // forwards that replayed a recording (SchedulerOptions::cuda_graphs)
};

class Scheduler {
 public:
  explicit Scheduler(ModelRunner& runner, SchedulerOptions options = {});

  // Queues a request; throws g4::Error naming the problem (empty prompt, an id out of range, a
  // prompt longer than the context, bad sampling parameters, max_new_tokens < 1, a sequence
  // larger than the whole KV budget, or "busy" when max_waiting requests already wait).
  RequestId add(const SchedulerRequest& request);
  // Ends a request now, waiting or running, and frees its KV memory at once. False if unknown
  // (or already ended).
  bool cancel(RequestId id);
  // One engine step; the tokens drawn in it, decode rows first, in arrival order. A sequence whose
  // logits hold a NaN fails alone (its event's error is kNanLogitsError, its KV memory is freed)
  // while the others go on.
  std::vector<SequenceEvent> step();

  bool idle() const { return waiting_.empty() && running_.empty(); }
  size_t waiting() const { return waiting_.size(); }
  size_t running() const { return running_.size(); }
  const StepStats& last_step() const { return stats_; }

 private:
  struct Sequence {
    RequestId id;
    std::vector<int32_t> prompt;
    Generation generation;
    KvSequence kv;
    int32_t pending = -1;  // drawn, to be fed by the next decode
    bool ended = false;
    int32_t top_logprobs = -1;
  };
  // A sequence's part of a step: its pending token (a decode row) or a chunk of its prompt.
  struct Work {
    Sequence* sequence;
    int64_t tokens;
    // Whether the forward draws a token for it: a decode row, or the chunk that ends its prompt.
    bool ends_prompt_or_decodes() const {
      return sequence->pending >= 0 || sequence->kv.position() + tokens == int64_t(sequence->prompt.size());
    }
  };
  std::vector<Work> plan_prefill();
  // One forward over `work` (its sequences' tokens at their next positions), then the draws.
  void run_forward(std::span<const Work> work, std::vector<SequenceEvent>& events);
  // Records the tokens drawn for `rows` (in row order) as their events.
  void record_draws(std::span<Sequence* const> rows, std::span<const int32_t> tokens,
                    std::vector<SequenceEvent>& events);
  // Ends `s` with `error`, keeping nothing of its caches (as cancel does).
  static SequenceEvent fail(Sequence& s, const std::string& error);
  // The logits rows of the rows that asked for log-probabilities, read back from the backend
  // (empty when none asked).
  std::vector<float> logprob_rows(std::span<Sequence* const> rows, const Tensor& logits);
  void drop_ended();

  ModelRunner& runner_;
  int64_t prefill_per_step_;
  int64_t forward_rows_ = 0;  // the most rows one forward runs (batch_invariant's bound or the workspace)
  size_t max_waiting_;
  RequestId next_id_ = 1;
  std::deque<Sequence> waiting_;
  std::list<Sequence> running_;  // admitted (caches held), in arrival order; stable addresses
  std::unique_ptr<DecodeBatchGraphs> graphs_;  // with SchedulerOptions::cuda_graphs
  StepStats stats_;
};

}  // namespace g4
