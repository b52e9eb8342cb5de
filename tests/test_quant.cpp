// GGUF block formats against the real llama.cpp: tests/fixtures/quant/ holds rows of several
// distributions, llama.cpp's quantization of them and llama.cpp's dequantization of that
// (tools/fixtures/make_quant_golden.sh made them). g4 must decode llama.cpp's bytes to the same floats bit for
// bit and, with the reference quantizers, encode the rows to the same bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "quant/block_formats.h"
#include "quant/quantize.h"
#include "support/fixtures.h"
#include "support/quant_stress_rows.h"
#include "util/error.h"

namespace g4 {
namespace {

constexpr int64_t kRows = 8, kCols = 256;  // as tools/fixtures/llamacpp_golden.cpp writes them
const DType kBlockTypes[] = {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                             DType::Q5_1, DType::Q4_K, DType::Q5_K, DType::Q6_K};

std::vector<uint8_t> read_fixture(const std::string& name) {
  std::ifstream in(std::string(G4_FIXTURES_DIR) + "/quant/" + name, std::ios::binary);
  EXPECT_TRUE(in) << "missing fixture " << name;
  return {std::istreambuf_iterator<char>(in), {}};
}

std::vector<float> read_floats(const std::string& name) {
  EXPECT_TRUE(std::ifstream(std::string(G4_FIXTURES_DIR) + "/quant/" + name)) << "missing fixture " << name;
  return test::read_floats(std::string(G4_FIXTURES_DIR) + "/quant/" + name);
}

struct Golden {
  std::vector<float> input, llama_decoded;
  std::vector<uint8_t> llama_bytes;
};

Golden golden(DType t) {
  Golden g{read_floats("inputs.f32"), read_floats(dtype_name(t) + ".f32"), read_fixture(dtype_name(t) + ".q")};
  EXPECT_EQ(g.input.size(), size_t(kRows * kCols));
  EXPECT_EQ(g.llama_decoded.size(), size_t(kRows * kCols));
  EXPECT_EQ(g.llama_bytes.size(), kRows * row_bytes(t, kCols));
  return g;
}

double rms_error(const float* x, const float* y, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
  return std::sqrt(sum / double(n));
}

std::vector<float> decode(DType t, const std::vector<uint8_t>& bytes, int64_t rows, int64_t cols) {
  std::vector<float> out(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r) decode_row(t, bytes.data() + r * row_bytes(t, cols), cols, out.data() + r * cols);
  return out;
}

std::vector<uint8_t> encode(DType t, const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<uint8_t> out(rows * row_bytes(t, cols));
  for (int64_t r = 0; r < rows; ++r) encode_row(t, x.data() + r * cols, cols, out.data() + r * row_bytes(t, cols));
  return out;
}

TEST(QuantGolden, DecodeIsBitIdenticalToLlamaCpp) {
  for (DType t : kBlockTypes) {
    const Golden g = golden(t);
    const std::vector<float> ours = decode(t, g.llama_bytes, kRows, kCols);
    for (size_t i = 0; i < ours.size(); ++i) {
      uint32_t a, b;
      std::memcpy(&a, &ours[i], 4);
      std::memcpy(&b, &g.llama_decoded[i], 4);
      ASSERT_EQ(a, b) << dtype_name(t) << " row " << i / kCols << " col " << i % kCols << ": g4 " << ours[i]
                      << ", llama.cpp " << g.llama_decoded[i];
    }
  }
}

TEST(QuantGolden, EncodeIsBitIdenticalToLlamaCppReference) {
  for (DType t : kBlockTypes) {
    const Golden g = golden(t);
    const std::vector<uint8_t> ours = encode(t, g.input, kRows, kCols);
    const size_t row = row_bytes(t, kCols);
    for (size_t i = 0; i < ours.size(); ++i)
      ASSERT_EQ(int(ours[i]), int(g.llama_bytes[i]))
          << dtype_name(t) << " row " << i / row << " byte " << i % row << " differs from llama.cpp's";
  }
}

// The table of docs/PERF.md ("Quantization error, g4 vs llama.cpp"):
//   build/tests/test_quant --gtest_filter=QuantGolden.RmsErrorTable
TEST(QuantGolden, RmsErrorTable) {
  // Row 0 is gaussian with sigma 1; the mean over all rows is dominated by row 7's +-3000 block.
  std::printf("| type | bits/weight | g4 RMS, gaussian row | llama.cpp RMS, gaussian row | g4 RMS, all rows "
              "| llama.cpp RMS, all rows |\n|---|---|---|---|---|---|\n");
  for (DType t : kBlockTypes) {
    const Golden g = golden(t);
    const std::vector<float> ours = decode(t, encode(t, g.input, kRows, kCols), kRows, kCols);
    const double g4_rms = rms_error(g.input.data(), ours.data(), kRows * kCols);
    const double llama_rms = rms_error(g.input.data(), g.llama_decoded.data(), kRows * kCols);
    const double g4_rms0 = rms_error(g.input.data(), ours.data(), kCols);
    const double llama_rms0 = rms_error(g.input.data(), g.llama_decoded.data(), kCols);
    EXPECT_LE(g4_rms, llama_rms) << dtype_name(t);
    EXPECT_LE(g4_rms0, llama_rms0) << dtype_name(t);
    std::printf("| %s | %.4g | %.6g | %.6g | %.6g | %.6g |\n", dtype_name(t).c_str(),
                8.0 * double(block_bytes(t)) / double(block_size(t)), g4_rms0, llama_rms0, g4_rms, llama_rms);
  }
}

// stress.txt: llama.cpp's results on the generated rows of support/quant_stress_rows.h.
constexpr int64_t kStressRows = test::kQuantStressRows;
static_assert(test::kQuantStressCols == kCols, "the stress rows have the golden rows' width");

uint64_t fnv1a(const void* data, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(data)[i]) * 0x100000001b3ull;
  return h;
}

struct StressResult {
  std::string bytes_hash, floats_hash;
  double rms = 0;
};

StressResult llama_stress(DType t) {
  std::ifstream in(std::string(G4_FIXTURES_DIR) + "/quant/stress.txt");
  std::string name;
  StressResult r;
  while (in >> name >> r.bytes_hash >> r.floats_hash >> r.rms)
    if (name == dtype_name(t)) return r;
  ADD_FAILURE() << "stress.txt has no " << dtype_name(t);
  return {};
}

std::string hex(uint64_t h) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(h));
  return text;
}

