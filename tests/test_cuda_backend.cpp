// The CUDA backend against the CPU backend (op by op, relative L2 <= 1e-2 on random inputs) and
// against transformers' logits (docs/DESIGN.md §6 bf16 tolerance) for one-shot prefill, token-by-token
// decode and chunked prefill; generations, graph decode and errors. Skips without CUDA or a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <span>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <vector>


#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/row_routing.h"
#include "quant/quantize.h"
#include "model/loader.h"
#include "format/tensor_source.h"
#include "runtime/session.h"
#include "sampling/sampling_params.h"
#include "sampling/speculative.h"
#include "support/draft_cases.h"
#include "support/cuda_vs_cpu.h"
#include "support/demo_engine.h"
#include "support/fixtures.h"
#include "support/generation.h"
#include "support/row_copies.h"
#include "util/error.h"
#include "util/half.h"

namespace g4 {
namespace {

// The bf16 bound on a trained model (docs/DESIGN.md, "Oracles").
constexpr double kRelativeL2 = 1e-2;
// The bf16 rule on random-weight fixtures (docs/DESIGN.md, "Oracles"): transformers itself, run in
// bf16 on them, lands at relative L2 0.07-0.21 (each fixture's reference.json, measured by
// tools/fixtures/make_fixtures.py on the H200): bf16 storage between ops sets the error, amplified layer by
// layer. The bound is transformers' own bf16 error with 25 % headroom; a kernel bug shows far above.
constexpr double kHeadroomOverTransformersBf16 = 1.25;
// On long sequences even transformers' bf16 misses a few clear greedy tokens: ours may trail its
// agreement by this much. Short fixtures must agree at every clear position.
constexpr double kGreedyAgreementSlack = 0.005;
constexpr int64_t kLongSequence = 1000;
// Greedy tokens must agree wherever the reference's top-2 logit margin exceeds this.
constexpr double kGreedyMargin = test::kClearMargin;

using test::Both;
using test::cuda_backend_or_null;
using test::random_values;
using test::relative_l2;
using CudaOps = test::CudaVsCpu;

#define REQUIRE_GPU(backend) G4_SKIP_OR_FAIL_WITHOUT_GPU(backend)

TEST_F(CudaOps, EmbedScalesInTheActivationDtype) {
  Both table = weight(50, 64, DType::F32);
  const std::vector<int32_t> ids = {3, 0, 49, 17, 3};
  Both id = raw(DType::I32, 5, 1, ids.data());
  Both out = activation(5, 64);
  cpu_.embed(table.cpu, id.cpu, 8.0f, out.cpu);
  gpu_->embed(table.gpu, id.gpu, 8.0f, out.gpu);
  expect_close(out, "embed");
}

TEST_F(CudaOps, RmsNormWithAndWithoutWeightInPlace) {
  Both x = activation(7, 5376), w = weight(0, 5376, DType::BF16, 1.0f, 0.2f), out = activation(7, 5376);
  cpu_.rms_norm(x.cpu, w.cpu, 1e-6f, out.cpu);
  gpu_->rms_norm(x.gpu, w.gpu, 1e-6f, out.gpu);
  expect_close(out, "rms_norm");
  Both heads = activation(12, 256);
  cpu_.rms_norm(heads.cpu, Tensor{}, 1e-6f, heads.cpu);
  gpu_->rms_norm(heads.gpu, Tensor{}, 1e-6f, heads.gpu);
  expect_close(heads, "rms_norm in place");
}

TEST_F(CudaOps, MatmulGemvAndGemmForEveryWeightDtype) {
  for (DType dtype : {DType::F32, DType::BF16, DType::F16, DType::Q8_0})
    for (int64_t T : {1, 3, 8, 9, 40})
      for (int64_t K : {256, 100}) {  // 100: not a multiple of 8, so cuBLAS even for small T
        if (dtype == DType::Q8_0 && K % kQ8BlockSize) continue;
        Both w = weight(300, K, dtype), x = activation(T, K), y = activation(T, 300);
        cpu_.matmul(x.cpu, w.cpu, y.cpu);
        gpu_->matmul(x.gpu, w.gpu, y.gpu);
        expect_close(y, "matmul " + dtype_name(dtype) + " T=" + std::to_string(T) + " K=" + std::to_string(K));
      }
}

// A quantized weight's bf16 copy holds the values every large matmul dequantized before: a forward
// of 100 rows without batch invariance (the dequantizing path's size) gives the same bits from it,
// also after the weight is written anew; 40 rows take the copy instead of the packed matmul and
// match the CPU; turned off, the copies are freed.
TEST_F(CudaOps, Bf16WeightCopiesHoldTheDequantizedValues) {
  gpu_->set_batch_invariant(false);
  const int64_t N = 4096, K = 5376;  // one chunk of the dequantizing path (the same cuBLAS call)
  for (DType dtype : {DType::Q4_0, DType::Q8_0, DType::Q6_K}) {
    const std::string what = "bf16 copy of " + dtype_name(dtype);
    gpu_->set_bf16_weight_copies(false);
    Both w = weight(N, K, dtype, 0.0f, 0.05f), x = activation(100, K), x40 = activation(40, K);
    Both y_dequantized = activation(100, N), y_copy = activation(100, N), y40 = activation(40, N);
    gpu_->matmul(x.gpu, w.gpu, y_dequantized.gpu);
    const size_t free_without = gpu_->free_memory_bytes();
    gpu_->set_bf16_weight_copies(true);
    EXPECT_GE(free_without, gpu_->free_memory_bytes() + size_t(N * K) * 2) << what << ": no copy was allocated";
    gpu_->matmul(x.gpu, w.gpu, y_copy.gpu);
    EXPECT_EQ(read(*gpu_, y_copy.gpu), read(*gpu_, y_dequantized.gpu)) << what;
    cpu_.matmul(x40.cpu, w.cpu, y40.cpu);
    gpu_->matmul(x40.gpu, w.gpu, y40.gpu);
    expect_close(y40, what + ", 40 rows");

    gpu_->fill_uniform(w.gpu, 0.0f, 0.05f, 7);  // written anew: its copy too
    gpu_->matmul(x.gpu, w.gpu, y_copy.gpu);
    gpu_->set_bf16_weight_copies(false);
    EXPECT_GE(gpu_->free_memory_bytes(), free_without - (size_t(4) << 20)) << what << ": the copy was not freed";
    gpu_->matmul(x.gpu, w.gpu, y_dequantized.gpu);
    EXPECT_EQ(read(*gpu_, y_copy.gpu), read(*gpu_, y_dequantized.gpu)) << what << ", written anew";
  }
}

TEST_F(CudaOps, GatedGeluGemvAndGemm) {
  for (int64_t T : {1, 3, 8, 9, 40})
    for (int64_t K : {256, 100}) {  // 100: not a multiple of 8, so cuBLAS even for small T
      Both w_gate = weight(300, K, DType::BF16), w_up = weight(300, K, DType::BF16);
      Both x = activation(T, K, 2.0f), out = activation(T, 300);
      cpu_.gated_gelu(x.cpu, w_gate.cpu, w_up.cpu, out.cpu);
      gpu_->gated_gelu(x.gpu, w_gate.gpu, w_up.gpu, out.gpu);
      expect_close(out, "gated_gelu T=" + std::to_string(T) + " K=" + std::to_string(K));
    }
  // 31B's shape, one decode token (hidden 5376, a slice of the 21504 intermediate rows).
  Both w_gate = weight(1000, 5376, DType::BF16, 0.0f, 0.05f), w_up = weight(1000, 5376, DType::BF16, 0.0f, 0.05f);
  Both x = activation(1, 5376), out = activation(1, 1000);
  cpu_.gated_gelu(x.cpu, w_gate.cpu, w_up.cpu, out.cpu);
  gpu_->gated_gelu(x.gpu, w_gate.gpu, w_up.gpu, out.gpu);
  expect_close(out, "gated_gelu 31B shape");
}

TEST_F(CudaOps, MatmulsOfOneInputInOneLaunchAndByGemm) {
  // q/k/v-like projections: rows that do not fill the last block of 8 warps; T = 9 goes to cuBLAS.
  for (int64_t T : {1, 4, 9}) {
    Both wq = weight(200, 256, DType::BF16), wk = weight(37, 256, DType::BF16), wv = weight(64, 256, DType::BF16);
    Both x = activation(T, 256), q = activation(T, 200), k = activation(T, 37), v = activation(T, 64);
    const Tensor cpu_ws[] = {wq.cpu, wk.cpu, wv.cpu}, cpu_ys[] = {q.cpu, k.cpu, v.cpu};
    const Tensor gpu_ws[] = {wq.gpu, wk.gpu, wv.gpu}, gpu_ys[] = {q.gpu, k.gpu, v.gpu};
    cpu_.matmuls(x.cpu, cpu_ws, cpu_ys);
    gpu_->matmuls(x.gpu, gpu_ws, gpu_ys);
    for (const auto& [out, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}})
      expect_close(*out, std::string("matmuls ") + name + " T=" + std::to_string(T));
  }
}

TEST_F(CudaOps, HeadNormsWithSeparateVAndKEqualsV) {
  const int64_t T = 3, heads = 4, kv_heads = 2;
  const std::vector<int32_t> pos = {1000, 1001, 1002};
  Both positions = raw(DType::I32, T, 1, pos.data());
  for (int64_t hd : {64, 256, 512})
    for (int64_t rotating : {hd / 2, hd / 8})
      for (bool k_eq_v : {false, true})
        for (int64_t q_first : {0, 2, 3}) {  // q of the chunk's last tokens only (a prompt's last layer)
        Both inv_freq = rope_inv_freq(hd, rotating);
        Both q_w = weight(0, hd, DType::BF16, 1.0f, 0.2f), k_w = weight(0, hd, DType::BF16, 1.0f, 0.2f);
        Both q = activation((T - q_first) * heads, hd, 3.0f), k = activation(T * kv_heads, hd, 2.0f);
        Both v = activation(T * kv_heads, hd, 1.5f);
        HeadNorms c{q.cpu, q_w.cpu, k.cpu, k_w.cpu, k_eq_v ? k.cpu : v.cpu, v.cpu, positions.cpu, inv_freq.cpu, 1e-6f,
                    q_first};
        HeadNorms g{q.gpu, q_w.gpu, k.gpu, k_w.gpu, k_eq_v ? k.gpu : v.gpu, v.gpu, positions.gpu, inv_freq.gpu, 1e-6f,
                    q_first};
        cpu_.head_norms(c);
        gpu_->head_norms(g);
        const std::string what = "head_norms hd " + std::to_string(hd) + " rotating " + std::to_string(rotating) +
                                 (k_eq_v ? " K=V" : "") + " q from token " + std::to_string(q_first);
        if (q_first < T) expect_close(q, what + " q");
        expect_close(k, what + " k");
        expect_close(v, what + " v");
      }
}

TEST_F(CudaOps, ResidualNormWithAndWithoutScalarAndNextNorm) {
  for (int64_t cols : {5376, 100})
    for (int64_t T : {1, 7}) {
      Both post = weight(0, cols, DType::BF16, 1.0f, 0.2f), next = weight(0, cols, DType::BF16, 1.0f, 0.2f);
      Both scalar = weight(0, 1, DType::F32, 0.7f, 0.0f);
      const std::string shape = " [" + std::to_string(T) + ", " + std::to_string(cols) + "]";
      // The attention block's end: no scalar, the pre-FFN norm of the new x.
      Both x = activation(T, cols, 4.0f), o = activation(T, cols), h = activation(T, cols);
      cpu_.residual_norm(x.cpu, o.cpu, post.cpu, Tensor{}, 1e-6f, next.cpu, h.cpu);
      gpu_->residual_norm(x.gpu, o.gpu, post.gpu, Tensor{}, 1e-6f, next.gpu, h.gpu);
      expect_close(x, "residual_norm x" + shape);
      expect_close(h, "residual_norm next input" + shape);
      // The MLP block's end: layer scalar, then the next layer's input norm, or nothing after the last.
      cpu_.residual_norm(x.cpu, o.cpu, post.cpu, scalar.cpu, 1e-6f, next.cpu, h.cpu);
      gpu_->residual_norm(x.gpu, o.gpu, post.gpu, scalar.gpu, 1e-6f, next.gpu, h.gpu);
      expect_close(x, "residual_norm scaled x" + shape);
      expect_close(h, "residual_norm scaled next input" + shape);
      cpu_.residual_norm(x.cpu, o.cpu, post.cpu, scalar.cpu, 1e-6f, Tensor{}, Tensor{});
      gpu_->residual_norm(x.gpu, o.gpu, post.gpu, scalar.gpu, 1e-6f, Tensor{}, Tensor{});
      expect_close(x, "residual_norm last layer" + shape);
      expect_close(o, "residual_norm leaves o" + shape);
    }
}

TEST_F(CudaOps, Softcap) {
  Both capped{cpu_.alloc(DType::F32, 3, 1000), gpu_->alloc(DType::F32, 3, 1000)};
  Both z = activation(3, 1000, 60.0f);
  cpu_.softcap(z.cpu, 30.0f, capped.cpu);
  gpu_->softcap(z.gpu, 30.0f, capped.gpu);
  expect_close(capped, "softcap");
}

// Synthetic weights are the same numbers on either backend: F32 bit for bit, BF16 the same rounding.
TEST_F(CudaOps, FillUniformGivesTheSameValuesAsTheCpu) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    Both t{cpu_.alloc(dtype, 37, 1001), gpu_->alloc(dtype, 37, 1001)};
    cpu_.fill_uniform(t.cpu, 0.25f, 0.5f, 1234);
    gpu_->fill_uniform(t.gpu, 0.25f, 0.5f, 1234);
    const std::vector<float> c = read(cpu_, t.cpu), g = read(*gpu_, t.gpu);
    EXPECT_EQ(c, g) << dtype_name(dtype);
    EXPECT_GE(*std::min_element(c.begin(), c.end()), -0.25f);
    EXPECT_LE(*std::max_element(c.begin(), c.end()), 0.75f);  // 0.25 + 0.5 * (1 - 2^-23) rounds to 0.75
    EXPECT_GT(*std::max_element(c.begin(), c.end()) - *std::min_element(c.begin(), c.end()), 0.9f) << "spread";
  }
}

