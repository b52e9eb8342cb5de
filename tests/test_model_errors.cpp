// Bad input to the CPU runtime gets a clear error naming the problem, never a crash.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "format/gguf.h"
#include "model/hf_checkpoint.h"
#include "format/safetensors.h"
#include "model/gguf_export.h"
#include "model/loader.h"
#include "runtime/session.h"
#include "support/demo_engine.h"
#include "support/fixtures.h"
#include "util/error.h"

namespace g4 {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A writable copy of the float32 fixture.
std::string copy_fixture(const std::string& test_name) {
  const std::string dir = test::temp_dir(test_name);
  for (const char* f : {"config.json", "model.safetensors"})
    fs::copy_file(test::fixture_dir("tiny-31b-style") + "/" + f, dir + "/" + f);
  return dir;
}

json read_json(const std::string& path) { return json::parse(std::ifstream(path)); }
void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// Rewrites model.safetensors after `edit` changed the list of tensors.
void rewrite_weights(const std::string& dir, const std::function<void(std::vector<HostTensor>&)>& edit) {
  std::vector<HostTensor> tensors;
  {
    SafetensorsFile f(test::fixture_dir("tiny-31b-style") + "/model.safetensors");
    for (const auto& [name, _] : f.entries()) tensors.push_back(f.tensor(name));
    edit(tensors);
    write_safetensors(dir + "/model.safetensors.new", tensors);
  }
  fs::rename(dir + "/model.safetensors.new", dir + "/model.safetensors");
}

// Loading `dir` fails with an error of `kind` whose message holds `fragment`.
void expect_load_error(const std::string& dir, const std::string& fragment,
                       ErrorKind kind = ErrorKind::kInvalidArgument) {
  CpuBackend backend(1);
  try {
    load_model(dir, backend);
    FAIL() << "loading " << dir << " should fail with '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << "message: " << e.what();
    EXPECT_EQ(e.kind(), kind) << to_string(e.kind()) << ", expected " << to_string(kind) << ": " << e.what();
  }
}

TEST(ModelErrors, MissingDirectory) { expect_load_error("/nonexistent/model", "does not exist", ErrorKind::kNotFound); }

TEST(ModelErrors, MissingConfig) {
  const std::string dir = copy_fixture("missing_config");
  fs::remove(dir + "/config.json");
  expect_load_error(dir, "missing config", ErrorKind::kNotFound);
}

TEST(ModelErrors, MissingWeights) {
  const std::string dir = copy_fixture("missing_weights");
  fs::remove(dir + "/model.safetensors");
  expect_load_error(dir, "missing weights", ErrorKind::kNotFound);
}

TEST(ModelErrors, MalformedConfigJson) {
  const std::string dir = copy_fixture("malformed_json");
  write_text(dir + "/config.json", "{\"vocab_size\": 512, ");
  expect_load_error(dir, "malformed JSON");
}

TEST(ModelErrors, MissingConfigKey) {
  const std::string dir = copy_fixture("missing_key");
  json c = read_json(dir + "/config.json");
  c.erase("hidden_size");
  write_text(dir + "/config.json", c.dump());
  expect_load_error(dir, "missing 'hidden_size'");
}

TEST(ModelErrors, TruncatedSafetensors) {
  const std::string dir = copy_fixture("truncated");
  fs::resize_file(dir + "/model.safetensors", fs::file_size(dir + "/model.safetensors") / 2);
  expect_load_error(dir, "out of range");
  fs::resize_file(dir + "/model.safetensors", 5);
  expect_load_error(dir, "truncated");
}

TEST(ModelErrors, HeaderLongerThanFile) {
  const std::string dir = copy_fixture("long_header");
  std::fstream f(dir + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
  const uint64_t huge = uint64_t(1) << 40;
  f.write(reinterpret_cast<const char*>(&huge), 8);
  f.close();
  expect_load_error(dir, "truncated");
}

// Rewrites the safetensors header of dir/model.safetensors with `edit(header, data_size)`.
void edit_header(const std::string& dir, const std::function<void(json&, size_t)>& edit) {
  std::ifstream in(dir + "/model.safetensors", std::ios::binary);
  uint64_t len;
  in.read(reinterpret_cast<char*>(&len), 8);
  std::string header(len, ' ');
  in.read(header.data(), std::streamsize(len));
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  json h = json::parse(header);
  edit(h, data.size());
  std::string text = h.dump();
  uint64_t new_len = text.size();
  std::ofstream out(dir + "/model.safetensors", std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&new_len), 8);
  out << text << data;
}

TEST(ModelErrors, OffsetsOutOfRange) {
  const std::string dir = copy_fixture("bad_offsets");
  edit_header(dir, [](json& h, size_t data_size) {  // F32 [64] = 256 bytes, starting 4 bytes before the end
    h["model.norm.weight"]["data_offsets"] = {data_size - 4, data_size + 252};
  });
  expect_load_error(dir, "out of range");
}

TEST(ModelErrors, MissingTensor) {
  const std::string dir = copy_fixture("missing_tensor");
  rewrite_weights(dir, [](std::vector<HostTensor>& t) {
    std::erase_if(t, [](const HostTensor& x) { return x.name == "model.layers.2.mlp.up_proj.weight"; });
  });
  expect_load_error(dir, "missing tensor 'layers.2.mlp.up_proj.weight'");
}

TEST(ModelErrors, WrongShape) {
  const std::string dir = copy_fixture("wrong_shape");
  rewrite_weights(dir, [](std::vector<HostTensor>& t) {
    for (auto& x : t)
      if (x.name == "model.layers.1.self_attn.q_proj.weight") x.shape = {32, 128};
  });
  expect_load_error(dir, "tensor 'layers.1.self_attn.q_proj.weight' has shape [32, 128]");
}

TEST(ModelErrors, UnsupportedDtype) {
  const std::string dir = copy_fixture("bad_dtype");
  // I32 has F32's byte size, so only the type is wrong.
  edit_header(dir, [](json& h, size_t) { h["model.norm.weight"]["dtype"] = "I32"; });
  expect_load_error(dir, "unsupported dtype I32", ErrorKind::kUnsupported);
}

TEST(ModelErrors, UnsupportedFeatures) {
  for (auto [key, value] : std::vector<std::pair<std::string, json>>{
           {"enable_moe_block", true}, {"hidden_size_per_layer_input", 256}, {"num_kv_shared_layers", 2}}) {
    const std::string dir = copy_fixture("unsupported_" + key);
    json c = read_json(dir + "/config.json");
    c[key] = value;
    write_text(dir + "/config.json", c.dump());
    expect_load_error(dir, "'" + key + "'", ErrorKind::kUnsupported);
    expect_load_error(dir, "not supported yet", ErrorKind::kUnsupported);
  }
}

void edit_config(const std::string& dir, const std::function<void(json&)>& edit) {
  json c = read_json(dir + "/config.json");
  edit(c);
  write_text(dir + "/config.json", c.dump());
}

TEST(ModelErrors, WrongModelType) {
  const std::string dir = copy_fixture("wrong_model_type");
  edit_config(dir, [](json& c) { c["model_type"] = "llama"; });
  expect_load_error(dir, "model_type 'llama' is not a Gemma 4 text model", ErrorKind::kUnsupported);
}

TEST(ModelErrors, UnknownRopeType) {
  const std::string dir = copy_fixture("bad_rope_type");
  edit_config(dir, [](json& c) { c["rope_parameters"]["full_attention"]["rope_type"] = "yarn"; });
  expect_load_error(dir, "rope_type 'yarn' is not supported", ErrorKind::kUnsupported);
}

TEST(ModelErrors, LayerTypesLengthMismatch) {
  const std::string dir = copy_fixture("layer_types_length");
  edit_config(dir, [](json& c) { c["layer_types"].erase(0); });
  expect_load_error(dir, "'layer_types' has 5 entries for 6 layers");
}

TEST(ModelErrors, NonPositiveLayerCount) {
  for (int layers : {0, -3}) {
    const std::string dir = copy_fixture("layers_" + std::to_string(layers));
    edit_config(dir, [&](json& c) { c["num_hidden_layers"] = layers; });
    expect_load_error(dir, "'num_hidden_layers' must be an integer in [1, 4096], got " + std::to_string(layers));
  }
}

TEST(ModelErrors, MalformedSafetensorsHeaderJson) {
  const std::string dir = copy_fixture("malformed_header");
  std::fstream f(dir + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(8);
  f.write("{\"x", 3);  // the header now starts with an unterminated string
  f.close();
  expect_load_error(dir, "malformed safetensors header");
}

TEST(ModelErrors, UnknownSafetensorsDtype) {
  const std::string dir = copy_fixture("unknown_dtype");
  edit_header(dir, [](json& h, size_t) { h["model.norm.weight"]["dtype"] = "F12"; });
  expect_load_error(dir, "unknown safetensors dtype 'F12'");
}

TEST(ModelErrors, SafetensorsSizeMismatch) {
  const std::string dir = copy_fixture("size_mismatch");
  edit_header(dir, [](json& h, size_t) { h["model.norm.weight"]["shape"] = {65}; });
  expect_load_error(dir, "tensor size mismatch in '" + dir + "/model.safetensors': tensor 'model.norm.weight'");
}

TEST(ModelErrors, IndexNamesAMissingShard) {
  const std::string dir = copy_fixture("missing_shard");
  fs::rename(dir + "/model.safetensors", dir + "/model-00001-of-00002.safetensors");
  json index = {{"metadata", json::object()}, {"weight_map", json::object()}};
  {
    SafetensorsFile f(dir + "/model-00001-of-00002.safetensors");
    for (const auto& [name, _] : f.entries()) index["weight_map"][name] = "model-00001-of-00002.safetensors";
  }
  index["weight_map"]["model.norm.weight"] = "model-00002-of-00002.safetensors";
  write_text(dir + "/model.safetensors.index.json", index.dump());
  expect_load_error(dir, "names 'model-00002-of-00002.safetensors', which does not exist", ErrorKind::kNotFound);
  index["weight_map"]["model.norm.weight"] = "../../model.safetensors";
  write_text(dir + "/model.safetensors.index.json", index.dump());
  expect_load_error(dir, "shard name '../../model.safetensors' is not a file name");
}

// A GGUF container that parses, rewritten from the exported fixture with the metadata keys that
// `keep` accepts and its tensor plans passed through `edit_plans` (tensor data unchanged).
std::string edited_gguf(const std::string& name, const std::function<bool(const std::string&)>& keep,
                        const std::function<void(std::vector<GgufTensorPlan>&)>& edit_plans) {
  const std::string dir = test::temp_dir(name);
  export_gguf(HfCheckpoint(test::fixture_dir("tiny-31b-style")), dir + "/source.gguf", ExportOptions{});
  const GgufFile in(dir + "/source.gguf");
  GgufMetadata m;
  for (const auto& [key, value] : in.metadata().entries())
    if (keep(key)) m.set(key, value);
  std::vector<GgufTensorPlan> plans;
  for (const GgufTensorInfo& info : in.tensors()) plans.push_back({info.name, info.shape(), info.dtype});
  edit_plans(plans);
  GgufWriter writer(dir + "/model.gguf", m, plans);
  for (const GgufTensorInfo& info : in.tensors()) {
    const HostTensor t = in.tensor(info);
    writer.append(t.data, t.bytes);
  }
  writer.finish();
  return dir + "/model.gguf";
}

TEST(ModelErrors, GgufMissingGemma4Key) {
  const std::string key = "gemma4.attention.sliding_window";
  const std::string path = edited_gguf(
      "gguf_missing_key", [&](const std::string& k) { return k != key; }, [](std::vector<GgufTensorPlan>&) {});
  ASSERT_NO_THROW(GgufFile{path});
  expect_load_error(path, key);
}

TEST(ModelErrors, GgufMisshapedTensor) {
  // q_proj [heads * head_dim, hidden] = [64, 64] in the sliding layers; [32, 128] has its bytes.
  const std::string path = edited_gguf("gguf_misshaped", [](const std::string&) { return true; },
                                       [](std::vector<GgufTensorPlan>& plans) {
    for (auto& p : plans)
      if (p.name == "blk.1.attn_q.weight") p.shape = {32, 128};
  });
  ASSERT_NO_THROW(GgufFile{path});
  expect_load_error(path, "tensor 'layers.1.self_attn.q_proj.weight' has shape [32, 128]");
}

// Weights that do not fit the backend's free memory are refused before anything is allocated,
// with the GiB needed and free (a backend that, like CUDA, copies the weights and has a limit).
TEST(ModelErrors, WeightsLargerThanTheFreeMemory) {
  class SmallDevice : public CpuBackend {
   public:
    explicit SmallDevice(size_t free_bytes) : CpuBackend(1), free_bytes_(free_bytes) {}
    size_t weight_bytes_on_backend(const HostTensor& w) const override { return w.bytes; }
    size_t free_memory_bytes() const override { return free_bytes_; }

   private:
    size_t free_bytes_;
  };
  const std::string demo = test::fortune_demo_path();  // 11.7 MB of weights
  SmallDevice full(size_t(1) << 30);  // the workspace margin alone
  const std::string error = test::error_of([&] { load_model(demo, full); });
  EXPECT_EQ(test::error_kind_of([&] { load_model(demo, full); }), ErrorKind::kResourceExhausted);
  EXPECT_NE(error.find("the model's weights need 0.01 GiB of cpu memory (plus 1.00 GiB for workspaces and the KV "
                       "cache), but only 1.00 GiB are free"),
            std::string::npos)
      << error;
  EXPECT_EQ(full.peak_memory_bytes(), 0u) << "nothing allocated before the check";
  SmallDevice enough(size_t(1) << 31);
  EXPECT_NO_THROW(load_model(demo, enough));
}

class SessionErrors : public ::testing::Test {
 protected:
  void SetUp() override { model_ = load_model(test::fixture_dir("tiny-31b-style"), backend_); }
  CpuBackend backend_{1};
  std::unique_ptr<Gemma4> model_;
};

TEST_F(SessionErrors, TokenIdOutOfRangeNamesTheId) {
  Session s(*model_, backend_, SessionOptions{16, 0});
  std::vector<int32_t> ids{5, 512, 7};
  try {
    s.prefill(ids);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 512"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.position(), 0) << "a rejected prompt must leave the session unchanged";
  std::vector<int32_t> negative{-1};
  EXPECT_THROW(s.prefill(negative), Error);
}

TEST_F(SessionErrors, FullContext) {
  Session s(*model_, backend_, SessionOptions{16, 0});
  std::vector<int32_t> ids(15, 3);
  s.prefill(ids);
  s.decode(4);
  EXPECT_EQ(s.position(), 16);
  try {
    s.decode(4);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("context full (16 tokens)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.position(), 16);
}

TEST_F(SessionErrors, ChunkLargerThanTheLimit) {
  Session s(*model_, backend_, SessionOptions{64, 0});
  EXPECT_EQ(s.max_prefill_chunk(), 16);  // min(64 - 1, 2 * window 8)
  std::vector<int32_t> ids(20, 3);
  EXPECT_THROW(s.logits_all(ids, 17), Error);
  EXPECT_THROW(Session(*model_, backend_, SessionOptions{64, 17}), Error);
  EXPECT_THROW(Session(*model_, backend_, SessionOptions{100000, 0}), Error) << "beyond max_position_embeddings";
}

TEST(LogitsCommand, WritesLogitsAndRejectsBadIds) {
  const auto ref = test::load_reference("tiny-31b-style");
  const std::string out = test::temp_dir("logits_cli") + "/logits.f32";
  std::string ids;
  for (int32_t id : ref.tokens) ids += (ids.empty() ? "" : ",") + std::to_string(id);
  std::string output;
  ASSERT_EQ(test::run_command(std::string(G4_BINARY) + " logits --model_path " + ref.dir + " --tokens " + ids +
                                  " --prefill_chunk 5 --out " + out, &output), 0) << output;
  EXPECT_NE(output.find("\"argmax_last\":"), std::string::npos) << output;
  std::vector<float> got(ref.logits.size());
  std::ifstream(out, std::ios::binary).read(reinterpret_cast<char*>(got.data()), std::streamsize(got.size() * 4));
  EXPECT_LE(test::max_abs_diff(got, ref.logits), 1e-3);

  EXPECT_NE(test::run_command(std::string(G4_BINARY) + " logits --model_path " + ref.dir +
                                  " --tokens 1,9999 --out " + out, &output), 0);
  EXPECT_NE(output.find("token id 9999"), std::string::npos) << output;
  EXPECT_NE(test::run_command(std::string(G4_BINARY) + " logits --model_path " + ref.dir +
                                  " --tokens 1,x --out " + out, &output), 0);
  EXPECT_NE(output.find("bad token id 'x'"), std::string::npos) << output;
}

}  // namespace
}  // namespace g4
