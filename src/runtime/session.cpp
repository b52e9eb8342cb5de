#include "runtime/session.h"

#include <algorithm>

#include "runtime/decode_graph.h"
#include "util/error.h"

namespace g4 {

namespace {

int64_t session_chunk(const ModelRunner& runner, int64_t max_seq_len, int64_t requested) {
  const int64_t most = std::min(runner.max_prefill_chunk(), runner.config().max_prefill_chunk(max_seq_len));
  if (requested <= 0) return most;
  G4_CHECK(requested <= most, "prefill chunk " + std::to_string(requested) + " exceeds max_prefill_chunk " +
                                  std::to_string(most) + " (min(max_seq_len - 1, 2 * sliding_window))");
  return requested;
}

}  // namespace

Session::Session(const Gemma4& model, Backend& backend, SessionOptions options)
    : Session(std::make_unique<ModelRunner>(model, backend,
                                            RunnerOptions{.max_seq_len = options.max_seq_len,
                                                          .max_prefill_chunk = options.max_prefill_chunk,
                                                          .kv_types = options.kv_types}),
              nullptr, options) {}

Session::Session(ModelRunner& runner, SessionOptions options) : Session(nullptr, &runner, options) {}

Session::Session(std::unique_ptr<ModelRunner> own_runner, ModelRunner* runner, SessionOptions options)
    : own_runner_(std::move(own_runner)),
      runner_(own_runner_ ? *own_runner_ : *runner),
      max_seq_len_(options.max_seq_len > 0 ? options.max_seq_len : runner_.max_seq_len()) {
  check_max_seq_len(runner_.config(), max_seq_len_);
  max_chunk_ = session_chunk(runner_, max_seq_len_, options.max_prefill_chunk);
  Backend& be = runner_.backend();
  step_.id = be.alloc(DType::I32, 1, 1);
  step_.position = be.alloc(DType::I32, 1, 1);
  step_.params = be.alloc_sampling_rows(1);
  step_.token = be.alloc(DType::I64, 1, 1);
  logits_ = be.alloc(DType::F32, 1, runner_.config().vocab_size);
}

Session::~Session() = default;

void Session::end_generation() {
  generation_.reset();
  penalties_ = {};
  pending_ = -1;
  drafting_ = false;
  round_.clear();
  finished_ = false;
  cancelled_.store(false);
}

void Session::reset() {
  end_generation();
  kv_.truncate(0);
}

void Session::check_input(std::span<const int32_t> tokens, int64_t start) const {
  runner_.check_tokens(tokens, start, max_seq_len_);
}

int64_t Session::start(std::span<const int32_t> prompt) {
  check_input(prompt, 0);
  end_generation();
  KvPool& pool = runner_.kv_pool();
  const int64_t own = pool.usable_prefix(kv_, prompt);
  if (kv_.empty() || pool.cached_prefix(max_seq_len_, prompt) > own) {
    // Ours go back first (their written pages cached): the same reservation comes back out.
    kv_.give_back();
    kv_ = pool.acquire(max_seq_len_, prompt);
  } else {
    kv_.truncate(own);
  }
  const std::span<const int32_t> rest = prompt.subspan(size_t(kv_.position()));
  prefill(rest);
  return int64_t(rest.size());
}

void Session::take_caches() {
  if (kv_.empty()) kv_ = runner_.kv_pool().acquire(max_seq_len_);
}

void Session::prefill(std::span<const int32_t> tokens) {
  check_input(tokens);
  take_caches();
  const LogitsOutput ws = runner_.workspace_logits(1);
  const LogitsOutput last{ws.normed, ws.act, logits_};
  // Only the last chunk's last position has logits worth computing.
  for (size_t at = 0; at < tokens.size(); at += size_t(max_chunk_)) {
    const size_t n = std::min(tokens.size() - at, size_t(max_chunk_));
    const SequenceChunk chunk{&kv_, tokens.subspan(at, n), at + n == tokens.size() ? 1 : 0};
    runner_.forward(std::span(&chunk, 1), last);
  }
}

std::vector<float> Session::logits_all(std::span<const int32_t> tokens, int64_t chunk) {
  check_input(tokens);
  chunk = chunk > 0 ? chunk : max_chunk_;
  G4_CHECK(chunk <= max_chunk_, "prefill chunk " + std::to_string(chunk) + " exceeds max_prefill_chunk " +
                                    std::to_string(max_chunk_));
  take_caches();
  const ModelConfig& c = runner_.config();
  Backend& be = runner_.backend();
  if (all_logits_.empty()) {
    all_normed_ = be.alloc(be.activation_dtype(), max_chunk_, c.hidden_size);
    all_act_ = be.alloc(be.activation_dtype(), max_chunk_, c.vocab_size);
    all_logits_ = be.alloc(DType::F32, max_chunk_, c.vocab_size);
  }
  std::vector<float> out(tokens.size() * size_t(c.vocab_size));
  for (size_t at = 0; at < tokens.size(); at += size_t(chunk)) {
    const int64_t n = int64_t(std::min(tokens.size() - at, size_t(chunk)));
    const SequenceChunk part{&kv_, tokens.subspan(at, size_t(n)), n};
    const LogitsOutput rows{all_normed_.rows_view(0, n), all_act_.rows_view(0, n), all_logits_.rows_view(0, n)};
    runner_.forward(std::span(&part, 1), rows);
    runner_.download_result(rows.logits, out.data() + at * size_t(c.vocab_size));
  }
  // Keep last_logits() meaningful after an all-positions run too.
  be.upload(out.data() + (tokens.size() - 1) * size_t(c.vocab_size), logits_);
  return out;
}

std::vector<float> Session::last_logits_host() {
  std::vector<float> out(static_cast<size_t>(vocab_size()));
  runner_.download_result(logits_, out.data());
  return out;
}

int64_t Session::sample(const Sampler& sampler, int64_t j) {
  G4_CHECK(position() > 0, "nothing to sample from: run a prompt first");
  Backend& be = runner_.backend();
  const SamplingParams params = sampler.for_token(j);
  be.upload_sampling_rows({&params, 1}, step_.params);
  adjust_logits();
  be.sample(logits_, step_.params, step_.token);
  int64_t token = 0;
  runner_.download_result(step_.token, &token);
  return checked_token(token);
}

void Session::prepare_decode_step() { runner_.kv_pool().prepare(kv_, 1); }

void Session::enqueue_decode_forward() {
  const SequenceRows one{&kv_.caches(), 0, 1, 1};
  const LogitsOutput ws = runner_.workspace_logits(1);
  runner_.enqueue(std::span(&one, 1), step_.id, step_.position, LogitsOutput{ws.normed, ws.act, logits_});
}

void Session::enqueue_decode_step() {
  enqueue_decode_forward();
  runner_.backend().sample(logits_, step_.params, step_.token);
}

void Session::begin_generation(const Sampler& sampler, GenerationLimits limits, bool graph, LogitPenalties penalties,
                               DraftOptions draft) {
  G4_CHECK(position() > 0, "begin_generation: prefill a prompt first");
  check_penalties(penalties, vocab_size());
  end_generation();
  if (draft.assistant && (!speculation_ || &speculation_->assistant() != draft.assistant ||
                          speculation_->draft_tokens() != draft.draft_tokens))
    speculation_ = std::make_unique<Speculation>(*draft.assistant, runner_, draft.draft_tokens, max_chunk_);
  drafting_ = draft.assistant != nullptr;
  if (drafting_) {
    speculation_->take_hidden(last_hidden());  // the prefill's: it draws the first token
    speculation_->force(draft.forced);
    speculation_->replay_draft_steps(graph);
  }
  generation_.emplace(sampler, std::move(limits));
  penalties_ = PenaltyState(std::move(penalties), kv_.tokens());
  use_graph_ = graph && penalties_.empty() && !drafting_;
  returned_position_ = position();
}

void Session::adjust_logits() {
  if (!generation_ || penalties_.empty()) return;
  const std::vector<LogitAdjustment> row = penalties_.adjustments();
  const AdjustmentRows staged = runner_.stage_adjustments(std::span(&row, 1));
  if (staged.rows > 0) runner_.backend().adjust_logits(logits_, staged);
}

int32_t Session::feed_and_draw(int32_t token, int64_t j) {
  check_input(std::span<const int32_t>(&token, 1));
  if (use_graph_) {
    if (!graph_) graph_ = std::make_unique<DecodeGraph>(*this);
    // A replay continues on the device from the previous one: start only a new generation.
    if (j == 1) graph_->start(token, generation_->sampler(), j);
    return int32_t(graph_->next());
  }
  Backend& be = runner_.backend();
  const int32_t position = int32_t(this->position());
  const SamplingParams params = generation_->sampler().for_token(j);
  be.upload(&token, step_.id);
  be.upload(&position, step_.position);
  be.upload_sampling_rows({&params, 1}, step_.params);
  prepare_decode_step();
  enqueue_decode_forward();
  adjust_logits();
  be.sample(logits_, step_.params, step_.token);
  int64_t drawn = 0;
  runner_.download_result(step_.token, &drawn);
  const int32_t next = int32_t(checked_token(drawn));
  note_fed(token);
  return next;
}

int32_t Session::next_drafted(int64_t j) {
  if (round_.empty()) {
    // Drafts that fit: the verify writes positions P..P + k, and the round gives up to k + 1 tokens.
    const int64_t k = std::min({speculation_->draft_tokens(), generation_->limits().max_new_tokens - j - 1,
                                max_seq_len_ - 1 - position()});
    if (k < 1) {
      const int32_t token = feed_and_draw(pending_, j);
      speculation_->take_hidden(last_hidden());
      return token;
    }
    check_input(std::span<const int32_t>(&pending_, 1));
    const std::vector<int32_t> tokens = speculation_->round(kv_, pending_, generation_->sampler(), j, k, penalties_);
    round_.assign(tokens.begin(), tokens.end());
  }
  const int32_t token = round_.front();
  round_.pop_front();
  return token;
}

DecodedToken Session::next() {
  G4_CHECK(generation_, "next(): no generation begun (begin_generation after a prefill)");
  G4_CHECK(!finished_, "next(): the generation has ended; begin another");
  // A round fed tokens past the last one returned: the caches keep only what was returned before it.
  auto keep_returned = [&] {
    round_.clear();
    if (position() > returned_position_) kv_.truncate(returned_position_);
  };
  if (cancelled_.load()) {
    finished_ = true;
    keep_returned();
    return {-1, StopReason::kCancelled};
  }
  const int64_t j = generation_->drawn();
  const int32_t token = pending_ < 0 && round_.empty() ? int32_t(sample(generation_->sampler(), j))
                        : drafting_                    ? next_drafted(j)
                                                       : feed_and_draw(pending_, j);
  // Where the token goes when fed: after the round's tokens still to come, which are fed already.
  returned_position_ = position() - int64_t(round_.size());
  const StopReason stop = generation_->record(token, returned_position_, max_seq_len_);
  penalties_.record(token);
  finished_ = stop != StopReason::kNone;
  if (finished_) keep_returned();
  pending_ = finished_ || !round_.empty() ? -1 : token;
  return {token, stop};
}

}  // namespace g4