// A sequence of chunks through one layer's cache: decode steps and prefill chunks, ring wrap.
struct AttentionCase {
  int heads, kv_heads, head_dim, window;
  int64_t capacity;
  std::vector<int64_t> chunks;
  int64_t queries = -1;  // queries of a chunk of several tokens: its last ones (-1: all of them)
  // After each chunk, two queries at the next position over the cache alone (an MTP assistant's,
  // AttentionArgs::reads_cache_only): keys below it, nothing stored, the next chunk unaffected.
  bool cache_only_queries = false;
};

// A short chunk of decode-step rows (a verify chunk) runs on the decode kernels (row_routing.h:
// chunk_on_decode_kernels): each of its rows gets exactly the bits a decode step at that position gives, over a ring (a 31B sliding layer's
// shape) and a flat cache (a full layer's, many splits), after a prompt on the prefill kernel.
TEST_F(CudaOps, ShortChunksGiveTheDecodeStepsBits) {
  struct Case {
    int heads, kv_heads, head_dim, window;
    int64_t capacity, prompt;
  };
  for (const Case c : {Case{32, 16, 256, 128, 256, 300}, Case{32, 4, 512, 0, 1400, 1000}}) {
    const int64_t kv_cols = int64_t(c.kv_heads) * c.head_dim, q_cols = int64_t(c.heads) * c.head_dim;
    for (const int64_t T : {int64_t(2), int64_t(5), kMaxChunkRowsOnDecodeKernels}) {
      ASSERT_TRUE(chunk_on_decode_kernels(T, 0, c.window, c.capacity));
      KvCache chunked = one_page_kv_cache(*gpu_, DType::BF16, c.capacity, kv_cols);
      KvCache stepped = one_page_kv_cache(*gpu_, DType::BF16, c.capacity, kv_cols);
      auto args = [&](KvCache& cache, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& positions,
                      const Tensor& out) {
        AttentionArgs a;
        a.cache = &cache;
        a.heads = c.heads, a.kv_heads = c.kv_heads, a.head_dim = c.head_dim, a.window = c.window;
        a.scale = 1.0f / std::sqrt(float(c.head_dim)) * 4.0f;
        a.q = q, a.k_new = k, a.v_new = v, a.positions = positions, a.out = out;
        a.rows_as_decode_steps = true;  // a verify chunk's rows (the prompt's run on the prefill kernel regardless)
        return a;
      };
      std::vector<int32_t> p(size_t(c.prompt + T));
      for (size_t i = 0; i < p.size(); ++i) p[i] = int32_t(i);
      const Tensor prompt_positions = raw(DType::I32, c.prompt, 1, p.data()).gpu;
      Both q = activation(c.prompt, q_cols), k = activation(c.prompt, kv_cols), v = activation(c.prompt, kv_cols);
      const Tensor prompt_out = gpu_->alloc(DType::BF16, c.prompt, q_cols);
      for (KvCache* cache : {&chunked, &stepped})
        gpu_->attention(args(*cache, q.gpu, k.gpu, v.gpu, prompt_positions, prompt_out));
      const Tensor positions = raw(DType::I32, T, 1, p.data() + c.prompt).gpu;
      Both qc = activation(T, q_cols), kc = activation(T, kv_cols), vc = activation(T, kv_cols);
      const Tensor chunk_out = gpu_->alloc(DType::BF16, T, q_cols), step_out = gpu_->alloc(DType::BF16, T, q_cols);
      gpu_->attention(args(chunked, qc.gpu, kc.gpu, vc.gpu, positions, chunk_out));
      for (int64_t z = 0; z < T; ++z)
        gpu_->attention(args(stepped, qc.gpu.rows_view(z, 1), kc.gpu.rows_view(z, 1), vc.gpu.rows_view(z, 1),
                             positions.rows_view(z, 1), step_out.rows_view(z, 1)));
      std::vector<uint16_t> chunk_bits(size_t(T * q_cols)), step_bits(chunk_bits.size());
      gpu_->download(chunk_out, chunk_bits.data());
      gpu_->download(step_out, step_bits.data());
      EXPECT_EQ(chunk_bits, step_bits) << "head dim " << c.head_dim << ", window " << c.window << ", T " << T;
    }
  }
}

