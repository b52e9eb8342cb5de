#include "runtime/scheduler.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <utility>

#include "sampling/sampler.h"
#include "sampling/speculative.h"
#include "util/error.h"
#include "util/seconds.h"

namespace g4 {

namespace {

// Orders a planner's sequence lists by request id (arrival order): for std::upper_bound.
constexpr auto kBeforeById = [](RequestId id, const auto& other) { return id < other.id; };

// The tokens of a sequence's next prompt chunk: the rest of its prompt, at most `most`.
template <typename Sequence>
int64_t next_prompt_chunk(const Sequence& s, int64_t most) {
  return std::min(int64_t(s.prompt.size()) - s.position, most);
}

}  // namespace

int64_t PlannedForward::rows() const {
  int64_t n = 0;
  for (const PlannedChunk& c : chunks) n += c.rows();
  return n;
}

int64_t PlannedForward::draws() const {
  int64_t n = 0;
  for (const PlannedChunk& c : chunks) n += c.draw_rows();
  return n;
}

bool PlannedForward::decodes_only() const {
  return std::all_of(chunks.begin(), chunks.end(), [](const PlannedChunk& c) { return c.decode && c.drafts == 0; });
}

// ---- StepPlanner ----

StepPlanner::StepPlanner(KvPool& pool, const SchedulerLimits& limits) : pool_(pool), limits_(limits) {
  G4_ASSERT(limits.max_seq_len >= 1 && limits.prefill_tokens_per_step >= 1 && limits.forward_rows >= 1 &&
                limits.forward_draws >= 1,
            "scheduler limits must be positive");
}

RequestId StepPlanner::add(const SchedulerRequest& request) {
  G4_CHECK(!request.prompt.empty(), "no tokens to run (an empty prompt)");
  G4_CHECK(int64_t(request.prompt.size()) <= limits_.max_seq_len,
           "context full (" + std::to_string(limits_.max_seq_len) + " tokens): 0 used, " +
               std::to_string(request.prompt.size()) + " more requested");
  Generation generation(Sampler(request.sampling), GenerationLimits{request.max_new_tokens, request.stop_ids});
  const int64_t positions = std::min(limits_.max_seq_len, int64_t(request.prompt.size()) + request.max_new_tokens);
  const int64_t pages = pool_.pages_for_positions(limits_.max_seq_len, positions);
  G4_REQUIRE(kResourceExhausted, pages <= pool_.pages_total(),
             "out of KV memory: " + std::to_string(request.prompt.size()) + " prompt tokens and " +
                 std::to_string(request.max_new_tokens) + " new ones need " +
                 std::to_string(size_t(pages) * pool_.page_bytes()) + " bytes of KV pages, more than the whole pool of " +
                 std::to_string(pool_.budget_bytes()) + " bytes");
  G4_CHECK(request.top_logprobs >= -1 && request.top_logprobs <= kMaxTopLogprobs,
           "top_logprobs must be in [0, " + std::to_string(kMaxTopLogprobs) + "] (or -1: none), got " +
               std::to_string(request.top_logprobs));
  G4_REQUIRE(kBusy, waiting_.size() < limits_.max_waiting,
             "busy: " + std::to_string(waiting_.size()) + " requests are waiting (the queue's bound); try again later");
  if (request.grammar)
    for (int32_t stop : request.grammar->vocabulary().stop_tokens())
      G4_CHECK(std::find(request.stop_ids.begin(), request.stop_ids.end(), stop) != request.stop_ids.end(),
               "the grammar ends on token " + std::to_string(stop) + ", which is not among the request's stop tokens");
  waiting_.push_back(Sequence{next_id_, request.prompt, std::move(generation), KvSequence{}, 0, -1, false,
                              request.top_logprobs, PenaltyState(request.penalties, request.prompt),
                              request.grammar ? std::make_shared<grammar::GrammarMatcher>(request.grammar) : nullptr,
                              std::nullopt, {}});
  return next_id_++;
}

bool StepPlanner::cancel(RequestId id) {
  auto is_id = [id](const Sequence& s) { return s.id == id; };
  if (auto it = std::find_if(waiting_.begin(), waiting_.end(), is_id); it != waiting_.end()) {
    waiting_.erase(it);
    return true;
  }
  for (std::list<Sequence>* list : {&running_, &preempted_})
    if (auto it = std::find_if(list->begin(), list->end(), is_id); it != list->end()) {
      list->erase(it);  // its pages go back to the pool
      return true;
    }
  return false;
}

const StepPlanner::Sequence& StepPlanner::running(RequestId id) const {
  auto it = std::find_if(running_.begin(), running_.end(), [id](const Sequence& s) { return s.id == id; });
  G4_ASSERT(it != running_.end(), "request " + std::to_string(id) + " is not running");
  return *it;
}

StepPlanner::Sequence& StepPlanner::running(RequestId id) {
  return const_cast<Sequence&>(std::as_const(*this).running(id));
}

KvSequence& StepPlanner::kv(RequestId id) { return running(id).kv; }

void StepPlanner::release_unread_pages() {
  for (Sequence& s : running_) pool_.release_unread(s.kv);
}

void StepPlanner::preempt_youngest() {
  Sequence& s = running_.back();
  s.swapped = pool_.swap_out(std::move(s.kv));
  preempted_.splice(std::upper_bound(preempted_.begin(), preempted_.end(), s.id, kBeforeById), running_,
                    std::prev(running_.end()));
  ++preemptions_;
}

void StepPlanner::resume_front() {
  Sequence& s = preempted_.front();
  s.kv = pool_.swap_in(*s.swapped);
  s.swapped.reset();
  running_.splice(std::upper_bound(running_.begin(), running_.end(), s.id, kBeforeById), preempted_,
                  preempted_.begin());
}

void StepPlanner::start_front() {
  Sequence& s = waiting_.front();
  s.kv = pool_.start(limits_.max_seq_len, s.prompt);
  s.position = s.kv.position();  // a cached prefix is already there
  running_.push_back(std::move(s));
  waiting_.pop_front();
}

PlannedChunk StepPlanner::chunk(const Sequence& s, int64_t tokens) const {
  PlannedChunk c;
  c.id = s.id;
  c.position = s.position;
  c.decode = s.pending >= 0;
  if (c.decode) {
    c.tokens = {s.pending};
  } else {
    const auto first = s.prompt.begin() + s.position;
    c.tokens.assign(first, first + tokens);
  }
  if (c.decode || s.position + tokens == int64_t(s.prompt.size())) {
    c.draw = s.generation.next_params();
    c.top_logprobs = s.top_logprobs;
    c.adjustments = s.penalties.adjustments();
    if (s.matcher) c.mask = std::make_shared<const DrawMask>(s.matcher);
    c.drafting = limits_.draft_tokens > 0;
    c.drafts = c.decode ? next_drafts(s) : 0;
  }
  return c;
}

int64_t StepPlanner::next_drafts(const Sequence& s) const {
  if (s.pending < 0 || s.draft_hidden.empty()) return 0;
  // The round draws up to drafts + 1 tokens and feeds the pending token and the drafts.
  const int64_t new_tokens_left = s.generation.limits().max_new_tokens - s.generation.drawn() - 1;
  const int64_t context_left = limits_.max_seq_len - 1 - s.position;
  return std::max<int64_t>(0, std::min({limits_.draft_tokens, new_tokens_left, context_left}));
}

// A sequence's prompt chunk is min(what is left of its prompt, prefill_tokens_per_step) — never cut
// by other sequences, so its chunking depends only on its own prompt — and it runs this step if it
// fits in what is left of the step's budget.
std::vector<PlannedChunk> StepPlanner::running_chunks(int64_t& budget, bool& prefills_fit) const {
  std::vector<PlannedChunk> chunks;
  for (const Sequence& s : running_)
    if (s.pending >= 0) chunks.push_back(chunk(s, 1));
  prefills_fit = true;
  for (const Sequence& s : running_) {
    if (s.pending >= 0) continue;
    const int64_t n = next_prompt_chunk(s, limits_.prefill_tokens_per_step);
    if (n > budget) {
      prefills_fit = false;
      break;
    }
    chunks.push_back(chunk(s, n));
    budget -= n;
  }
  return chunks;
}

int64_t StepPlanner::pages_for(const std::vector<PlannedChunk>& chunks) const {
  int64_t pages = 0;
  for (const PlannedChunk& c : chunks)
    pages += pool_.pages_for_forward(running(c.id).kv, c.rows());
  return pages;
}

int64_t StepPlanner::pages_committed() const {
  int64_t pages = 0;
  for (const Sequence& s : running_)
    pages += pool_.pages_to_reach(s.kv, s.pending >= 0 ? s.position + 1 + next_drafts(s) : int64_t(s.prompt.size()) + 1);
  return pages;
}

int64_t StepPlanner::pages_to_start(const Sequence& s) const {
  if (!s.swapped) return pool_.pages_to_start(limits_.max_seq_len, s.prompt, int64_t(s.prompt.size()) + 1);
  // Its pages, and a page per layer for its next position at most.
  return s.swapped->pages() + pool_.pages_for_positions(limits_.max_seq_len, 1);
}

StepPlan StepPlanner::plan() {
  StepPlan plan;
  release_unread_pages();
  int64_t budget = limits_.prefill_tokens_per_step;
  bool prefills_fit = true;
  std::vector<PlannedChunk> chunks = running_chunks(budget, prefills_fit);
  while (running_.size() > 1 && pages_for(chunks) > pool_.pages_available()) {
    plan.preempted.push_back(running_.back().id);
    preempt_youngest();
    budget = limits_.prefill_tokens_per_step;
    chunks = running_chunks(budget, prefills_fit);
  }
  int64_t room = pool_.pages_available() - pages_committed();
  bool resumed = false;
  while (plan.preempted.empty() && !preempted_.empty() && pages_to_start(preempted_.front()) <= room) {
    room -= pages_to_start(preempted_.front());
    plan.resumed.push_back(preempted_.front().id);
    resume_front();
    resumed = true;
  }
  if (resumed) {  // their chunks join the running ones' in arrival order
    budget = limits_.prefill_tokens_per_step;
    chunks = running_chunks(budget, prefills_fit);
  }
  while (prefills_fit && preempted_.empty() && !waiting_.empty() && budget > 0) {
    const int64_t cost = pages_to_start(waiting_.front());
    if (cost > room) break;  // pages come back as running sequences end
    room -= cost;
    plan.admitted.push_back(waiting_.front().id);
    start_front();
    const Sequence& s = running_.back();
    const int64_t n = next_prompt_chunk(s, limits_.prefill_tokens_per_step);
    if (n > budget) break;
    chunks.push_back(chunk(s, n));
    budget -= n;
  }
  plan.forwards = pack(std::move(chunks));
  return plan;
}

// Packed in order into forwards of at most forward_rows rows and forward_draws draws; a chunk larger
// than forward_rows runs in a forward of its own.
std::vector<PlannedForward> StepPlanner::pack(std::vector<PlannedChunk> chunks) const {
  std::vector<PlannedForward> forwards;
  int64_t rows = 0, draws = 0;
  for (PlannedChunk& c : chunks) {
    const int64_t n = c.rows(), d = c.draw_rows();
    if (forwards.empty() || rows + n > limits_.forward_rows || draws + d > limits_.forward_draws) {
      forwards.emplace_back();
      rows = 0, draws = 0;
    }
    rows += n;
    draws += d;
    forwards.back().chunks.push_back(std::move(c));
  }
  return forwards;
}

void StepPlanner::follow(const StepPlan& plan) {
  release_unread_pages();
  for (RequestId id : plan.preempted) {
    G4_ASSERT(!running_.empty() && running_.back().id == id,
              "the plan preempts request " + std::to_string(id) + ", which is not the youngest running here");
    preempt_youngest();
  }
  for (RequestId id : plan.resumed) {
    G4_ASSERT(!preempted_.empty() && preempted_.front().id == id,
              "the plan resumes request " + std::to_string(id) + ", which is not the next preempted here");
    resume_front();
  }
  for (RequestId id : plan.admitted) {
    G4_ASSERT(!waiting_.empty() && waiting_.front().id == id,
              "the plan starts request " + std::to_string(id) + ", which is not the next waiting here");
    start_front();
  }
}

std::vector<SequenceEvent> StepPlanner::update(const StepPlan& plan, const StepResult& result) {
  G4_ASSERT(result.forwards.size() == plan.forwards.size(), "one result per planned forward");
  std::vector<SequenceEvent> events;
  for (size_t f = 0; f < plan.forwards.size(); ++f) {
    const ForwardDraws& out = result.forwards[f];
    size_t row = 0;  // among the forward's drawing chunks
    for (const PlannedChunk& c : plan.forwards[f].chunks) {
      Sequence& s = running(c.id);
      s.position += int64_t(c.tokens.size());
      if (!c.draw) continue;
      G4_ASSERT(row < out.draws.size(), "a draw for every drawing chunk");
      record(s, c, out.draws[row++], events);
    }
  }
  // Sequences that ended leave; their written pages stay cached, keyed by their tokens.
  running_.remove_if([](const Sequence& s) { return s.ended; });
  return events;
}

void StepPlanner::record(Sequence& s, const PlannedChunk& c, const ChunkDraw& d, std::vector<SequenceEvent>& events) {
  if (c.drafting) s.draft_hidden = d.hidden;
  // The accepted drafts, then the token; each goes where it is fed next. The caches keep what is fed
  // before the last token recorded: rejected drafts, and drafts after a token that ends the
  // generation, leave them.
  const size_t count = d.accepted_drafts.size() + 1;
  for (size_t m = 0; m < count && !s.ended; ++m) {
    const int32_t token = m + 1 < count ? d.accepted_drafts[m] : d.token;
    if (m > 0) ++s.position;
    if (token == kNanLogitsToken) {
      events.push_back(fail(s, kNanLogitsError));
      break;
    }
    if (s.matcher && !s.matcher->accept_token(token)) {  // the mask allowed it: the backend broke the mask
      events.push_back(fail(s, "internal error: token " + std::to_string(token) + " was drawn outside the grammar"));
      break;
    }
    const StopReason stop = s.generation.record(token, s.position, limits_.max_seq_len);
    s.penalties.record(token);
    s.ended = stop != StopReason::kNone;
    s.pending = s.ended ? -1 : token;
    SequenceEvent event{s.id, DecodedToken{token, stop}, std::nullopt, {}};
    if (c.top_logprobs >= 0) {
      const size_t vocab = d.logits.size() / count;
      event.logprobs = token_logprobs(std::span(d.logits).subspan(m * vocab, vocab), token, c.top_logprobs);
    }
    events.push_back(std::move(event));
  }
  if (s.kv.position() > s.position) s.kv.truncate(s.position);
}

SequenceEvent StepPlanner::fail(Sequence& s, const std::string& error) {
  s.ended = true;
  s.pending = -1;
  return SequenceEvent{s.id, DecodedToken{-1, StopReason::kFailed}, std::nullopt, error};
}

// ---- StepExecutor ----

namespace {

// A verify chunk's grammar masks: row i the grammar's after drafts [0, i) (row 0 `first`, the
// pending draw's). From a draft the grammar refuses, or one that ends it, the later rows keep the
// last mask: the verdict never reaches them (the target cannot draw the refused draft).
std::vector<std::shared_ptr<const DrawMask>> masks_along(const grammar::GrammarMatcher& matcher,
                                                         std::span<const int32_t> drafts,
                                                         std::shared_ptr<const DrawMask> first) {
  std::vector<std::shared_ptr<const DrawMask>> rows = {std::move(first)};
  grammar::GrammarMatcher walker = matcher;
  bool open = true;  // every draft so far taken, none ending the grammar
  for (int32_t draft : drafts) {
    open = open && walker.accept_token(draft) && !walker.is_terminated();
    rows.push_back(open ? std::make_shared<const DrawMask>(std::make_shared<grammar::GrammarMatcher>(walker))
                        : rows.back());
  }
  return rows;
}

const Drafts& drafts_of(const std::vector<std::pair<RequestId, Drafts>>& drafts, RequestId id) {
  const auto it = std::find_if(drafts.begin(), drafts.end(), [id](const auto& d) { return d.first == id; });
  G4_ASSERT(it != drafts.end(), "the drafts of request " + std::to_string(id));
  return it->second;
}

}  // namespace

StepExecutor::StepExecutor(ModelRunner& runner, bool cuda_graphs, const DraftOptions& draft, int64_t draft_rows)
    : runner_(runner),
      graphs_(cuda_graphs ? std::make_unique<DecodeBatchGraphs>(runner) : nullptr),
      // A forward draws at most max_batch_sequences rows, two or more for each verify chunk.
      drafter_(draft.assistant ? std::make_unique<Drafter>(*draft.assistant, runner, draft_rows,
                                                           std::max<int64_t>(1, runner.max_batch_sequences() / 2),
                                                           draft.draft_tokens)
                               : nullptr) {
  if (!drafter_) return;
  drafter_->replay_steps(cuda_graphs);
  Backend& be = runner.backend();
  const int64_t rows = runner.max_batch_sequences();  // a forward's verify rows
  verdict_params_ = be.alloc_sampling_rows(rows);
  verdicts_ = be.alloc(DType::I64, rows, 1);  // two a verify chunk of two or more rows
}

std::vector<std::optional<DraftVerdict>> StepExecutor::judge_sampled_chunks(
    const PlannedForward& forward, std::span<const SequenceChunk> chunks, const Tensor& logits,
    const std::vector<std::pair<RequestId, Drafts>>& drafts) {
  std::vector<std::optional<DraftVerdict>> out(forward.chunks.size());
  std::vector<size_t> judged;          // the chunks, in order
  std::vector<int64_t> first_rows;     // each one's first logits row
  std::vector<SamplingParams> params;  // their rows' draws, one after another
  int64_t row = 0;
  for (size_t i = 0; i < forward.chunks.size(); ++i) {
    const PlannedChunk& c = forward.chunks[i];
    if (!c.draw) continue;
    if (c.drafts > 0 && !is_greedy(*c.draw) && chunks[i].out_rows > 1) {
      judged.push_back(i);
      first_rows.push_back(row);
      for (int64_t r = 0; r < chunks[i].out_rows; ++r) {
        params.push_back(*c.draw);
        params.back().seed += uint64_t(r);
      }
    }
    row += chunks[i].out_rows;
  }
  if (judged.empty()) return out;
  Backend& be = runner_.backend();
  be.upload_sampling_rows(params, verdict_params_);
  int64_t param_row = 0;
  for (size_t j = 0; j < judged.size(); ++j) {
    const PlannedChunk& c = forward.chunks[judged[j]];
    const int64_t rows = chunks[judged[j]].out_rows;
    be.judge_drafts(logits.rows_view(first_rows[j], rows), drafts_of(drafts, c.id).rows, verdict_params_.slice(param_row, rows),
                    verdicts_.rows_view(2 * int64_t(j), 2));
    param_row += rows;
  }
  std::vector<int64_t> verdicts(2 * judged.size());
  runner_.download_result(verdicts_.rows_view(0, int64_t(verdicts.size())), verdicts.data());
  for (size_t j = 0; j < judged.size(); ++j) out[judged[j]] = verdict_from(verdicts[2 * j], verdicts[2 * j + 1]);
  return out;
}

StepResult StepExecutor::run(const StepPlan& plan, StepPlanner& sequences) {
  StepResult result;
  for (size_t f = 0; f < plan.forwards.size(); ++f)
    result.forwards.push_back(run_forward(int64_t(f), plan.forwards[f], sequences, draft(plan.forwards[f], sequences)));
  return result;
}

std::vector<std::pair<RequestId, Drafts>> StepExecutor::draft(const PlannedForward& forward, StepPlanner& sequences) {
  std::vector<RequestId> ids;
  std::vector<DraftRequest> requests;
  for (const PlannedChunk& c : forward.chunks) {
    if (c.drafts == 0) continue;
    G4_ASSERT(drafter_ && c.decode && c.draw, "a verify chunk needs an assistant and a pending token to draw after");
    // Its pages and tables as the verify will use them: a resumed sequence's tables, and those
    // that shed pages, are uploaded here, before the assistant reads through them.
    KvSequence& kv = sequences.kv(c.id);
    runner_.kv_pool().prepare(kv, c.rows());
    ids.push_back(c.id);
    requests.push_back(DraftRequest{&kv.caches(), c.tokens[0], c.position, sequences.draft_hidden(c.id), *c.draw,
                                    c.drafts});
  }
  std::vector<std::pair<RequestId, Drafts>> out;
  if (requests.empty()) return out;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Drafts> drafted = drafter_->draft(requests);
  speculation_.draft_seconds += seconds_since(t0);
  for (size_t i = 0; i < ids.size(); ++i) out.emplace_back(ids[i], std::move(drafted[i]));
  return out;
}

ForwardDraws StepExecutor::run_forward(int64_t index, const PlannedForward& forward, StepPlanner& sequences,
                                       const std::vector<std::pair<RequestId, Drafts>>& drafts) {
  std::vector<std::vector<int32_t>> fed(forward.chunks.size());  // each chunk's tokens, a verify chunk's drafts too
  std::vector<SequenceChunk> chunks;
  std::vector<SamplingParams> params;
  std::vector<std::vector<LogitAdjustment>> adjustments;  // per draw, when any draw has some
  std::vector<const DrawMask*> masks;                     // per draw, when any draw has one
  std::vector<std::shared_ptr<const DrawMask>> verify_masks;  // the verify chunks' rows' (masks_along)
  bool adjusts = false, masked = false, verifies = false, keeps_hidden = false;
  for (size_t i = 0; i < forward.chunks.size(); ++i) {
    const PlannedChunk& c = forward.chunks[i];
    KvSequence& kv = sequences.kv(c.id);
    G4_ASSERT(kv.position() == c.position, "request " + std::to_string(c.id) + "'s caches hold " +
                                               std::to_string(kv.position()) + " positions; its chunk starts at " +
                                               std::to_string(c.position));
    fed[i] = c.tokens;
    if (c.drafts > 0) {
      const std::vector<int32_t>& d = drafts_of(drafts, c.id).tokens;
      fed[i].insert(fed[i].end(), d.begin(), d.end());
      verifies = true;
    }
    const int64_t out_rows = c.draw ? 1 + int64_t(fed[i].size() - c.tokens.size()) : 0;
    chunks.push_back(SequenceChunk{&kv, fed[i], out_rows});
    // A verify chunk's row r draws after its drafts [0, r): its adjustments count them, its mask
    // follows them.
    const std::span<const int32_t> drafted = std::span(fed[i]).subspan(c.tokens.size());
    const std::vector<std::vector<LogitAdjustment>> along =
        c.drafts > 0 ? sequences.penalties(c.id).adjustments_along(drafted) : std::vector<std::vector<LogitAdjustment>>{};
    const std::vector<std::shared_ptr<const DrawMask>> row_masks =
        c.drafts > 0 && c.mask ? masks_along(*sequences.matcher(c.id), drafted, c.mask)
                               : std::vector<std::shared_ptr<const DrawMask>>{};
    for (int64_t r = 0; r < out_rows; ++r) {  // row r draws token index j + r: seed + r
      params.push_back(*c.draw);
      params.back().seed += uint64_t(r);
      adjustments.push_back(along.empty() ? c.adjustments : along[size_t(r)]);
      adjusts = adjusts || !adjustments.back().empty();
      masks.push_back(row_masks.empty() ? c.mask.get() : row_masks[size_t(r)].get());
    }
    verify_masks.insert(verify_masks.end(), row_masks.begin(), row_masks.end());
    masked = masked || c.mask;
    keeps_hidden = keeps_hidden || (c.draw && c.drafting);
  }
  ForwardDraws out;
  if (params.empty()) {
    runner_.forward(chunks, runner_.workspace_logits(1));
    return out;
  }
  // A forward that only decodes may replay a recording of itself; one that adjusts or masks logits
  // runs eagerly (its lists and masks change every step; a recording holds none).
  if (!adjusts) adjustments.clear();
  if (!masked) masks.clear();
  auto run = [&](const std::function<void()>& work) {
    if (!graphs_ || !forward.decodes_only() || adjusts || masked) return work();
    std::vector<const std::vector<KvCache>*> caches;
    for (const SequenceChunk& c : chunks) caches.push_back(&c.kv->caches());
    out.replayed = graphs_->run(index, caches, work);
  };
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int32_t> tokens = runner_.forward_and_sample(chunks, params, adjustments, masks, run);

  // The logits and hidden rows, read back only where needed: a log-probability row (logits),
  // drafting sequences' rows (hidden); sampled verify chunks are judged where their logits are.
  const LogitsOutput ws = runner_.workspace_logits(int64_t(params.size()));
  const std::vector<std::optional<DraftVerdict>> sampled_verdicts =
      verifies ? judge_sampled_chunks(forward, chunks, ws.logits, drafts)
               : std::vector<std::optional<DraftVerdict>>(forward.chunks.size());
  auto logits_rows = [&](int64_t first, int64_t n) {
    std::vector<float> rows(size_t(n * ws.logits.cols));
    runner_.download_result(ws.logits.rows_view(first, n), rows.data());
    return rows;
  };
  std::vector<uint8_t> hidden;
  if (keeps_hidden) {
    hidden.resize(ws.normed.bytes());
    runner_.download_result(ws.normed, hidden.data());
  }
  int64_t row = 0;  // the chunk's first output row
  for (size_t i = 0; i < forward.chunks.size(); ++i) {
    const PlannedChunk& c = forward.chunks[i];
    if (!c.draw) continue;
    const int64_t rows = chunks[i].out_rows;
    ChunkDraw d;
    int64_t at = row;  // the row that drew d.token
    if (c.drafts > 0) {
      const std::span<const int32_t> drafted(fed[i].data() + 1, size_t(rows - 1));
      // Greedy (or no draft): from the target's own draws of the rows.
      const DraftVerdict verdict = sampled_verdicts[i]
                                       ? *sampled_verdicts[i]
                                       : judge_greedy_draws(std::span(tokens).subspan(size_t(row), size_t(rows)), drafted);
      d.accepted_drafts.assign(drafted.begin(), drafted.begin() + verdict.accepted);
      d.token = int32_t(verdict.token);
      d.drafted = rows - 1;
      at = row + verdict.accepted;
      ++speculation_.rounds;
      speculation_.drafted += d.drafted;
      speculation_.accepted += verdict.accepted;
    } else {
      d.token = tokens[size_t(row)];
    }
    if (c.drafting) {
      const size_t bytes = ws.normed.row_size();
      d.hidden.assign(hidden.begin() + at * int64_t(bytes), hidden.begin() + (at + 1) * int64_t(bytes));
    }
    // As each token's draw saw them (after any logit bias and penalties): a verify chunk's rows up
    // to the verdict's, each the logits at its token's position.
    if (c.top_logprobs >= 0) d.logits = logits_rows(row, at - row + 1);
    out.draws.push_back(std::move(d));
    row += rows;
  }
  if (verifies) speculation_.verify_seconds += seconds_since(t0);
  return out;
}

// ---- Scheduler ----

namespace {

SchedulerLimits limits_of(const ModelRunner& runner, const SchedulerOptions& options) {
  const int64_t chunk = runner.max_prefill_chunk();
  const int64_t per_step = options.prefill_tokens_per_step > 0 ? options.prefill_tokens_per_step : chunk;
  if (options.draft.assistant) {
    const int64_t k = options.draft.draft_tokens;
    G4_CHECK(k >= 1 && k <= kMaxDraftTokens, "draft_tokens must be in [1, " + std::to_string(kMaxDraftTokens) +
                                                 "], got " + std::to_string(k));
    G4_CHECK(k + 1 <= std::min(runner.max_batch_sequences(), chunk) &&
                 (!options.batch_invariant || k + 1 <= runner.backend().batch_invariant_rows()),
             "a round of " + std::to_string(k) + " drafts verifies " + std::to_string(k + 1) +
                 " rows in one forward: more than the runner draws (" + std::to_string(runner.max_batch_sequences()) +
                 ") or runs (" + std::to_string(chunk) + ") at once");
  }
  G4_CHECK(per_step <= chunk, "prefill_tokens_per_step " + std::to_string(per_step) +
                                  " exceeds the forward workspace (" + std::to_string(chunk) +
                                  " rows, max_prefill_chunk)");
  return SchedulerLimits{
      .max_seq_len = runner.max_seq_len(),
      .prefill_tokens_per_step = per_step,
      .forward_rows = options.batch_invariant ? std::min(runner.backend().batch_invariant_rows(), chunk) : chunk,
      .forward_draws = runner.max_batch_sequences(),
      .max_waiting = options.max_waiting,
      .draft_tokens = options.draft.assistant ? options.draft.draft_tokens : 0,
  };
}

ModelRunner& with_batch_invariance(ModelRunner& runner, bool batch_invariant) {
  runner.backend().set_batch_invariant(batch_invariant);
  return runner;
}

}  // namespace

Scheduler::Scheduler(ModelRunner& runner, SchedulerOptions options)
    : runner_(with_batch_invariance(runner, options.batch_invariant)),
      planner_(runner.kv_pool(), limits_of(runner, options)),
      // The assistant's steps take at most a forward's rows (batch invariance) and draws (memory).
      executor_(runner, options.cuda_graphs, options.draft,
                std::min(limits_of(runner, options).forward_rows, runner.max_batch_sequences())) {}

RequestId Scheduler::add(const SchedulerRequest& request) {
  runner_.check_tokens(request.prompt, 0, runner_.max_seq_len());
  check_penalties(request.penalties, runner_.config().vocab_size);
  if (request.grammar)
    G4_CHECK(request.grammar->vocabulary().size() <= runner_.config().vocab_size,
             "the grammar's vocabulary has " + std::to_string(request.grammar->vocabulary().size()) +
                 " tokens, more than the model's " + std::to_string(runner_.config().vocab_size));
  return planner_.add(request);
}

std::vector<SequenceEvent> Scheduler::execute(const StepPlan& plan) {
  stats_ = {};
  const StepResult result = executor_.run(plan, planner_);
  for (size_t f = 0; f < plan.forwards.size(); ++f) {
    bool decodes = false, prefills = false;
    for (const PlannedChunk& c : plan.forwards[f].chunks) {
      (c.decode ? stats_.decode_rows : stats_.prefill_rows) += int64_t(c.tokens.size());
      (c.decode ? decodes : prefills) = true;
    }
    stats_.decode_forwards += decodes ? 1 : 0;
    stats_.prefill_forwards += prefills ? 1 : 0;
    stats_.replayed_forwards += result.forwards[f].replayed ? 1 : 0;
    ++stats_.forwards;
  }
  stats_.preempted = int64_t(plan.preempted.size());
  stats_.resumed = int64_t(plan.resumed.size());
  return planner_.update(plan, result);
}

std::vector<SequenceEvent> Scheduler::follow(const StepPlan& plan) {
  planner_.follow(plan);
  return execute(plan);
}

}  // namespace g4
