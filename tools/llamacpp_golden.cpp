// Writes golden data for g4's block formats from llama.cpp's own ggml (tools/make_quant_golden.sh
// builds and runs it). Output, in OUT_DIR:
//   inputs.f32      kRows x kCols float32 rows (little endian), one distribution per row
//   <TYPE>.q        llama.cpp's quantization of those rows (ggml_quantize_chunk, no importance
//                   matrix: the reference quantize_row_<type>_ref)
//   <TYPE>.f32      llama.cpp's dequantization of <TYPE>.q (the type traits' to_float)
//   stress.txt      per type, FNV-1a hashes of llama.cpp's bytes and floats for g4::test::kQuantStressRows rows
//                   that tests/test_quant.cpp regenerates exactly (integer hashing and exact float
//                   steps, no libm), and llama.cpp's RMS error on them: many more blocks than the
//                   files above could hold, so the quantizers' searches meet most of their branches.
// The rows are fixed by a seeded generator, but the tests only read the files, so they do not
// depend on this program's random numbers being reproducible elsewhere.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "quant_stress_rows.h"

#include "ggml.h"

namespace {

constexpr int kRows = 8;
constexpr int kCols = 256;  // one K-quant super-block, eight 32-blocks

std::vector<float> make_inputs() {
  std::mt19937 rng(20261201);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> x(size_t(kRows) * kCols, 0.0f);
  for (int c = 0; c < kCols; ++c) {
    float* r = &x[c];
    r[0 * kCols] = gauss(rng);                                       // gaussian
    r[1 * kCols] = 0.05f * uniform(rng);                             // uniform, weight-sized
    r[2 * kCols] = 0.02f * gauss(rng) * (c % 37 == 5 ? 40.0f : 1.0f);  // outliers
    r[3 * kCols] = 0.0f;                                             // all zero
    r[4 * kCols] = (c / 32) % 2 ? 0.0f : gauss(rng);                 // zero 32-blocks between others
    r[5 * kCols] = 3e-6f * gauss(rng);                               // tiny: scales near f16 subnormals
    r[6 * kCols] = 1.0f + 0.5f * uniform(rng);                       // all positive (min > 0)
    // mixed: a constant block, a negative-only block, large values, and a single spike
    const int block = c / 32;
    r[7 * kCols] = block == 0 ? 0.25f : block == 1 ? -std::fabs(gauss(rng)) : block == 2 ? 3000.0f * uniform(rng)
                 : block == 3 ? (c == 100 ? 7.0f : 0.0f) : 0.1f * gauss(rng);
  }
  return x;
}


uint64_t fnv1a(const void* data, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(data)[i]) * 0x100000001b3ull;
  return h;
}

void write_file(const std::string& path, const void* data, size_t bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(data, 1, bytes, f) != bytes || std::fclose(f) != 0) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string out = argv[1];
  const std::vector<float> x = make_inputs();
  write_file(out + "/inputs.f32", x.data(), x.size() * 4);

  const ggml_type types[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0,
                             GGML_TYPE_Q5_1, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
  std::vector<float> sx(size_t(g4::test::kQuantStressRows) * kCols);
  for (size_t i = 0; i < sx.size(); ++i) sx[i] = g4::test::quant_stress_value(i);
  std::string stress;
  for (ggml_type t : types) {
    const size_t row = ggml_row_size(t, kCols);
    std::vector<uint8_t> q(row * kRows);
    ggml_quantize_init(t);
    const size_t written = ggml_quantize_chunk(t, x.data(), q.data(), 0, kRows, kCols, nullptr);
    if (written != q.size()) {
      std::fprintf(stderr, "%s: wrote %zu bytes, expected %zu\n", ggml_type_name(t), written, q.size());
      return 1;
    }
    std::vector<float> y(x.size());
    ggml_get_type_traits(t)->to_float(q.data(), y.data(), int64_t(y.size()));
    const std::string name = ggml_type_name(t);
    std::string upper;
    for (char ch : name) upper += char(std::toupper(static_cast<unsigned char>(ch)));
    write_file(out + "/" + upper + ".q", q.data(), q.size());
    write_file(out + "/" + upper + ".f32", y.data(), y.size() * 4);
    std::printf("%-5s %zu bytes a row\n", upper.c_str(), row);

    std::vector<uint8_t> sq(row * g4::test::kQuantStressRows);
    ggml_quantize_chunk(t, sx.data(), sq.data(), 0, g4::test::kQuantStressRows, kCols, nullptr);
    std::vector<float> sy(sx.size());
    ggml_get_type_traits(t)->to_float(sq.data(), sy.data(), int64_t(sy.size()));
    double sum = 0;
    for (size_t i = 0; i < sx.size(); ++i) sum += (double(sx[i]) - sy[i]) * (double(sx[i]) - sy[i]);
    char line[160];
    std::snprintf(line, sizeof line, "%s %016llx %016llx %.9g\n", upper.c_str(),
                  (unsigned long long)fnv1a(sq.data(), sq.size()), (unsigned long long)fnv1a(sy.data(), sy.size() * 4),
                  std::sqrt(sum / double(sx.size())));
    stress += line;
  }
  write_file(out + "/stress.txt", stress.data(), stress.size());
  return 0;
}