TEST_F(CudaOps, AttentionChunksOverRingAndFlatCaches) {
  const std::vector<AttentionCase> cases = {
      {4, 2, 16, 8, 16, {5, 1, 1, 16, 1, 3, 9, 1, 1}},     // tiny sliding layer, chunk = capacity
      {4, 2, 256, 16, 32, {20, 1, 1, 32, 1, 7, 1}},          // 31B sliding head dim
      {4, 1, 512, 0, 90, {17, 1, 1, 40, 1, 1, 20, 1}},       // 31B full head dim, flat cache
      {8, 1, 64, 0, 300, {1, 1, 150, 1, 100, 1}},            // group of 8, many decode splits
      {4, 2, 256, 128, 256, {200, 1, 200, 1}},               // 31B sliding shape, 200-token chunks wrap the ring
      {8, 1, 512, 0, 450, {200, 1, 200, 1}},                 // 31B full shape (group 8), 200-token chunks
      // A prompt's last layer: queries for the last token only, or none (the chunk fills the cache);
      // the decode steps after each read what it stored.
      {4, 2, 16, 8, 16, {5, 1, 16, 1, 3, 9, 1}, 1},
      {4, 2, 256, 128, 256, {200, 1, 200, 1}, 1},
      {8, 1, 512, 0, 450, {200, 1, 200, 1}, 1},
      {4, 2, 256, 128, 256, {200, 1, 200, 1}, 0},
      {8, 1, 512, 0, 450, {200, 1, 200, 1}, 0},
      // More keys than the backend's one-tile splits hold: decode splits of several 32-key tiles.
      {8, 1, 512, 0, 17000, {16900, 1, 1}, 0},
      // Queries over the cache alone: the window cuts, the ring wrapped, many splits.
      {4, 2, 16, 8, 16, {12, 5}, -1, true},
      {4, 2, 256, 16, 32, {40, 3}, -1, true},
      {8, 1, 512, 0, 400, {300, 20}, -1, true},
  };
  for (const auto& c : cases) {
    const int64_t kv_cols = int64_t(c.kv_heads) * c.head_dim, q_cols = int64_t(c.heads) * c.head_dim;
    KvCache cpu_cache = one_page_kv_cache(cpu_, DType::F32, c.capacity, kv_cols);
    KvCache gpu_cache = one_page_kv_cache(*gpu_, DType::BF16, c.capacity, kv_cols);
    int32_t pos = 0;
    for (int64_t T : c.chunks) {
      std::vector<int32_t> p(static_cast<size_t>(T));
      for (int64_t i = 0; i < T; ++i) p[size_t(i)] = pos + int32_t(i);
      Both positions = raw(DType::I32, T, 1, p.data());
      const int64_t queries = T > 1 && c.queries >= 0 ? c.queries : T;
      Both q = activation(queries, q_cols), k = activation(T, kv_cols), v = activation(T, kv_cols);
      Both out = activation(queries, q_cols);
      AttentionArgs a;
      a.q_first = T - queries;
      a.cache = &cpu_cache;
      a.heads = c.heads;
      a.kv_heads = c.kv_heads;
      a.head_dim = c.head_dim;
      a.window = c.window;
      a.scale = 1.0f / std::sqrt(float(c.head_dim)) * 4.0f;
      AttentionArgs g = a;
      a.q = q.cpu, a.k_new = k.cpu, a.v_new = v.cpu, a.positions = positions.cpu, a.out = out.cpu;
      g.q = q.gpu, g.k_new = k.gpu, g.v_new = v.gpu, g.positions = positions.gpu, g.out = out.gpu;
      g.cache = &gpu_cache;
      cpu_.attention(a);
      gpu_->attention(g);
      if (queries > 0)
        expect_close(out, "attention hd " + std::to_string(c.head_dim) + " at " + std::to_string(pos) + " T=" +
                              std::to_string(T) + " queries " + std::to_string(queries));
      pos += int32_t(T);
      for (int query = 0; c.cache_only_queries && query < 2; ++query) {
        Both at = raw(DType::I32, 1, 1, &pos), q1 = activation(1, q_cols), out1 = activation(1, q_cols);
        AttentionArgs ac = a, gc = g;
        ac.q = q1.cpu, ac.out = out1.cpu, ac.positions = at.cpu, ac.q_first = 0, ac.k_new = ac.v_new = Tensor{};
        gc.q = q1.gpu, gc.out = out1.gpu, gc.positions = at.gpu, gc.q_first = 0, gc.k_new = gc.v_new = Tensor{};
        ac.reads_cache_only = gc.reads_cache_only = true;
        cpu_.attention(ac);
        gpu_->attention(gc);
        expect_close(out1, "cache-only query, hd " + std::to_string(c.head_dim) + " at " + std::to_string(pos));
      }
    }
  }
}

