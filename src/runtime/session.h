// One sequence on a model (docs/DESIGN.md §7): its KV caches from the runner's pool, chunked
// prefill, decoding one token at a time with the stop rules, cancelling, and the decode step —
// written once — that eager decoding runs and DecodeGraph records.
//
//   auto session = engine.create_session();
//   session->start(prompt);                          // prefills what no cached prefix holds
//   session->begin_generation(Sampler(params), {max_new_tokens, stop_ids});
//   for (DecodedToken t; !(t = session->next()).last();) use(t.token);
#pragma once
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "runtime/generation.h"
#include "sampling/logit_penalties.h"
#include "runtime/model_runner.h"
#include "runtime/speculation.h"
#include "sampling/sampler.h"

namespace g4 {

class DecodeGraph;

struct SessionOptions {
  int64_t max_seq_len = 0;        // 0 = the runner's
  int64_t max_prefill_chunk = 0;  // 0 = min(the runner's, ModelConfig::max_prefill_chunk(max_seq_len))
  KvTypes kv_types;  // the caches of a session alone on a model (a runner's sessions take the runner's)
};

// The backend tensors of one decode step: the token fed and its position (I32 [1, 1]), the
// parameters of the draw, and the token drawn (I64 [1, 1]).
struct DecodeStepTensors {
  Tensor id, position;
  SamplingRows params;  // one row
  Tensor token;
};

class Session {
 public:
  // A session alone on a model, with a private runner whose KV budget is this one sequence (tools
  // and tests that run one sequence on a bare model).
  Session(const Gemma4& model, Backend& backend, SessionOptions options = {});
  // A session of a runner (Engine::create_session). Its caches come from the runner's pool when it
  // first runs tokens (so that start() can begin with the cached prefix of its prompt): start() and
  // prefill() throw "out of KV memory" when live sessions have spent the budget. The runner must
  // outlive the session.
  explicit Session(ModelRunner& runner, SessionOptions options = {});
  ~Session();  // the caches go back to the pool, their written pages cached for prefix reuse
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  int64_t position() const { return kv_.position(); }
  const std::vector<int32_t>& tokens() const { return kv_.tokens(); }  // whose K/V the caches hold
  int64_t max_seq_len() const { return max_seq_len_; }
  int64_t max_prefill_chunk() const { return max_chunk_; }
  int64_t vocab_size() const { return runner_.config().vocab_size; }
  Backend& backend() const { return runner_.backend(); }
  ModelRunner& runner() const { return runner_; }
  const KvSequence& kv() const { return kv_; }
  // Empties the session (position 0; its pages go back to the pool, its reservation stays) and ends
  // any generation.
  void reset();

  // Makes the session hold exactly `prompt`, with its last token's logits: the longest usable
  // prefix of it that this session holds (KvPool::usable_prefix) or the pool's prefix cache has
  // (KvPool::cached_prefix) is kept, the rest prefilled. Returns the number of tokens prefilled. Ends any generation.
  int64_t start(std::span<const int32_t> prompt);
  // Feeds tokens at the next positions in chunks of at most max_prefill_chunk; afterwards
  // last_logits() holds the last token's logits. Checks every id and the context before running.
  void prefill(std::span<const int32_t> tokens);
  void decode(int32_t token) { prefill(std::span<const int32_t>(&token, 1)); }
  // Throws (naming the problem) unless tokens can run from position `start`: at least one, every
  // id in range and the context large enough.
  void check_input(std::span<const int32_t> tokens, int64_t start) const;
  void check_input(std::span<const int32_t> tokens) const { check_input(tokens, position()); }
  // As prefill, but returns the logits of every position ([tokens][vocab], float32).
  std::vector<float> logits_all(std::span<const int32_t> tokens, int64_t chunk = 0);

  const Tensor& last_logits() const { return logits_; }  // F32 [1, vocab] in backend memory
  std::vector<float> last_logits_host();
  // Draws token j of `sampler` (seed + j) from last_logits() on the backend (8 bytes come back).
  int64_t sample(const Sampler& sampler, int64_t j = 0);

