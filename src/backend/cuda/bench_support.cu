#include "backend/cuda/bench_support.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/device_buffer.h"

namespace g4 {

namespace {

// Allocates through the backend (so the tensors own their memory) and fills on the legacy stream
// once the backend's zero-fill has finished.
class RandomFiller {
 public:
  RandomFiller(Backend& backend, uint64_t seed) : backend_(backend), seed_(seed) {}

  Tensor matrix(int64_t out, int64_t in) {
    Tensor t = backend_.alloc(DType::BF16, out, in);
    backend_.synchronize();
    launch_fill_uniform(t.as<bf16>(), t.numel(), 0.0f, std::sqrt(3.0f / float(in)), next_seed(), nullptr);
    return t;
  }
  Tensor vector(int64_t n, float center, float spread) {
    Tensor t = backend_.alloc(DType::F32, 1, n);
    backend_.synchronize();
    launch_fill_uniform(t.as<float>(), n, center, spread, next_seed(), nullptr);
    return t;
  }
  Tensor norm(int64_t n) { return vector(n, 1.0f, 0.2f); }

 private:
  uint64_t next_seed() { return seed_ * 1000003ull + counter_++; }
  Backend& backend_;
  uint64_t seed_, counter_ = 0;
};

}  // namespace

ModelWeights random_weights_on_device(const ModelConfig& c, Backend& backend, uint64_t seed) {
  RandomFiller fill(backend, seed);
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  ModelWeights w;
  w.embed = fill.matrix(c.vocab_size, H);
  w.lm_head = c.tie_word_embeddings ? w.embed : fill.matrix(c.vocab_size, H);
  w.final_norm = fill.norm(H);
  for (const LayerConfig& l : c.layers) {
    const int64_t q_cols = int64_t(c.num_heads) * l.head_dim, kv_cols = int64_t(l.kv_heads) * l.head_dim;
    LayerWeights lw;
    lw.attn_norm = fill.norm(H);
    lw.q_proj = fill.matrix(q_cols, H);
    lw.k_proj = fill.matrix(kv_cols, H);
    if (!l.k_eq_v) lw.v_proj = fill.matrix(kv_cols, H);
    lw.o_proj = fill.matrix(H, q_cols);
    lw.q_norm = fill.norm(l.head_dim);
    lw.k_norm = fill.norm(l.head_dim);
    lw.post_attn_norm = fill.norm(H);
    lw.ffn_norm = fill.norm(H);
    lw.gate_proj = fill.matrix(I, H);
    lw.up_proj = fill.matrix(I, H);
    lw.down_proj = fill.matrix(H, I);
    lw.post_ffn_norm = fill.norm(H);
    lw.layer_scalar = fill.vector(1, 1.0f, 0.0f);
    const std::vector<float> inv = l.rope_inv_freq();
    lw.rope_inv_freq = backend.alloc(DType::F32, int64_t(inv.size()), 1);
    backend.upload(inv.data(), lw.rope_inv_freq);
    w.layers.push_back(std::move(lw));
  }
  G4_CUDA(cudaDeviceSynchronize());
  backend.synchronize();
  return w;
}

double measure_copy_bandwidth(size_t bytes) {
  const DeviceBuffer src(bytes), dst(bytes);
  cudaEvent_t start, stop;
  G4_CUDA(cudaEventCreate(&start));
  G4_CUDA(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int i = 0; i < 11; ++i) {
    G4_CUDA(cudaEventRecord(start));
    G4_CUDA(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice));
    G4_CUDA(cudaEventRecord(stop));
    G4_CUDA(cudaEventSynchronize(stop));
    float t = 0;
    G4_CUDA(cudaEventElapsedTime(&t, start, stop));
    if (i > 0) ms.push_back(t);  // the first copy warms up
  }
  G4_CUDA(cudaEventDestroy(start));
  G4_CUDA(cudaEventDestroy(stop));
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return 2.0 * double(bytes) / (double(ms[ms.size() / 2]) * 1e-3);
}

}  // namespace g4