// The model's attention call: head norms, then attention. For one decode token the CUDA backend
// folds the norms into the attention launch, which also stores the normed K/V in the cache. Token
// after token, the folded launch must give exactly what the GPU's separate ops give (same rounding
// points), and match the CPU within the bf16 bound (at a softmax scale that keeps the scores of
// these random unit-norm heads from saturating the softmax, which would amplify rounding).
TEST_F(CudaOps, NormedAttentionFoldsTheHeadNormsIntoDecode) {
  const std::vector<AttentionCase> cases = {
      {4, 2, 64, 8, 8, {5, 1, 1, 1, 1, 1, 1}},        // ring of one window: every slot rewritten
      {4, 2, 256, 16, 32, {20, 1, 1, 1, 1}},           // 31B sliding head dim
      {8, 1, 512, 0, 64, {30, 1, 1, 1}},               // 31B full head dim and group, flat cache
  };
  for (const auto& c : cases)
    for (bool k_eq_v : {false, true}) {
      const int64_t hd = c.head_dim, kv_cols = int64_t(c.kv_heads) * hd, q_cols = int64_t(c.heads) * hd;
      Both inv_freq = rope_inv_freq(hd, hd / 8);  // partial RoPE: a quarter of the pairs rotate
      Both q_w = weight(0, hd, DType::BF16, 1.0f, 0.2f), k_w = weight(0, hd, DType::BF16, 1.0f, 0.2f);
      auto cache_of = [&](Backend& be, DType dtype) {
        return one_page_kv_cache(be, dtype, c.capacity, kv_cols);
      };
      KvCache cpu_cache = cache_of(cpu_, DType::F32), folded_cache = cache_of(*gpu_, DType::BF16),
              separate_cache = cache_of(*gpu_, DType::BF16);
      int32_t pos = 0;
      for (int64_t T : c.chunks) {
        std::vector<int32_t> p(static_cast<size_t>(T));
        for (int64_t i = 0; i < T; ++i) p[size_t(i)] = pos + int32_t(i);
        Both positions = raw(DType::I32, T, 1, p.data());
        const std::vector<float> qv = random_values(size_t(T * q_cols), 3.0f, seed_++),
                                 kv = random_values(size_t(T * kv_cols), 2.0f, seed_++),
                                 vv = random_values(size_t(T * kv_cols), 1.5f, seed_++);
        // The CPU's inputs, the folded launch's, and a copy for the GPU's separate ops.
        Both q = activation(T, q_cols, qv), k = activation(T, kv_cols, kv), v = activation(T, kv_cols, vv);
        Both q2 = activation(T, q_cols, qv), k2 = activation(T, kv_cols, kv), v2 = activation(T, kv_cols, vv);
        Both out = activation(T, q_cols), out2 = activation(T, q_cols);
        auto run = [&](Backend& be, const Tensor& qt, const Tensor& kt, const Tensor& vt, const Tensor& ot,
                       KvCache& cache, bool gpu, bool separate) {
          const Tensor kh = kt.reshaped(T * c.kv_heads, hd), vh = vt.reshaped(T * c.kv_heads, hd);
          const HeadNorms n{qt.reshaped(T * c.heads, hd), gpu ? q_w.gpu : q_w.cpu, kh, gpu ? k_w.gpu : k_w.cpu,
                            k_eq_v ? kh : vh, vh, gpu ? positions.gpu : positions.cpu,
                            gpu ? inv_freq.gpu : inv_freq.cpu, 1e-6f};
          AttentionArgs a;
          a.q = qt, a.k_new = kt, a.v_new = vt, a.out = ot, a.cache = &cache;
          a.positions = gpu ? positions.gpu : positions.cpu;
          a.heads = c.heads, a.kv_heads = c.kv_heads, a.head_dim = c.head_dim, a.window = c.window;
          a.scale = 1.0f / std::sqrt(float(hd));
          if (separate) {
            be.head_norms(n);
            be.attention(a);
          } else {
            be.normed_attention(n, a);
          }
        };
        run(cpu_, q.cpu, k.cpu, v.cpu, out.cpu, cpu_cache, false, false);
        run(*gpu_, q.gpu, k.gpu, v.gpu, out.gpu, folded_cache, true, false);
        run(*gpu_, q2.gpu, k2.gpu, v2.gpu, out2.gpu, separate_cache, true, true);
        const std::string what = "normed attention hd " + std::to_string(hd) + (k_eq_v ? " K=V" : "") + " at " +
                                 std::to_string(pos) + " T=" + std::to_string(T);
        expect_close(out, what);
        expect_close(Both{cpu_cache.k, folded_cache.k}, what + ": K cache");
        expect_close(Both{cpu_cache.v, folded_cache.v}, what + ": V cache");
        EXPECT_EQ(read(*gpu_, out.gpu), read(*gpu_, out2.gpu)) << what << ": folded != separate ops";
        EXPECT_EQ(read(*gpu_, folded_cache.k), read(*gpu_, separate_cache.k)) << what << ": K cache, folded != separate";
        EXPECT_EQ(read(*gpu_, folded_cache.v), read(*gpu_, separate_cache.v)) << what << ": V cache, folded != separate";
        pos += int32_t(T);
      }
    }
}