// Half a million values a type, 2048 K-quant super-blocks: enough for the scale searches to take
// most of their branches (the 8 golden rows alone leave some untouched).
TEST(QuantGolden, StressRowsMatchLlamaCppBitForBit) {
  std::vector<float> x(size_t(kStressRows * kCols));
  for (size_t i = 0; i < x.size(); ++i) x[i] = test::quant_stress_value(i);
  std::printf("| type | g4 RMS, stress rows | llama.cpp RMS, stress rows |\n|---|---|---|\n");
  for (DType t : kBlockTypes) {
    const StressResult llama = llama_stress(t);
    const std::vector<uint8_t> bytes = encode(t, x, kStressRows, kCols);
    EXPECT_EQ(hex(fnv1a(bytes.data(), bytes.size())), llama.bytes_hash) << dtype_name(t) << ": encode differs";
    const std::vector<float> y = decode(t, bytes, kStressRows, kCols);
    EXPECT_EQ(hex(fnv1a(y.data(), y.size() * 4)), llama.floats_hash) << dtype_name(t) << ": decode differs";
    const double rms = rms_error(x.data(), y.data(), int64_t(x.size()));
    EXPECT_LE(rms, llama.rms * (1 + 1e-8)) << dtype_name(t);  // llama.cpp's RMS is printed to 9 digits
    std::printf("| %s | %.9g | %.9g |\n", dtype_name(t).c_str(), rms, llama.rms);
  }
}

TEST(Quant, RowBytesFollowGgmlBlocks) {
  EXPECT_EQ(row_bytes(DType::Q8_0, 64), 68u);
  EXPECT_EQ(row_bytes(DType::Q4_0, 64), 36u);
  EXPECT_EQ(row_bytes(DType::Q4_1, 64), 40u);
  EXPECT_EQ(row_bytes(DType::Q5_0, 64), 44u);
  EXPECT_EQ(row_bytes(DType::Q5_1, 64), 48u);
  EXPECT_EQ(row_bytes(DType::Q4_K, 512), 288u);
  EXPECT_EQ(row_bytes(DType::Q5_K, 512), 352u);
  EXPECT_EQ(row_bytes(DType::Q6_K, 512), 420u);
  for (DType t : kBlockTypes) EXPECT_EQ(block_codec(t)->block_bytes, block_bytes(t)) << dtype_name(t);
  EXPECT_EQ(block_codec(DType::BF16), nullptr);
}

