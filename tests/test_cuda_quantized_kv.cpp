// Attention over quantized KV caches (Q8_0, TQ4) on CUDA against the CPU reference
// (backend/cpu/attention.h): the rows the store writes against cpu::encode_kv_row's, prefill
// chunks and decode steps through shuffled page tables on full and sliding layers, a long
// context's many decode splits, a decode batch against each sequence alone (bit for bit), and the
// demo model's logits and greedy tokens with quantized caches. Skips without CUDA or a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/attention.h"
#include "model/loader.h"
#include "model/kv_types.h"
#include "runtime/session.h"
#include "sampling/sampler.h"
#include "support/cuda_vs_cpu.h"
#include "support/demo_engine.h"
#include "support/fixtures.h"
#include "util/half.h"

namespace g4 {
namespace {

using test::Both;
using test::random_values;
using test::relative_l2;

// The CUDA kernels take the queries (TQ4: rotated) and the cache's values into the tensor cores as
// f16 (2^-11 relative) and round P to f16 and the output to bf16 (2^-9): together about 2e-3 of
// relative L2, and about 4e-3 of max|out| for the worst value. The bounds leave 5x headroom; a key
// read from another row, a rotation sign lost or a split dropped costs tens of percent.
constexpr double kRelativeL2 = 1e-2;
constexpr double kMaxAbsOfMax = 2e-2;
// Codes that may differ from the CPU's: TQ4 sums a head's squares in another order than the
// host's, which moves a code only where z lies on a boundary.
constexpr double kCodesEqual = 0.999;
// The demo model: the bf16 bound on a trained model (docs/DESIGN.md, "Oracles"; CUDA's demo
// logits measure 3.85e-3 against transformers' float64) plus what the quantized caches add where
// their rows come from bf16 activations rather than float32 (the CPU with its q/k/v rounded to bf16
// moves the demo's logits by 6.7e-3 with tq4 full and q8_0 sliding layers).
constexpr double kDemoRelativeL2 = 2e-2;

struct Layer {
  int heads, kv_heads, head_dim, window;
  std::string name(DType type) const {
    return dtype_name(type) + " heads " + std::to_string(heads) + "/" + std::to_string(kv_heads) + " hd " +
           std::to_string(head_dim) + (window ? " window " + std::to_string(window) : " full");
  }
};

// A chunk of T tokens whose last `queries` ask for outputs (-1: all of them).
struct Chunk {
  int64_t T, queries = -1;
};

// One layer's cache in pages on a backend, as the KV pool lays them out: an arena of pages of
// page_positions K rows then their V rows, and a table naming `slots` of them in shuffled order
// (more pages than slots: others lie between).
struct PagedCache {
  KvCache cache;
  Tensor arena;  // the pages' bytes, as I32 words
  std::vector<int32_t> table;
  int64_t page_positions = 0, row_bytes = 0;
  int64_t row(int64_t p) const {
    return int64_t(table[size_t((p / page_positions) % int64_t(table.size()))]) * 2 * page_positions +
           p % page_positions;
  }
};

PagedCache paged_cache(Backend& be, DType type, const Layer& l, int64_t page_positions, int64_t slots,
                       const std::vector<int32_t>& table) {
  const int64_t cols = kv_cache_cols(type, l.kv_heads, l.head_dim), pages = 2 * slots + 1;
  PagedCache c;
  c.page_positions = page_positions;
  c.row_bytes = int64_t(row_bytes(type, cols));
  c.table = table;
  c.arena = be.alloc(DType::I32, 1, pages * 2 * page_positions * c.row_bytes / 4);
  Tensor k = c.arena;
  k.dtype = type;
  k = k.reshaped(pages * 2 * page_positions, cols);
  c.cache = KvCache{k, k.rows_view(page_positions, k.rows - page_positions), be.alloc(DType::I32, slots, 1),
                    page_positions, 2 * page_positions};
  be.upload(table.data(), c.cache.table);
  return c;
}

// `slots` pages of 2 slots + 1 in shuffled order.
std::vector<int32_t> shuffled_table(int64_t slots, uint32_t seed) {
  std::vector<int32_t> order(size_t(2 * slots + 1));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(seed));
  order.resize(size_t(slots));
  return order;
}

std::vector<uint8_t> bytes_of(Backend& be, const Tensor& t) {
  std::vector<uint8_t> out(t.bytes());
  be.download(t, out.data());
  return out;
}

uint16_t u16_at(const uint8_t* p) { return uint16_t(p[0] | p[1] << 8); }

// Two f16 or bf16 numbers at most one unit in the last place apart (both NaN, or of one sign and
// bits at most 1 apart).
bool within_one_ulp(uint16_t a, uint16_t b, bool bf16) {
  const auto is_nan = [&](uint16_t x) { return bf16 ? std::isnan(bf16_to_f32(x)) : std::isnan(f16_to_f32(x)); };
  if (is_nan(a) || is_nan(b)) return is_nan(a) && is_nan(b);
  return (a & 0x8000) == (b & 0x8000) && std::abs(int(a & 0x7fff) - int(b & 0x7fff)) <= 1;
}

// How a stored row compares with the CPU encoder's: codes (TQ4) or quants (Q8_0) equal, norms or
// scales off by more than one ulp, other bytes (TQ4's padding) different.
struct RowComparison {
  int64_t codes = 0, codes_equal = 0, scales_off = 0, other_bytes_off = 0;
  void add(DType type, const uint8_t* got, const uint8_t* want, const Layer& l, int64_t row_bytes) {
    const int64_t hd = l.head_dim;
    if (type == DType::Q8_0) {
      for (int64_t b = 0; b < l.kv_heads * hd / kQ8BlockSize; ++b) {
        const uint8_t *g = got + b * kQ8BlockBytes, *w = want + b * kQ8BlockBytes;
        scales_off += !within_one_ulp(u16_at(g), u16_at(w), false);
        for (int64_t i = 2; i < kQ8BlockBytes; ++i) codes_equal += g[i] == w[i];
        codes += kQ8BlockBytes - 2;
      }
      return;
    }
    const int64_t code_bytes = l.kv_heads * hd / 2;
    for (int64_t i = 0; i < code_bytes; ++i) {
      codes_equal += (got[i] & 15) == (want[i] & 15);
      codes_equal += (got[i] >> 4) == (want[i] >> 4);
      codes += 2;
    }
    for (int h = 0; h < l.kv_heads; ++h)
      scales_off += !within_one_ulp(u16_at(got + code_bytes + 2 * h), u16_at(want + code_bytes + 2 * h), true);
    for (int64_t i = code_bytes + 2 * l.kv_heads; i < row_bytes; ++i) other_bytes_off += got[i] != want[i];
  }
  void expect_close(const std::string& what) const {
    EXPECT_GE(double(codes_equal), kCodesEqual * double(codes)) << what << ": " << codes - codes_equal << " of "
                                                                << codes << " codes differ";
    EXPECT_EQ(scales_off, 0) << what << ": norms or scales more than one ulp off";
    EXPECT_EQ(other_bytes_off, 0) << what << ": padding bytes";
  }
};

class CudaQuantizedKv : public test::CudaVsCpu {
 protected:
  // Attention of one chunk on both backends; returns the GPU's and the CPU's outputs.
  std::pair<std::vector<float>, std::vector<float>> attend(const Layer& l, PagedCache& cpu_cache,
                                                           PagedCache& gpu_cache, int32_t pos, const Chunk& chunk) {
    const int64_t T = chunk.T, queries = chunk.queries >= 0 ? chunk.queries : T;
    const int64_t kv_cols = int64_t(l.kv_heads) * l.head_dim, q_cols = int64_t(l.heads) * l.head_dim;
    std::vector<int32_t> p(static_cast<size_t>(T));
    std::iota(p.begin(), p.end(), pos);
    Both positions = raw(DType::I32, T, 1, p.data());
    Both q = activation(queries, q_cols), k = activation(T, kv_cols, 2.0f), v = activation(T, kv_cols, 1.5f);
    Both out = activation(queries, q_cols);
    AttentionArgs a;
    a.heads = l.heads, a.kv_heads = l.kv_heads, a.head_dim = l.head_dim, a.window = l.window;
    a.scale = 4.0f / std::sqrt(float(l.head_dim));  // scores of a few units: a softmax neither flat nor one-hot
    a.q_first = T - queries;
    AttentionArgs g = a;
    a.q = q.cpu, a.k_new = k.cpu, a.v_new = v.cpu, a.positions = positions.cpu, a.out = out.cpu;
    a.cache = &cpu_cache.cache;
    g.q = q.gpu, g.k_new = k.gpu, g.v_new = v.gpu, g.positions = positions.gpu, g.out = out.gpu;
    g.cache = &gpu_cache.cache;
    g.last_position = pos + T - 1;
    cpu_.attention(a);
    gpu_->attention(g);
    return {read(*gpu_, out.gpu), read(cpu_, out.cpu)};
  }

