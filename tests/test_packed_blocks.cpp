// The CUDA backend's packed weight layout and its integer dot products (backend/cuda/packed_blocks.h),
// run on the CPU: the functions are shared by host and device, so these checks cover the bit
// layouts, the dp2a pairing and the offset/minimum terms the GPU kernels use, on any machine.
// Packing a GGUF tensor and reading it back gives decode_row's values bit for bit, every byte of the
// packed tensor is written, the int16-activation dot product equals the float dot product of the
// quantized activations to float rounding, the batch GEMV's tensor-core parts give that dot exactly,
// and random blocks for synthetic weights are valid.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/packed_blocks.h"
#include "quant/block_formats.h"
#include "quant/quantize.h"
#include "quant/random_blocks.h"
#include "support/fixtures.h"
#include "support/quant_stress_rows.h"
#include "util/half.h"

namespace g4 {
namespace {

using namespace packed;

constexpr DType kBlockTypes[] = {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                                 DType::Q5_1, DType::Q4_K, DType::Q5_K, DType::Q6_K};

// A GGUF-layout matrix of random bytes whose f16 scale fields are finite: every bit pattern a file
// can hold (negative Q6_K scales, Q8_0's -128, K-quant scales with their top bits set).
std::vector<uint8_t> random_gguf(DType t, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(row_bytes(t, cols) * size_t(rows));
  for (uint8_t& b : bytes) b = uint8_t(rng());
  const size_t block = block_bytes(t);
  for (size_t at = 0; at < bytes.size(); at += block) {
    const size_t fields[] = {t == DType::Q6_K ? size_t(208) : 0, t == DType::Q6_K ? size_t(208) : 2};
    for (size_t f : fields)
      if ((bytes[at + f + 1] & 0x7c) == 0x7c) bytes[at + f + 1] &= 0xbf;  // exponent all ones: not finite
  }
  return bytes;
}

// The matrix as the quant codecs store values of quant_stress_value (zero blocks, outliers, offsets).
std::vector<uint8_t> encoded_gguf(DType t, int64_t rows, int64_t cols, uint64_t first) {
  std::vector<float> values(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < values.size(); ++i) values[i] = test::quant_stress_value(first + i);
  std::vector<uint8_t> bytes(row_bytes(t, cols) * size_t(rows));
  for (int64_t r = 0; r < rows; ++r)
    encode_row(t, values.data() + r * cols, cols, bytes.data() + size_t(r) * row_bytes(t, cols));
  return bytes;
}

// The packed form of a GGUF matrix, starting from `fill` bytes.
std::vector<uint8_t> pack(DType t, const std::vector<uint8_t>& gguf, int64_t rows, int64_t cols, uint8_t fill) {
  std::vector<uint8_t> out(gguf.size(), fill);
  const size_t block = block_bytes(t);
  const int64_t per_row = cols / block_size(t);
  with_block_type(t, [&](auto type) {
    for (int64_t r = 0; r < rows; ++r) {
      const RowRegions<uint8_t> regions = row_regions<decltype(type)::value>(out.data(), rows, cols, r);
      for (int64_t i = 0; i < per_row; ++i)
        pack_block<decltype(type)::value>(gguf.data() + size_t(r * per_row + i) * block, regions, i);
    }
  });
  return out;
}

// Every weight of a packed matrix as the GPU reads it.
std::vector<float> unpack(DType t, const std::vector<uint8_t>& packed, int64_t rows, int64_t cols) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  with_block_type(t, [&](auto type) {
    constexpr DType kType = decltype(type)::value;
    for (int64_t r = 0; r < rows; ++r) {
      const RowRegions<const uint8_t> regions = row_regions<kType>(packed.data(), rows, cols, r);
      for (int64_t b = 0; b < cols / kBlock; ++b) {
        const BlockWeights w = unpack_block<kType>(load_block<kType, PlainLoads>(regions, b), int(b % kSubBlocks));
        for (int i = 0; i < kBlock; ++i) out[size_t(r * cols + b * kBlock + i)] = dequantized<kType>(w, i);
      }
    }
  });
  return out;
}

std::vector<float> decoded(DType t, const std::vector<uint8_t>& gguf, int64_t rows, int64_t cols) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    decode_row(t, gguf.data() + size_t(r) * row_bytes(t, cols), cols, out.data() + r * cols);
  return out;
}

