#include "runtime/model_runner.h"

#include <algorithm>
#include <numeric>

#include "util/error.h"

namespace g4 {

namespace {

bool has_sliding_layers(const ModelConfig& c) {
  return std::any_of(c.layers.begin(), c.layers.end(), [](const auto& l) { return l.sliding; });
}

int64_t chosen_max_seq_len(const ModelConfig& c, int64_t requested) {
  const int64_t n = requested > 0 ? requested : c.default_max_seq_len();
  check_max_seq_len(c, n);  // before anything is sized by it
  return n;
}

int64_t chosen_chunk(const ModelConfig& c, int64_t max_seq_len, int64_t requested) {
  const int64_t spec = c.max_prefill_chunk(max_seq_len);
  if (requested <= 0) return spec;
  G4_CHECK(requested <= spec, "prefill chunk " + std::to_string(requested) + " exceeds max_prefill_chunk " +
                                  std::to_string(spec) + " (min(max_seq_len - 1, 2 * sliding_window))");
  return requested;
}

int64_t checked_batch_sequences(int64_t n) {
  G4_CHECK(n >= 1, "max_batch_sequences must be >= 1, got " + std::to_string(n));
  return n;
}

// What a KV pool may take of the backend's free memory: all but a margin for what is allocated
// later (graph recordings, library workspaces, token masks): 1 GiB or 1/32 of it, the larger.
size_t kv_memory_available(const Backend& backend) {
  const size_t free_bytes = backend.free_memory_bytes();
  if (free_bytes == SIZE_MAX) return SIZE_MAX;  // a host that does not say: the budget stands as given
  const size_t margin = std::max<size_t>(size_t(1) << 30, free_bytes / 32);
  return free_bytes > margin ? free_bytes - margin : 0;
}

}  // namespace

// The sliding layers' ring must hold a whole window (the attention reads the window back from
// it), so a context shorter than the window cannot be served.
int64_t min_max_seq_len(const ModelConfig& c) {
  return has_sliding_layers(c) ? std::max<int64_t>(2, c.sliding_window) : 2;
}

void check_max_seq_len(const ModelConfig& c, int64_t max_seq_len) {
  G4_CHECK(max_seq_len >= min_max_seq_len(c),
           "max_seq_len " + std::to_string(max_seq_len) + " is below what the model needs: at least " +
               std::to_string(min_max_seq_len(c)) +
               (has_sliding_layers(c) && c.sliding_window >= 2 ? " (the sliding window)" : ""));
  G4_CHECK(max_seq_len <= c.max_position_embeddings,
           "max_seq_len " + std::to_string(max_seq_len) + " exceeds the model's context length " +
               std::to_string(c.max_position_embeddings) + " (max_position_embeddings)");
}

ModelRunner::ModelRunner(const Gemma4& model, Backend& backend, RunnerOptions o)
    : model_(model),
      backend_(backend),
      max_seq_len_(chosen_max_seq_len(model.config(), o.max_seq_len)),
      // Caches and activations hold this rank's heads and MLP columns (all of them on one device).
      pool_(model.rank_config(), backend,
            o.kv_budget_bytes > 0
                ? o.kv_budget_bytes
                : size_t(std::max<int64_t>(1, o.kv_budget_sequences)) *
                      kv_sequence_bytes(model.rank_config(),
                                        layer_kv_dtypes(model.rank_config(), o.kv_types, backend.activation_dtype()),
                                        max_seq_len_),
            o.kv_types),
      buffers_(model.rank_config(), backend, chosen_chunk(model.config(), max_seq_len_, o.max_prefill_chunk),
               checked_batch_sequences(o.max_batch_sequences)) {
  const ModelConfig& c = config();
  const int64_t rows = buffers_.max_tokens, outputs = buffers_.max_outputs;
  ids_ = backend.alloc(DType::I32, rows, 1);
  positions_ = backend.alloc(DType::I32, rows, 1);
  logits_ = backend.alloc(DType::F32, outputs, c.vocab_size);
  params_ = backend.alloc_sampling_rows(outputs);
  adjustments_.offsets = backend.alloc(DType::I32, outputs + 1, 1);
  tokens_ = backend.alloc(DType::I64, outputs, 1);
  const ModelConfig& rc = model.rank_config();
  backend.reserve_forward(ForwardReservation{.rows = rows,
                                             .decode_sequences = outputs,
                                             .heads = int(rc.num_heads),
                                             .head_dim = rc.max_head_dim(),
                                             .intermediate = rc.intermediate_size});
  // The caches come last, from what the weights and the workspaces leave: a budget the device
  // cannot hold makes requests wait for memory instead of failing in the middle of a step.
  pool_.allocate_pages(kv_memory_available(backend), max_seq_len_);
}

void ModelRunner::check_tokens(std::span<const int32_t> tokens, int64_t start, int64_t max_seq_len) const {
  G4_CHECK(!tokens.empty(), "no tokens to run (an empty prompt)");
  const int64_t vocab = config().vocab_size;
  for (size_t i = 0; i < tokens.size(); ++i)
    G4_CHECK(tokens[i] >= 0 && tokens[i] < vocab, "token id " + std::to_string(tokens[i]) + " at index " +
                                                      std::to_string(i) + " is out of range [0, " +
                                                      std::to_string(vocab) + ")");
  G4_CHECK(start + int64_t(tokens.size()) <= max_seq_len,
           "context full (" + std::to_string(max_seq_len) + " tokens): " + std::to_string(start) + " used, " +
               std::to_string(tokens.size()) + " more requested");
}

ModelRunner::StagedInputs ModelRunner::stage_inputs(std::span<const SequenceChunk> chunks) {
  std::vector<int32_t> ids, positions;
  StagedInputs staged;
  for (const SequenceChunk& c : chunks) {
    pool_.prepare(*c.kv, int64_t(c.tokens.size()));
    staged.rows.push_back(SequenceRows{&c.kv->caches(), int64_t(ids.size()), int64_t(c.tokens.size()), c.out_rows,
                                       c.kv->position() + int64_t(c.tokens.size()) - 1});
    ids.insert(ids.end(), c.tokens.begin(), c.tokens.end());
    positions.resize(ids.size());
    std::iota(positions.end() - int64_t(c.tokens.size()), positions.end(), int32_t(c.kv->position()));
  }
  const int64_t T = int64_t(ids.size());
  G4_CHECK(T >= 1 && T <= max_prefill_chunk(), "a forward of " + std::to_string(T) + " tokens; the workspace holds " +
                                                   std::to_string(max_prefill_chunk()));
  staged.ids = ids_.rows_view(0, T);
  staged.positions = positions_.rows_view(0, T);
  backend_.upload(ids.data(), staged.ids);
  backend_.upload(positions.data(), staged.positions);
  return staged;
}

void ModelRunner::forward(std::span<const SequenceChunk> chunks, const LogitsOutput& out) {
  const StagedInputs in = stage_inputs(chunks);
  enqueue(in.rows, in.ids, in.positions, out);
  for (const SequenceChunk& c : chunks) c.kv->append(c.tokens);
}

std::vector<int32_t> ModelRunner::forward_and_sample(std::span<const SequenceChunk> chunks,
                                                     std::span<const SamplingParams> params,
                                                     std::span<const std::vector<LogitAdjustment>> adjustments,
                                                     std::span<const DrawMask* const> masks,
                                                     const std::function<void(const std::function<void()>& work)>& run) {
  const int64_t n = int64_t(params.size());
  int64_t out_rows = 0;
  for (const SequenceChunk& c : chunks) out_rows += c.out_rows;
  G4_CHECK(n >= 1 && n <= max_batch_sequences() && out_rows == n,
           "forward_and_sample: one SamplingParams per output row (" + std::to_string(out_rows) + " rows, " +
               std::to_string(n) + " given), at most " + std::to_string(max_batch_sequences()));
  G4_CHECK(adjustments.empty() || int64_t(adjustments.size()) == n, "forward_and_sample: adjustments for every row or none");
  G4_CHECK(masks.empty() || int64_t(masks.size()) == n, "forward_and_sample: masks for every row or none");
  const StagedInputs in = stage_inputs(chunks);
  backend_.upload_sampling_rows(params, params_);
  const AdjustmentRows adjust = stage_adjustments(adjustments);
  const LogitsOutput out = workspace_logits(n);
  run([&] {
    enqueue(in.rows, in.ids, in.positions, out);
    if (adjust.rows > 0) backend_.adjust_logits(out.logits, adjust);
    // After the forward is enqueued: the host computes the masks while an asynchronous backend runs it.
    if (const TokenMaskRows mask = stage_masks(masks); mask.rows > 0) backend_.mask_logits(out.logits, mask);
    backend_.sample(out.logits, params_.first(n), tokens_.rows_view(0, n));
  });
  std::vector<int64_t> drawn(size_t(n), 0);
  download_result(tokens_.rows_view(0, n), drawn.data());
  for (const SequenceChunk& c : chunks) c.kv->append(c.tokens);
  return std::vector<int32_t>(drawn.begin(), drawn.end());
}

AdjustmentRows ModelRunner::stage_adjustments(std::span<const std::vector<LogitAdjustment>> rows) {
  std::vector<int32_t> offsets{0};
  std::vector<LogitAdjustment> entries;
  for (const std::vector<LogitAdjustment>& row : rows) {
    entries.insert(entries.end(), row.begin(), row.end());
    offsets.push_back(int32_t(entries.size()));
  }
  if (entries.empty()) return {};
  constexpr int64_t kWords = int64_t(sizeof(LogitAdjustment) / 4);
  if (adjustments_.entries.rows < int64_t(entries.size()))
    adjustments_.entries = backend_.alloc(DType::I32, int64_t(entries.size()), kWords);
  if (adjustments_.offsets.rows < int64_t(offsets.size()))  // a verify chunk's rows (runtime/speculation.h)
    adjustments_.offsets = backend_.alloc(DType::I32, int64_t(offsets.size()), 1);
  const AdjustmentRows staged{adjustments_.entries.rows_view(0, int64_t(entries.size())),
                              adjustments_.offsets.rows_view(0, int64_t(offsets.size())), int64_t(rows.size())};
  backend_.upload(entries.data(), staged.entries);
  backend_.upload(offsets.data(), staged.offsets);
  return staged;
}

TokenMaskRows ModelRunner::stage_masks(std::span<const DrawMask* const> rows) {
  std::vector<int32_t> row_mask(rows.size(), -1);
  int64_t masks = 0, words = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    if (!rows[r]) continue;
    row_mask[r] = int32_t(masks++);
    words = std::max(words, rows[r]->word_count());
  }
  if (masks == 0) return {};
  G4_CHECK(words <= (config().vocab_size + 31) / 32, "a token mask of " + std::to_string(words) +
                                                         " words is wider than the vocabulary");
  if (masks_.words.rows < max_batch_sequences() || masks_.words.cols != words) {
    masks_.words = backend_.alloc(DType::I32, max_batch_sequences(), words);
    masks_.row_mask = backend_.alloc(DType::I32, max_batch_sequences(), 1);
  }
  mask_words_.resize(size_t(masks * words));
  for (size_t r = 0; r < rows.size(); ++r)
    if (rows[r]) {
      const std::vector<uint32_t>& w = rows[r]->words();
      std::copy(w.begin(), w.end(), mask_words_.begin() + row_mask[r] * words);
    }
  const TokenMaskRows staged{masks_.words.rows_view(0, masks), masks_.row_mask.rows_view(0, int64_t(rows.size())),
                             int64_t(rows.size())};
  backend_.upload(mask_words_.data(), staged.words);
  backend_.upload(row_mask.data(), staged.row_mask);
  return staged;
}