// Round trips on gaussian rows: the error per type stays within what its bits allow, and a
// decoded row re-encodes to values no farther from it than the original was.
TEST(Quant, RoundTripErrorMatchesTheBits) {
  std::mt19937 rng(7);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  const int64_t cols = 1024;
  std::vector<float> x(cols);
  for (float& v : x) v = gauss(rng);
  const struct { DType t; double max_rms; } cases[] = {
      {DType::Q8_0, 0.006}, {DType::Q4_0, 0.12}, {DType::Q4_1, 0.11}, {DType::Q5_0, 0.06},
      {DType::Q5_1, 0.055}, {DType::Q4_K, 0.1},  {DType::Q5_K, 0.05}, {DType::Q6_K, 0.025}};
  for (const auto& c : cases) {
    const std::vector<float> y = decode(c.t, encode(c.t, x, 1, cols), 1, cols);
    const double rms = rms_error(x.data(), y.data(), cols);
    EXPECT_LT(rms, c.max_rms) << dtype_name(c.t);
    EXPECT_GT(rms, 0.0) << dtype_name(c.t);
    const std::vector<float> z = decode(c.t, encode(c.t, y, 1, cols), 1, cols);
    EXPECT_LE(rms_error(y.data(), z.data(), cols), rms) << dtype_name(c.t);
  }
}

TEST(Quant, ZeroRowsStayZero) {
  const std::vector<float> zeros(512, 0.0f);
  for (DType t : kBlockTypes) {
    const std::vector<float> y = decode(t, encode(t, zeros, 1, 512), 1, 512);
    for (float v : y) ASSERT_EQ(v, 0.0f) << dtype_name(t);
  }
}

TEST(QuantBadInput, RowLengthNotAMultipleOfTheBlock) {
  std::vector<float> x(300, 1.0f);
  std::vector<uint8_t> bytes(1024);
  const std::string encode = test::error_of([&] { encode_row(DType::Q4_K, x.data(), 300, bytes.data()); });
  EXPECT_NE(encode.find("Q4_K rows need a multiple of 256 elements, got 300"), std::string::npos) << encode;
  const std::string decode = test::error_of([&] { decode_row(DType::Q4_0, bytes.data(), 40, x.data()); });
  EXPECT_NE(decode.find("Q4_0 rows need a multiple of 32 elements, got 40"), std::string::npos) << decode;
  EXPECT_THROW(row_bytes(DType::Q6_K, 128), Error);
}

TEST(QuantBadInput, NonFiniteValuesCannotBeEncoded) {
  for (DType t : kBlockTypes) {
    std::vector<float> x(256, 0.5f);
    x[77] = std::nanf("");
    std::vector<uint8_t> bytes(row_bytes(t, 256));
    EXPECT_THROW(encode_row(t, x.data(), 256, bytes.data()), Error) << dtype_name(t);
    x[77] = INFINITY;
    EXPECT_THROW(encode_row(t, x.data(), 256, bytes.data()), Error) << dtype_name(t);
  }
}

// A NaN/inf scale decodes (as llama.cpp does) to non-finite weights without crashing, and
// first_nonfinite_block finds the block so a loader can name it.
TEST(QuantBadInput, NonFiniteScalesAreFound) {
  std::vector<float> x(512);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i));
  for (DType t : kBlockTypes) {
    std::vector<uint8_t> bytes = encode(t, x, 1, 512);
    EXPECT_EQ(first_nonfinite_block(t, bytes.data(), 512), -1) << dtype_name(t);
    const size_t scale_at = t == DType::Q6_K ? 208 : 0;  // Q6_K keeps d at the end of its block
    const int64_t bad_block = 512 / block_size(t) - 1;
    for (uint16_t bad : {uint16_t(0x7e00), uint16_t(0xfc00)}) {  // NaN, -inf
      std::vector<uint8_t> broken = bytes;
      std::memcpy(broken.data() + bad_block * block_bytes(t) + scale_at, &bad, 2);
      EXPECT_EQ(first_nonfinite_block(t, broken.data(), 512), bad_block) << dtype_name(t);
      std::vector<float> y(512);
      decode_row(t, broken.data(), 512, y.data());
      bool any_nonfinite = false;
      for (float v : y) any_nonfinite |= !std::isfinite(v);
      EXPECT_TRUE(any_nonfinite) << dtype_name(t);
    }
  }
  EXPECT_EQ(first_nonfinite_block(DType::F32, x.data(), 512), -1);
}

// Arbitrary bytes are valid blocks of every type: decoding never reads outside the row.
TEST(QuantBadInput, RandomBytesDecodeWithoutCrashing) {
  std::mt19937 rng(3);
  for (DType t : kBlockTypes) {
    std::vector<uint8_t> bytes(row_bytes(t, 1024));
    for (uint8_t& b : bytes) b = uint8_t(rng());
    std::vector<float> y(1024 + 1, -7.0f);
    decode_row(t, bytes.data(), 1024, y.data());
    EXPECT_EQ(y[1024], -7.0f) << dtype_name(t);  // nothing written past the row
  }
}

}  // namespace
}  // namespace g4