// Row lengths: one K-quant super-block, several, and for the 32-weight types lengths that are no
// multiple of 256 (whose regions are then only 2- or 4-byte aligned).
std::vector<int64_t> test_cols(DType t) {
  if (block_size(t) == kQkBlockSize) return {256, 768};
  return {32, 96, 256, 352};
}

TEST(PackedBlocks, UnpackingGivesTheCodecsValuesBitForBit) {
  for (DType t : kBlockTypes)
    for (int64_t cols : test_cols(t))
      for (int source = 0; source < 2; ++source) {
        const int64_t rows = 5;
        const std::vector<uint8_t> gguf =
            source == 0 ? random_gguf(t, rows, cols, uint32_t(cols)) : encoded_gguf(t, rows, cols, uint64_t(cols) * 977);
        const std::vector<float> want = decoded(t, gguf, rows, cols);
        const std::vector<float> got = unpack(t, pack(t, gguf, rows, cols, 0), rows, cols);
        ASSERT_EQ(got.size(), want.size());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
            << dtype_name(t) << " cols " << cols << (source == 0 ? " random bytes" : " encoded values");
      }
}

// The packed tensor has exactly the GGUF bytes (Tensor::bytes() stays valid) and packing writes
// every one of them: packing over zeros and over 0xFF gives the same bytes.
TEST(PackedBlocks, PackingWritesEveryByteOfTheSameSize) {
  for (DType t : kBlockTypes)
    for (int64_t cols : test_cols(t)) {
      const int64_t rows = 3;
      const std::vector<uint8_t> gguf = random_gguf(t, rows, cols, 7);
      const Format f = format_of(t);
      const int64_t blocks = rows * cols / kBlock, supers = is_k_quant(t) ? blocks / kSubBlocks : 0;
      EXPECT_EQ(size_t(blocks * (f.qs + f.qh + f.params) + supers * (f.super + f.super_d)), gguf.size())
          << dtype_name(t);
      EXPECT_EQ(pack(t, gguf, rows, cols, 0x00), pack(t, gguf, rows, cols, 0xFF)) << dtype_name(t) << " cols " << cols;
    }
}

// Block b's activations quantized as the GPU quantizes them.
std::vector<ActivationBlock> quantized_activations(const std::vector<float>& x) {
  std::vector<ActivationBlock> out(x.size() / kBlock);
  for (size_t b = 0; b < out.size(); ++b) quantize_activation_block(x.data() + b * kBlock, out[b]);
  return out;
}

double activation_value(const ActivationBlock& a, int i) {
  const uint32_t word = a.q[i / 2];
  return double(a.d) * double(int16_t(uint16_t(i % 2 ? word >> 16 : word)));
}

TEST(PackedBlocks, ActivationQuantizationIsInt16PerBlockOf32) {
  std::vector<float> x(64);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  for (float& v : x) v = dist(rng);
  x[5] = 7.5f;  // the first block's largest magnitude becomes q = 32767
  for (int i = kBlock; i < 2 * kBlock; ++i) x[size_t(i)] = 0.0f;
  const std::vector<ActivationBlock> a = quantized_activations(x);
  EXPECT_FLOAT_EQ(a[0].d, 7.5f / 32767.0f);
  EXPECT_EQ(int16_t(uint16_t(a[0].q[2] >> 16)), 32767);
  int sum = 0, sum_lo = 0;
  for (int i = 0; i < kBlock; ++i) {
    EXPECT_NEAR(activation_value(a[0], i), x[size_t(i)], 0.5 * a[0].d) << i;
    const int q = int(std::lround(activation_value(a[0], i) / a[0].d));
    sum += q;
    if (i < 16) sum_lo += q;
  }
  EXPECT_EQ(a[0].sum, sum);
  EXPECT_EQ(a[0].sum_lo, sum_lo);
  EXPECT_FLOAT_EQ(a[0].dsum, a[0].d * float(sum));
  EXPECT_EQ(a[1].d, 0.0f);  // an all-zero block: no division by zero
  EXPECT_EQ(a[1].sum, 0);
  x[40] = NAN;  // a NaN activation must reach the output, not vanish in the integers
  EXPECT_TRUE(std::isnan(quantized_activations(x)[1].d));
}