  // Chunk after chunk through one layer on both backends, over caches paged alike: every output
  // within the bounds of the CPU's. A sliding layer's cache is a ring of the window and the largest
  // chunk, or with `as_long_as_the_context` as many pages as the chunks' positions (the pool's layout
  // when the context is no longer than that ring).
  void expect_chunks_match(DType type, const Layer& l, const std::vector<Chunk>& chunks, int64_t page_positions,
                           bool as_long_as_the_context = false) {
    const int64_t total = std::accumulate(chunks.begin(), chunks.end(), int64_t(0),
                                          [](int64_t n, const Chunk& c) { return n + c.T; });
    int64_t largest = 0;
    for (const Chunk& c : chunks) largest = std::max(largest, c.T);
    // The pool's rule for a quantized ring: the window and the largest chunk (kv_page_layout).
    const int64_t slots = l.window && !as_long_as_the_context
                              ? (l.window + largest + page_positions - 1) / page_positions + 1
                              : (total + page_positions - 1) / page_positions;
    const std::vector<int32_t> table = shuffled_table(slots, seed_++);
    PagedCache cpu_cache = paged_cache(cpu_, type, l, page_positions, slots, table);
    PagedCache gpu_cache = paged_cache(*gpu_, type, l, page_positions, slots, table);
    int32_t pos = 0;
    for (const Chunk& c : chunks) {
      const auto [got, want] = attend(l, cpu_cache, gpu_cache, pos, c);
      const std::string what = l.name(type) + " at " + std::to_string(pos) + " T=" + std::to_string(c.T);
      if (!want.empty()) expect_outputs_close(got, want, what);
      pos += int32_t(c.T);
    }
  }

