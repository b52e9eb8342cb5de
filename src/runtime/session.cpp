#include "runtime/session.h"

#include <algorithm>
#include <numeric>

#include "util/error.h"

namespace g4 {

static int64_t default_chunk(const ModelConfig& c, int64_t max_seq_len, int64_t requested) {
  const int64_t spec = c.max_prefill_chunk(max_seq_len);
  if (requested <= 0) return spec;
  G4_CHECK(requested <= spec, "prefill chunk " + std::to_string(requested) + " exceeds max_prefill_chunk " +
                                  std::to_string(spec) + " (min(max_seq_len - 1, 2 * sliding_window))");
  return requested;
}

namespace {

bool has_sliding_layers(const ModelConfig& c) {
  return std::any_of(c.layers.begin(), c.layers.end(), [](const auto& l) { return l.sliding; });
}

std::string min_max_seq_len_reason(const ModelConfig& c) {
  return has_sliding_layers(c) && c.sliding_window >= 2 ? " (the sliding window)" : "";
}

}  // namespace

// The sliding layers' ring must hold a whole window (the attention reads the window back from
// it), so a context shorter than the window cannot be served.
int64_t min_max_seq_len(const ModelConfig& c) {
  return has_sliding_layers(c) ? std::max<int64_t>(2, c.sliding_window) : 2;
}

Session::Session(const Gemma4& model, Backend& backend, SessionOptions options)
    : model_(model),
      backend_(backend),
      max_seq_len_(options.max_seq_len > 0 ? options.max_seq_len : model.config().default_max_seq_len()),
      max_chunk_(default_chunk(model.config(), max_seq_len_, options.max_prefill_chunk)),
      buffers_(model.config(), backend, max_chunk_) {
  const ModelConfig& c = model.config();
  G4_CHECK(max_seq_len_ >= min_max_seq_len(c), "max_seq_len " + std::to_string(max_seq_len_) +
                                                   " is below what the model needs: at least " +
                                                   std::to_string(min_max_seq_len(c)) + min_max_seq_len_reason(c));
  G4_CHECK(max_seq_len_ <= c.max_position_embeddings,
           "max_seq_len " + std::to_string(max_seq_len_) + " exceeds the model's context length " +
               std::to_string(c.max_position_embeddings) + " (max_position_embeddings)");
  const DType a = backend.activation_dtype();
  for (const auto& l : c.layers) {
    KvCache cache;
    cache.capacity = l.sliding ? std::min<int64_t>(2 * int64_t(c.sliding_window), max_seq_len_) : max_seq_len_;
    cache.k = backend.alloc(a, cache.capacity, int64_t(l.kv_heads) * l.head_dim);
    cache.v = backend.alloc(a, cache.capacity, int64_t(l.kv_heads) * l.head_dim);
    caches_.push_back(std::move(cache));
  }
  ids_ = backend.alloc(DType::I32, max_chunk_, 1);
  positions_ = backend.alloc(DType::I32, max_chunk_, 1);
  logits_ = backend.alloc(DType::F32, 1, c.vocab_size);
  params_ = backend.alloc(DType::I32, 1, sizeof(SamplingParams) / 4);
  token_ = backend.alloc(DType::I64, 1, 1);
}

void Session::check_input(std::span<const int32_t> tokens, int64_t start) const {
  G4_CHECK(!tokens.empty(), "no tokens to run");
  const int64_t vocab = model_.config().vocab_size;
  for (size_t i = 0; i < tokens.size(); ++i)
    G4_CHECK(tokens[i] >= 0 && tokens[i] < vocab, "token id " + std::to_string(tokens[i]) + " at index " +
                                                      std::to_string(i) + " is out of range [0, " +
                                                      std::to_string(vocab) + ")");
  G4_CHECK(start + int64_t(tokens.size()) <= max_seq_len_,
           "context full (" + std::to_string(max_seq_len_) + " tokens): " + std::to_string(start) +
               " used, " + std::to_string(tokens.size()) + " more requested");
}

void Session::run_chunk(std::span<const int32_t> tokens, ChunkOutput output, float* host_logits) {
  const int64_t T = int64_t(tokens.size());
  std::vector<int32_t> pos(tokens.size());
  std::iota(pos.begin(), pos.end(), int32_t(position_));
  Tensor ids = ids_.rows_view(0, T), positions = positions_.rows_view(0, T);
  backend_.upload(tokens.data(), ids);
  backend_.upload(pos.data(), positions);
  const int64_t out_rows = output == ChunkOutput::kAllLogits ? T : output == ChunkOutput::kLastLogits ? 1 : 0;
  model_.forward_layers(backend_, buffers_, caches_, ids, positions, out_rows);
  position_ += T;
  const Tensor hidden = buffers_.x.rows_view(0, T);
  if (output == ChunkOutput::kAllLogits) {
    Tensor logits = all_logits_.rows_view(0, T);
    model_.logits(backend_, hidden, all_normed_.rows_view(0, T), all_scratch_.rows_view(0, T), logits);
    backend_.download(logits, host_logits);
  } else if (output == ChunkOutput::kLastLogits) {
    model_.logits(backend_, hidden.rows_view(T - 1, 1), buffers_.last_hidden, buffers_.logits_act, logits_);
  }
}

// Only the last chunk's last position has logits worth computing during generation.
void Session::prefill(std::span<const int32_t> tokens) {
  check_input(tokens);
  for (size_t at = 0; at < tokens.size(); at += size_t(max_chunk_)) {
    const size_t n = std::min(tokens.size() - at, size_t(max_chunk_));
    run_chunk(tokens.subspan(at, n), at + n == tokens.size() ? ChunkOutput::kLastLogits : ChunkOutput::kCacheOnly,
              nullptr);
  }
}

std::vector<float> Session::logits_all(std::span<const int32_t> tokens, int64_t chunk) {
  check_input(tokens);
  chunk = chunk > 0 ? chunk : max_chunk_;
  G4_CHECK(chunk <= max_chunk_, "prefill chunk " + std::to_string(chunk) + " exceeds max_prefill_chunk " +
                                    std::to_string(max_chunk_));
  const ModelConfig& c = model_.config();
  if (all_logits_.empty()) {
    all_normed_ = backend_.alloc(backend_.activation_dtype(), max_chunk_, c.hidden_size);
    all_scratch_ = backend_.alloc(backend_.activation_dtype(), max_chunk_, c.vocab_size);
    all_logits_ = backend_.alloc(DType::F32, max_chunk_, c.vocab_size);
  }
  std::vector<float> out(tokens.size() * size_t(c.vocab_size));
  for (size_t at = 0; at < tokens.size(); at += size_t(chunk))
    run_chunk(tokens.subspan(at, std::min(tokens.size() - at, size_t(chunk))), ChunkOutput::kAllLogits, out.data() + at * c.vocab_size);
  // Keep last_logits() meaningful after an all-positions run too.
  backend_.upload(out.data() + (tokens.size() - 1) * size_t(c.vocab_size), logits_);
  return out;
}

std::vector<float> Session::last_logits_host() {
  std::vector<float> out(size_t(model_.config().vocab_size));
  backend_.download(logits_, out.data());
  return out;
}

int64_t Session::sample(const SamplingParams& params) {
  validate_sampling_params(params);
  G4_CHECK(position_ > 0, "nothing to sample from: run a prompt first");
  backend_.upload(&params, params_);
  backend_.sample(logits_, params_, token_);
  int64_t token = 0;
  backend_.download(token_, &token);
  return token;
}

}  // namespace g4