// y[r] = Σ_b block_dot over a row, as the GEMV computes it (per block in float, summed in double here).
std::vector<double> packed_gemv(DType t, const std::vector<uint8_t>& packed, int64_t rows, int64_t cols,
                                const std::vector<ActivationBlock>& x) {
  std::vector<double> y(static_cast<size_t>(rows));
  with_block_type(t, [&](auto type) {
    constexpr DType kType = decltype(type)::value;
    for (int64_t r = 0; r < rows; ++r) {
      const RowRegions<const uint8_t> regions = row_regions<kType>(packed.data(), rows, cols, r);
      for (int64_t b = 0; b < cols / kBlock; ++b)
        y[size_t(r)] += block_dot<kType>(unpack_block<kType>(load_block<kType, PlainLoads>(regions, b), int(b % kSubBlocks)),
                                         x[size_t(b)]);
    }
  });
  return y;
}

double relative_l2(const std::vector<double>& got, const std::vector<double>& want) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    err += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(err / norm);
}

// The integer path (dp2a pairs, offsets subtracted as integers, minimums through d·sum) computes the
// dot product of the weights with the quantized activations to float rounding (bound 1e-5; a wrong
// pairing, offset or scale lands near 1), and the dot product with the activations themselves within
// the int16 quantization error (measured ~1e-5; bound 1e-3).
TEST(PackedBlocks, IntegerDotProductsMatchTheFloatDotProduct) {
  for (DType t : kBlockTypes)
    for (int64_t cols : test_cols(t)) {
      const int64_t rows = 16;
      const std::vector<uint8_t> gguf = encoded_gguf(t, rows, cols, 4096 * 256);  // rows of every stress kind
      const std::vector<float> w = decoded(t, gguf, rows, cols);
      std::vector<float> x(static_cast<size_t>(cols));
      std::mt19937 rng(static_cast<uint32_t>(cols));
      std::normal_distribution<float> dist(0.0f, 1.0f);
      for (float& v : x) v = dist(rng);
      const std::vector<ActivationBlock> xq = quantized_activations(x);
      std::vector<double> with_quantized(static_cast<size_t>(rows)), exact(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < cols; ++i) {
          const double wi = w[size_t(r * cols + i)];
          with_quantized[size_t(r)] += wi * activation_value(xq[size_t(i / kBlock)], int(i % kBlock));
          exact[size_t(r)] += wi * double(x[size_t(i)]);
        }
      const std::vector<double> got = packed_gemv(t, pack(t, gguf, rows, cols, 0), rows, cols, xq);
      const std::string what = dtype_name(t) + " cols " + std::to_string(cols);
      EXPECT_LE(relative_l2(got, with_quantized), 1e-5) << what;
      EXPECT_LE(relative_l2(got, exact), 1e-3) << what;
    }
}

