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
#include <span>
#include <string>
#include <vector>

#include "grammar/matcher.h"
#include "runtime/decode_graph.h"
#include "runtime/drafter.h"
#include "runtime/generation.h"
#include "runtime/kv_pool.h"
#include "runtime/model_runner.h"
#include "runtime/step_plan.h"
#include "sampling/logit_penalties.h"
#include "sampling/logprobs.h"
#include "sampling/sampling_params.h"
#include "sampling/speculative.h"

namespace g4 {

struct SchedulerRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;           // validated by add(); sampling.seed draws token 0
  int64_t max_new_tokens = 128;      // >= 1
  std::vector<int32_t> stop_ids{1};
  // Logit bias and penalties (sampling/logit_penalties.h), applied on the backend before each draw.
  LogitPenalties penalties;
  // -1: no log-probabilities; 0..kMaxTopLogprobs: each drawn token's, and that many alternatives
  // (docs/DESIGN.md §8: the model's distribution, read back from the logits the token was drawn from).
  int32_t top_logprobs = -1;
  // Constrained decoding (docs/DESIGN.md §4): each draw is limited to the tokens that keep the output
  // a prefix of this grammar's language (its stop tokens where the language may end, and they must
  // be stop_ids). Null: any token.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
};

// One token drawn for one request; drawn.last() says the request ended with it (and left the
// scheduler; its written pages stay cached for prefix reuse). A request that failed ends with no
// token (StopReason::kFailed) and the reason in `error`.
struct SequenceEvent {
  RequestId id = 0;
  DecodedToken drawn;
  std::optional<TokenLogprobs> logprobs;  // when the request asked for them
  std::string error;                      // why the request failed; empty when it did not
};

struct SchedulerOptions {
  int64_t prefill_tokens_per_step = 0;  // prompt tokens one step prefills; 0 = the runner's max_prefill_chunk
  size_t max_waiting = 256;             // requests waiting to start; add() past it is Error(kBusy)
  // true: the backend is asked for batch invariance (Backend::set_batch_invariant) and forwards
  // hold at most its batch_invariant_rows(), so a sequence's tokens do not depend on its batch.
  // false: the fastest kernels, and a decode batch (and prefill chunks) fill whole forwards of up
  // to the workspace's rows; a sequence's tokens may then depend on what runs beside it where large
  // matmuls run differently from small ones (CUDA) (docs/DESIGN.md §7).
  bool batch_invariant = true;
  // Steps that only decode replay a recorded forward per batch size (DecodeBatchGraphs: CUDA
  // graphs; a backend with graphs, one device), with the tokens of eager steps; so do the drafter's
  // steps (Drafter::replay_steps).
  bool cuda_graphs = false;
  // Speculative decoding with an MTP assistant (runtime/drafter.h): every request decodes in rounds
  // of up to draft_tokens drafts, verified in the step's forwards beside the other sequences' rows,
  // each verify row under the logit bias, penalties and grammar of the draw at its position (and its
  // log-probabilities from that row). No assistant: none.
  DraftOptions draft{nullptr, 0};
};

// What the last step ran (for tests and reports); a forward with decode and prefill rows counts in
// both forward counts.
struct StepStats {
  int64_t decode_rows = 0, decode_forwards = 0, prefill_rows = 0, prefill_forwards = 0, forwards = 0;
  int64_t replayed_forwards = 0;  // forwards that replayed a recording (SchedulerOptions::cuda_graphs)
  int64_t preempted = 0, resumed = 0;
};

// The numbers the scheduling policy works within.
struct SchedulerLimits {
  int64_t max_seq_len = 0;            // positions of every sequence's KV caches
  int64_t prefill_tokens_per_step = 0;  // prompt tokens one step prefills (>= 1)
  int64_t forward_rows = 0;           // the most rows one forward runs (a larger chunk runs alone)
  int64_t forward_draws = 0;          // the most tokens one forward draws
  size_t max_waiting = 256;           // requests waiting to start; add() past it is Error(kBusy)
  int64_t draft_tokens = 0;           // the most drafts of a round (0: no drafting)
};

// The scheduling policy and the state of its sequences: plans each step (StepPlan: which
// sequences decode, which prompt chunks run, which waiting requests start, which running ones are
// preempted) and applies what running it gave (update). It runs no forward: policy tests drive it
// with tokens of their choosing.
//
// Memory (docs/DESIGN.md §7): sequences hold KV pages as they grow and reserve none. A waiting
// request starts when the pool's available pages, less what running sequences will still take to
// finish their prompts and write their next token, hold its prompt and first token (its cached
// prefix costs nothing); when a step's forwards need more pages than are available, the youngest
// running sequence is preempted (its pages copied to host memory and freed) and resumes, before
// any new request starts, when its pages fit again.
class StepPlanner {
 public:
  StepPlanner(KvPool& pool, const SchedulerLimits& limits);

