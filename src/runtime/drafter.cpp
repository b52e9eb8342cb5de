#include "runtime/drafter.h"

#include <algorithm>
#include <cmath>

#include "util/error.h"

namespace g4 {

void ForcedAcceptance::force(std::vector<int32_t>& drafts, int64_t j, int64_t round, int64_t vocab) const {
  const auto n = int64_t(std::floor(double(round + 1) * accepted_per_round) - std::floor(double(round) * accepted_per_round));
  for (int64_t i = 0; i < int64_t(drafts.size()) && i <= n && j + i < int64_t(continuation.size()); ++i) {
    const int32_t next = continuation[size_t(j + i)];
    drafts[size_t(i)] = i < n ? next : int32_t((next + 1) % vocab);
  }
}

Drafter::Drafter(const Gemma4Assistant& assistant, ModelRunner& runner, int64_t max_rows, int64_t max_drafts,
                 DraftLogits logits_at)
    : assistant_(assistant),
      runner_(runner),
      buf_(assistant.config(), runner.backend(), max_rows),
      max_drafts_(max_drafts),
      logits_at_(logits_at) {
  assistant_cache_layers(runner.config(), assistant.config());
  G4_ASSERT(max_drafts >= 1 && max_drafts <= kMaxDraftTokens, "a drafter's rounds hold 1 to kMaxDraftTokens drafts");
  Backend& be = runner.backend();
  ids_ = be.alloc(DType::I32, max_rows, 1);
  positions_ = be.alloc(DType::I32, max_rows, 1);
  h_ = be.alloc(be.activation_dtype(), max_rows, runner.config().hidden_size);
  logits_ = be.alloc(DType::F32, (logits_at == DraftLogits::kBackend ? max_drafts : 1) * max_rows,
                     runner.config().vocab_size);
  tokens_ = be.alloc(DType::I64, max_drafts * max_rows, 1);
  params_ = be.alloc_sampling_rows(max_drafts * max_rows);
}

std::vector<Drafts> Drafter::draft(std::span<const DraftRequest> requests) {
  G4_ASSERT(logits_at_ == DraftLogits::kHost || int64_t(requests.size()) <= buf_.max_rows,
            "a drafter that keeps its logits in backend memory drafts one group at a time");
  std::vector<Drafts> out(requests.size());
  for (size_t first = 0; first < requests.size(); first += size_t(buf_.max_rows)) {
    const size_t n = std::min(requests.size() - first, size_t(buf_.max_rows));
    draft_group(requests.subspan(first, n), std::span(out).subspan(first, n));
  }
  return out;
}

void Drafter::draft_group(std::span<const DraftRequest> requests, std::span<Drafts> out) {
  Backend& be = runner_.backend();
  const size_t count = requests.size(), row_bytes = h_.row_size();
  const int64_t n = int64_t(count), V = runner_.config().vocab_size;
  std::vector<int32_t> ids(count), positions(count);
  std::vector<uint8_t> hidden(count * row_bytes);
  std::vector<DraftRow> rows(count);
  int64_t steps = 0;
  for (int64_t r = 0; r < n; ++r) {
    const DraftRequest& q = requests[size_t(r)];
    G4_ASSERT(q.drafts >= 1 && q.caches && q.hidden.size() == row_bytes,
              "a draft request needs drafts, caches and the target's hidden row");
    ids[size_t(r)] = q.pending;
    positions[size_t(r)] = int32_t(q.position);
    std::copy(q.hidden.begin(), q.hidden.end(), hidden.begin() + r * int64_t(row_bytes));
    rows[size_t(r)] = DraftRow{q.caches};
    steps = std::max(steps, q.drafts);
  }
  G4_ASSERT(steps <= max_drafts_, "a draft request for more drafts than the drafter holds");
  const Tensor ids_n = ids_.rows_view(0, n), h = h_.rows_view(0, n);
  auto step_tokens = [&](int64_t i) { return tokens_.rows_view(i * n, n); };  // step i's draws
  auto step_logits = [&](int64_t i) { return logits_.rows_view(logits_at_ == DraftLogits::kBackend ? i * n : 0, n); };
  be.upload(positions.data(), positions_.rows_view(0, n));
  be.upload(hidden.data(), h);
  be.upload(ids.data(), ids_n);
  // Every step's draws at once: step i's rows at [i·n, (i + 1)·n), seed + i.
  std::vector<SamplingParams> params;
  for (int64_t i = 0; i < steps; ++i)
    for (const DraftRequest& q : requests) {
      params.push_back(q.params);
      params.back().seed += uint64_t(i);
    }
  be.upload_sampling_rows(params, params_);
  // No host work between steps: each step's draws become the next step's ids on the device, and
  // every step's tokens come back at the end. With DraftLogits::kHost a sampled row's logits come
  // back after each step (the acceptance rule weighs them).
  const bool sampled = std::any_of(requests.begin(), requests.end(), [](const DraftRequest& q) { return !is_greedy(q.params); });
  const bool logits_to_host = sampled && logits_at_ == DraftLogits::kHost;
  std::vector<std::vector<float>> host_logits(count);  // sampled rows: every step's logits
  for (int64_t i = 0; i < steps; ++i) {
    if (i > 0) be.tokens_to_ids(step_tokens(i - 1), ids_n);
    const Tensor logits = step_logits(i);
    assistant_.step(be, buf_, runner_.model(), rows, ids_n, positions_.rows_view(0, n), h, logits, h);
    be.sample(logits, params_.slice(i * n, n), step_tokens(i));
    for (int64_t r = 0; r < n && logits_to_host; ++r) {
      if (is_greedy(requests[size_t(r)].params)) continue;
      std::vector<float>& kept = host_logits[size_t(r)];
      kept.resize(size_t(i + 1) * size_t(V));
      runner_.download_result(logits.rows_view(r, 1), kept.data() + size_t(i) * size_t(V));
    }
  }
  std::vector<int64_t> drawn(size_t(steps) * count);
  runner_.download_result(tokens_.rows_view(0, steps * n), drawn.data());
  for (int64_t r = 0; r < n; ++r) {  // a row's drafts: its count, or up to a draw from NaN logits
    Drafts& d = out[size_t(r)];
    for (int64_t i = 0; i < requests[size_t(r)].drafts && drawn[size_t(i * n + r)] != kNanLogitsToken; ++i)
      d.tokens.push_back(int32_t(drawn[size_t(i * n + r)]));
    if (logits_at_ == DraftLogits::kBackend)
      d.rows = DraftRows{tokens_, logits_, r, n, int64_t(d.tokens.size())};
    if (!host_logits[size_t(r)].empty()) {
      d.logits = std::move(host_logits[size_t(r)]);
      d.logits.resize(d.tokens.size() * size_t(V));
    }
  }
}

}  // namespace g4