// A decode batch's attention (one token per sequence, each over its own cache at its own
// position) in the batched launches, against each sequence run alone: the same bits in the outputs
// and the caches (docs/DESIGN.md §7, batch invariance). 70 sequences span two launches of 64. The
// 31B's sliding shape (16 kv heads) is one block per (kv head, sequence) in a batch of 64, which
// merges its 8 splits itself, while a sequence alone takes a block per split and the merge kernel.
TEST_F(CudaOps, DecodeBatchAttentionGivesEachSequenceItsAloneBits) {
  const int64_t S = 70;
  struct Case {
    int heads, kv_heads, head_dim, window;
    int64_t capacity;
  };
  for (const Case& c : {Case{4, 2, 256, 16, 32}, Case{8, 1, 512, 0, 96}, Case{32, 16, 256, 256, 256}})
    for (bool k_eq_v : {false, true}) {
      const int64_t hd = c.head_dim, kv_cols = int64_t(c.kv_heads) * hd, q_cols = int64_t(c.heads) * hd;
      Both inv_freq = rope_inv_freq(hd, hd / 8);
      Both q_w = weight(0, hd, DType::BF16, 1.0f, 0.2f), k_w = weight(0, hd, DType::BF16, 1.0f, 0.2f);
      // Positions from 0 to past a ring's wrap (flat caches: below the capacity).
      std::vector<int32_t> p(static_cast<size_t>(S));
      for (int64_t i = 0; i < S; ++i) p[size_t(i)] = int32_t((7 * i + 3) % (c.window ? 3 * c.capacity : c.capacity));
      Both positions = raw(DType::I32, S, 1, p.data());
      const std::vector<float> qv = random_values(size_t(S * q_cols), 3.0f, seed_++),
                               kv = random_values(size_t(S * kv_cols), 2.0f, seed_++),
                               vv = random_values(size_t(S * kv_cols), 1.5f, seed_++);
      Both q = activation(S, q_cols, qv), k = activation(S, kv_cols, kv), v = activation(S, kv_cols, vv);
      Both out = activation(S, q_cols), out_alone = activation(S, q_cols);
      std::vector<KvCache> batched, alone;
      for (int64_t i = 0; i < S; ++i) {
        const std::vector<float> kc = random_values(size_t(c.capacity * kv_cols), 2.0f, seed_++),
                                 vc = random_values(size_t(c.capacity * kv_cols), 1.5f, seed_++);
        for (std::vector<KvCache>* caches : {&batched, &alone})
          caches->push_back(
              one_page_kv_cache(*gpu_, activation(c.capacity, kv_cols, kc).gpu, activation(c.capacity, kv_cols, vc).gpu));
      }
      // Sequence i's arguments, as the model makes them: row i of every tensor.
      auto sequence = [&](int64_t i, const Tensor& ot, KvCache& cache) {
        const Tensor qi = q.gpu.rows_view(i, 1), ki = k.gpu.rows_view(i, 1), vi = v.gpu.rows_view(i, 1);
        const Tensor kh = ki.reshaped(c.kv_heads, hd), vh = vi.reshaped(c.kv_heads, hd);
        HeadNorms n{qi.reshaped(c.heads, hd), q_w.gpu, kh, k_w.gpu, k_eq_v ? kh : vh, vh,
                    positions.gpu.rows_view(i, 1), inv_freq.gpu, 1e-6f};
        AttentionArgs a;
        a.q = qi, a.k_new = ki, a.v_new = vi, a.out = ot.rows_view(i, 1), a.cache = &cache;
        a.positions = positions.gpu.rows_view(i, 1);
        a.heads = c.heads, a.kv_heads = c.kv_heads, a.head_dim = c.head_dim, a.window = c.window;
        a.scale = 1.0f / std::sqrt(float(hd));
        return std::pair{n, a};
      };
      std::vector<HeadNorms> norms;
      std::vector<AttentionArgs> args;
      for (int64_t i = 0; i < S; ++i) {
        auto [n, a] = sequence(i, out.gpu, batched[size_t(i)]);
        norms.push_back(n);
        args.push_back(a);
      }
      gpu_->normed_attention_batch(norms, args);
      for (int64_t i = 0; i < S; ++i) {
        auto [n, a] = sequence(i, out_alone.gpu, alone[size_t(i)]);
        gpu_->normed_attention(n, a);
      }
      const std::string what = "decode batch hd " + std::to_string(hd) + (k_eq_v ? " K=V" : "");
      EXPECT_EQ(read(*gpu_, out.gpu), read(*gpu_, out_alone.gpu)) << what << ": outputs";
      for (int64_t i = 0; i < S; ++i) {
        EXPECT_EQ(read(*gpu_, batched[size_t(i)].k), read(*gpu_, alone[size_t(i)].k)) << what << ": K cache " << i;
        EXPECT_EQ(read(*gpu_, batched[size_t(i)].v), read(*gpu_, alone[size_t(i)].v)) << what << ": V cache " << i;
      }
    }
}

// Logit bias and penalties (Backend::adjust_logits): the device changes exactly the listed logits,
// to the CPU's bits — a bias, a repetition penalty on a positive and a negative logit, a
// subtraction, a ban (-infinity) — and leaves rows without adjustments as they were.
TEST_F(CudaOps, AdjustLogitsMatchesTheCpu) {
  const int64_t rows = 3, vocab = 262144;
  std::vector<float> logits = random_values(size_t(rows * vocab), 20.0f, 7);
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<std::vector<LogitAdjustment>> lists = {
      {{5, 2.5f, 1.0f, 0.0f}, {77, 0.0f, 1.3f, 0.75f}, {vocab - 1, -inf, 1.0f, 0.0f}},
      {},
      {{0, -1.0f, 0.5f, 3.0f}, {4096, 100.0f, 2.0f, 0.0f}}};
  std::vector<LogitAdjustment> entries;
  std::vector<int32_t> offsets{0};
  for (const auto& list : lists) {
    entries.insert(entries.end(), list.begin(), list.end());
    offsets.push_back(int32_t(entries.size()));
  }
  Both l = raw(DType::F32, rows, vocab, logits.data());
  Both e = raw(DType::I32, int64_t(entries.size()), int64_t(sizeof(LogitAdjustment) / 4), entries.data());
  Both o = raw(DType::I32, rows + 1, 1, offsets.data());
  cpu_.adjust_logits(l.cpu, AdjustmentRows{e.cpu, o.cpu, rows});
  gpu_->adjust_logits(l.gpu, AdjustmentRows{e.gpu, o.gpu, rows});
  const std::vector<float> want = read(cpu_, l.cpu), got = read(*gpu_, l.gpu);
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0);
  size_t changed = 0;
  for (size_t i = 0; i < want.size(); ++i) changed += want[i] != logits[i] ? 1 : 0;
  EXPECT_EQ(changed, entries.size()) << "only the listed logits change";
  EXPECT_EQ(got[size_t(vocab - 1)], -inf);
}

// Token masks (Backend::mask_logits): the device sets exactly the CPU's logits to -infinity — the
// tokens a row's mask leaves out, and those past a mask shorter than the vocabulary — and leaves
// rows without a mask alone.
TEST_F(CudaOps, MaskLogitsMatchesTheCpu) {
  const int64_t rows = 3, vocab = 262144 + 5, words = 262144 / 32;
  std::vector<float> logits = random_values(size_t(rows * vocab), 20.0f, 11);
  std::vector<uint32_t> masks(size_t(2 * words));
  std::mt19937 rng(3);
  for (uint32_t& w : masks) w = uint32_t(rng());
  const std::vector<int32_t> row_mask = {1, -1, 0};
  Both l = raw(DType::F32, rows, vocab, logits.data());
  Both m = raw(DType::I32, 2, words, masks.data());
  Both r = raw(DType::I32, rows, 1, row_mask.data());
  cpu_.mask_logits(l.cpu, TokenMaskRows{m.cpu, r.cpu, rows});
  gpu_->mask_logits(l.gpu, TokenMaskRows{m.gpu, r.gpu, rows});
  const std::vector<float> want = read(cpu_, l.cpu), got = read(*gpu_, l.gpu);
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0);
  for (int64_t row = 0; row < rows; ++row) {
    int64_t kept = 0;
    for (int64_t t = 0; t < vocab; ++t) kept += got[size_t(row * vocab + t)] == logits[size_t(row * vocab + t)] ? 1 : 0;
    int64_t allowed = vocab;
    if (row_mask[size_t(row)] >= 0) {
      allowed = 0;
      for (int64_t w = 0; w < words; ++w) allowed += std::popcount(masks[size_t(row_mask[size_t(row)] * words + w)]);
    }
    EXPECT_EQ(kept, allowed) << "row " << row;
  }
}

