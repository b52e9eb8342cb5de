// Gemma 4's MTP assistant (model/assistant.h) against llama.cpp's gemma4-assistant and transformers'
// Gemma4AssistantForCausalLM: a random assistant of the fortune demo (tests/fixtures/assistant,
// tools/fixtures/make_assistant_golden.sh, tools/fixtures/transformers_assistant_golden.py) drafts
// four tokens after two prompts, one shorter and one longer than the sliding window, and every
// step's logits and next hidden state are held to each oracle's; an assistant that does not belong
// to the target, or a file that is no assistant, is a clear error.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend_factory.h"
#include "model/assistant.h"
#include "model/config.h"
#include "model/gguf_export.h"
#include "model/loader.h"
#include "runtime/session.h"
#include "support/fixtures.h"
#include "util/error.h"
#include "util/files.h"

namespace g4 {
namespace {

const std::string kAssistantDir = std::string(G4_FIXTURES_DIR) + "/assistant";
const std::string kTargetDir = std::string(G4_FIXTURES_DIR) + "/demo/hf";

// An oracle's files in a case's folder (prefix + target_h.f32, draft_logits.f32, draft_h.f32) and how
// far g4's CPU may be from them (relative L2). llama.cpp's CPU run differs from float64 by up to ~1e-3
// (its GELU goes through an fp16 table: tools/fixtures/make_assistant_golden.sh); transformers' run is
// float64, and g4's CPU is ~1e-6 from float64 (measured: up to 8e-7 against it).
struct Oracle {
  std::string prefix;
  double bound;
};
const Oracle kLlamaCpp{"", 3e-3}, kTransformers{"transformers_", 1e-5};

std::vector<float> row(const std::vector<float>& rows, int64_t i, int64_t cols) {
  return {rows.begin() + i * cols, rows.begin() + (i + 1) * cols};
}

std::vector<float> download(Backend& be, const Tensor& t) {
  std::vector<float> out(size_t(t.numel()));
  be.download(t, out.data());
  return out;
}

// The gap between the two largest values.
double top2_margin(const std::vector<float>& v) {
  std::vector<float> s = v;
  std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<float>());
  return double(s[0]) - double(s[1]);
}

// The draft steps' logits, each from the h before it, on the CPU with the assistant at `path`.
std::vector<float> draft_logits(const std::string& path, const std::string& case_name) {
  const nlohmann::json meta = read_json_file(kAssistantDir + "/" + case_name + "/meta.json");
  auto be = make_backend("cpu");
  const std::unique_ptr<Gemma4> target = load_model(kTargetDir, *be);
  const std::unique_ptr<Gemma4Assistant> assistant = load_assistant(path, *be, target->config());
  Session session(*target, *be);
  session.prefill(meta["prompt_ids"].get<std::vector<int32_t>>());
  const int64_t vocab = meta["vocab"];
  DraftBuffers buf(assistant->config(), *be, 1);
  Tensor ids = be->alloc(DType::I32, 1, 1), positions = be->alloc(DType::I32, 1, 1);
  Tensor h = be->alloc(be->activation_dtype(), 1, meta["backbone"].get<int64_t>()), logits = be->alloc(DType::F32, 1, vocab);
  const int32_t pos0 = int32_t(session.position());
  be->upload(&pos0, positions);
  const DraftRow rows[] = {{&session.kv().caches()}};
  std::vector<float> out;
  for (int32_t id : meta["draft_ids"].get<std::vector<int32_t>>()) {
    be->upload(&id, ids);
    assistant->step(*be, buf, *target, rows, ids, positions, out.empty() ? session.runner().workspace_logits(1).normed : h,
                    logits, h);
    const std::vector<float> step = download(*be, logits);
    out.insert(out.end(), step.begin(), step.end());
  }
  return out;
}

void check_draft_steps(const std::string& case_name, const Oracle& oracle) {
  SCOPED_TRACE(case_name + " against " + (oracle.prefix.empty() ? "llama.cpp" : oracle.prefix));
  const std::string dir = kAssistantDir + "/" + case_name;
  const nlohmann::json meta = read_json_file(dir + "/meta.json");
  const std::vector<int32_t> prompt = meta["prompt_ids"].get<std::vector<int32_t>>();
  const std::vector<int32_t> drafts = meta["draft_ids"].get<std::vector<int32_t>>();
  const int64_t vocab = meta["vocab"], backbone = meta["backbone"], K = meta["K"];
  auto be = make_backend("cpu");
  const std::unique_ptr<Gemma4> target = load_model(kTargetDir, *be);
  const std::unique_ptr<Gemma4Assistant> assistant = load_assistant(kAssistantDir + "/hf", *be, target->config());
  Session session(*target, *be);
  session.prefill(prompt);
  ASSERT_EQ(session.position(), meta["pos0"].get<int64_t>());
  if (oracle.prefix.empty())
    EXPECT_LT(test::relative_l2(session.last_logits_host(), test::read_floats(dir + "/target_logits.f32")), oracle.bound);
  const Tensor target_h = session.runner().workspace_logits(1).normed;
  EXPECT_LT(test::relative_l2(download(*be, target_h), test::read_floats(dir + "/" + oracle.prefix + "target_h.f32")),
            oracle.bound);

  const std::vector<float> want_logits = test::read_floats(dir + "/" + oracle.prefix + "draft_logits.f32");
  const std::vector<float> want_h = test::read_floats(dir + "/" + oracle.prefix + "draft_h.f32");
  DraftBuffers buf(assistant->config(), *be, 1);
  Tensor ids = be->alloc(DType::I32, 1, 1), positions = be->alloc(DType::I32, 1, 1);
  Tensor h = be->alloc(be->activation_dtype(), 1, backbone), logits = be->alloc(DType::F32, 1, vocab);
  const int32_t pos0 = int32_t(session.position());
  be->upload(&pos0, positions);
  const DraftRow rows[] = {{&session.kv().caches()}};
  // Each step from the oracle's h of the step before: a random assistant's h chain amplifies any
  // difference (llama.cpp's own fp16 GELU included) several times a step.
  for (int64_t j = 0; j < K; ++j) {
    SCOPED_TRACE("draft step " + std::to_string(j));
    be->upload(&drafts[size_t(j)], ids);
    if (j > 0) be->upload(row(want_h, j - 1, backbone).data(), h);
    assistant->step(*be, buf, *target, rows, ids, positions, j == 0 ? target_h : h, logits, h);
    const std::vector<float> got = download(*be, logits), want = row(want_logits, j, vocab);
    EXPECT_LT(test::relative_l2(got, want), oracle.bound);
    EXPECT_LT(test::relative_l2(download(*be, h), row(want_h, j, backbone)), oracle.bound);
    if (top2_margin(want) > 0.05)
      EXPECT_EQ(std::max_element(got.begin(), got.end()) - got.begin(),
                std::max_element(want.begin(), want.end()) - want.begin());
  }
}

TEST(Assistant, DraftStepsFollowLlamaCppWithinTheWindow) { check_draft_steps("short", kLlamaCpp); }
TEST(Assistant, DraftStepsFollowLlamaCppPastTheWindow) { check_draft_steps("long", kLlamaCpp); }
TEST(Assistant, DraftStepsFollowTransformersWithinTheWindow) { check_draft_steps("short", kTransformers); }
TEST(Assistant, DraftStepsFollowTransformersPastTheWindow) { check_draft_steps("long", kTransformers); }

// g4 export writes an assistant in llama.cpp's gemma4-assistant layout (llama.cpp reads it back with
// the same results as the golden file: docs/DESIGN.md, "Speculative decoding"); loaded back, it
// drafts the checkpoint's bits.
TEST(Assistant, ExportedAsGgufItDraftsTheCheckpointsBits) {
  const std::string dir = kAssistantDir + "/hf";
  ASSERT_EQ(HfCheckpoint::role_of(dir), ModelRole::kAssistant);
  const std::string gguf = test::temp_dir("assistant-export") + "/assistant.gguf";
  export_gguf(HfCheckpoint(dir, ModelRole::kAssistant), gguf, ExportOptions{});
  const GgufFile file(gguf);
  EXPECT_EQ(file.metadata().get_string("general.architecture"), "gemma4-assistant");
  EXPECT_EQ(file.metadata().get_int("gemma4-assistant.embedding_length_out"), 256);
  EXPECT_EQ(file.metadata().get_int("gemma4-assistant.attention.shared_kv_layers"), 4);
  EXPECT_TRUE(file.find_tensor("nextn.pre_projection.weight") && file.find_tensor("nextn.post_projection.weight"));
  for (const char* c : {"short", "long"}) EXPECT_EQ(draft_logits(gguf, c), draft_logits(dir, c)) << c;

  // Neither form runs as a model of its own.
  auto be = make_backend("cpu");
  EXPECT_NE(test::error_of([&] { load_model(gguf, *be); }).find("give it as --draft_model"), std::string::npos);
  EXPECT_NE(test::error_of([&] { load_model(dir, *be); }).find("give it as --draft_model"), std::string::npos);
}

// The drafts a round default to the assistant's num_assistant_tokens (generation_config.json; in a
// g4 export, g4.num_assistant_tokens), within what a round may hold, else 4; a value that is not a
// positive integer is a clear error.
TEST(Assistant, DraftsARoundComeFromItsGenerationConfig) {
  auto be = make_backend("cpu");
  const ModelConfig target = load_hf_config(kTargetDir + "/config.json");
  EXPECT_EQ(load_assistant(kAssistantDir + "/hf", *be, target)->default_draft_tokens(), kDefaultDraftTokens);
  const std::string dir = test::temp_dir("assistant-drafts");
  for (const char* file : {"config.json", "model.safetensors"})
    std::filesystem::copy_file(kAssistantDir + "/hf/" + file, dir + "/" + file);
  auto with = [&](const std::string& generation_config) {
    std::ofstream(dir + "/generation_config.json") << generation_config;
  };
  with(R"({"num_assistant_tokens": 6, "num_assistant_tokens_schedule": "constant"})");
  EXPECT_EQ(load_assistant(dir, *be, target)->default_draft_tokens(), 6);
  const std::string gguf = dir + "/assistant.gguf";
  export_gguf(HfCheckpoint(dir, ModelRole::kAssistant), gguf, ExportOptions{});
  EXPECT_EQ(load_assistant(gguf, *be, target)->default_draft_tokens(), 6);
  with(R"({"num_assistant_tokens": 20})");  // transformers' own default: more than a round holds
  EXPECT_EQ(load_assistant(dir, *be, target)->default_draft_tokens(), kMaxDraftTokens);
  for (const char* bad : {R"({"num_assistant_tokens": 0})", R"({"num_assistant_tokens": 2.5})"}) {
    with(bad);
    EXPECT_NE(test::error_of([&] { load_assistant(dir, *be, target); }).find("num_assistant_tokens"), std::string::npos)
        << bad;
  }
}

TEST(Assistant, ReadsTheLastTargetLayerOfEachKind) {
  const ModelConfig target = load_hf_config(kTargetDir + "/config.json");
  const ModelConfig assistant = load_hf_config(kAssistantDir + "/hf/config.json", ModelRole::kAssistant);
  EXPECT_EQ(assistant.backbone_hidden_size, target.hidden_size);
  EXPECT_EQ(assistant_cache_layers(target, assistant), (std::vector<int>{4, 4, 4, 5}));
}

TEST(Assistant, OneOfAnotherModelIsAClearError) {
  const ModelConfig target = load_hf_config(kTargetDir + "/config.json");
  const ModelConfig assistant = load_hf_config(kAssistantDir + "/hf/config.json", ModelRole::kAssistant);
  auto message = [&](const std::function<void(ModelConfig&, ModelConfig&)>& change) {
    ModelConfig t = target, a = assistant;
    change(t, a);
    return test::error_of([&] { assistant_cache_layers(t, a); });
  };
  EXPECT_NE(message([](ModelConfig&, ModelConfig& a) { a.vocab_size = 8192; }).find("vocabulary has 8192 tokens"),
            std::string::npos);
  EXPECT_NE(message([](ModelConfig& t, ModelConfig&) { t.hidden_size = 512; }).find("hidden states of width 256"),
            std::string::npos);
  EXPECT_NE(message([](ModelConfig&, ModelConfig& a) { a.layers[3].head_dim = 64; }).find("head size 64"),
            std::string::npos);
  EXPECT_NE(message([](ModelConfig&, ModelConfig& a) { a.layers[0].kv_heads = 1; }).find("reads 1 KV heads"),
            std::string::npos);
  EXPECT_NE(message([](ModelConfig&, ModelConfig& a) { a.sliding_window = 32; }).find("sliding window of 32"),
            std::string::npos);
  EXPECT_NE(message([](ModelConfig&, ModelConfig& a) { a.layers[3].rope_theta = 1e4; }).find("another RoPE"),
            std::string::npos);
  EXPECT_NE(message([](ModelConfig& t, ModelConfig&) {
              for (LayerConfig& l : t.layers) l.sliding = false;
            }).find("no sliding attention layer"),
            std::string::npos);
  EXPECT_NE(message([](ModelConfig&, ModelConfig& a) { a.backbone_hidden_size = 0; }).find("not an MTP assistant"),
            std::string::npos);

  // The embedded chat demo (hidden 512, 8 192 tokens) is another model: refused before any weight is read.
  auto be = make_backend("cpu");
  ModelConfig chat = target;
  chat.vocab_size = 8192;
  EXPECT_NE(test::error_of([&] { load_assistant(kAssistantDir + "/hf", *be, chat); }).find("does not belong"),
            std::string::npos);
}

// transformers' Gemma4AssistantConfig nests the layers' config under text_config, with
// backbone_hidden_size beside it; the flat layout reads the same.
TEST(Assistant, NestedAndFlatConfigsReadTheSame) {
  const nlohmann::json flat = read_json_file(kAssistantDir + "/hf/config.json");
  nlohmann::json text = flat;
  text.erase("backbone_hidden_size");
  text["model_type"] = "gemma4_text";
  const nlohmann::json nested = {{"architectures", {"Gemma4AssistantForCausalLM"}},
                                 {"model_type", "gemma4_assistant"},
                                 {"backbone_hidden_size", 256},
                                 {"use_ordered_embeddings", false},
                                 {"text_config", text}};
  EXPECT_EQ(hf_config_role(nested), ModelRole::kAssistant);
  const ModelConfig a = parse_hf_config(flat, ModelRole::kAssistant), b = parse_hf_config(nested, ModelRole::kAssistant);
  EXPECT_EQ(b.backbone_hidden_size, 256);
  EXPECT_EQ(assistant_cache_layers(load_hf_config(kTargetDir + "/config.json"), b),
            assistant_cache_layers(load_hf_config(kTargetDir + "/config.json"), a));
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.num_layers(), b.num_layers());
}

