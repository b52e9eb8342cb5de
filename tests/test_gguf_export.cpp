// g4 export / GGUF model files against the Hugging Face fixtures: logits of an f32 export equal
// transformers' reference (docs/DESIGN.md §6), bf16/f16 exports reload the converted weights bit for bit, q8_0
// stays within the format's bound, the llama.cpp gemma4 layout (names, dims, keys) is what is
// written, and the CLI (export, inspect) reports errors without leaving files behind.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "model/hf_checkpoint.h"
#include "format/safetensors.h"
#include "quant/quantize.h"
#include "model/gguf_export.h"
#include "model/gguf_model.h"
#include "model/loader.h"
#include "runtime/session.h"
#include "support/fixtures.h"
#include "support/fuzz.h"
#include "util/error.h"
#include "util/half.h"

namespace g4 {
namespace {

namespace fs = std::filesystem;

constexpr double kF32Tolerance = 1e-3;  // docs/DESIGN.md §6, float32 compute

const std::vector<std::string> kFixtures = {"tiny-31b-style", "tiny-31b-style-bf16", "published-layout",
                                           "real-head-dims"};

std::string export_fixture(const std::string& fixture, std::optional<DType> weights, const std::string& tag,
                           bool sample = false) {
  const std::string path = test::temp_dir("gguf_export_" + fixture + "_" + tag) + "/model.gguf";
  ExportOptions options;
  options.weights = weights;
  options.use_sampling = sample;
  export_gguf(HfCheckpoint(test::fixture_dir(fixture)), path, options);
  return path;
}

std::vector<float> gguf_logits(const std::string& path, const test::Reference& ref) {
  CpuBackend backend(2);
  auto model = load_model(path, backend);
  SessionOptions o;
  o.max_seq_len = ref.positions + 1;
  Session s(*model, backend, o);
  return s.logits_all(ref.tokens);
}

// The tensor's values converted the way the exporter does: decode, then encode as `dtype`.
std::vector<uint8_t> converted(const HostTensor& t, DType dtype) {
  const int64_t cols = t.shape.back(), rows = t.numel() / cols;
  std::vector<float> wide(static_cast<size_t>(cols));
  std::vector<uint8_t> out(size_t(rows) * row_bytes(dtype, cols));
  for (int64_t r = 0; r < rows; ++r) {
    decode_row(t.dtype, static_cast<const uint8_t*>(t.data) + size_t(r) * row_bytes(t.dtype, cols), cols,
               wide.data());
    encode_row(dtype, wide.data(), cols, out.data() + size_t(r) * row_bytes(dtype, cols));
  }
  return out;
}

std::vector<float> widened(const HostTensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  const int64_t cols = t.shape.back();
  for (int64_t r = 0; r < t.numel() / cols; ++r)
    decode_row(t.dtype, static_cast<const uint8_t*>(t.data) + size_t(r) * row_bytes(t.dtype, cols), cols,
               out.data() + r * cols);
  return out;
}

class GgufExport : public ::testing::TestWithParam<std::string> {};

TEST_P(GgufExport, F32ExportMatchesTheReferenceLogits) {
  const auto ref = test::load_reference(GetParam());
  const std::string path = export_fixture(GetParam(), DType::F32, "f32");
  EXPECT_LE(test::max_abs_diff(gguf_logits(path, ref), ref.logits), kF32Tolerance);
}

TEST_P(GgufExport, ConfigSurvivesTheRoundTrip) {
  const HfCheckpoint checkpoint(test::fixture_dir(GetParam()));
  const GgufModel model(export_fixture(GetParam(), std::nullopt, "config"));
  const ModelConfig &a = checkpoint.config(), &b = model.config();
  EXPECT_EQ(b.vocab_size, a.vocab_size);
  EXPECT_EQ(b.hidden_size, a.hidden_size);
  EXPECT_EQ(b.intermediate_size, a.intermediate_size);
  EXPECT_EQ(b.num_heads, a.num_heads);
  EXPECT_EQ(b.sliding_window, a.sliding_window);
  EXPECT_EQ(b.max_position_embeddings, a.max_position_embeddings);
  EXPECT_EQ(b.tie_word_embeddings, a.tie_word_embeddings);
  EXPECT_EQ(b.bos_id, a.bos_id);
  EXPECT_EQ(b.eos_ids, a.eos_ids);
  EXPECT_EQ(b.pad_id, a.pad_id);
  EXPECT_EQ(b.rms_norm_eps, double(float(a.rms_norm_eps)));  // GGUF stores it as F32
  EXPECT_EQ(b.final_logit_softcap, a.final_logit_softcap);
  ASSERT_EQ(b.num_layers(), a.num_layers());
  for (int i = 0; i < a.num_layers(); ++i) {
    const LayerConfig &x = a.layers[size_t(i)], &y = b.layers[size_t(i)];
    EXPECT_EQ(y.sliding, x.sliding) << i;
    EXPECT_EQ(y.head_dim, x.head_dim) << i;
    EXPECT_EQ(y.kv_heads, x.kv_heads) << i;
    EXPECT_EQ(y.k_eq_v, x.k_eq_v) << i;
    EXPECT_EQ(y.rope_theta, x.rope_theta) << i;
    EXPECT_EQ(x.rope_inv_freq(), y.rope_inv_freq()) << i;
  }
}

// bf16 and f16 exports hold exactly the converted checkpoint values; 1-D tensors are F32.
TEST_P(GgufExport, HalfPrecisionExportsReloadExactly) {
  const HfCheckpoint checkpoint(test::fixture_dir(GetParam()));
  for (DType dtype : {DType::BF16, DType::F16}) {
    const GgufModel model(export_fixture(GetParam(), dtype, dtype_name(dtype)));
    for (const TensorSpec& spec : expected_tensors(checkpoint.config())) {
      const HostTensor& original = *checkpoint.find(spec.name);
      const HostTensor* reloaded = model.find(spec.name);
      ASSERT_NE(reloaded, nullptr) << spec.name;
      const DType want = spec.shape.size() == 2 ? dtype : DType::F32;
      EXPECT_EQ(reloaded->dtype, want) << spec.name;
      EXPECT_EQ(reloaded->shape, spec.shape) << spec.name;
      const auto expected = converted(original, want);
      ASSERT_EQ(reloaded->bytes, expected.size()) << spec.name;
      EXPECT_EQ(std::memcmp(reloaded->data, expected.data(), expected.size()), 0) << spec.name;
    }
  }
}

// A checkpoint directory holding `source`'s tensors widened to F32, with the fixture's config.
std::string f32_checkpoint(const std::string& checkpoint_dir, const TensorSource& source, const std::string& tag) {
  const std::string dir = test::temp_dir("gguf_widened_" + tag);
  std::vector<std::vector<float>> values;
  std::vector<HostTensor> tensors;
  for (const std::string& name : source.names()) {
    const HostTensor& t = *source.find(name);
    values.push_back(widened(t));
    HostTensor f;
    f.name = name == "lm_head.weight" ? name : "model." + name;
    f.dtype = DType::F32;
    f.shape = t.shape;
    f.data = values.back().data();
    f.bytes = values.back().size() * sizeof(float);
    tensors.push_back(f);
  }
  write_safetensors(dir + "/model.safetensors", tensors);
  std::ifstream in(checkpoint_dir + "/config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config["torch_dtype"] = "float32";
  std::ofstream(dir + "/config.json") << config.dump();
  return dir;
}

// The 4-, 5- and 6-bit block types on the trained demo model (its 256-wide rows fit the K-quants'
// 256-weight blocks): every matrix but the embedding is stored in the type (the embedding stays
// Q8_0), the CPU computes exactly what the dequantized weights compute, and the logits stay near
// transformers' float64 reference by a bound that grows as the bits shrink.
TEST(GgufQuantizedExport, BlockTypesRunTheirDequantizedWeights) {
  const test::Reference ref = test::load_demo_reference();
  const std::string demo = std::string(G4_FIXTURES_DIR) + "/demo/hf";
  // Relative L2 against float64 measured 2026-12-01 (CPU): Q6_K 0.012, Q5_K 0.025, Q5_1 0.026,
  // Q5_0 0.028, Q4_K 0.048, Q4_1 0.052, Q4_0 0.057; the bounds are about twice those.
  const std::pair<DType, double> cases[] = {{DType::Q6_K, 0.03}, {DType::Q5_K, 0.05}, {DType::Q5_1, 0.05},
                                            {DType::Q5_0, 0.05}, {DType::Q4_K, 0.1},  {DType::Q4_1, 0.1},
                                            {DType::Q4_0, 0.12}};
  for (const auto& [type, bound] : cases) {
    const std::string name = dtype_name(type);
    const std::string path = test::temp_dir("gguf_demo_" + name) + "/demo.gguf";
    ExportOptions options;
    options.weights = type;
    export_gguf(HfCheckpoint(demo), path, options);
    const GgufModel model(path);
    EXPECT_EQ(model.find("embed_tokens.weight")->dtype, DType::Q8_0) << name;
    EXPECT_EQ(model.find("layers.0.mlp.down_proj.weight")->dtype, type) << name;
    EXPECT_EQ(model.find("layers.5.self_attn.q_proj.weight")->dtype, type) << name;
    const std::vector<float> logits = gguf_logits(path, ref);
    CpuBackend backend(2);
    auto dequantized = load_model(f32_checkpoint(demo, model, "demo_" + name), backend);
    SessionOptions o;
    o.max_seq_len = ref.positions + 1;
    EXPECT_LE(test::max_abs_diff(logits, Session(*dequantized, backend, o).logits_all(ref.tokens)), kF32Tolerance)
        << name;
    const double error = test::relative_l2(test::stored_rows(logits, ref), ref.logits);
    std::printf("  demo %s: relative L2 %.3g against transformers float64\n", name.c_str(), error);
    EXPECT_LE(error, bound) << name;
  }
}

// Files written before RoPE went float32 for every dtype carry `g4.rope_dtype` ("BF16" for bf16
// checkpoints); they load, the key is ignored and the logits are those of the file without it.
TEST_P(GgufExport, TheOldRopeDtypeKeyIsIgnored) {
  const auto ref = test::load_reference(GetParam());
  const std::string path = export_fixture(GetParam(), DType::BF16, "rope_dtype");
  const GgufFile file(path);
  GgufMetadata metadata = file.metadata();
  metadata.set("g4.rope_dtype", std::string("BF16"));
  std::vector<GgufTensorPlan> plans;
  for (const GgufTensorInfo& t : file.tensors()) plans.push_back({t.name, t.shape(), t.dtype});
  const std::string old = test::temp_dir("gguf_old_rope_dtype") + "/old.gguf";
  GgufWriter writer(old, metadata, plans);
  for (const GgufTensorInfo& t : file.tensors()) {
    const HostTensor h = file.tensor(t);
    writer.append(h.data, h.bytes);
  }
  writer.finish();
  EXPECT_EQ(gguf_logits(old, ref), gguf_logits(path, ref));
}

// Q8_0: every matrix value within d/2 of the original (d = the block's max |x| / 127) plus the f16
// rounding of d; the file computes exactly what its dequantised weights do; and the logits stay
// near transformers' reference.
TEST_P(GgufExport, Q8_0ExportIsWithinTheFormatBound) {
  const auto ref = test::load_reference(GetParam());
  const HfCheckpoint checkpoint(test::fixture_dir(GetParam()));
  const std::string path = export_fixture(GetParam(), DType::Q8_0, "q8_0");
  const GgufModel model(path);
  for (const TensorSpec& spec : expected_tensors(checkpoint.config())) {
    if (spec.shape.size() != 2) continue;
    const HostTensor* reloaded = model.find(spec.name);
    ASSERT_EQ(reloaded->dtype, DType::Q8_0) << spec.name;
    const auto x = widened(*checkpoint.find(spec.name)), y = widened(*reloaded);
    for (size_t b = 0; b < x.size() / 32; ++b) {
      float amax = 0;
      for (size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
      const float d = amax / 127.0f, d16 = f16_to_f32(f32_to_f16(d));
      const double bound = d / 2 * (1 + 1e-6) + 127.0 * std::fabs(d - d16);
      for (size_t i = 0; i < 32; ++i) ASSERT_LE(std::fabs(x[b * 32 + i] - y[b * 32 + i]), bound) << spec.name;
    }
  }
  const std::vector<float> logits = gguf_logits(path, ref);
  CpuBackend backend(2);
  auto dequantised = load_model(f32_checkpoint(test::fixture_dir(GetParam()), model, GetParam() + "_q8_0"), backend);
  SessionOptions o;
  o.max_seq_len = ref.positions + 1;
  EXPECT_LE(test::max_abs_diff(logits, Session(*dequantised, backend, o).logits_all(ref.tokens)), kF32Tolerance);

  // These random-weight fixtures amplify weight noise ~20x (a bf16 export of the f32 fixture, a
  // 2^-9 relative perturbation, moves the logits by relative L2 0.045); Q8_0's rounding is a few
  // times coarser, measured: relative L2 0.10 / 0.34 / 0.10, max |dlogit| 0.83 / 2.6 / 0.63 at
  // logits up to ~4.4. A bound of 0.5 holds those, and a wrong scale or layout (uncorrelated
  // logits, relative L2 ~1.4) fails it.
  const double error = test::relative_l2(logits, ref.logits);
  std::printf("%s q8_0: relative L2 %.4f, max |dlogit| %.4f\n", GetParam().c_str(), error,
              test::max_abs_diff(logits, ref.logits));
  EXPECT_LE(error, 0.5);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GgufExport, ::testing::ValuesIn(kFixtures));

TEST(GgufLayout, LlamaCppNamesDimsAndKeys) {
  const GgufFile file(export_fixture("tiny-31b-style", std::nullopt, "layout"));
  const GgufMetadata& m = file.metadata();
  EXPECT_EQ(m.get_string("general.architecture"), "gemma4");
  EXPECT_EQ(m.get_int("gemma4.block_count"), 6);
  EXPECT_EQ(m.get_int("gemma4.embedding_length"), 64);
  EXPECT_EQ(m.get_int("gemma4.feed_forward_length"), 160);
  EXPECT_EQ(m.get_int("gemma4.attention.head_count"), 4);
  EXPECT_EQ(m.get_int_array("gemma4.attention.head_count_kv"), (std::vector<int64_t>{2, 2, 2, 2, 2, 1}));
  EXPECT_EQ(m.get_int("gemma4.attention.key_length"), 32);
  EXPECT_EQ(m.get_int("gemma4.attention.key_length_swa"), 16);
  EXPECT_EQ(m.get_int("gemma4.rope.dimension_count"), 32);
  EXPECT_EQ(m.get_float("gemma4.rope.freq_base"), 1e6);
  EXPECT_EQ(m.get_float("gemma4.rope.freq_base_swa"), 1e4);
  EXPECT_EQ(m.get_int("gemma4.attention.sliding_window"), 8);
  EXPECT_EQ(m.get_bool_array("gemma4.attention.sliding_window_pattern"),
            (std::vector<bool>{true, true, true, true, true, false}));
  EXPECT_EQ(m.get_float("gemma4.final_logit_softcapping"), 30.0);
  EXPECT_EQ(m.get_int("gemma4.attention.shared_kv_layers"), 0);
  EXPECT_EQ(m.get_int("gemma4.embedding_length_per_layer_input"), 0);
  EXPECT_EQ(m.get_int("tokenizer.ggml.padding_token_id"), 0);  // config.json's pad_token_id
  EXPECT_FALSE(m.get_bool("g4.use_sampling"));
  EXPECT_EQ(m.get_int("g4.max_seq_len"), 256);      // min(max_position_embeddings 256, 4096)
  EXPECT_EQ(m.get_int("g4.max_prefill_chunk"), 16);  // min(255, 2 * window 8)
  EXPECT_EQ(m.get_int("g4.min_prefill_chunk"), 1);

  // Linear weights [out, in] have dims [in, out]; tied embeddings mean no output tensor.
  EXPECT_EQ(file.find_tensor("token_embd.weight")->dims, (std::vector<uint64_t>{64, 512}));
  EXPECT_EQ(file.find_tensor("blk.0.attn_q.weight")->dims, (std::vector<uint64_t>{64, 64}));
  EXPECT_EQ(file.find_tensor("blk.0.ffn_down.weight")->dims, (std::vector<uint64_t>{160, 64}));
  EXPECT_EQ(file.find_tensor("blk.5.attn_k.weight")->dims, (std::vector<uint64_t>{64, 32}));
  EXPECT_EQ(file.find_tensor("blk.5.layer_output_scale.weight")->dims, (std::vector<uint64_t>{1}));
  EXPECT_NE(file.find_tensor("blk.4.attn_v.weight"), nullptr);
  EXPECT_EQ(file.find_tensor("blk.5.attn_v.weight"), nullptr);  // K=V full layer
  EXPECT_EQ(file.find_tensor("output.weight"), nullptr);
  for (const char* name : {"output_norm.weight", "blk.3.attn_norm.weight", "blk.3.attn_output.weight",
                           "blk.3.attn_q_norm.weight", "blk.3.attn_k_norm.weight", "blk.3.post_attention_norm.weight",
                           "blk.3.ffn_norm.weight", "blk.3.ffn_gate.weight", "blk.3.ffn_up.weight",
                           "blk.3.post_ffw_norm.weight"})
    EXPECT_NE(file.find_tensor(name), nullptr) << name;

  // rope_freqs: f32[full head_dim / 2], 1.0 for the 0.25 * 32 / 2 = 4 rotating pairs, 1e30 after.
  const HostTensor freqs = file.tensor(*file.find_tensor("rope_freqs.weight"));
  ASSERT_EQ(freqs.dtype, DType::F32);
  const std::vector<float> values(static_cast<const float*>(freqs.data), static_cast<const float*>(freqs.data) + 16);
  EXPECT_EQ(values, (std::vector<float>{1, 1, 1, 1, 1e30f, 1e30f, 1e30f, 1e30f, 1e30f, 1e30f, 1e30f, 1e30f, 1e30f,
                                        1e30f, 1e30f, 1e30f}));
}

TEST(GgufLayout, TensorNamesMapBothWays) {
  EXPECT_EQ(gguf_tensor_name("layers.12.self_attn.q_proj.weight"), "blk.12.attn_q.weight");
  EXPECT_EQ(gguf_tensor_name("layers.0.layer_scalar"), "blk.0.layer_output_scale.weight");
  EXPECT_EQ(gguf_tensor_name("lm_head.weight"), "output.weight");
  EXPECT_EQ(canonical_tensor_name("blk.59.post_ffw_norm.weight"), "layers.59.post_feedforward_layernorm.weight");
  EXPECT_EQ(canonical_tensor_name("output_norm.weight"), "norm.weight");
  EXPECT_EQ(canonical_tensor_name("rope_freqs.weight"), "");
  EXPECT_EQ(canonical_tensor_name("blk.07.attn_q.weight"), "");
  EXPECT_EQ(canonical_tensor_name("blk.x.attn_q.weight"), "");
  EXPECT_THROW(gguf_tensor_name("vision_tower.weight"), Error);
}

TEST(GgufLayout, Q8_0FallsBackForRaggedInFeatures) {
  std::string note;
  EXPECT_EQ(stored_dtype({64, 48}, DType::BF16, DType::Q8_0, &note), DType::F16);
  EXPECT_NE(note.find("48 is not a multiple of 32"), std::string::npos) << note;
  EXPECT_EQ(stored_dtype({64, 64}, DType::BF16, DType::Q8_0, &note), DType::Q8_0);
  EXPECT_TRUE(note.empty());
  EXPECT_EQ(stored_dtype({64}, DType::BF16, DType::Q8_0, &note), DType::F32);
  EXPECT_EQ(stored_dtype({64, 64}, DType::BF16, std::nullopt, &note), DType::BF16);
  // K-quants need 256-wide rows; llama.cpp's fallbacks: Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0.
  EXPECT_EQ(stored_dtype({64, 64}, DType::BF16, DType::Q4_K, &note), DType::Q5_0);
  EXPECT_NE(note.find("64 is not a multiple of 256: Q5_0 instead of Q4_K"), std::string::npos) << note;
  EXPECT_EQ(stored_dtype({64, 64}, DType::BF16, DType::Q5_K, &note), DType::Q5_1);
  EXPECT_EQ(stored_dtype({64, 64}, DType::BF16, DType::Q6_K, &note), DType::Q8_0);
  EXPECT_EQ(stored_dtype({64, 48}, DType::BF16, DType::Q6_K, &note), DType::F16);
  EXPECT_EQ(stored_dtype({64, 48}, DType::BF16, DType::Q4_0, &note), DType::F16);
  EXPECT_EQ(stored_dtype({64, 256}, DType::BF16, DType::Q4_K, &note), DType::Q4_K);
  // The embedding keeps 8 bits under a narrower type.
  EXPECT_EQ(stored_dtype({64, 256}, DType::BF16, DType::Q4_K, &note, /*embedding=*/true), DType::Q8_0);
  EXPECT_NE(note.find("embedding stays Q8_0"), std::string::npos) << note;
  EXPECT_EQ(parse_weight_dtype("q4_k"), DType::Q4_K);
  EXPECT_EQ(parse_weight_dtype("q6_k"), DType::Q6_K);
  const std::string q2_k = test::error_of([] { parse_weight_dtype("q2_k"); });
  EXPECT_NE(q2_k.find("--weights must be one of"), std::string::npos) << q2_k;
  EXPECT_NE(q2_k.find("q4_0"), std::string::npos) << q2_k;
}

// llama.cpp's Q4_K_M per-tensor choice: Q6_K for the output matrix and for attn_v / ffn_down in the
// first and last eighth of the layers and every third layer between, Q4_K elsewhere. For the 31B
// shape (60 layers, 50 of them with a v_proj) and for the demo model's export.
TEST(GgufQuantizedExport, Q4_K_MChoosesLlamaCppsTypes) {
  ExportOptions o;
  o.weights = DType::Q4_K;
  o.q4_k_m = true;
  auto down = [&](int layer) {
    return requested_dtype("layers." + std::to_string(layer) + ".mlp.down_proj.weight", o, 60, 0, 50);
  };
  for (int layer : {0, 6, 9, 12, 51, 52, 59}) EXPECT_EQ(down(layer), DType::Q6_K) << layer;
  for (int layer : {7, 8, 10, 11, 50}) EXPECT_EQ(down(layer), DType::Q4_K) << layer;
  auto v = [&](int index) { return requested_dtype("layers.3.self_attn.v_proj.weight", o, 60, index, 50); };
  for (int index : {0, 5, 8, 43, 49}) EXPECT_EQ(v(index), DType::Q6_K) << index;
  for (int index : {6, 7, 9, 42}) EXPECT_EQ(v(index), DType::Q4_K) << index;
  EXPECT_EQ(requested_dtype("embed_tokens.weight", o, 60, 0, 50), DType::Q6_K);
  EXPECT_EQ(requested_dtype("layers.3.self_attn.q_proj.weight", o, 60, 0, 50), DType::Q4_K);
  EXPECT_EQ(requested_dtype("layers.3.mlp.gate_proj.weight", o, 60, 0, 50), DType::Q4_K);

  const std::string path = test::temp_dir("gguf_demo_q4_k_m") + "/demo.gguf";
  export_gguf(HfCheckpoint(std::string(G4_FIXTURES_DIR) + "/demo/hf"), path, o);
  const GgufModel model(path);
  EXPECT_EQ(model.find("embed_tokens.weight")->dtype, DType::Q8_0);  // 8 bits unless asked otherwise
  for (int layer = 0; layer < 6; ++layer) {
    const std::string p = "layers." + std::to_string(layer) + ".";
    EXPECT_EQ(model.find(p + "mlp.down_proj.weight")->dtype, layer == 2 || layer == 5 ? DType::Q6_K : DType::Q4_K)
        << layer;
    if (layer < 5)  // five sliding layers have a v_proj: the 3rd and the 5th get more bits
      EXPECT_EQ(model.find(p + "self_attn.v_proj.weight")->dtype, layer == 2 || layer == 4 ? DType::Q6_K : DType::Q4_K)
          << layer;
    EXPECT_EQ(model.find(p + "mlp.up_proj.weight")->dtype, DType::Q4_K) << layer;
  }
}

// A block whose f16 scale is NaN (a corrupt or hostile file) is refused at load, naming the tensor,
// instead of turning the model's output into NaN.
TEST(GgufQuantizedExport, ANanBlockScaleIsAClearError) {
  const std::string path = export_fixture("tiny-31b-style", DType::Q4_0, "q4_0_nan");
  uint64_t at = 0;
  {
    const GgufFile file(path);
    const GgufTensorInfo* q = file.find_tensor("blk.1.attn_q.weight");
    ASSERT_TRUE(q && q->dtype == DType::Q4_0);
    at = file.data_offset() + q->offset + 3 * block_bytes(DType::Q4_0);  // block 3's scale
  }
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(std::streamoff(at));
  const uint16_t nan = 0x7E00;
  f.write(reinterpret_cast<const char*>(&nan), 2);
  f.close();
  CpuBackend backend(1);
  const std::string error = test::error_of([&] { load_model(path, backend); });
  EXPECT_NE(error.find("'layers.1.self_attn.q_proj.weight': block 3 has a NaN or infinite scale"), std::string::npos)
      << error;
}

// A backend that cannot run a weight type: loading says which tensor and type before allocating.
TEST(GgufQuantizedExport, ABackendThatCannotRunATypeSaysSoAtLoad) {
  class Bf16Only : public CpuBackend {
   public:
    Bf16Only() : CpuBackend(1) {}
    bool runs_weight_dtype(DType t) const override { return t == DType::Q8_0 || !is_block_quantized(t); }
  };
  const std::string path = export_fixture("tiny-31b-style", DType::Q4_0, "q4_0");
  Bf16Only backend;
  const std::string error = test::error_of([&] { load_model(path, backend); });
  EXPECT_NE(error.find("is Q4_0, which the cpu backend does not run"), std::string::npos) << error;
  EXPECT_EQ(backend.peak_memory_bytes(), 0u) << "nothing allocated before the check";
}

TEST(GgufProgram, FlagsAndTokenizerTravelWithTheFile) {
  const std::string dir = test::temp_dir("gguf_tokenizer_checkpoint");
  for (const char* file : {"config.json", "model.safetensors"})
    fs::copy_file(test::fixture_dir("published-layout") + "/" + file, dir + "/" + file);
  const std::string tokenizer = R"({"model": {"type": "BPE"}, "note": "\u2581 not a real tokenizer"})";
  std::ofstream(dir + "/tokenizer.json") << tokenizer;
  ExportOptions options;
  options.use_sampling = true;
  options.max_seq_len = 10;
  const std::string path = dir + "/model.gguf";
  const ExportResult result = export_gguf(HfCheckpoint(dir), path, options);
  EXPECT_TRUE(result.tokenizer_embedded);
  EXPECT_EQ(result.file_bytes, fs::file_size(path));
  const GgufModel model(path);
  ASSERT_TRUE(model.tokenizer_json().has_value());
  EXPECT_EQ(*model.tokenizer_json(), tokenizer);
  EXPECT_TRUE(model.program().use_sampling);
  EXPECT_EQ(model.program().max_seq_len, 10);
  EXPECT_EQ(model.program().max_prefill_chunk, 8);  // min(10 - 1, 2 * window 4)
  EXPECT_EQ(model.program().min_prefill_chunk, 1);
  EXPECT_EQ(model.program().kv_types, KvTypes{});  // none recorded: bf16

  // KV types travel as g4.kv_type / g4.kv_sliding_type; a value g4 does not know names its key.
  options.kv_types = {KvType::kTq4, KvType::kBf16};  // (head dim 16: no Q8_0 block)
  const ExportResult quantized_kv = export_gguf(HfCheckpoint(dir), dir + "/tq4.gguf", options);
  EXPECT_EQ(GgufModel(dir + "/tq4.gguf").program().kv_types, options.kv_types);
  GgufMetadata metadata = gemma4_metadata(model.config(), quantized_kv.program);
  metadata.set(gguf_key::kKvType, std::string("q4_0"));
  const std::string error = test::error_of([&] { program_flags(metadata, model.config()); });
  EXPECT_NE(error.find("GGUF metadata 'g4.kv_type': --kv_type must be bf16, q8_0 or tq4, not 'q4_0'"), std::string::npos)
      << error;
  options.kv_types = {};

  EXPECT_FALSE(GgufModel(export_fixture("published-layout", std::nullopt, "no_tokenizer")).tokenizer_json());
  options.max_seq_len = 513;  // beyond max_position_embeddings 512
  EXPECT_THROW(export_gguf(HfCheckpoint(dir), dir + "/too_long.gguf", options), Error);
  EXPECT_FALSE(fs::exists(dir + "/too_long.gguf"));
}

// The exported fixture, mutated: parsing and reading the config end in success or g4::Error.
TEST(GgufProgram, MutatedModelFilesFailCleanly) {
  const std::string path = export_fixture("published-layout", DType::Q8_0, "fuzz");
  std::ifstream in(path, std::ios::binary);
  const std::vector<uint8_t> seed{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const size_t header = GgufFile(path).data_offset();
  std::mt19937_64 rng(test::fuzz_seed(4));  // fixed seed and count: the same files on every machine
  const size_t total = test::fuzz_runs(3000);
  size_t runs = 0;
  while (runs < total) {
    auto bytes = std::make_shared<std::vector<uint8_t>>(seed);
    for (int m = 0; m < 1 + int(rng() % 3); ++m) {
      const size_t at = rng() % header;  // the metadata and tensor table, where the structure is
      if (rng() % 8 == 0) {
        bytes->resize(at);
        break;
      }
      (*bytes)[at] = uint8_t(rng());
    }
    ++runs;
    try {
      const GgufFile file(bytes, "mutated");
      const ModelConfig config = gemma4_config(file);
      program_flags(file.metadata(), config);
    } catch (const Error&) {
    }
  }
}

// --- CLI ------------------------------------------------------------------------------------------

std::string g4_cli(const std::string& args, int* status) {
  std::string out;
  *status = test::run_command(std::string(G4_BINARY) + " " + args, &out);
  return out;
}

TEST(GgufCli, InspectShowsTheSamplingFlag) {
  const std::string dir = test::temp_dir("gguf_cli_inspect");
  const std::string fixture = test::fixture_dir("tiny-31b-style");
  int status = 0;
  std::string out = g4_cli("export --model-dir " + fixture + " --output " + dir + "/s.gguf --sample --weights q8_0",
                           &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("blk.0.attn_q.weight"), std::string::npos) << out;
  EXPECT_NE(out.find("wrote " + dir + "/s.gguf"), std::string::npos) << out;
  out = g4_cli("export --model_dir " + fixture + " --output " + dir + "/l.gguf --max_seq_len 64", &status);
  ASSERT_EQ(status, 0) << out;

  out = g4_cli("inspect " + dir + "/s.gguf", &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("\"g4.use_sampling\": true"), std::string::npos) << out;
  EXPECT_NE(out.find("\"blk.0.attn_q.weight\""), std::string::npos);
  EXPECT_NE(out.find("\"Q8_0\""), std::string::npos);
  out = g4_cli("inspect " + dir + "/l.gguf", &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("\"g4.use_sampling\": false"), std::string::npos) << out;
  EXPECT_NE(out.find("\"g4.max_seq_len\": 64"), std::string::npos) << out;

  out = g4_cli("inspect " + fixture + "/config.json", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("bad magic"), std::string::npos) << out;
}

TEST(GgufCli, ExportErrorsLeaveNoFile) {
  const std::string dir = test::temp_dir("gguf_cli_errors");
  const std::string fixture = test::fixture_dir("tiny-31b-style");
  const std::string output = dir + "/out.gguf";
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      {"--model-dir " + dir + "/missing --output " + output, "does not exist"},
      {"--model-dir " + fixture + " --output " + output + " --weights q2_k", "--weights must be one of"},
      {"--model-dir " + fixture + " --output " + output + " --max-seq-len 100000", "max_seq_len 100000"},
      {"--model-dir " + fixture + " --output " + dir + "/no/such/dir/out.gguf", "cannot write"},
  };
  for (const Case& c : cases) {
    int status = 0;
    const std::string out = g4_cli("export " + c.args, &status);
    EXPECT_NE(status, 0) << c.args;
    EXPECT_NE(out.find(c.message), std::string::npos) << c.args << "\n" << out;
    EXPECT_TRUE(fs::is_empty(dir)) << c.args;
  }
}

}  // namespace
}  // namespace g4