TEST_F(CudaOps, SampleAndAdvanceStepMatchTheCpu) {
  const int64_t vocab = 262144;
  std::vector<float> logits = random_values(size_t(vocab), 20.0f, 99);
  Both l = raw(DType::F32, 1, vocab, logits.data());
  for (SamplingParams p : {SamplingParams{0.0f, 1.0f, 0.0f, 0, 5}, SamplingParams{1.0f, 0.95f, 0.0f, 64, 7},
                           SamplingParams{0.8f, 0.9f, 0.05f, 0, 11}}) {
    const SamplingRows cpu_params = cpu_.alloc_sampling_rows(1), gpu_params = gpu_->alloc_sampling_rows(1);
    cpu_.upload_sampling_rows({&p, 1}, cpu_params);
    gpu_->upload_sampling_rows({&p, 1}, gpu_params);
    Both token{cpu_.alloc(DType::I64, 1, 1), gpu_->alloc(DType::I64, 1, 1)};
    cpu_.sample(l.cpu, cpu_params, token.cpu);
    gpu_->sample(l.gpu, gpu_params, token.gpu);
    int64_t want = 0, got = 0;
    cpu_.download(token.cpu, &want);
    gpu_->download(token.gpu, &got);
    EXPECT_EQ(got, want) << "temperature " << p.temperature;
  }
  const int64_t token = 1234;
  const std::vector<int32_t> start = {7, 41};
  Both t = raw(DType::I64, 1, 1, &token), ids = raw(DType::I32, 1, 1, &start[0]), pos = raw(DType::I32, 1, 1, &start[1]);
  gpu_->advance_step(t.gpu, ids.gpu, pos.gpu);
  int32_t id = 0, position = 0;
  gpu_->download(ids.gpu, &id);
  gpu_->download(pos.gpu, &position);
  EXPECT_EQ(id, 1234);
  EXPECT_EQ(position, 42);
}

// A draft chain's drawn tokens become the next step's ids on the device; a row that drew none
// (kNanLogitsToken) feeds id 0.
TEST_F(CudaOps, TokensToIdsMatchTheCpu) {
  const std::vector<int64_t> tokens = {5, kNanLogitsToken, 262143, 0, 77};
  Both t = raw(DType::I64, 5, 1, tokens.data());
  Both ids{cpu_.alloc(DType::I32, 5, 1), gpu_->alloc(DType::I32, 5, 1)};
  cpu_.tokens_to_ids(t.cpu, ids.cpu);
  gpu_->tokens_to_ids(t.gpu, ids.gpu);
  std::vector<int32_t> want(5), got(5);
  cpu_.download(ids.cpu, want.data());
  gpu_->download(ids.gpu, got.data());
  EXPECT_EQ(want, (std::vector<int32_t>{5, 0, 262143, 0, 77}));
  EXPECT_EQ(got, want);
  EXPECT_THROW(gpu_->tokens_to_ids(ids.gpu, t.gpu), Error) << "I32 tokens";
}

// The speculative verdict on the device is the CPU's, bit for bit: for greedy and sampled draws with
// each cut, drafts that stand and drafts that fall, a drafter's strided rows, both vocabulary sizes
// (the 31B's: the whole-row cuts at full width); a NaN target row draws no token; drafts the rule
// cannot judge give the codes that turn into the CPU's errors.
TEST_F(CudaOps, JudgeDraftsMatchTheCpu) {
  auto params = [](float temperature, float top_p, float min_p, int32_t top_k) {
    SamplingParams p;
    p.temperature = temperature, p.top_p = top_p, p.min_p = min_p, p.top_k = top_k;
    return p;
  };
  const SamplingParams settings[] = {params(0.0f, 1.0f, 0.0f, 0), params(1.0f, 1.0f, 0.0f, 0), params(0.7f, 0.9f, 0.0f, 0),
                                     params(1.3f, 1.0f, 0.05f, 40), params(1.0f, 0.95f, 0.0f, 64)};
  for (const int64_t vocab : {1000, 262144}) {
    int stood = 0, fell = 0;
    const int trials = vocab > 1000 ? 20 : 60;
    for (int t = 0; t < trials; ++t) {
      SamplingParams p = settings[t % 5];
      p.seed = 1000 + 17 * uint64_t(t);
      const test::DraftCase c = test::make_draft_case(4, vocab, 1, 3, p, 0.4f, uint32_t(t));
      const test::DraftCaseVerdict want = test::judge_on(cpu_, c), got = test::judge_on(*gpu_, c);
      EXPECT_EQ(got, want) << "vocab " << vocab << ", trial " << t << ": accepted " << want.accepted << ", token "
                           << want.token << " on the CPU";
      ++(want.accepted == c.k ? stood : fell);
    }
    EXPECT_GT(stood, 0) << "vocab " << vocab;
    EXPECT_GT(fell, 0) << "vocab " << vocab;
  }
  SamplingParams p = settings[1];
  test::DraftCase nan_target = test::make_draft_case(3, 1000, 0, 1, p, 0.0f, 5);  // p = q: every draft stands
  nan_target.target[size_t(2 * 1000 + 3)] = std::nanf("");
  EXPECT_EQ(test::judge_on(*gpu_, nan_target), (test::DraftCaseVerdict{2, kNanLogitsToken}));
  EXPECT_EQ(test::judge_on(cpu_, nan_target), (test::DraftCaseVerdict{2, kNanLogitsToken}));
  test::DraftCase nan_draft = nan_target;
  nan_draft.target = test::make_draft_case(3, 1000, 0, 1, p, 0.0f, 5).target;
  nan_draft.draft_logits[size_t(1000 + 9)] = std::nanf("");
  EXPECT_EQ(test::judge_on(*gpu_, nan_draft), (test::DraftCaseVerdict{1, kDraftLogitsNan}));
  EXPECT_THROW(test::judge_on(cpu_, nan_draft), Error);
  test::DraftCase not_a_token = nan_draft;
  not_a_token.draft_tokens[0] = 1000;
  EXPECT_EQ(test::judge_on(*gpu_, not_a_token), (test::DraftCaseVerdict{0, kDraftNotAToken}));
  EXPECT_NE(test::error_of([] { verdict_from(0, kDraftNotAToken); }).find("is not a token id"), std::string::npos);
}