  static void expect_outputs_close(const std::vector<float>& got, const std::vector<float>& want,
                                   const std::string& what) {
    double largest = 0;
    for (float x : want) largest = std::max(largest, double(std::fabs(x)));
    EXPECT_LE(relative_l2(got, want), kRelativeL2) << what;
    EXPECT_LE(test::max_abs_diff(got, want), kMaxAbsOfMax * largest) << what;
  }
};

const std::vector<Layer>& layers() {
  static const std::vector<Layer> all = {
      {8, 1, 128, 0},   // a group of 8 over one kv head
      {4, 2, 256, 48},  // 31B sliding head dim, a ring
      {4, 4, 512, 0},   // 31B full head dim, group 1
      {16, 2, 512, 0},  // 31B full layer's group of 8
      {8, 4, 128, 40},  // group 2, a ring
      {2, 2, 256, 0},   // group 1
      {4, 2, 64, 24},   // the demo's sliding head dim
  };
  return all;
}

// The store alone (a chunk with no queries): each stored row against cpu::encode_kv_row of the same
// values, a NaN and an infinity among them (their Q8_0 blocks get a NaN scale and zero quants,
// their TQ4 heads a NaN or infinite norm), at the positions' rows of a shuffled page table.
TEST_F(CudaQuantizedKv, StoredRowsAreTheCpuEncodersRows) {
  for (DType type : {DType::Q8_0, DType::TQ4})
    for (const Layer& l : layers()) {
      const int64_t T = 45, pos0 = 11, page_positions = 16, slots = 8;  // a ring of the window and the chunk
      const int64_t kv_cols = int64_t(l.kv_heads) * l.head_dim;
      PagedCache cache = paged_cache(*gpu_, type, l, page_positions, slots, shuffled_table(slots, seed_++));
      std::vector<float> k = random_values(size_t(T * kv_cols), 2.0f, seed_++);
      std::vector<float> v = random_values(size_t(T * kv_cols), 1.5f, seed_++);
      k[size_t(3 * kv_cols + 5)] = std::numeric_limits<float>::quiet_NaN();
      v[size_t(7 * kv_cols + kv_cols - 1)] = std::numeric_limits<float>::infinity();
      std::vector<int32_t> p(static_cast<size_t>(T));
      std::iota(p.begin(), p.end(), int32_t(pos0));
      AttentionArgs a;
      a.q = gpu_->alloc(DType::BF16, 0, int64_t(l.heads) * l.head_dim);
      a.out = gpu_->alloc(DType::BF16, 0, int64_t(l.heads) * l.head_dim);
      a.k_new = activation(T, kv_cols, k).gpu;
      a.v_new = activation(T, kv_cols, v).gpu;
      a.positions = raw(DType::I32, T, 1, p.data()).gpu;
      a.cache = &cache.cache;
      a.heads = l.heads, a.kv_heads = l.kv_heads, a.head_dim = l.head_dim, a.window = l.window;
      a.q_first = T;
      gpu_->attention(a);
      const std::vector<uint8_t> stored = bytes_of(*gpu_, cache.arena);
      RowComparison compare;
      std::vector<uint8_t> want(size_t(cache.row_bytes));
      for (int64_t t = 0; t < T; ++t)
        for (const std::vector<float>* rows : {&k, &v}) {
          cpu::encode_kv_row(type, rows->data() + t * kv_cols, l.kv_heads, l.head_dim, want.data());
          const int64_t row = cache.row(pos0 + t) + (rows == &v ? page_positions : 0);
          compare.add(type, stored.data() + row * cache.row_bytes, want.data(), l, cache.row_bytes);
        }
      compare.expect_close("store " + l.name(type));
    }
}

// Prefill chunks (every query, the last one only, or none, as a prompt's last layer) and decode
// steps through shuffled pages, full layers and rings that wrap, every head dim and group the
// kernels take: each output within the bounds of the CPU's.
TEST_F(CudaQuantizedKv, ChunksAndDecodeStepsMatchTheCpu) {
  const std::vector<Chunk> chunks = {{37}, {1}, {1}, {1}, {20, 1}, {1}, {1}, {70}, {1}, {9, 0}, {1}};
  for (DType type : {DType::Q8_0, DType::TQ4})
    for (const Layer& l : layers()) expect_chunks_match(type, l, chunks, l.head_dim == 64 ? 8 : 16);
}

// Sliding layers whose cache holds the whole context (64 positions) but not the window and a chunk
// (48 + 29 and 40 + 29): the chunks never wrap, so they run, and match the CPU.
TEST_F(CudaQuantizedKv, ChunksOverACacheAsLongAsTheContextMatchTheCpu) {
  const std::vector<Chunk> chunks = {{30}, {1}, {17}, {1}};
  for (DType type : {DType::Q8_0, DType::TQ4})
    for (const Layer& l : {Layer{4, 2, 256, 48}, Layer{8, 4, 128, 40}}) expect_chunks_match(type, l, chunks, 16, true);
}

// 20 000 positions: prefill chunks of 4 000 (their last query compared), then decode steps whose
// keys spread over 105 splits of three 64-key tiles each, merged.
TEST_F(CudaQuantizedKv, LongContextDecodeOverManySplitsMatchesTheCpu) {
  std::vector<Chunk> chunks(5, Chunk{4000, 1});
  chunks.insert(chunks.end(), 3, Chunk{1});
  for (DType type : {DType::Q8_0, DType::TQ4}) expect_chunks_match(type, Layer{8, 1, 512, 0}, chunks, 64);
}

// A decode batch (one token per sequence, each over its own paged cache at its own position, as
// the model runs it: head norms, then attention) in the batched launches against each sequence run
// alone: the same bits in the outputs and the caches. 70 sequences span two launches of 64.
TEST_F(CudaQuantizedKv, DecodeBatchGivesEachSequenceItsAloneBits) {
  const int64_t S = 70, page_positions = 32;
  for (DType type : {DType::Q8_0, DType::TQ4})
    for (const Layer& l : {Layer{16, 2, 128, 0}, Layer{8, 4, 256, 64}, Layer{16, 2, 512, 0}}) {
      const int64_t hd = l.head_dim, kv_cols = int64_t(l.kv_heads) * hd, q_cols = int64_t(l.heads) * hd;
      const int64_t slots = l.window ? (l.window + page_positions - 1) / page_positions + 1 : 10;
      const int64_t capacity = slots * page_positions;
      Both inv_freq = rope_inv_freq(hd, hd / 8);
      Both q_w = weight(0, hd, DType::BF16, 1.0f, 0.2f), k_w = weight(0, hd, DType::BF16, 1.0f, 0.2f);
      // Positions from 0 to past a ring's wrap (flat caches: below the capacity).
      std::vector<int32_t> p(static_cast<size_t>(S));
      for (int64_t i = 0; i < S; ++i) p[size_t(i)] = int32_t((7 * i + 3) % (l.window ? 3 * capacity : capacity));
      Both positions = raw(DType::I32, S, 1, p.data());
      // The raw projections twice: the head norms run in place, once for the batch, once alone.
      const std::vector<float> qv = random_values(size_t(S * q_cols), 3.0f, seed_++),
                               kv = random_values(size_t(S * kv_cols), 2.0f, seed_++),
                               vv = random_values(size_t(S * kv_cols), 1.5f, seed_++);
      Both q = activation(S, q_cols, qv), k = activation(S, kv_cols, kv), v = activation(S, kv_cols, vv);
      Both q2 = activation(S, q_cols, qv), k2 = activation(S, kv_cols, kv), v2 = activation(S, kv_cols, vv);
      Both out = activation(S, q_cols), out_alone = activation(S, q_cols);
      // Every row of every page holds a key and a value already (rows of a pool encoded once).
      const int64_t row_bytes = int64_t(::g4::row_bytes(type, kv_cache_cols(type, l.kv_heads, int(hd))));
      constexpr int64_t kPoolRows = 97;
      std::vector<uint8_t> pool(size_t(kPoolRows * row_bytes));
      const std::vector<float> pool_values = random_values(size_t(kPoolRows * kv_cols), 2.0f, seed_++);
      for (int64_t r = 0; r < kPoolRows; ++r)
        cpu::encode_kv_row(type, pool_values.data() + r * kv_cols, l.kv_heads, int(hd), pool.data() + r * row_bytes);
      std::vector<PagedCache> batched, alone;
      for (int64_t i = 0; i < S; ++i) {
        const std::vector<int32_t> table = shuffled_table(slots, seed_++);
        batched.push_back(paged_cache(*gpu_, type, l, page_positions, slots, table));
        alone.push_back(paged_cache(*gpu_, type, l, page_positions, slots, table));
        std::vector<uint8_t> bytes(batched.back().arena.bytes());
        for (int64_t r = 0; r < int64_t(bytes.size()) / row_bytes; ++r)
          std::memcpy(bytes.data() + r * row_bytes, pool.data() + (r * 31 + i) % kPoolRows * row_bytes,
                      size_t(row_bytes));
        gpu_->upload(bytes.data(), batched.back().arena);
        gpu_->upload(bytes.data(), alone.back().arena);
      }
      // Sequence i's arguments, as the model makes them: row i of every tensor.
      auto sequence = [&](int64_t i, const Both& qt, const Both& kt, const Both& vt, const Tensor& ot,
                          PagedCache& cache) {
        const Tensor qi = qt.gpu.rows_view(i, 1), ki = kt.gpu.rows_view(i, 1), vi = vt.gpu.rows_view(i, 1);
        const Tensor kh = ki.reshaped(l.kv_heads, hd), vh = vi.reshaped(l.kv_heads, hd);
        HeadNorms n{qi.reshaped(l.heads, hd), q_w.gpu, kh, k_w.gpu, vh, vh, positions.gpu.rows_view(i, 1),
                    inv_freq.gpu, 1e-6f};
        AttentionArgs a;
        a.q = qi, a.k_new = ki, a.v_new = vi, a.out = ot.rows_view(i, 1), a.cache = &cache.cache;
        a.positions = positions.gpu.rows_view(i, 1);
        a.heads = l.heads, a.kv_heads = l.kv_heads, a.head_dim = l.head_dim, a.window = l.window;
        a.scale = 1.0f / std::sqrt(float(hd));
        a.last_position = p[size_t(i)];
        return std::pair{n, a};
      };
      std::vector<HeadNorms> norms;
      std::vector<AttentionArgs> args;
      for (int64_t i = 0; i < S; ++i) {
        auto [n, a] = sequence(i, q, k, v, out.gpu, batched[size_t(i)]);
        norms.push_back(n);
        args.push_back(a);
      }
      gpu_->normed_attention_batch(norms, args);
      for (int64_t i = 0; i < S; ++i) {
        auto [n, a] = sequence(i, q2, k2, v2, out_alone.gpu, alone[size_t(i)]);
        gpu_->normed_attention(n, a);
      }
      const std::string what = "decode batch " + l.name(type);
      EXPECT_EQ(read(*gpu_, out.gpu), read(*gpu_, out_alone.gpu)) << what << ": outputs";
      for (int64_t i = 0; i < S; ++i)
        EXPECT_EQ(bytes_of(*gpu_, batched[size_t(i)].arena), bytes_of(*gpu_, alone[size_t(i)].arena))
            << what << ": cache " << i;
    }
}

// The greedy token of every position of `logits` ([positions][vocab]) against `want`'s, at the
// positions where want's top-2 margin exceeds test::kClearMargin.
void expect_clear_tokens_agree(const std::vector<float>& got, const std::vector<float>& want, int64_t vocab,
                               const std::string& what) {
  int clear = 0, agreed = 0;
  for (size_t at = 0; at + size_t(vocab) <= want.size(); at += size_t(vocab)) {
    std::vector<float> row(want.begin() + std::ptrdiff_t(at), want.begin() + std::ptrdiff_t(at) + vocab);
    const auto best = std::max_element(row.begin(), row.end()) - row.begin();
    std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<float>());
    if (double(row[0]) - double(row[1]) <= test::kClearMargin) continue;
    ++clear;
    agreed += std::max_element(got.begin() + std::ptrdiff_t(at), got.begin() + std::ptrdiff_t(at) + vocab) -
                  (got.begin() + std::ptrdiff_t(at)) ==
              best;
  }
  EXPECT_GT(clear, 0) << what << ": no clear position";
  EXPECT_EQ(agreed, clear) << what << ": greedy tokens at clear positions";
}

