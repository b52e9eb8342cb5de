// The CPU backend: float32 arithmetic, weights used in place from the mapped file (F32, BF16,
// F16 or a GGUF block type, widened to float32 row by row), multi-threaded with a ThreadPool.
#pragma once
#include <cstdint>
#include <limits>
#include <memory>

#include "backend/backend.h"
#include "backend/memory_meter.h"
#include "util/thread_pool.h"

namespace g4 {

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(int threads = 0);
  std::string name() const override { return "cpu"; }
  DType activation_dtype() const override { return DType::F32; }

  Tensor alloc(DType dtype, int64_t rows, int64_t cols) override;
  void upload(const void* host, const Tensor& dst) override;
  void download(const Tensor& src, void* host) override;
  Tensor upload_weight(const HostTensor& w) override;

  void embed(const Tensor& table, const Tensor& ids, float scale, const Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) override;
  void matmul(const Tensor& x, const Tensor& w, const Tensor& y) override;
  void head_norms(const HeadNorms& args) override;
  void attention(const AttentionArgs& args) override;
  void concat_cols(std::span<const Tensor> parts, const Tensor& out) override;
  void gated_gelu(const Tensor& x, const Tensor& w_gate, const Tensor& w_up, const Tensor& out) override;
  void residual_norm(const Tensor& x, const Tensor& o, const Tensor& post_weight, const Tensor& scalar, float eps,
                     const Tensor& next_weight, const Tensor& next_out) override;
  void softcap(const Tensor& x, float cap, const Tensor& out) override;
  bool runs_weight_dtype(DType) const override { return true; }  // every row codec decodes to F32
  bool runs_kv_dtype(DType t) const override { return t == DType::F32 || is_quantized_kv(t); }
  size_t weight_bytes_on_backend(const HostTensor&) const override { return 0; }  // used in place
  // What the system can still give (MemAvailable), or SIZE_MAX where it does not say.
  size_t free_memory_bytes() const override;
  void fill_uniform(const Tensor& t, float center, float spread, uint64_t seed) override;
  void sample(const Tensor& logits, const SamplingRows& params, const Tensor& tokens) override;
  void adjust_logits(const Tensor& logits, const AdjustmentRows& rows) override;
  void mask_logits(const Tensor& logits, const TokenMaskRows& rows) override;
  void synchronize() override {}
  size_t peak_memory_bytes() const override { return memory_.peak_bytes(); }
  // Every op computes each row on its own (each (row, output) dot product alone, per-row norms,
  // attention per query row), whatever the row count.
  int64_t batch_invariant_rows() const override { return std::numeric_limits<int64_t>::max(); }
  void begin_capture() override;
  void end_capture(std::unique_ptr<RecordedStep>& step) override;
  void replay(const RecordedStep& step) override;
  void advance_step(const Tensor& token, const Tensor& ids, const Tensor& positions) override;
  void tokens_to_ids(const Tensor& tokens, const Tensor& ids) override;
  void judge_drafts(const Tensor& target_logits, const DraftRows& drafts, const SamplingRows& params,
                    const Tensor& verdict) override;

 private:
  // In place on x [T*heads, head_dim]: RMSNorm of each head with `weight`, then RoPE.
  void rms_norm_rope(const Tensor& x, const Tensor& weight, float eps, const Tensor& positions, const Tensor& inv_freq);

  ThreadPool pool_;
  MemoryMeter memory_;
};

// Widens one row of a weight of any supported dtype to float32.
void widen_row(const Tensor& w, int64_t row, float* out);

}  // namespace g4