TEST_F(CudaOps, TooLargeAllocationIsAClearError) {
  try {
    gpu_->alloc(DType::BF16, int64_t(1) << 22, int64_t(1) << 20);  // 8 TiB
    FAIL() << "expected an out-of-memory error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos) << e.what();
  }
  Tensor ok = gpu_->alloc(DType::F32, 4, 4);  // the backend still works afterwards
  std::vector<float> zeros(16, 1.0f);
  gpu_->download(ok, zeros.data());
  EXPECT_EQ(zeros[0], 0.0f);
}

// KV pages' size (512 KiB rows): 150 of 200 rows in a scattered order run through both pinned
// halves of the staging twice each (64 rows a half).
TEST_F(CudaOps, RowCopiesLandInTheirRowsThroughThePinnedHalves) {
  std::vector<int32_t> order(200);
  for (int32_t r = 0; r < 200; ++r) order[size_t(r)] = (r * 37) % 200;
  order.resize(150);
  EXPECT_EQ(test::row_copy_mismatches(*gpu_, 200, 131072, order), 0);
}

// ---------------------------------------------------------------- fixtures

class CudaFixture : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    REQUIRE_GPU(gpu_);
    ref_ = test::load_reference(GetParam());
    model_ = load_model(ref_.dir, *gpu_);
  }
  Session new_session(Backend& be, Gemma4& model) {
    SessionOptions o;
    o.max_seq_len = ref_.positions + 1;
    return Session(model, be, o);
  }
  // The bf16 rule: relative L2 within transformers' own bf16 error (plus headroom) over the stored
  // rows, and the reference's greedy token at its clear positions (every one on short fixtures; on
  // long ones at least transformers' bf16 agreement minus kGreedyAgreementSlack).
  void expect_matches_reference(const std::vector<float>& every_position, const std::string& how) {
    ASSERT_EQ(every_position.size(), size_t(ref_.positions * ref_.vocab)) << how;
    const std::vector<float> got = test::stored_rows(every_position, ref_);
    const double err = relative_l2(got, ref_.logits);
    const test::GreedyAgreement greedy = test::greedy_agreement(every_position, ref_);
    std::printf("  %s, %s: relative L2 %.3f (transformers bf16 %.3f), max |dlogit| %.3f, greedy %d of %d clear\n",
                GetParam().c_str(), how.c_str(), err, ref_.transformers_bf16.relative_l2,
                test::max_abs_diff(got, ref_.logits), greedy.agreed, greedy.clear);
    EXPECT_LE(err, kHeadroomOverTransformersBf16 * ref_.transformers_bf16.relative_l2) << how;
    ASSERT_GE(greedy.clear, 1) << how << ": no clear position to check the greedy token at";
    if (ref_.positions >= kLongSequence) {
      EXPECT_GE(greedy.clear, 100) << how;
      EXPECT_GE(greedy.fraction(), ref_.transformers_bf16.clear_greedy_agreement - kGreedyAgreementSlack)
          << how << ": first differing clear position " << greedy.first_disagreement;
    } else {
      EXPECT_EQ(greedy.agreed, greedy.clear) << how << ": first differing clear position " << greedy.first_disagreement;
    }
  }

  std::unique_ptr<Backend> gpu_ = cuda_backend_or_null();
  test::Reference ref_;
  std::unique_ptr<Gemma4> model_;
};

TEST_P(CudaFixture, OnePrefillMatchesEveryPosition) {
  Session s = new_session(*gpu_, *model_);
  expect_matches_reference(s.logits_all(ref_.tokens), "one prefill");
}

TEST_P(CudaFixture, TokenByTokenDecodeMatches) {
  Session s = new_session(*gpu_, *model_);
  std::vector<float> got;
  for (int32_t id : ref_.tokens) {
    s.decode(id);
    auto row = s.last_logits_host();
    got.insert(got.end(), row.begin(), row.end());
  }
  expect_matches_reference(got, "token by token");
}

TEST_P(CudaFixture, ChunkedPrefillMatches) {
  const int64_t window = model_->config().sliding_window;
  for (int64_t chunk : {int64_t(2), int64_t(3), window - 1, window + 1, 2 * window}) {
    Session s = new_session(*gpu_, *model_);
    expect_matches_reference(s.logits_all(ref_.tokens, chunk), "chunk " + std::to_string(chunk));
  }
}

// The hidden states after the first n layers (one chunk of the fixture's tokens).
std::vector<float> hidden_after(Backend& be, const Gemma4& full, int n, std::span<const int32_t> tokens) {
  ModelConfig c = full.config();
  ModelWeights w = full.weights();
  c.layers.resize(size_t(n));
  w.layers.resize(size_t(n));
  const Gemma4 model(c, w);
  const int64_t T = int64_t(tokens.size());
  ForwardBuffers buf(c, be, T);
  std::vector<KvCache> caches;
  for (const LayerConfig& l : c.layers) {
    const int64_t cap = l.sliding ? 2 * int64_t(c.sliding_window) : T;
    const int64_t cols = int64_t(l.kv_heads) * l.head_dim;
    caches.push_back(one_page_kv_cache(be, be.activation_dtype(), cap, cols));
  }
  std::vector<int32_t> pos(tokens.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = int32_t(i);
  Tensor ids = be.alloc(DType::I32, T, 1), positions = be.alloc(DType::I32, T, 1);
  be.upload(tokens.data(), ids);
  be.upload(pos.data(), positions);
  model.forward_layers(be, buf, caches, ids, positions, T);
  const Tensor x = buf.x.rows_view(0, T);
  std::vector<float> out(size_t(x.numel()));
  if (x.dtype == DType::F32) {
    be.download(x, out.data());
  } else {
    std::vector<uint16_t> h(out.size());
    be.download(x, h.data());
    for (size_t i = 0; i < h.size(); ++i) out[i] = bf16_to_f32(h[i]);
  }
  return out;
}

// Relative L2 of the CUDA hidden states against the CPU's after n layers: 1.5 x the largest
// measured at that depth over the five fixtures (H200, 2026-12-01: 1.7e-3, 1.6e-2, 4.9e-2, 0.104,
// 0.154, 0.059, 0.092; random weights amplify bf16 rounding layer by layer). A wrong kernel
// lands near 1.
constexpr double kHiddenErrorBound[] = {2.5e-3, 2.5e-2, 7.4e-2, 0.156, 0.231, 0.089, 0.139};

TEST_P(CudaFixture, HiddenStatesAgreeWithTheCpuLayerByLayer) {
  CpuBackend cpu(2);
  auto cpu_model = load_model(ref_.dir, cpu);
  const int64_t T = std::min<int64_t>(ref_.positions, 2 * model_->config().sliding_window);
  const std::span<const int32_t> tokens(ref_.tokens.data(), size_t(T));
  for (int n = 0; n <= model_->config().num_layers(); ++n) {
    const double err = relative_l2(hidden_after(*gpu_, *model_, n, tokens), hidden_after(cpu, *cpu_model, n, tokens));
    ASSERT_LT(size_t(n), std::size(kHiddenErrorBound)) << "no measured bound for this depth";
    const double bound = kHiddenErrorBound[n];
    std::printf("  %s, hidden after %d layers: relative L2 %.2e (bound %.2e)\n", GetParam().c_str(), n, err, bound);
    EXPECT_LE(err, bound) << "after " << n << " layers";
  }
}

// The top-2 margin of the last logits of a session.
double top2_margin(Session& s) {
  std::vector<float> l = s.last_logits_host();
  std::partial_sort(l.begin(), l.begin() + 2, l.end(), std::greater<float>());
  return double(l[0]) - double(l[1]);
}

// Greedy generations of n tokens on the CPU (cs) and the GPU (gs) agree; they may part only at a
// step whose CPU top-2 margin is within kGreedyMargin (after that the sequences legitimately
// differ). Returns the number of identical steps.
int expect_same_greedy_generation(Session& cs, Session& gs, std::span<const int32_t> prompt, int n) {
  const Sampler greedy(SamplingParams{.temperature = 0.0f});
  cs.prefill(prompt);
  gs.prefill(prompt);
  int agreed = 0;
  for (; agreed < n; ++agreed) {
    const int64_t want = cs.sample(greedy), got = gs.sample(greedy);
    if (got != want) {
      EXPECT_LE(top2_margin(cs), kGreedyMargin) << "tokens differ at step " << agreed << " despite a clear margin";
      break;
    }
    if (agreed + 1 < n) cs.decode(int32_t(want)), gs.decode(int32_t(got));
  }
  std::printf("  greedy tokens identical to the CPU for %d of %d steps\n", agreed, n);
  return agreed;
}

TEST_P(CudaFixture, GreedyGenerationEqualsTheCpuBackend) {
  CpuBackend cpu(2);
  auto cpu_model = load_model(ref_.dir, cpu);
  Session cs = new_session(cpu, *cpu_model), gs = new_session(*gpu_, *model_);
  expect_same_greedy_generation(cs, gs, std::span<const int32_t>(ref_.tokens.data(), 12), int(ref_.positions) - 12);
}

TEST_P(CudaFixture, GraphDecodeEqualsPlainDecode) {
  const std::span<const int32_t> prompt(ref_.tokens.data(), 12);
  const int n = int(ref_.positions) - 12;
  for (SamplingParams p : {SamplingParams{0.0f, 1.0f, 0.0f, 0, 3}, SamplingParams{1.0f, 0.95f, 0.0f, 64, 3}}) {
    Session plain = new_session(*gpu_, *model_);
    const std::vector<int64_t> want = test::generate_plain(plain, prompt, p, n);
    const std::vector<float> want_logits = plain.last_logits_host();

    Session s = new_session(*gpu_, *model_);
    EXPECT_EQ(test::generate_with_graph(s, prompt, p, n), want) << "temperature " << p.temperature;
    EXPECT_EQ(s.position(), plain.position());
    EXPECT_LE(relative_l2(s.last_logits_host(), want_logits), 1e-5);
  }
}

std::string fixture_test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaFixture,
                         ::testing::Values("tiny-31b-style", "tiny-31b-style-bf16", "published-layout",
                                           "long-31b-heads", "long-published-layout", "real-head-dims"),
                         fixture_test_name);

