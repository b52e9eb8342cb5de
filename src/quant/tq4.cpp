#include "quant/tq4.h"

#include <cmath>
#include <numbers>
#include <limits>
#include <string>
#include <vector>

#include "util/error.h"
#include "util/half.h"

namespace g4::tq4 {

namespace {

constexpr int kLloydIterations = 4000;
constexpr uint64_t kSignSeed = 0x7C4B5E1D2F3A6908ull;
constexpr int64_t kMaxDim = 65536;

double normal_pdf(double t) { return std::exp(-0.5 * t * t) / std::sqrt(2.0 * std::numbers::pi); }
double normal_cdf(double t) { return 0.5 * std::erfc(-t / std::sqrt(2.0)); }

// Lloyd's rounds from levels spread over [-3, 3]: each boundary the midpoint of its neighbours,
// each level the mean of N(0, 1) over its cell; then made exactly symmetric.
std::array<double, kLevels> lloyd_max_levels() {
  std::array<double, kLevels> c;
  for (int k = 0; k < kLevels; ++k) c[size_t(k)] = -3.0 + 6.0 * (k + 0.5) / kLevels;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  for (int round = 0; round < kLloydIterations; ++round) {
    std::array<double, kLevels> next;
    for (int k = 0; k < kLevels; ++k) {
      const double lo = k == 0 ? -kInf : (c[size_t(k - 1)] + c[size_t(k)]) / 2;
      const double hi = k == kLevels - 1 ? kInf : (c[size_t(k)] + c[size_t(k + 1)]) / 2;
      next[size_t(k)] = (normal_pdf(lo) - normal_pdf(hi)) / (normal_cdf(hi) - normal_cdf(lo));
    }
    c = next;
  }
  std::array<double, kLevels> symmetric;
  for (int k = 0; k < kLevels / 2; ++k) {
    const double v = (c[size_t(kLevels / 2 + k)] - c[size_t(kLevels / 2 - 1 - k)]) / 2;
    symmetric[size_t(kLevels / 2 + k)] = v;
    symmetric[size_t(kLevels / 2 - 1 - k)] = -v;
  }
  return symmetric;
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

const std::vector<double>& signs() {
  static const std::vector<double> s = [] {
    std::vector<double> out(static_cast<size_t>(kMaxDim));
    uint64_t state = kSignSeed;
    for (double& v : out) v = splitmix64(state) >> 63 ? -1.0 : 1.0;
    return out;
  }();
  return s;
}

// Sylvester's Walsh–Hadamard transform, unnormalised, in place (the oracle's butterfly order).
template <typename T>
void hadamard(std::span<T> v) {
  const size_t d = v.size();
  for (size_t h = 1; h < d; h *= 2)
    for (size_t i = 0; i < d; i += 2 * h)
      for (size_t j = i; j < i + h; ++j) {
        const T a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
}

}  // namespace

const std::array<double, kLevels>& codebook() {
  static const std::array<double, kLevels> levels = lloyd_max_levels();
  return levels;
}

const std::array<double, kLevels - 1>& boundaries() {
  static const std::array<double, kLevels - 1> bounds = [] {
    std::array<double, kLevels - 1> b;
    for (int k = 0; k < kLevels - 1; ++k) b[size_t(k)] = (codebook()[size_t(k)] + codebook()[size_t(k + 1)]) / 2;
    return b;
  }();
  return bounds;
}

double sign(int64_t i) { return signs()[size_t(i)]; }

void check_dim(int64_t d) {
  G4_CHECK(d >= 2 && d <= kMaxDim && (d & (d - 1)) == 0,
           "TQ4: a head vector of " + std::to_string(d) + " values (a power of two from 2 to 65536 is needed)");
}

uint16_t encode(std::span<const float> x, std::span<uint8_t> codes) {
  const int64_t d = int64_t(x.size());
  check_dim(d);
  G4_CHECK(codes.size() == x.size(), "TQ4 encode: one code per value");
  double total = 0.0;
  for (float v : x) total += double(v) * double(v);
  const double norm = std::sqrt(total);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = sign(int64_t(i)) * double(x[i]);
  hadamard(std::span<double>(y));
  const auto& bounds = boundaries();
  for (size_t i = 0; i < y.size(); ++i) {
    const double z = norm > 0 ? y[i] / norm : 0.0;
    uint8_t code = 0;
    for (double b : bounds) code += z > b ? 1 : 0;
    codes[i] = code;
  }
  return f32_to_bf16(float(norm));
}

void decode(uint16_t norm_bits, std::span<const uint8_t> codes, std::span<float> out) {
  const int64_t d = int64_t(codes.size());
  check_dim(d);
  G4_CHECK(out.size() == codes.size(), "TQ4 decode: one value per code");
  std::vector<double> w(codes.size());
  for (size_t i = 0; i < codes.size(); ++i) {
    G4_CHECK(codes[i] < kLevels, "TQ4 decode: code " + std::to_string(codes[i]) + " is not 4-bit");
    w[i] = codebook()[codes[i]];
  }
  hadamard(std::span<double>(w));
  const double scale = double(bf16_to_f32(norm_bits)) / double(d);
  for (size_t i = 0; i < w.size(); ++i) out[i] = float(scale * (sign(int64_t(i)) * w[i]));
}

void rotate(std::span<float> v) {
  check_dim(int64_t(v.size()));
  for (size_t i = 0; i < v.size(); ++i) v[i] *= float(sign(int64_t(i)));
  hadamard(v);
}

void rotate_back(std::span<float> v) {
  check_dim(int64_t(v.size()));
  hadamard(v);
  for (size_t i = 0; i < v.size(); ++i) v[i] *= float(sign(int64_t(i)));
}

const std::array<float, kLevels>& codebook_f32() {
  static const std::array<float, kLevels> levels = [] {
    std::array<float, kLevels> out;
    for (int k = 0; k < kLevels; ++k) out[size_t(k)] = float(codebook()[size_t(k)]);
    return out;
  }();
  return levels;
}

void pack_codes(std::span<const uint8_t> codes, std::span<uint8_t> packed) {
  G4_CHECK(codes.size() % 2 == 0 && packed.size() == codes.size() / 2, "TQ4: two codes a byte");
  for (size_t i = 0; i < packed.size(); ++i) packed[i] = uint8_t((codes[2 * i] & 15) | (codes[2 * i + 1] << 4));
}

void unpack_codes(std::span<const uint8_t> packed, std::span<uint8_t> codes) {
  G4_CHECK(codes.size() == 2 * packed.size(), "TQ4: two codes a byte");
  for (size_t i = 0; i < packed.size(); ++i) {
    codes[2 * i] = packed[i] & 15;
    codes[2 * i + 1] = packed[i] >> 4;
  }
}

}  // namespace g4::tq4
