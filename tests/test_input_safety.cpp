// Regression tests for memory-safety defects found by fuzzing the file inputs under
// AddressSanitizer + UndefinedBehaviorSanitizer (tools/ci/sanitize.sh): each input here once wrote out
// of bounds, allocated without limit, read misaligned data, blocked forever, or converted an
// out-of-range float to int. Without a sanitizer some of them pass silently; tools/ci/sanitize.sh
// runs them with one.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "format/gguf.h"
#include "model/hf_checkpoint.h"
#include "quant/quantize.h"
#include "format/safetensors.h"
#include "model/config.h"
#include "model/gguf_export.h"
#include "model/gguf_model.h"
#include "model/loader.h"
#include "runtime/session.h"
#include "support/fixtures.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/half.h"
#include "util/mapped_file.h"

namespace g4 {
namespace {

using test::error_of;

namespace fs = std::filesystem;
using nlohmann::json;

json fixture_config() {
  return json::parse(std::ifstream(test::fixture_dir("tiny-31b-style") + "/config.json"));
}

// --- config.json numbers --------------------------------------------------------------------------

// partial_rotary_factor 1.5 once made LayerConfig::rope_inv_freq write past its array (heap
// overflow under ASan); 1e9 made int(partial * head_dim) undefined.
TEST(InputSafety, PartialRotaryFactorOutsideZeroToOneIsRejected) {
  for (const json& partial : {json(1.5), json(-0.5), json(0.0), json(1e9), json(std::nan("")),
                              json(std::numeric_limits<double>::infinity())}) {
    json c = fixture_config();
    c["rope_parameters"]["full_attention"]["partial_rotary_factor"] = partial;
    const std::string message = error_of([&] { parse_hf_config(c); });
    EXPECT_NE(message.find("partial_rotary_factor"), std::string::npos) << partial << ": " << message;
  }
  json c = fixture_config();
  c["rope_parameters"]["full_attention"]["partial_rotary_factor"] = 1.0;
  EXPECT_NO_THROW(parse_hf_config(c));
}

// A LayerConfig built by hand (not through parse_hf_config) stays inside its array too.
TEST(InputSafety, RopeInverseFrequenciesStayInsideTheArray) {
  for (double partial : {1.5, 1e9, -3.0, std::nan("")}) {
    LayerConfig l;
    l.head_dim = 16;
    l.rope_partial = partial;
    const std::vector<float> inv = l.rope_inv_freq();
    ASSERT_EQ(inv.size(), 8u) << partial;
  }
}

TEST(InputSafety, ConfigNumbersAreRangeChecked) {
  const std::vector<std::pair<std::string, json>> cases = {
      {"num_hidden_layers", 5000},           {"num_hidden_layers", 1e9},
      {"num_hidden_layers", int64_t(1) << 40}, {"vocab_size", int64_t(1) << 40},
      {"vocab_size", 1e30},                  {"hidden_size", -64},
      {"hidden_size", 64.5},                 {"intermediate_size", std::numeric_limits<uint64_t>::max()},
      {"num_attention_heads", 0},            {"head_dim", 1e9},
      {"head_dim", "16"},                    {"sliding_window", 0},
      {"sliding_window", int64_t(1) << 33},  {"max_position_embeddings", -1},
      {"rms_norm_eps", -1e-6},               {"rms_norm_eps", 0},
      {"final_logit_softcapping", -30.0},    {"bos_token_id", 512},
      {"pad_token_id", 512},                 {"pad_token_id", -1},
      {"eos_token_id", 1e12},                {"eos_token_id", json::array({1, -7})},
      {"num_key_value_heads", 3},            {"num_key_value_heads", 0},
  };
  for (const auto& [key, value] : cases) {
    json c = fixture_config();
    c[key] = value;
    const std::string message = error_of([&] { parse_hf_config(c); });
    EXPECT_NE(message.find("config.json"), std::string::npos) << key << "=" << value << ": " << message;
  }
  for (const json& theta : {json(0.0), json(-1.0), json(std::nan("")), json(std::numeric_limits<double>::infinity())}) {
    json c = fixture_config();
    c["rope_parameters"]["sliding_attention"]["rope_theta"] = theta;
    EXPECT_NE(error_of([&] { parse_hf_config(c); }).find("rope_theta"), std::string::npos) << theta;
  }
}

// Without layer_types, num_hidden_layers alone once sized the model (memory grew past 4 GB).
TEST(InputSafety, HugeLayerCountWithoutLayerTypesFailsFast) {
  json c = fixture_config();
  c.erase("layer_types");
  c["num_hidden_layers"] = 2000000000;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_NE(error_of([&] { parse_hf_config(c); }).find("'num_hidden_layers' must be an integer in [1, 4096]"),
            std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// --- tokenizer.json ids ---------------------------------------------------------------------------

json small_tokenizer() {
  json vocab = {{"<pad>", 0}, {"<eos>", 1}, {"<bos>", 2}, {"<unk>", 3}, {"a", 4}, {"b", 5}, {"ab", 6}};
  return {{"version", "1.0"},
          {"added_tokens", json::array({{{"id", 0}, {"content", "<pad>"}, {"special", true}},
                                        {{"id", 1}, {"content", "<eos>"}, {"special", true}}})},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({json::array({"a", "b"})})},
                     {"unk_token", "<unk>"}}},
          {"decoder", {{"type", "Fuse"}}}};
}

// A vocab entry with id 2147483647 once made the tokenizer allocate a 2^31-entry table (64 GB).
TEST(InputSafety, TokenizerIdsMustBeDenseAndIntegral) {
  ASSERT_EQ(Tokenizer::from_json(small_tokenizer().dump()).encode("ab", false), (std::vector<int32_t>{6}));
  for (const json& id : {json(2147483647), json(100000000), json(9), json(-1), json(int64_t(1) << 40),
                         json(std::numeric_limits<uint64_t>::max()), json(4.5), json(1e30), json("4")}) {
    json t = small_tokenizer();
    t["model"]["vocab"]["b"] = id;
    const std::string message = error_of([&] { Tokenizer::from_json(t.dump()); });
    EXPECT_NE(message.find("tokenizer"), std::string::npos) << id << ": " << message;
    EXPECT_NE(message.find("id"), std::string::npos) << id << ": " << message;
    t = small_tokenizer();
    t["added_tokens"][1]["id"] = id;
    EXPECT_NE(error_of([&] { Tokenizer::from_json(t.dump()); }).find("id"), std::string::npos) << id;
  }
  // An added token may take the next free id: the bound counts added tokens too.
  json t = small_tokenizer();
  t["added_tokens"].push_back({{"id", 7}, {"content", "<extra>"}, {"special", true}});
  EXPECT_EQ(Tokenizer::from_json(t.dump()).vocab_size(), 8);
}

// --- misaligned reads -----------------------------------------------------------------------------

TEST(InputSafety, HalfPrecisionRowsAtOddAddressesDecode) {
  const float values[3] = {1.5f, -2.25f, 65504.0f};
  for (DType dtype : {DType::F16, DType::BF16}) {
    std::vector<uint8_t> buffer(1 + 2 * 3 + 1);
    encode_row(dtype, values, 3, buffer.data() + 1);  // odd address on purpose
    float back[3];
    decode_row(dtype, buffer.data() + 1, 3, back);
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(back[i], dtype == DType::F16 ? f16_to_f32(f32_to_f16(values[i])) : bf16_to_f32(f32_to_bf16(values[i])));
  }
}

// Rewrites a GGUF with general.alignment 1 and a padding key chosen so that rope_freqs (F32) lands
// at an address that is not a multiple of 4; the weights (BF16) then start at odd addresses too.
std::string misaligned_gguf(const std::string& source, const std::string& dir) {
  const GgufFile in(source);
  for (size_t pad = 0; pad < 4; ++pad) {
    GgufMetadata m;
    for (const auto& [key, value] : in.metadata().entries())
      if (key != "general.alignment") m.set(key, value);
    m.set("general.alignment", uint32_t(1));
    m.set("test.padding", std::string(pad, 'p'));
    std::vector<GgufTensorPlan> plans;
    for (const GgufTensorInfo& info : in.tensors()) plans.push_back({info.name, info.shape(), info.dtype});
    const std::string path = dir + "/aligned1_" + std::to_string(pad) + ".gguf";
    {
      GgufWriter writer(path, m, plans);
      for (const GgufTensorInfo& info : in.tensors()) {
        const HostTensor t = in.tensor(info);
        writer.append(t.data, t.bytes);
      }
      writer.finish();
    }
    const GgufFile out(path);
    const GgufTensorInfo* rope = out.find_tensor(kRopeFreqsTensor);
    if (rope && (out.data_offset() + rope->offset) % 4 != 0) return path;
  }
  ADD_FAILURE() << "no padding put " << kRopeFreqsTensor << " at an unaligned offset";
  return "";
}

// The CPU logits of a few tokens of the model at `path` (a tiny fixture or its export).
std::vector<float> short_logits(const std::string& path) {
  CpuBackend backend(1);
  auto model = load_model(path, backend);
  Session s(*model, backend, SessionOptions{8, 0});
  return s.logits_all(std::vector<int32_t>{2, 17, 99, 5});
}

// GGUF allows general.alignment 1: rope_freqs was read through a float pointer and BF16 weights
// through a uint16_t pointer (misaligned loads, undefined behaviour).
TEST(InputSafety, GgufWithAlignmentOneLoadsAndMatches) {
  const std::string dir = test::temp_dir("alignment_one");
  ExportOptions options;
  options.weights = DType::BF16;
  export_gguf(HfCheckpoint(test::fixture_dir("tiny-31b-style")), dir + "/model.gguf", options);
  const std::string odd = misaligned_gguf(dir + "/model.gguf", dir);
  ASSERT_FALSE(odd.empty());
  EXPECT_EQ(short_logits(odd), short_logits(dir + "/model.gguf"));
}

// safetensors puts no alignment on tensor data: a header whose length is odd puts BF16 weights at
// odd addresses.
TEST(InputSafety, SafetensorsAtOddOffsetsLoadAndMatch) {
  const std::string fixture = test::fixture_dir("tiny-31b-style-bf16");
  const std::string dir = test::temp_dir("odd_safetensors");
  fs::copy_file(fixture + "/config.json", dir + "/config.json");
  std::ifstream in(fixture + "/model.safetensors", std::ios::binary);
  uint64_t len;
  in.read(reinterpret_cast<char*>(&len), 8);
  std::string header(len, ' ');
  in.read(header.data(), std::streamsize(len));
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string text = json::parse(header).dump();
  if ((8 + text.size()) % 2 == 0) text += ' ';  // JSON allows trailing whitespace
  const uint64_t odd_len = text.size();
  {
    std::ofstream out(dir + "/model.safetensors", std::ios::binary);
    out.write(reinterpret_cast<const char*>(&odd_len), 8);
    out << text << data;
  }
  EXPECT_EQ(short_logits(dir), short_logits(fixture));
}

// --- special files --------------------------------------------------------------------------------

// Opening a FIFO for reading waits for a writer: a model path naming one hung g4 forever.
TEST(InputSafety, FifoIsRejectedWithoutBlocking) {
  const std::string fifo = test::temp_dir("fifo") + "/model.gguf";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  for (const auto& open : std::vector<std::function<void()>>{
           [&] { MappedFile::open(fifo); }, [&] { GgufFile{fifo}; }, [&] { load_hf_config(fifo); },
           [&] { Tokenizer::from_file(fifo); }, [&] { CpuBackend b(1); load_model(fifo, b); }}) {
    auto result = std::async(std::launch::async, [&] { return error_of(open); });
    if (result.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      // Release the blocked reader (a writer end lets its open return), then fail.
      const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
      if (fd >= 0) ::close(fd);
      ADD_FAILURE() << "opening a FIFO blocked";
    }
    const std::string message = result.get();
    EXPECT_TRUE(message.find("not a regular file") != std::string::npos ||
                message.find("cannot open tokenizer file") != std::string::npos)
        << message;
  }
}

}  // namespace
}  // namespace g4