// The bf16 bound itself (relative L2 <= 1e-2) on a trained model: transformers' float64 logits of
// the demo model (tests/fixtures/demo/transformers, computed from its Hugging Face checkpoint by
// tools/fixtures/demo_reference_logits.py) at every position of real text, by one-shot prefill, token by
// token and in chunks; the greedy token must match at every clear position, and most positions of
// a trained model are clear. Random-weight fixtures amplify rounding (transformers' own bf16
// misses 1e-2 on them); a trained model does not.
TEST(CudaDemoModel, LogitsMatchTransformersWithinTheBf16Bound) {
  auto gpu = cuda_backend_or_null();
  REQUIRE_GPU(gpu);
  const test::Reference ref = test::load_demo_reference();
  auto model = load_model(test::fortune_demo_path(), *gpu);
  SessionOptions o;
  o.max_seq_len = ref.positions + 1;
  Session s(*model, *gpu, o);
  const std::vector<float> prefill = s.logits_all(ref.tokens);
  s.reset();
  const std::vector<float> chunked = s.logits_all(ref.tokens, 7);
  std::vector<float> decode;
  s.reset();
  for (int32_t t : ref.tokens) {
    s.prefill(std::span<const int32_t>(&t, 1));
    const std::vector<float> row = s.last_logits_host();
    decode.insert(decode.end(), row.begin(), row.end());
  }
  using Named = std::pair<const char*, const std::vector<float>*>;
  for (const auto& [what, got] :
       {Named{"one-shot prefill", &prefill}, Named{"chunks of 7", &chunked}, Named{"token by token", &decode}}) {
    const double err = relative_l2(test::stored_rows(*got, ref), ref.logits);
    const test::GreedyAgreement greedy = test::greedy_agreement(*got, ref);
    std::printf("  demo model vs transformers float64, %s, %lld positions: relative L2 %.2e, greedy %d of %d clear\n",
                what, static_cast<long long>(ref.positions), err, greedy.agreed, greedy.clear);
    EXPECT_LE(err, kRelativeL2) << what;
    EXPECT_GE(greedy.clear, ref.positions / 4) << what << ": too few clear positions for a trained model";
    EXPECT_EQ(greedy.agreed, greedy.clear) << what << ": first differing clear position " << greedy.first_disagreement;
  }
}

// The demo's greedy chat reply on the CPU (float32) and the GPU (bf16): the same tokens until a
// step whose top-2 margin is within the bf16 error, where they may legitimately part (measured
// 2026-12-01: the first 6 tokens agree). This, not tools/gpu/gpu_check.sh's token-for-token print, is
// the CPU/CUDA agreement check.
TEST(CudaDemoModel, GreedyGenerationEqualsTheCpuUntilAnUnclearMargin) {
  auto gpu = cuda_backend_or_null();
  REQUIRE_GPU(gpu);
  CpuBackend cpu(2);
  const std::string demo = test::fortune_demo_path();
  auto cpu_model = load_model(demo, cpu), gpu_model = load_model(demo, *gpu);
  const auto golden = nlohmann::json::parse(std::ifstream(std::string(G4_FIXTURES_DIR) + "/demo/golden.json"));
  const std::vector<int32_t> prompt = golden["continuations"][0]["prompt_ids"].get<std::vector<int32_t>>();
  SessionOptions o;
  o.max_seq_len = 256;
  Session cs(*cpu_model, cpu, o), gs(*gpu_model, *gpu, o);
  EXPECT_GE(expect_same_greedy_generation(cs, gs, prompt, 128), 1);
}

TEST(CudaSession, TooLargeMaxSeqLenIsAClearOutOfMemoryError) {
  auto gpu = cuda_backend_or_null();
  REQUIRE_GPU(gpu);
  auto model = load_model(test::fixture_dir("tiny-31b-style"), *gpu);
  ModelConfig config = model->config();
  config.max_position_embeddings = int64_t(1) << 40;
  Gemma4 huge(config, model->weights());
  SessionOptions o;
  o.max_seq_len = int64_t(1) << 38;  // the full layer's flat cache alone would need 16 TiB
  try {
    Session s(huge, *gpu, o);
    s.prefill(std::vector<int32_t>{2});  // a session takes its caches when it first runs tokens
    FAIL() << "expected an out-of-memory error";
  } catch (const Error& e) {
    // The KV pool's pages are settled when the session's runner is made: before any forward.
    EXPECT_EQ(e.kind(), ErrorKind::kResourceExhausted) << e.what();
    EXPECT_NE(std::string(e.what()).find("out of KV memory"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("lower --max_seq_len"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace g4