// The batch GEMV's exact integer dot (packed_blocks.h: centred quants times the activations' high
// and low bytes, each sum carried as a float from kMagicBits): both parts stay below 2^22 and
// dot_from_parts gives float(dot) bit for bit, for random blocks and for every type's extremes
// (quants all at the farthest value from the offset, activations all ±32767 or alternating).
TEST(PackedBlocks, BatchGemvPartsGiveTheGemvsFloatOfTheDot) {
  std::mt19937 rng(7);
  auto check = [&](auto type, const BlockWeights& w, const ActivationBlock& x) {
    constexpr DType kType = decltype(type)::value;
    int lo = 0, hi = 0;
    block_integer_dots<kType>(w, x, &lo, &hi);
    const int dot = lo + hi - quant_offset(kType) * x.sum;
    int high = 0, low = 0;  // Σ c·hi, Σ c·lo
    for (int i = 0; i < kBlock; ++i) {
      const int c = int8_t(uint8_t(centred_quants<kType>(w.q[i / 4]) >> (8 * (i % 4))));
      const int v = int16_t(uint16_t(x.q[i / 2] >> (16 * (i % 2))));
      high += c * (v >> 8);
      low += c * (v & 0xFF);
    }
    ASSERT_EQ(256 * high + low, dot) << dtype_name(kType);
    ASSERT_LT(std::abs(high), 1 << 22) << dtype_name(kType);
    ASSERT_LT(std::abs(low), 1 << 22) << dtype_name(kType);
    const float got = dot_from_parts(kMagicBits + high, kMagicBits + low), want = float(dot);
    ASSERT_EQ(std::memcmp(&got, &want, sizeof got), 0) << dtype_name(kType) << ": " << got << " against " << want;
  };
  for (DType t : kBlockTypes) {
    if (t == DType::Q6_K) continue;  // not taken by the batch GEMV
    with_block_type(t, [&](auto type) {
      constexpr DType kType = decltype(type)::value;
      const uint32_t mask = kType == DType::Q8_0 ? 0xFFFFFFFFu : format_of(kType).qh > 0 ? 0x1F1F1F1Fu : 0x0F0F0F0Fu;
      const uint32_t extreme = kType == DType::Q8_0 ? 0x80808080u : quant_offset(kType) > 0 ? 0u : mask;
      std::normal_distribution<float> dist(0.0f, 1.0f);
      for (int trial = 0; trial < 4000; ++trial) {
        BlockWeights w{};
        for (uint32_t& word : w.q) word = (trial % 4 == 0 ? extreme : uint32_t(rng())) & mask;
        float values[kBlock];
        for (int i = 0; i < kBlock; ++i)
          values[i] = trial % 8 == 0 ? 1.0f : trial % 8 == 1 ? -1.0f : trial % 8 == 2 ? (i % 2 ? 1.0f : -1.0f)
                                                                                     : dist(rng) * float(1 + trial % 50);
        ActivationBlock x;
        quantize_activation_block(values, x);
        check(type, w, x);
      }
    });
  }
}

// Synthetic weights: valid blocks (finite scales), the same bytes for the same seed and index,
// weights spread about the requested range, both halves of it used.
TEST(PackedBlocks, RandomBlocksAreValidAndSpreadAsAsked) {
  const float spread = 0.02f;
  for (DType t : kBlockTypes) {
    const int64_t cols = 256, rows = 64;
    const RandomBlockScales scales = random_block_scales(t, spread);
    std::vector<uint8_t> bytes(row_bytes(t, cols) * rows), again(bytes.size());
    const int64_t blocks = int64_t(bytes.size() / block_bytes(t));
    for (int64_t i = 0; i < blocks; ++i) {
      random_block(t, scales, 42, uint64_t(i), bytes.data() + size_t(i) * block_bytes(t));
      random_block(t, scales, 42, uint64_t(i), again.data() + size_t(i) * block_bytes(t));
    }
    EXPECT_EQ(bytes, again) << dtype_name(t);
    EXPECT_EQ(first_nonfinite_block(t, bytes.data(), rows * cols), -1) << dtype_name(t);
    const std::vector<float> w = decoded(t, bytes, rows, cols);
    double sum2 = 0, lowest = 0, highest = 0;
    for (float v : w) {
      sum2 += double(v) * v;
      lowest = std::min(lowest, double(v));
      highest = std::max(highest, double(v));
    }
    const double rms = std::sqrt(sum2 / double(w.size())), uniform_rms = spread / std::sqrt(3.0);
    EXPECT_GT(rms, 0.5 * uniform_rms) << dtype_name(t);
    EXPECT_LT(rms, 2.0 * uniform_rms) << dtype_name(t);
    EXPECT_LT(lowest, -0.5 * spread) << dtype_name(t);
    EXPECT_GT(highest, 0.5 * spread) << dtype_name(t);
    EXPECT_LT(std::max(-lowest, highest), 2.5 * spread) << dtype_name(t);
  }
  EXPECT_NE(test::error_of([] { random_block_scales(DType::Q6_K, 1e-12f); }).find("too small"), std::string::npos);
}

}  // namespace
}  // namespace g4
