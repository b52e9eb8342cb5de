#include "runtime/drafter.h"

#include <algorithm>
#include <cmath>

#include "runtime/decode_graph.h"
#include "util/error.h"

namespace g4 {

void ForcedAcceptance::force(std::vector<int32_t>& drafts, int64_t j, int64_t round, int64_t vocab) const {
  const auto n = int64_t(std::floor(double(round + 1) * accepted_per_round) - std::floor(double(round) * accepted_per_round));
  for (int64_t i = 0; i < int64_t(drafts.size()) && i <= n && j + i < int64_t(continuation.size()); ++i) {
    const int32_t next = continuation[size_t(j + i)];
    drafts[size_t(i)] = i < n ? next : int32_t((next + 1) % vocab);
  }
}

Drafter::Drafter(const Gemma4Assistant& assistant, ModelRunner& runner, int64_t max_rows, int64_t max_requests,
                 int64_t max_drafts)
    : assistant_(assistant),
      runner_(runner),
      buf_(assistant.config(), runner.backend(), max_rows),
      max_requests_(max_requests),
      max_drafts_(max_drafts) {
  assistant_cache_layers(runner.config(), assistant.config());
  G4_ASSERT(max_drafts >= 1 && max_drafts <= kMaxDraftTokens, "a drafter's rounds hold 1 to kMaxDraftTokens drafts");
  G4_ASSERT(max_rows >= 1 && max_requests >= 1, "a drafter drafts for at least one sequence");
  Backend& be = runner.backend();
  ids_ = be.alloc(DType::I32, max_rows, 1);
  positions_ = be.alloc(DType::I32, max_rows, 1);
  h_ = be.alloc(be.activation_dtype(), max_rows, runner.config().hidden_size);
  logits_ = be.alloc(DType::F32, max_drafts * max_requests, runner.config().vocab_size);
  tokens_ = be.alloc(DType::I64, max_drafts * max_requests, 1);
  params_ = be.alloc_sampling_rows(max_drafts * max_requests);
}

Drafter::~Drafter() = default;

void Drafter::replay_steps(bool on) {
  if (!on) graphs_.reset();
  else if (!graphs_) graphs_ = std::make_unique<DecodeBatchGraphs>(runner_);
}

std::vector<Drafts> Drafter::draft(std::span<const DraftRequest> requests) {
  const int64_t count = int64_t(requests.size()), R = max_requests_;
  G4_ASSERT(count <= R, "a drafter's call drafts for at most " + std::to_string(R) + " sequences");
  int64_t steps = 0;
  for (const DraftRequest& q : requests) steps = std::max(steps, q.drafts);
  G4_ASSERT(steps <= max_drafts_, "a draft request for more drafts than the drafter holds");
  // Every draw of the call at once: request r's step i at row i·R + r, seed + i.
  std::vector<SamplingParams> params(size_t(steps * R));
  for (int64_t i = 0; i < steps; ++i)
    for (int64_t r = 0; r < count; ++r) {
      params[size_t(i * R + r)] = requests[size_t(r)].params;
      params[size_t(i * R + r)].seed += uint64_t(i);
    }
  runner_.backend().upload_sampling_rows(params, params_);
  for (int64_t first = 0; first < count; first += buf_.max_rows)
    draft_group(requests.subspan(size_t(first), size_t(std::min(count - first, buf_.max_rows))), first, steps);
  // Every step's tokens come back at once; a request's drafts: its count, or up to a draw from NaN logits.
  std::vector<int64_t> drawn(size_t(steps * R));
  runner_.download_result(tokens_.rows_view(0, steps * R), drawn.data());
  std::vector<Drafts> out(requests.size());
  for (int64_t r = 0; r < count; ++r) {
    Drafts& d = out[size_t(r)];
    for (int64_t i = 0; i < requests[size_t(r)].drafts && drawn[size_t(i * R + r)] != kNanLogitsToken; ++i)
      d.tokens.push_back(int32_t(drawn[size_t(i * R + r)]));
    d.rows = DraftRows{tokens_, logits_, r, R, int64_t(d.tokens.size())};
  }
  return out;
}

// Requests [first, first + n) of the call, `steps` assistant steps; each step's draws become the next
// step's ids on the device, so no host work runs between steps.
void Drafter::draft_group(std::span<const DraftRequest> requests, int64_t first, int64_t steps) {
  Backend& be = runner_.backend();
  const size_t count = requests.size(), row_bytes = h_.row_size();
  const int64_t n = int64_t(count), R = max_requests_;
  std::vector<int32_t> ids(count), positions(count);
  std::vector<uint8_t> hidden(count * row_bytes);
  std::vector<DraftRow> rows(count);
  for (int64_t r = 0; r < n; ++r) {
    const DraftRequest& q = requests[size_t(r)];
    G4_ASSERT(q.drafts >= 1 && q.caches && q.hidden.size() == row_bytes,
              "a draft request needs drafts, caches and the target's hidden row");
    ids[size_t(r)] = q.pending;
    positions[size_t(r)] = int32_t(q.position);
    std::copy(q.hidden.begin(), q.hidden.end(), hidden.begin() + r * int64_t(row_bytes));
    rows[size_t(r)] = DraftRow{q.caches};
  }
  const Tensor ids_n = ids_.rows_view(0, n), h = h_.rows_view(0, n);
  be.upload(positions.data(), positions_.rows_view(0, n));
  be.upload(hidden.data(), h);
  be.upload(ids.data(), ids_n);
  auto run_steps = [&] {
    for (int64_t i = 0; i < steps; ++i) {
      const int64_t at = i * R + first;  // step i's rows of this group
      if (i > 0) be.tokens_to_ids(tokens_.rows_view(at - R, n), ids_n);
      const Tensor logits = logits_.rows_view(at, n);
      assistant_.step(be, buf_, runner_.model(), rows, ids_n, positions_.rows_view(0, n), h, logits, h);
      be.sample(logits, params_.slice(at, n), tokens_.rows_view(at, n));
    }
  };
  if (!graphs_) return run_steps();
  // The steps read their inputs from the buffers uploaded above and write rows fixed by (first,
  // steps): a recording of them replays for any group with that key over the same caches.
  std::vector<const std::vector<KvCache>*> caches;
  for (const DraftRequest& q : requests) caches.push_back(q.caches);
  if (graphs_->run(first * (kMaxDraftTokens + 1) + steps, caches, run_steps)) ++replayed_groups_;
}

}  // namespace g4