  // Queues a request; throws g4::Error naming the problem (an empty prompt, a prompt longer than
  // the context, bad sampling parameters, max_new_tokens < 1, a sequence whose prompt and new
  // tokens need more KV pages than the whole pool (kResourceExhausted), or kBusy when max_waiting
  // requests already wait).
  RequestId add(const SchedulerRequest& request);
  // Ends a request now, waiting, running or preempted, and gives its KV memory back at once. False if
  // unknown.
  bool cancel(RequestId id);

  // The next step: preemptions while the running sequences' next chunks need more pages than are
  // available; decode rows of every running sequence that has a pending token, in arrival order,
  // then prompt chunks within the step's prefill budget; preempted sequences resume, then waiting
  // requests start, in arrival order, while the pool has room (beginning with their cached
  // prefixes). Packed into forwards of at most forward_rows rows and forward_draws draws.
  StepPlan plan();
  // Applies another scheduler's plan's membership changes (a split model's rank 0: preemptions,
  // resumptions, admissions) as that scheduler applied them; throws Error(kInternal) when they do
  // not name this scheduler's sequences in its order (the ranks diverged).
  void follow(const StepPlan& plan);
  // Applies what running `plan` gave: each drawn token recorded (a sequence that ends leaves, its
  // written pages cached for prefix reuse; NaN logits fail the sequence alone). The events in row
  // order.
  std::vector<SequenceEvent> update(const StepPlan& plan, const StepResult& result);

  // The caches of a running sequence (the executor's view).
  KvSequence& kv(RequestId id);
  // A drafting sequence's target hidden row that drew its pending token (the executor's view).
  std::span<const uint8_t> draft_hidden(RequestId id) const { return running(id).draft_hidden; }
  // A running sequence's logit bias and penalties as of its pending draw (the executor's view: a
  // verify chunk's rows are adjusted along its drafts).
  const PenaltyState& penalties(RequestId id) const { return running(id).penalties; }
  // A running sequence's grammar as of its pending draw (null: none).
  const grammar::GrammarMatcher* matcher(RequestId id) const { return running(id).matcher.get(); }
  bool idle() const { return waiting_.empty() && running_.empty() && preempted_.empty(); }
  size_t waiting() const { return waiting_.size() + preempted_.size(); }  // not running, preempted ones too
  size_t running() const { return running_.size(); }
  size_t preempted() const { return preempted_.size(); }  // waiting to resume
  int64_t preemptions() const { return preemptions_; }    // since the planner was made

 private:
  struct Sequence {
    RequestId id;
    std::vector<int32_t> prompt;
    Generation generation;
    KvSequence kv;
    int64_t position = 0;  // tokens whose K/V the caches hold (as of the last update)
    int32_t pending = -1;  // drawn, to be fed by the next decode
    bool ended = false;
    int32_t top_logprobs = -1;
    PenaltyState penalties;
    std::shared_ptr<grammar::GrammarMatcher> matcher;  // with SchedulerRequest::grammar
    std::optional<SwappedSequence> swapped;  // while preempted
    std::vector<uint8_t> draft_hidden;       // with an assistant: ChunkDraw::hidden of its last draw
  };
  Sequence& running(RequestId id);
  const Sequence& running(RequestId id) const;
  // The sliding layers' pages before every running sequence's window go back first, so that the
  // pages a plan counts are those its forwards take (rank 0 and its followers alike).
  void release_unread_pages();
  // The chunks of the running sequences: decode rows, then prompt chunks in order while the step's
  // prefill budget lasts (`budget`: left of it). Sets `prefills_fit` when every prompt chunk fit.
  std::vector<PlannedChunk> running_chunks(int64_t& budget, bool& prefills_fit) const;
  // The pages the forwards of `chunks` take.
  int64_t pages_for(const std::vector<PlannedChunk>& chunks) const;
  // The pages the running sequences will still take to finish their prompts and write their next token.
  int64_t pages_committed() const;
  // The pages a waiting or preempted sequence takes to run again.
  int64_t pages_to_start(const Sequence& s) const;
  void preempt_youngest();
  void resume_front();
  void start_front();
  // The chunk of `s` that runs next (its pending token, or up to `budget` prompt tokens).
  PlannedChunk chunk(const Sequence& s, int64_t tokens) const;
  // The drafts of the round `s` runs next: at most draft_tokens, and no more than its new tokens and
  // its context leave room for (0: it decodes one token).
  int64_t next_drafts(const Sequence& s) const;
  // Records a drawing chunk's tokens (its accepted drafts, then its token) for `s`; the events.
  void record(Sequence& s, const PlannedChunk& c, const ChunkDraw& d, std::vector<SequenceEvent>& events);
  // Decode rows, then prompt chunks, packed in order into forwards.
  std::vector<PlannedForward> pack(std::vector<PlannedChunk> chunks) const;
  // Ends `s` with `error`, keeping nothing of its caches (as cancel does).
  static SequenceEvent fail(Sequence& s, const std::string& error);