  // ---- generation: one token per next() ----
  // Starts a generation from the last prefill's logits (call after start() or prefill()). With
  // `graph`, decode steps replay one recorded step (a backend with graphs, backend sampling).
  // With penalties (logit bias and penalties over this session's tokens and the output), every
  // draw adjusts the logits first, and decode steps run eagerly whatever `graph` says. With an
  // assistant (`draft`), tokens come in draft-and-verify rounds (runtime/speculation.h): the same
  // text for greedy and the same distribution for sampling, with penalties too (each verify row
  // adjusted as its draw would be); `graph` then replays the draft steps, the verify runs eagerly.
  void begin_generation(const Sampler& sampler, GenerationLimits limits, bool graph = false,
                        LogitPenalties penalties = {}, DraftOptions draft = {});
  // Draws the next token: the first from the prefill's logits, each later one after feeding the
  // token before it. The result says whether the generation ends with it; next() after that throws.
  DecodedToken next();
  // Makes the next next() return kCancelled without running anything. Safe from another thread
  // or a signal handler.
  void cancel() { cancelled_.store(true); }
  const std::optional<Generation>& generation() const { return generation_; }
  // The drafting rounds of this session's generations with an assistant (nullptr: none yet).
  const SpeculationStats* speculation_stats() const { return speculation_ ? &speculation_->stats() : nullptr; }

  // ---- the decode step (written once: eager decode runs it, DecodeGraph records it) ----
  const DecodeStepTensors& decode_step_tensors() const { return step_; }
  // Enqueues the forward of step.id at step.position over this session's caches, the logits into
  // last_logits() and the draw with step.params into step.token. Uploads, reads back and
  // allocates nothing.
  void enqueue_decode_step();
  // Makes the caches hold the page of the next position, which a decode step stores (eager or
  // replayed: a recording reads the page tables from backend memory).
  void prepare_decode_step();
  // Records that a decode step fed `token` (its K/V are now in the caches).
  void note_fed(int32_t token) { kv_.append(std::span<const int32_t>(&token, 1)); }

 private:
  // The forward of enqueue_decode_step, without the draw.
  void enqueue_decode_forward();
  // The generation's logit bias and penalties applied to last_logits() (nothing without any).
  void adjust_logits();
  Session(std::unique_ptr<ModelRunner> own_runner, ModelRunner* runner, SessionOptions options);
  // Feeds `token` and draws token j from its logits (eager, or a replay of the recorded step).
  int32_t feed_and_draw(int32_t token, int64_t j);
  // The next token of a generation with an assistant: from the current round, else a new round
  // (or one plain step when no draft fits the context or the tokens left).
  int32_t next_drafted(int64_t j);
  // The final-normed hidden state of the last forward's output row (what drew the pending token).
  Tensor last_hidden() const { return runner_.workspace_logits(1).normed; }
  void end_generation();
  void take_caches();  // from the pool, if the session holds none yet

  std::unique_ptr<ModelRunner> own_runner_;  // only for a session alone on a model
  ModelRunner& runner_;
  int64_t max_seq_len_ = 0, max_chunk_ = 0;
  KvSequence kv_;
  DecodeStepTensors step_;
  Tensor logits_;
  Tensor all_normed_, all_act_, all_logits_;  // [max_chunk, ...], allocated on first logits_all

  std::optional<Generation> generation_;
  PenaltyState penalties_;  // of the generation begun
  int32_t pending_ = -1;  // drawn, not yet fed
  std::unique_ptr<Speculation> speculation_;  // of the generation's assistant
  bool drafting_ = false;                     // this generation drafts
  std::deque<int32_t> round_;  // a round's tokens not yet returned (all fed but the last)
  int64_t returned_position_ = 0;  // the position the last returned token takes when fed
  bool finished_ = false;
  std::atomic<bool> cancelled_{false};
  bool use_graph_ = false;
  std::unique_ptr<DecodeGraph> graph_;  // made on the first graph step, kept across generations
};

}  // namespace g4