void ModelRunner::download_result(const Tensor& t, void* out) const {
  backend_.download(t, out);
  if (Communicator* comm = model_.communicator()) comm->throw_if_failed();
}

void ModelRunner::enqueue(std::span<const SequenceRows> sequences, const Tensor& ids, const Tensor& positions,
                          const LogitsOutput& out) {
  model_.forward_batch(backend_, buffers_, sequences, ids, positions);
  // The output rows, as runs of adjacent rows (a decode batch is one run): one LM head per run.
  int64_t written = 0, run_first = 0, run_rows = 0;
  auto flush = [&] {
    if (run_rows == 0) return;
    const Tensor hidden = buffers_.x.rows_view(run_first, run_rows);
    model_.logits(backend_, hidden, out.normed.rows_view(written, run_rows), out.act.rows_view(written, run_rows),
                  out.logits.rows_view(written, run_rows));
    written += run_rows;
    run_rows = 0;
  };
  for (const SequenceRows& s : sequences) {
    if (s.out_rows == 0) continue;
    const int64_t first = s.first_row + s.rows - s.out_rows;
    if (run_rows > 0 && run_first + run_rows != first) flush();
    if (run_rows == 0) run_first = first;
    run_rows += s.out_rows;
  }
  flush();
  G4_CHECK(written <= out.logits.rows, "forward: " + std::to_string(written) + " output rows, room for " +
                                           std::to_string(out.logits.rows));
}

LogitsOutput ModelRunner::workspace_logits(int64_t rows) const {
  G4_CHECK(rows >= 1 && rows <= max_batch_sequences(), "a forward with " + std::to_string(rows) +
                                                           " output rows; the workspace holds " +
                                                           std::to_string(max_batch_sequences()));
  return {buffers_.out_normed.rows_view(0, rows), buffers_.logits_act.rows_view(0, rows), logits_.rows_view(0, rows)};
}

}  // namespace g4