  KvPool& pool_;
  SchedulerLimits limits_;
  RequestId next_id_ = 1;
  std::deque<Sequence> waiting_;
  std::list<Sequence> running_;    // admitted (caches held), in arrival order; stable addresses
  std::list<Sequence> preempted_;  // caches swapped out, in arrival order
  int64_t preemptions_ = 0;
};

// Runs planned forwards on a model: uploads each forward's tokens, runs it and draws its tokens on
// the backend (forwards that only decode may replay a recording: CUDA graphs), reads back the
// tokens and the logits rows that asked for log-probabilities. The caches advance with the forward;
// nothing else of the scheduler's state changes here.
//
// Verify chunks (PlannedChunk::drafts): before each forward, the assistant drafts for all of its
// verify chunks at once (Drafter, groups of at most `draft_rows` sequences); the forward then draws
// every row of them, and the acceptance rule (sampling/speculative.h) decides each round: greedy
// from the draws, sampled on the backend from the logits (Backend::judge_drafts).
class StepExecutor {
 public:
  StepExecutor(ModelRunner& runner, bool cuda_graphs, const DraftOptions& draft, int64_t draft_rows);
  StepResult run(const StepPlan& plan, StepPlanner& sequences);
  const SpeculationStats& speculation_stats() const { return speculation_; }

 private:
  // The drafts of the forward's verify chunks, by request (valid until the next call: the drafter
  // keeps them in backend memory for the verdicts).
  std::vector<std::pair<RequestId, Drafts>> draft(const PlannedForward& forward, StepPlanner& sequences);
  ForwardDraws run_forward(int64_t index, const PlannedForward& forward, StepPlanner& sequences,
                           const std::vector<std::pair<RequestId, Drafts>>& drafts);
  // The verdicts of the forward's sampled verify chunks (by chunk; others empty), judged on the backend
  // over their rows of `logits` and read back together.
  std::vector<std::optional<DraftVerdict>> judge_sampled_chunks(const PlannedForward& forward,
                                                                std::span<const SequenceChunk> chunks,
                                                                const Tensor& logits,
                                                                const std::vector<std::pair<RequestId, Drafts>>& drafts);

  ModelRunner& runner_;
  std::unique_ptr<DecodeBatchGraphs> graphs_;  // with SchedulerOptions::cuda_graphs
  std::unique_ptr<Drafter> drafter_;           // with SchedulerOptions::draft
  SamplingRows verdict_params_;                // the verify rows' draws of a forward's sampled chunks
  Tensor verdicts_;                            // I64: their verdicts, two numbers each
  SpeculationStats speculation_;               // since the executor was made
};

// Continuous batching on one model: a StepPlanner and a StepExecutor. step() = plan, execute,
// update; a split model's rank 0 publishes plan() and every other rank follow()s it.
class Scheduler {
 public:
  explicit Scheduler(ModelRunner& runner, SchedulerOptions options = {});

  // As StepPlanner::add, with the prompt's ids and the biased tokens checked against the vocabulary.
  RequestId add(const SchedulerRequest& request);
  bool cancel(RequestId id) { return planner_.cancel(id); }
  // One engine step; the tokens drawn in it, decode rows first, in arrival order. A sequence whose
  // logits hold a NaN fails alone (its event's error is kNanLogitsError, its KV memory is freed)
  // while the others go on.
  std::vector<SequenceEvent> step() { return execute(plan()); }
  StepPlan plan() { return planner_.plan(); }
  // Runs `plan` (made by this scheduler's plan()) and applies its results.
  std::vector<SequenceEvent> execute(const StepPlan& plan);
  // Runs another scheduler's plan (rank 0's, whose inputs this one applied alike): its admissions,
  // then execute.
  std::vector<SequenceEvent> follow(const StepPlan& plan);

  bool idle() const { return planner_.idle(); }
  size_t waiting() const { return planner_.waiting(); }
  size_t running() const { return planner_.running(); }
  size_t preempted() const { return planner_.preempted(); }
  int64_t preemptions() const { return planner_.preemptions(); }
  const StepStats& last_step() const { return stats_; }
  // Draft rounds since the scheduler was made (SchedulerOptions::draft).
  const SpeculationStats& speculation_stats() const { return executor_.speculation_stats(); }

 private:
  ModelRunner& runner_;
  StepPlanner planner_;
  StepExecutor executor_;
  StepStats stats_;
};

}  // namespace g4