// The demo model on the CPU and on the GPU, and its transformers reference; skips without a GPU.
class CudaQuantizedKvDemo : public ::testing::Test {
 protected:
  void SetUp() override {
    G4_SKIP_OR_FAIL_WITHOUT_GPU(gpu_);
    ref_ = test::load_demo_reference();
    cpu_model_ = load_model(test::fortune_demo_path(), cpu_);
    gpu_model_ = load_model(test::fortune_demo_path(), *gpu_);
  }
  std::unique_ptr<Backend> gpu_ = test::cuda_backend_or_null();
  CpuBackend cpu_{2};
  test::Reference ref_;
  std::unique_ptr<Gemma4> cpu_model_, gpu_model_;
};

// The demo model with quantized caches (full layers tq4 and sliding q8_0, then full q8_0 and
// sliding bf16) on CUDA against the CPU with the same caches: the reference text's logits by
// chunks of 7 and token by token (the prefill and the decode kernels) within kDemoRelativeL2 and
// with the CPU's greedy token wherever its margin is clear; then a greedy generation of 32 tokens
// after the golden prompt, the same tokens until a step whose margin is not clear.
TEST_F(CudaQuantizedKvDemo, LogitsAndGreedyTokensFollowTheCpu) {
  const auto golden = nlohmann::json::parse(std::ifstream(std::string(G4_FIXTURES_DIR) + "/demo/golden.json"));
  const std::vector<int32_t> prompt = golden["continuations"][0]["prompt_ids"].get<std::vector<int32_t>>();
  for (KvTypes types : {KvTypes{KvType::kTq4, KvType::kQ8_0}, KvTypes{KvType::kQ8_0, KvType::kBf16}}) {
    const std::string kinds = "full " + kv_type_name(types.full) + ", sliding " + kv_type_name(types.sliding);
    SessionOptions o;
    o.max_seq_len = 256;
    o.kv_types = types;
    Session cs(*cpu_model_, cpu_, o), gs(*gpu_model_, *gpu_, o);
    const std::vector<float> want = cs.logits_all(ref_.tokens, 7);
    const std::vector<float> chunked = gs.logits_all(ref_.tokens, 7);
    gs.reset();
    std::vector<float> decoded;  // logits row by row
    for (int32_t t : ref_.tokens) {
      gs.prefill(std::span<const int32_t>(&t, 1));
      const std::vector<float> row = gs.last_logits_host();
      decoded.insert(decoded.end(), row.begin(), row.end());
    }
    using Named = std::pair<const char*, const std::vector<float>*>;
    for (const auto& [how, got] : {Named{"chunks of 7", &chunked}, Named{"token by token", &decoded}}) {
      const std::string what = kinds + ", " + how;
      const double err = relative_l2(*got, want);
      std::printf("  demo model, %s: relative L2 %.2e against the CPU\n", what.c_str(), err);
      EXPECT_LE(err, kDemoRelativeL2) << what;
      expect_clear_tokens_agree(*got, want, cs.vocab_size(), what);
    }

    cs.reset();
    gs.reset();
    const Sampler greedy(SamplingParams{.temperature = 0.0f});
    cs.prefill(prompt);
    gs.prefill(prompt);
    int agreed = 0;
    for (; agreed < 32; ++agreed) {
      const int64_t token = cs.sample(greedy);
      if (gs.sample(greedy) != token) {
        std::vector<float> l = cs.last_logits_host();
        std::partial_sort(l.begin(), l.begin() + 2, l.end(), std::greater<float>());
        EXPECT_LE(double(l[0]) - double(l[1]), test::kClearMargin)
            << kinds << ": tokens differ at step " << agreed << " despite a clear margin";
        break;
      }
      cs.decode(int32_t(token));
      gs.decode(int32_t(token));
    }
    std::printf("  demo model, %s: greedy tokens identical to the CPU for %d of 32 steps\n", kinds.c_str(), agreed);
    EXPECT_GE(agreed, 1) << kinds;
  }
}

// A context no longer than the sliding window (the demo's 128, the least it takes: what a batch of
// short chats gets) has sliding caches as long as the context, shorter than the window and a chunk:
// q8_0 caches in chunks of 60 run and follow the CPU.
TEST_F(CudaQuantizedKvDemo, AContextAsShortAsTheWindowRunsInChunks) {
  SessionOptions o;
  o.max_seq_len = 128;
  o.kv_types = KvTypes{KvType::kQ8_0, KvType::kQ8_0};
  Session cs(*cpu_model_, cpu_, o), gs(*gpu_model_, *gpu_, o);
  const std::vector<int32_t> tokens(ref_.tokens.begin(), ref_.tokens.begin() + std::min<ptrdiff_t>(120, ptrdiff_t(ref_.tokens.size())));
  const std::vector<float> want = cs.logits_all(tokens, 60), got = gs.logits_all(tokens, 60);
  EXPECT_LE(relative_l2(got, want), kDemoRelativeL2);
  expect_clear_tokens_agree(got, want, cs.vocab_size(), "q8_0 caches, a context of 128");
}

}  // namespace
}  // namespace g4
