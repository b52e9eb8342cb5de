// TQ4, the 4-bit KV format of full-attention layers (quant/tq4.h, docs/DESIGN.md "Quantized KV:
// TQ4"), against its float64 oracle (tools/fixtures/tq4_oracle.py, tests/fixtures/tq4/cases.json):
// the codebook, and for head vectors of 64, 256 and 512 values — Gaussian at several scales, with
// heavy channels, zero, one-hot, constant, near float32's range — the bf16 norm, the codes and the
// decoded values bit for bit. Then what the format promises: R is orthogonal, the error of a
// Gaussian vector is Lloyd–Max's, the packing round-trips, bad sizes are clear errors.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "quant/tq4.h"
#include "support/fixtures.h"
#include "util/error.h"
#include "util/half.h"

namespace g4 {
namespace {

nlohmann::json oracle_cases() {
  std::ifstream in(std::string(G4_FIXTURES_DIR) + "/tq4/cases.json");
  EXPECT_TRUE(in.good()) << "tests/fixtures/tq4/cases.json (tools/fixtures/tq4_oracle.py writes it)";
  return nlohmann::json::parse(in);
}

std::vector<uint32_t> hex_words(const std::string& text) {
  std::istringstream in(text);
  std::vector<uint32_t> out;
  std::string word;
  while (in >> word) out.push_back(uint32_t(std::stoul(word, nullptr, 16)));
  return out;
}

std::vector<float> as_floats(const std::vector<uint32_t>& bits) {
  std::vector<float> out;
  for (uint32_t b : bits) out.push_back(std::bit_cast<float>(b));
  return out;
}

TEST(Tq4, TheCodebookIsTheOraclesLloydMaxLevels) {
  const nlohmann::json doc = oracle_cases();
  ASSERT_EQ(doc["codebook"].size(), size_t(tq4::kLevels));
  for (int k = 0; k < tq4::kLevels; ++k) {
    const double want = std::strtod(doc["codebook"][size_t(k)].get<std::string>().c_str(), nullptr);
    EXPECT_NEAR(tq4::codebook()[size_t(k)], want, 1e-13) << "level " << k;
    EXPECT_EQ(tq4::codebook()[size_t(k)], -tq4::codebook()[size_t(tq4::kLevels - 1 - k)]) << "symmetric";
  }
  // Max (1960), 16 levels of N(0, 1): the outermost level 2.7326, the innermost 0.1284.
  EXPECT_NEAR(tq4::codebook()[15], 2.7326, 1e-4);
  EXPECT_NEAR(tq4::codebook()[8], 0.1284, 1e-4);
}

TEST(Tq4, CodesNormsAndDecodedValuesAreTheOraclesBitForBit) {
  const nlohmann::json doc = oracle_cases();
  ASSERT_GE(doc["cases"].size(), 30u);
  for (const nlohmann::json& c : doc["cases"]) {
    const std::string name = c["name"];
    const std::vector<float> x = as_floats(hex_words(c["input"]));
    std::vector<uint8_t> codes(x.size());
    const uint16_t norm = tq4::encode(x, codes);
    EXPECT_EQ(norm, uint16_t(std::stoul(c["norm"].get<std::string>(), nullptr, 16))) << name;
    std::string hex;
    for (uint8_t code : codes) hex += "0123456789abcdef"[code];
    EXPECT_EQ(hex, c["codes"].get<std::string>()) << name;
    std::vector<float> decoded(x.size());
    tq4::decode(norm, codes, decoded);
    const std::vector<uint32_t> want = hex_words(c["decoded"]);
    ASSERT_EQ(want.size(), decoded.size()) << name;
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(decoded[i]), want[i]) << name << " value " << i;
  }
}

// Gaussian head vectors: the bf16 norm is the vector's length, and the decoded vector's error is the
// Lloyd–Max quantizer's (R orthogonal keeps the error's energy: a non-orthogonal R would not).
TEST(Tq4, RotationKeepsLengthsAndErrorsAreLloydMaxs) {
  std::mt19937 rng(5);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  for (int64_t d : {64, 256, 512}) {
    double error = 0, energy = 0;
    for (int trial = 0; trial < 64; ++trial) {
      std::vector<float> x(static_cast<size_t>(d)), y(static_cast<size_t>(d));
      for (float& v : x) v = gauss(rng);
      std::vector<uint8_t> codes(static_cast<size_t>(d));
      const uint16_t norm = tq4::encode(x, codes);
      double sum = 0;
      for (float v : x) sum += double(v) * v;
      EXPECT_NEAR(bf16_to_f32(norm), std::sqrt(sum), std::sqrt(sum) / 128) << "the norm in bf16";
      tq4::decode(norm, codes, y);
      for (size_t i = 0; i < x.size(); ++i) {
        error += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
        energy += double(x[i]) * x[i];
      }
    }
    // Lloyd–Max's mean squared error for N(0, 1) at 16 levels is 0.009497 of the variance; the
    // rotated coordinates are nearly Gaussian, and the bf16 norm adds at most 2^-9 relative.
    const double relative = error / energy;
    EXPECT_GT(relative, 0.0080) << "d " << d;
    EXPECT_LT(relative, 0.0110) << "d " << d;
  }
}

TEST(Tq4, CodesPackTwoToAByteAndBack) {
  std::vector<uint8_t> codes(64), back(64), packed(32);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = uint8_t((i * 7 + 3) % 16);
  tq4::pack_codes(codes, packed);
  EXPECT_EQ(packed[0], uint8_t(3 | (10 << 4)));
  tq4::unpack_codes(packed, back);
  EXPECT_EQ(back, codes);
  EXPECT_EQ(tq4::vector_bytes(512), 258);
}

TEST(Tq4, BadSizesAndCodesAreClearErrors) {
  std::vector<float> x(96, 1.0f);
  std::vector<uint8_t> codes(96);
  const std::string error = test::error_of([&] { tq4::encode(x, codes); });
  EXPECT_NE(error.find("a head vector of 96 values"), std::string::npos) << error;
  std::vector<uint8_t> bad(64, 16);
  std::vector<float> out(64);
  EXPECT_NE(test::error_of([&] { tq4::decode(0x3f80, bad, out); }).find("code 16 is not 4-bit"), std::string::npos);
  std::vector<uint8_t> short_codes(32);
  std::vector<float> y(64);
  EXPECT_NE(test::error_of([&] { tq4::encode(y, short_codes); }).find("one code per value"), std::string::npos);
}

}  // namespace
}  // namespace g4