TEST(Assistant, ConfigsAndFilesOfTheWrongKindAreClearErrors) {
  nlohmann::json config = read_json_file(kAssistantDir + "/hf/config.json");
  nlohmann::json no_backbone = config;
  no_backbone.erase("backbone_hidden_size");
  EXPECT_NE(test::error_of([&] { parse_hf_config(no_backbone, ModelRole::kAssistant); }).find("'backbone_hidden_size'"),
            std::string::npos);
  nlohmann::json own_kv = config;
  own_kv["num_kv_shared_layers"] = 2;
  EXPECT_NE(test::error_of([&] { parse_hf_config(own_kv, ModelRole::kAssistant); }).find("num_kv_shared_layers"),
            std::string::npos);
  // An assistant is no model of its own, and a model no assistant.
  EXPECT_NE(test::error_of([&] { parse_hf_config(config); }).find("MTP assistant"), std::string::npos);
  auto be = make_backend("cpu");
  EXPECT_NE(test::error_of([&] { load_assistant(kTargetDir, *be, load_hf_config(kTargetDir + "/config.json")); })
                .find("num_kv_shared_layers"),
            std::string::npos);
  EXPECT_EQ(test::error_kind_of([&] { load_assistant(kAssistantDir + "/missing", *be, ModelConfig{}); }),
            ErrorKind::kNotFound);
}

}  // namespace
}  // namespace g4
