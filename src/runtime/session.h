// One generation context: per-layer KV caches (a ring of 2*window positions for sliding layers,
// flat for full layers), chunked prefill, decode, and sampling on the backend.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "model/gemma4.h"
#include "sampling/sampling_params.h"

namespace g4 {

struct SessionOptions {
  int64_t max_seq_len = 0;        // 0 = ModelConfig::default_max_seq_len()
  int64_t max_prefill_chunk = 0;  // 0 = ModelConfig::max_prefill_chunk(max_seq_len) (docs/DESIGN.md §3)
};

// The smallest context a session of this model accepts (2, or the sliding window if larger).
int64_t min_max_seq_len(const ModelConfig& c);

class Session {
 public:
  Session(const Gemma4& model, Backend& backend, SessionOptions options = {});

  int64_t position() const { return position_; }
  int64_t max_seq_len() const { return max_seq_len_; }
  int64_t max_prefill_chunk() const { return max_chunk_; }
  int64_t vocab_size() const { return model_.config().vocab_size; }
  void reset() { position_ = 0; }

  // Feeds tokens at the next positions in chunks of at most max_prefill_chunk; afterwards
  // last_logits() holds the last token's logits. Checks every id and the context before running.
  void prefill(std::span<const int32_t> tokens);
  void decode(int32_t token) { prefill(std::span<const int32_t>(&token, 1)); }
  // Throws (naming the problem) unless tokens can run from position `start`: every id in range
  // and the context large enough.
  void check_input(std::span<const int32_t> tokens, int64_t start) const;
  void check_input(std::span<const int32_t> tokens) const { check_input(tokens, position_); }
  // As prefill, but returns the logits of every position ([tokens][vocab], float32).
  std::vector<float> logits_all(std::span<const int32_t> tokens, int64_t chunk = 0);

  const Tensor& last_logits() const { return logits_; }  // F32 [1, vocab] in backend memory
  std::vector<float> last_logits_host();
  // Samples from last_logits() on the backend (only the 8-byte token crosses to the host).
  int64_t sample(const SamplingParams& params);

 private:
  friend class DecodeGraph;  // records a decode step over this session's buffers and caches
  // What a chunk's forward leaves behind besides its K/V: nothing more, the last position's logits
  // in logits_, or every position's logits copied to host_logits.
  enum class ChunkOutput { kCacheOnly, kLastLogits, kAllLogits };
  void run_chunk(std::span<const int32_t> tokens, ChunkOutput output, float* host_logits);

  const Gemma4& model_;
  Backend& backend_;
  int64_t max_seq_len_ = 0, max_chunk_ = 0, position_ = 0;
  ForwardBuffers buffers_;
  std::vector<KvCache> caches_;
  Tensor ids_, positions_, logits_, params_, token_;
  Tensor all_normed_, all_scratch_, all_logits_;  // [max_chunk, ...], allocated on first logits_all
};

}  // namespace g4
