// The GGUF container: writer -> reader round trips of every metadata type and tensor type,
// alignment, the Q8_0 quantiser, and rejection of malformed files (hand-made and fuzzed).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "format/gguf.h"
#include "quant/quantize.h"
#include "support/fixtures.h"
#include "support/fuzz.h"
#include "util/error.h"
#include "util/half.h"

namespace g4 {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

GgufFile parse_bytes(std::vector<uint8_t> bytes) {
  return GgufFile(std::make_shared<const std::vector<uint8_t>>(std::move(bytes)), "test bytes");
}

// Throws with a message containing `needle`.
void expect_error(const std::vector<uint8_t>& bytes, const std::string& needle) {
  try {
    parse_bytes(bytes);
    ADD_FAILURE() << "no error, expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

GgufMetadata every_type_metadata() {
  GgufMetadata m;
  m.set("u8", uint8_t(200));
  m.set("i8", int8_t(-100));
  m.set("u16", uint16_t(60000));
  m.set("i16", int16_t(-30000));
  m.set("u32", uint32_t(4000000000u));
  m.set("i32", int32_t(-2000000000));
  m.set("f32", 3.25f);
  m.set("bool", true);
  m.set("string", std::string("Gemma \xe2\x96\x81 4"));
  m.set("u64", uint64_t(1) << 63);
  m.set("i64", int64_t(-(int64_t(1) << 62)));
  m.set("f64", 1e-300);
  m.set("array.u8", GgufValue::array_of(std::vector<uint8_t>{1, 2, 255}));
  m.set("array.i8", GgufValue::array_of(std::vector<int8_t>{-1, 0, 1}));
  m.set("array.u16", GgufValue::array_of(std::vector<uint16_t>{65535}));
  m.set("array.i16", GgufValue::array_of(std::vector<int16_t>{-5, 5}));
  m.set("array.u32", GgufValue::array_of(std::vector<uint32_t>{7, 8}));
  m.set("array.i32", GgufValue::array_of(std::vector<int32_t>{16, 16, 4}));
  m.set("array.f32", GgufValue::array_of(std::vector<float>{0.5f, -1e30f}));
  m.set("array.bool", GgufValue::array_of(std::vector<bool>{true, false, true}));
  m.set("array.string", GgufValue::array_of(std::vector<std::string>{"<pad>", "", "<eos>"}));
  m.set("array.u64", GgufValue::array_of(std::vector<uint64_t>{uint64_t(-1)}));
  m.set("array.i64", GgufValue::array_of(std::vector<int64_t>{-1}));
  m.set("array.f64", GgufValue::array_of(std::vector<double>{2.5}));
  m.set("array.empty", GgufValue::array_of(std::vector<uint32_t>{}));
  return m;
}

// Tensors of every stored dtype with deterministic contents, and the file they make.
struct TensorCase {
  GgufTensorPlan plan;
  std::vector<uint8_t> bytes;
};

std::vector<TensorCase> every_dtype_tensors() {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::vector<GgufTensorPlan> plans = {{"vector.f32", {5}, DType::F32},
                                             {"matrix.f16", {3, 7}, DType::F16},
                                             {"matrix.bf16", {2, 3, 5}, DType::BF16},
                                             {"matrix.q8_0", {4, 64}, DType::Q8_0}};
  std::vector<TensorCase> cases;
  for (const auto& plan : plans) {
    int64_t n = 1;
    for (int64_t d : plan.shape) n *= d;
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = normal(rng);
    TensorCase c{plan, std::vector<uint8_t>(size_t(n / plan.shape.back()) * row_bytes(plan.dtype, plan.shape.back()))};
    const int64_t cols = plan.shape.back();
    for (int64_t r = 0; r < n / cols; ++r)
      encode_row(plan.dtype, x.data() + r * cols, cols, c.bytes.data() + size_t(r) * row_bytes(plan.dtype, cols));
    cases.push_back(std::move(c));
  }
  return cases;
}

// Writes `cases` in appends of 1, 2, 3, ... bytes, so tensor data crosses append boundaries.
void write_file(const std::string& path, const GgufMetadata& m, const std::vector<TensorCase>& cases) {
  std::vector<GgufTensorPlan> plans;
  for (const auto& c : cases) plans.push_back(c.plan);
  GgufWriter writer(path, m, plans);
  for (const auto& c : cases)
    for (size_t at = 0, piece = 1; at < c.bytes.size(); at += piece, ++piece) {
      piece = std::min(piece, c.bytes.size() - at);
      writer.append(c.bytes.data() + at, piece);
    }
  writer.finish();
}

TEST(Gguf, EveryMetadataTypeRoundTrips) {
  const std::string path = test::temp_dir("gguf_metadata") + "/m.gguf";
  const GgufMetadata m = every_type_metadata();
  write_file(path, m, {});
  const GgufFile file(path);
  EXPECT_EQ(file.version(), 3u);
  ASSERT_EQ(file.metadata().entries().size(), m.entries().size());
  for (size_t i = 0; i < m.entries().size(); ++i) {
    EXPECT_EQ(file.metadata().entries()[i].first, m.entries()[i].first);
    EXPECT_EQ(file.metadata().entries()[i].second.type(), m.entries()[i].second.type()) << m.entries()[i].first;
    EXPECT_TRUE(file.metadata().entries()[i].second == m.entries()[i].second) << m.entries()[i].first;
  }
  EXPECT_EQ(file.metadata().get_int("i16"), -30000);
  EXPECT_EQ(file.metadata().get_int_array("array.i32"), (std::vector<int64_t>{16, 16, 4}));
  EXPECT_EQ(file.metadata().get_bool_array("array.bool"), (std::vector<bool>{true, false, true}));
  EXPECT_DOUBLE_EQ(file.metadata().get_float("f64"), 1e-300);
}

TEST(Gguf, TypedAccessNamesTheKey) {
  const GgufMetadata m = every_type_metadata();
  EXPECT_THROW(m.get_int("missing"), Error);
  try {
    m.get_bool("string");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'string' is STRING, expected BOOL"), std::string::npos) << e.what();
  }
  EXPECT_THROW(m.get_int("u64"), Error);  // 2^63 does not fit int64
  EXPECT_THROW(m.get_int("f32"), Error);
}

TEST(Gguf, EveryTensorTypeRoundTripsAligned) {
  for (uint32_t alignment : {32u, 64u, 1u}) {
    const std::string path = test::temp_dir("gguf_tensors") + "/t.gguf";
    GgufMetadata m;
    if (alignment != kGgufDefaultAlignment) m.set("general.alignment", alignment);
    const auto cases = every_dtype_tensors();
    write_file(path, m, cases);
    const GgufFile file(path);
    EXPECT_EQ(file.alignment(), alignment);
    EXPECT_EQ(file.data_offset() % alignment, 0u);
    ASSERT_EQ(file.tensors().size(), cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
      const GgufTensorInfo& info = file.tensors()[i];
      EXPECT_EQ(info.name, cases[i].plan.name);
      EXPECT_EQ(info.offset % alignment, 0u);
      EXPECT_EQ(info.shape(), cases[i].plan.shape);
      EXPECT_EQ(info.dims.front(), uint64_t(cases[i].plan.shape.back())) << "dims[0] is the innermost";
      const HostTensor t = file.tensor(info);
      EXPECT_EQ(t.dtype, cases[i].plan.dtype);
      ASSERT_EQ(t.bytes, cases[i].bytes.size());
      EXPECT_EQ(std::memcmp(t.data, cases[i].bytes.data(), t.bytes), 0) << info.name;
    }
  }
}

TEST(Gguf, WriterLeavesNothingBehindOnFailure) {
  const std::string dir = test::temp_dir("gguf_writer_fail");
  const auto cases = every_dtype_tensors();
  {
    GgufWriter writer(dir + "/x.gguf", {}, {cases[0].plan});
    EXPECT_THROW(writer.append(cases[0].bytes.data(), cases[0].bytes.size() + 1), Error);
    EXPECT_THROW(writer.finish(), Error);  // incomplete tensor
  }
  EXPECT_TRUE(fs::is_empty(dir));
  EXPECT_THROW(GgufWriter(dir + "/no/such/dir/x.gguf", {}, {}), Error);
  GgufMetadata bad_alignment;
  bad_alignment.set("general.alignment", uint32_t(24));
  EXPECT_THROW(GgufWriter(dir + "/y.gguf", bad_alignment, {}), Error);
  EXPECT_TRUE(fs::is_empty(dir));
}

TEST(Q8_0, FollowsLlamaCppDefinition) {
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i) x[size_t(i)] = float(i - 16) * 0.5f;  // max |x| = 8 -> d = 8/127
  std::vector<uint8_t> block(kQ8BlockBytes);
  encode_row(DType::Q8_0, x.data(), 32, block.data());
  uint16_t d16;
  std::memcpy(&d16, block.data(), 2);
  EXPECT_EQ(d16, f32_to_f16(8.0f / 127.0f));
  const int8_t* q = reinterpret_cast<const int8_t*>(block.data() + 2);
  EXPECT_EQ(q[0], -127);  // -8 / d
  for (int i = 0; i < 32; ++i) EXPECT_EQ(q[i], int8_t(std::roundf(x[size_t(i)] * (127.0f / 8.0f)))) << i;

  std::vector<float> zeros(32, 0.0f), back(32, 1.0f);
  encode_row(DType::Q8_0, zeros.data(), 32, block.data());
  decode_row(DType::Q8_0, block.data(), 32, back.data());
  EXPECT_EQ(back, zeros);

  x[3] = NAN;
  EXPECT_THROW(encode_row(DType::Q8_0, x.data(), 32, block.data()), Error);
  EXPECT_THROW(encode_row(DType::Q8_0, x.data(), 31, block.data()), Error);
  const float too_big = 70000.0f;
  uint16_t h;
  EXPECT_THROW(encode_row(DType::F16, &too_big, 1, &h), Error);
}

TEST(Q8_0, ErrorWithinTheFormatBound) {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> x(32 * 256), back(x.size());
  for (float& v : x) v = normal(rng);
  std::vector<uint8_t> q(row_bytes(DType::Q8_0, int64_t(x.size())));
  encode_row(DType::Q8_0, x.data(), int64_t(x.size()), q.data());
  decode_row(DType::Q8_0, q.data(), int64_t(x.size()), back.data());
  for (size_t b = 0; b < x.size() / 32; ++b) {
    float amax = 0;
    for (size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    const float d = amax / 127.0f, d16 = f16_to_f32(f32_to_f16(d));
    const double bound = d / 2 * (1 + 1e-6) + 127.0 * std::fabs(d - d16);
    for (size_t i = 0; i < 32; ++i) ASSERT_LE(std::fabs(x[b * 32 + i] - back[b * 32 + i]), bound) << b << ":" << i;
  }
}

// --- Malformed files, built byte by byte ---------------------------------------------------------

class Bytes {
 public:
  template <typename T>
  Bytes& pod(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    data.insert(data.end(), p, p + sizeof(T));
    return *this;
  }
  Bytes& str(const std::string& s) {
    pod(uint64_t(s.size()));
    data.insert(data.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& header(uint64_t tensors, uint64_t kvs, uint32_t version = 3) {
    data.insert(data.end(), {'G', 'G', 'U', 'F'});
    return pod(version).pod(tensors).pod(kvs);
  }
  Bytes& tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
    str(name).pod(uint32_t(dims.size()));
    for (uint64_t d : dims) pod(d);
    return pod(type).pod(offset);
  }
  Bytes& pad(size_t alignment = 32) {
    data.resize((data.size() + alignment - 1) / alignment * alignment);
    return *this;
  }
  Bytes& zeros(size_t n) {
    data.resize(data.size() + n);
    return *this;
  }
  std::vector<uint8_t> data;
};

constexpr uint32_t kF32 = 0, kQ8_0 = 8;

TEST(GgufMalformed, HandMadeValidFileParses) {
  Bytes b;
  b.header(2, 1).str("general.architecture").pod(uint32_t(GgufType::STRING)).str("gemma4");
  b.tensor("a", {4}, kF32, 0).tensor("b", {32, 2}, kQ8_0, 32).pad().zeros(32 + 68);
  const GgufFile file = parse_bytes(b.data);
  EXPECT_EQ(file.tensors().size(), 2u);
  EXPECT_EQ(file.tensors()[1].bytes, 68u);
}

// llama.cpp's block types read as g4 dtypes with ggml's block sizes (community files hold these).
TEST(GgufMalformed, BlockTypesParseWithGgmlSizes) {
  const struct { GgmlType type; DType dtype; uint64_t bytes; } cases[] = {
      {GgmlType::Q4_0, DType::Q4_0, 2 * 8 * 18},  {GgmlType::Q4_1, DType::Q4_1, 2 * 8 * 20},
      {GgmlType::Q5_0, DType::Q5_0, 2 * 8 * 22},  {GgmlType::Q5_1, DType::Q5_1, 2 * 8 * 24},
      {GgmlType::Q8_0, DType::Q8_0, 2 * 8 * 34},  {GgmlType::Q4_K, DType::Q4_K, 2 * 144},
      {GgmlType::Q5_K, DType::Q5_K, 2 * 176},     {GgmlType::Q6_K, DType::Q6_K, 2 * 210}};
  for (const auto& c : cases) {
    Bytes b;
    b.header(1, 0).tensor("w", {256, 2}, uint32_t(c.type), 0).pad().zeros(c.bytes);
    const GgufFile file = parse_bytes(b.data);
    EXPECT_EQ(file.tensors()[0].dtype, c.dtype) << dtype_name(c.dtype);
    EXPECT_EQ(file.tensors()[0].bytes, c.bytes) << dtype_name(c.dtype);
    EXPECT_EQ(ggml_type_of(c.dtype), c.type) << dtype_name(c.dtype);
    expect_error(std::vector<uint8_t>(b.data.begin(), b.data.end() - 1), "runs past the end");
  }
}

TEST(GgufMalformed, BadMagicAndVersion) {
  Bytes b;
  b.header(0, 0);
  auto bad = b.data;
  bad[0] = 'X';
  expect_error(bad, "bad magic");
  expect_error({'G', 'G'}, "truncated header");
  expect_error(Bytes().header(0, 0, 1).data, "unsupported GGUF version 1");
  expect_error(Bytes().header(0, 0, 4).data, "unsupported GGUF version 4");
  expect_error(Bytes().header(0, 0, 0x03000000).data, "unsupported GGUF version");  // big-endian file
}

TEST(GgufMalformed, EveryTruncationOfTheHeaderIsAnError) {
  Bytes b;
  b.header(1, 2).str("k").pod(uint32_t(GgufType::ARRAY)).pod(uint32_t(GgufType::STRING)).pod(uint64_t(2));
  b.str("x").str("yy").str("n").pod(uint32_t(GgufType::U32)).pod(uint32_t(5));
  b.tensor("t", {8}, kF32, 0).pad().zeros(32);
  ASSERT_NO_THROW(parse_bytes(b.data));
  for (size_t size = 0; size < b.data.size(); ++size)
    EXPECT_THROW(parse_bytes(std::vector<uint8_t>(b.data.begin(), b.data.begin() + long(size))), Error) << size;
  // Cut inside the tensor data: the message says where the data ends.
  expect_error(std::vector<uint8_t>(b.data.begin(), b.data.end() - 1), "runs past the end of the file");
}

TEST(GgufMalformed, AbsurdCountsAndLengths) {
  expect_error(Bytes().header(uint64_t(1) << 62, 0).data, "tensor count");
  expect_error(Bytes().header(0, uint64_t(1) << 62).data, "metadata count");
  expect_error(Bytes().header(0, 1).pod(uint64_t(-1)).zeros(16).data, "truncated metadata key");
  expect_error(Bytes().header(0, 1).str("k").pod(uint32_t(GgufType::ARRAY)).pod(uint32_t(GgufType::U64)).pod(
                   uint64_t(1) << 61).data,
               "element count");
  expect_error(Bytes().header(0, 1).str("k").pod(uint32_t(GgufType::ARRAY)).pod(uint32_t(GgufType::STRING)).pod(
                   uint64_t(1) << 40).data,
               "element count");
  expect_error(Bytes().header(0, 1).str("k").pod(uint32_t(99)).data, "unknown type 99");
  expect_error(Bytes().header(0, 1).str("k").pod(uint32_t(GgufType::ARRAY)).pod(uint32_t(GgufType::ARRAY)).data,
               "nested arrays");
  expect_error(Bytes().header(0, 1).str("k").pod(uint32_t(GgufType::BOOL)).pod(uint8_t(7)).data, "bool value 7");
  expect_error(Bytes().header(0, 2).str("k").pod(uint32_t(GgufType::U8)).pod(uint8_t(1)).str("k").pod(
                   uint32_t(GgufType::U8)).pod(uint8_t(1)).data,
               "duplicate metadata key 'k'");
}

TEST(GgufMalformed, BadTensorTable) {
  auto one = [](std::vector<uint64_t> dims, uint32_t type, uint64_t offset, size_t data) {
    Bytes b;
    b.header(1, 0).tensor("w", std::move(dims), type, offset).pad().zeros(data);
    return b.data;
  };
  expect_error(one({8}, kF32, 64, 32), "runs past the end");
  expect_error(one({8}, kF32, uint64_t(-32), 32), "runs past the end");
  expect_error(one({8}, kF32, 4, 64), "not a multiple of the alignment");
  expect_error(one({uint64_t(1) << 40, uint64_t(1) << 40}, kF32, 0, 32), "dimensions overflow");
  expect_error(one({8, 0}, kF32, 0, 32), "has dimension 0");
  expect_error(one({1, 1, 1, 1, 1}, kF32, 0, 32), "5 dimensions");
  expect_error(one({256}, 10, 0, 96), "tensor 'w' has GGML type 10 (Q2_K), which g4 does not support");
  expect_error(one({128}, uint32_t(GgmlType::Q4_K), 0, 160), "Q4_K needs its innermost dimension to be a multiple of 256");
  expect_error(one({33}, kQ8_0, 0, 64), "multiple of 32");
  Bytes overlap;
  overlap.header(2, 0).tensor("a", {16}, kF32, 0).tensor("b", {16}, kF32, 32).pad().zeros(128);
  expect_error(overlap.data, "overlap");
  Bytes twice;
  twice.header(2, 0).tensor("a", {8}, kF32, 0).tensor("a", {8}, kF32, 32).pad().zeros(64);
  expect_error(twice.data, "duplicate tensor 'a'");
  Bytes alignment;
  alignment.header(0, 1).str("general.alignment").pod(uint32_t(GgufType::U32)).pod(uint32_t(48));
  expect_error(alignment.data, "power of two");
}

// Seeded mutations of a valid file (bytes flipped, runs overwritten with extreme values, truncation,
// splices of its own pieces): every parse ends in success or g4::Error. A fixed seed and run count
// (G4_FUZZ_RUNS / G4_FUZZ_SEED override them), so every machine parses the same files; the
// in-bounds read below is checked by AddressSanitizer under tools/ci/sanitize.sh.
TEST(GgufMalformed, MutationFuzz) {
  const std::string path = test::temp_dir("gguf_fuzz") + "/seed.gguf";
  write_file(path, every_type_metadata(), every_dtype_tensors());
  const std::vector<uint8_t> seed = read_bytes(path);
  std::mt19937_64 rng(test::fuzz_seed(20240607));
  auto pick = [&](size_t n) { return size_t(rng() % std::max<size_t>(n, 1)); };
  const size_t total = test::fuzz_runs(20000);
  size_t runs = 0, accepted = 0;
  while (runs < total) {
    std::vector<uint8_t> bytes = seed;
    const int mutations = 1 + int(rng() % 4);
    for (int m = 0; m < mutations; ++m) {
      switch (rng() % 5) {
        case 0: bytes[pick(bytes.size())] ^= uint8_t(1u << (rng() % 8)); break;
        case 1: bytes[pick(bytes.size())] = uint8_t(rng()); break;
        case 2: {  // an extreme little-endian integer over 1, 4 or 8 bytes
          const uint64_t extremes[] = {0, 1, 0x7f, 0xff, 0xffffffffu, 0x80000000u, ~uint64_t(0), uint64_t(1) << 62};
          const uint64_t v = extremes[rng() % std::size(extremes)];
          const size_t width = std::array<size_t, 3>{1, 4, 8}[rng() % 3];
          const size_t at = pick(bytes.size() - width);
          std::memcpy(bytes.data() + at, &v, width);
          break;
        }
        case 3: bytes.resize(pick(bytes.size())); break;
        case 4: {  // splice: copy a run of the seed somewhere else
          const size_t from = pick(seed.size()), to = pick(bytes.size());
          const size_t n = std::min({size_t(1 + rng() % 64), seed.size() - from, bytes.size() - to});
          std::memcpy(bytes.data() + to, seed.data() + from, n);
          break;
        }
      }
      if (bytes.size() < 16) break;
    }
    ++runs;
    try {
      const GgufFile file = parse_bytes(bytes);
      for (const GgufTensorInfo& info : file.tensors()) {
        const HostTensor t = file.tensor(info);
        volatile uint8_t last = static_cast<const uint8_t*>(t.data)[t.bytes - 1];  // in bounds
        (void)last;
      }
      ++accepted;
    } catch (const Error&) {
    }
  }
  std::printf("mutation fuzz: %zu files, %zu parsed, the rest rejected with g4::Error\n", runs, accepted);
}

}  // namespace
}  // namespace g4
