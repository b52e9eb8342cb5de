// llama.cpp's tokenizer.ggml.* keys in g4's exports, and g4's tokenizer built from them when a file
// has no tokenizer.huggingface.json: the demo model's export carries the keys the way llama.cpp's
// Gemma 4 converter writes them, the keys alone tokenize and decode exactly as the checkpoint's
// tokenizer.json does, and inconsistent keys fail naming the key.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "backend/backend_factory.h"
#include "model/gguf_export.h"
#include "model/loader.h"
#include "model/gguf_model.h"
#include "model/gguf_tokenizer.h"
#include "model/hf_checkpoint.h"
#include "support/fixtures.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/files.h"

namespace g4 {
namespace {

using test::error_of;

const std::string kDemoDir = std::string(G4_FIXTURES_DIR) + "/demo/hf";

// One bf16 export of the demo checkpoint per test binary run.
const std::string& demo_export() {
  static const std::string path = [] {
    const std::string p = test::temp_dir("gguf_tokenizer_demo") + "/demo.gguf";
    ExportOptions options;
    options.weights = DType::BF16;
    export_gguf(HfCheckpoint(kDemoDir), p, options);
    return p;
  }();
  return path;
}

// The file at `from` with its metadata replaced by `metadata`, written through GgufWriter.
std::string rewrite(const std::string& from, const GgufMetadata& metadata, const std::string& tag) {
  const GgufFile file(from);
  std::vector<GgufTensorPlan> plans;
  for (const GgufTensorInfo& t : file.tensors()) plans.push_back({t.name, t.shape(), t.dtype});
  const std::string path = test::temp_dir("gguf_tokenizer_" + tag) + "/model.gguf";
  GgufWriter writer(path, metadata, plans);
  for (const GgufTensorInfo& t : file.tensors()) {
    const HostTensor h = file.tensor(t);
    writer.append(h.data, h.bytes);
  }
  writer.finish();
  return path;
}

GgufMetadata without_hf_json(GgufMetadata m) {
  GgufMetadata out;
  for (const auto& [key, value] : m.entries())
    if (key != gguf_key::kTokenizerJson) out.set(key, value);
  return out;
}

std::vector<std::string> strings(const GgufMetadata& m, const char* key) {
  std::vector<std::string> out;
  for (const GgufValue& v : m.get(key).to_array(key).items) out.push_back(v.to_string(key));
  return out;
}

TEST(GgufTokenizer, DemoExportCarriesLlamaCppKeys) {
  const GgufFile file(demo_export());
  const GgufMetadata& m = file.metadata();
  const Tokenizer hf = Tokenizer::from_file(kDemoDir + "/tokenizer.json");
  EXPECT_EQ(m.get_string(gguf_key::kTokenizerModel), "gemma4");
  const auto tokens = strings(m, gguf_key::kTokens);
  ASSERT_EQ(int64_t(tokens.size()), hf.vocab_size());
  for (int32_t id = 0; id < hf.vocab_size(); ++id) ASSERT_EQ(tokens[size_t(id)], hf.token(id)) << id;
  for (const GgufValue& s : m.get(gguf_key::kScores).to_array(gguf_key::kScores).items)
    ASSERT_EQ(s.to_float(gguf_key::kScores), -1000.0);
  const auto types = m.get_int_array(gguf_key::kTokenType);
  ASSERT_EQ(types.size(), tokens.size());
  auto type_of = [&](const std::string& t) { return GgmlTokenType(types[size_t(*hf.token_id(t))]); };
  EXPECT_EQ(type_of("<bos>"), GgmlTokenType::Control);
  EXPECT_EQ(type_of("<|turn>"), GgmlTokenType::Control);
  EXPECT_EQ(type_of("<|channel>"), GgmlTokenType::UserDefined);
  EXPECT_EQ(type_of("<|\"|>"), GgmlTokenType::UserDefined);
  EXPECT_EQ(type_of("<0x0A>"), GgmlTokenType::Byte);
  EXPECT_EQ(type_of("<unused4>"), GgmlTokenType::Normal);  // in the model vocab, not an added token
  EXPECT_EQ(type_of("▁t"), GgmlTokenType::Normal);
  int bytes = 0, control = 0, user = 0;
  for (int64_t t : types) {
    bytes += t == int64_t(GgmlTokenType::Byte);
    control += t == int64_t(GgmlTokenType::Control);
    user += t == int64_t(GgmlTokenType::UserDefined);
  }
  EXPECT_EQ(bytes, 256);
  EXPECT_EQ(control + user, 16);  // the demo's 16 special added tokens
  EXPECT_EQ(user, 7);

  const nlohmann::json json = nlohmann::json::parse(read_file(kDemoDir + "/tokenizer.json"));
  const auto merges = strings(m, gguf_key::kMerges);
  ASSERT_EQ(merges.size(), json["model"]["merges"].size());
  for (size_t i = 0; i < merges.size(); ++i)
    ASSERT_EQ(merges[i], json["model"]["merges"][i][0].get<std::string>() + " " +
                             json["model"]["merges"][i][1].get<std::string>());
  EXPECT_EQ(m.get_int(gguf_key::kBosTokenId), 2);
  EXPECT_EQ(m.get_int("tokenizer.ggml.eos_token_id"), 1);
  EXPECT_EQ(m.get_int(gguf_key::kUnknownTokenId), 3);
  EXPECT_TRUE(m.get_bool(gguf_key::kAddBosToken));
  EXPECT_FALSE(m.get_bool(gguf_key::kAddSpacePrefix));
  EXPECT_TRUE(m.find(gguf_key::kTokenizerJson));
  EXPECT_FALSE(m.find(gguf_key::kChatTemplate));  // the demo checkpoint has none
}

TEST(GgufTokenizer, KeysAloneTokenizeLikeTheCheckpoint) {
  const GgufFile file(demo_export());
  const std::string path = rewrite(demo_export(), without_hf_json(file.metadata()), "no_hf_json");
  const GgufModel model(path);
  ASSERT_TRUE(model.tokenizer_json().has_value());
  const Tokenizer ggml = Tokenizer::from_json(*model.tokenizer_json());
  const Tokenizer hf = Tokenizer::from_file(kDemoDir + "/tokenizer.json");
  const nlohmann::json golden = nlohmann::json::parse(read_file(std::string(G4_FIXTURES_DIR) + "/demo/golden.json"));
  for (const auto& probe : golden["tokenizer_probe"]) {
    const std::string text = probe["text"].get<std::string>();
    EXPECT_EQ(ggml.encode(text, true), probe["ids"].get<std::vector<int32_t>>()) << text;
    EXPECT_EQ(ggml.encode(text, false), hf.encode(text, false)) << text;
  }
  ASSERT_EQ(ggml.vocab_size(), hf.vocab_size());
  EXPECT_EQ(ggml.bos_id(), hf.bos_id());
  std::vector<int32_t> all;
  for (int32_t id = 0; id < hf.vocab_size(); ++id) {
    ASSERT_EQ(ggml.token(id), hf.token(id)) << id;
    ASSERT_EQ(ggml.is_special(id), hf.is_special(id)) << hf.token(id);
    all.push_back(id);
  }
  EXPECT_EQ(ggml.decode(all), hf.decode(all));
  EXPECT_EQ(ggml.decode(all, true), hf.decode(all, true));
}

// The demo export's metadata with one change, turned into a tokenizer.
class BadKeys : public ::testing::Test {
 protected:
  GgufMetadata m = without_hf_json(GgufFile(demo_export()).metadata());
  std::string error() {
    return error_of([&] { Tokenizer::from_json(tokenizer_json_from_ggml(m).value()); });
  }
  // Applies `change` to the elements of the array under `key`.
  void edit(const char* key, const std::function<void(std::vector<GgufValue>&)>& change) {
    GgufArray a = m.get(key).to_array(key);
    change(a.items);
    m.set(key, GgufValue::array(a.element_type, std::move(a.items)));
  }
};

TEST_F(BadKeys, TheUntouchedKeysWork) { EXPECT_EQ(error(), "(no g4::Error thrown)"); }

TEST_F(BadKeys, ScoresOfAnotherLength) {
  edit(gguf_key::kScores, [](std::vector<GgufValue>& v) { v.pop_back(); });
  EXPECT_NE(error().find("'tokenizer.ggml.scores' has 4095 entries for 4096 tokens"), std::string::npos) << error();
}

TEST_F(BadKeys, TypesOfAnotherLength) {
  edit(gguf_key::kTokenType, [](std::vector<GgufValue>& v) { v.push_back(int32_t(1)); });
  EXPECT_NE(error().find("'tokenizer.ggml.token_type' has 4097 entries"), std::string::npos) << error();
}

TEST_F(BadKeys, AnUnknownType) {
  edit(gguf_key::kTokenType, [](std::vector<GgufValue>& v) { v[7] = int32_t(9); });
  EXPECT_NE(error().find("'tokenizer.ggml.token_type': token 7 ('<unused7>') has type 9"), std::string::npos)
      << error();
  edit(gguf_key::kTokenType, [](std::vector<GgufValue>& v) { v[7] = int32_t(0); });
  EXPECT_NE(error().find("has type 0"), std::string::npos) << error();
}

TEST_F(BadKeys, AByteTypeOnAnotherToken) {
  edit(gguf_key::kTokenType, [](std::vector<GgufValue>& v) { v[7] = int32_t(GgmlTokenType::Byte); });
  EXPECT_NE(error().find("is a BYTE token but not of the form <0xNN>"), std::string::npos) << error();
}

TEST_F(BadKeys, AMergeNamingAnUnknownToken) {
  edit(gguf_key::kMerges, [](std::vector<GgufValue>& v) { v[5] = std::string("▁t nosuchtoken"); });
  EXPECT_NE(error().find("'tokenizer.ggml.merges': merge \"▁t nosuchtoken\" names 'nosuchtoken'"), std::string::npos)
      << error();
}

TEST_F(BadKeys, AMergeWithoutTwoParts) {
  edit(gguf_key::kMerges, [](std::vector<GgufValue>& v) { v[5] = std::string("ab"); });
  EXPECT_NE(error().find("'tokenizer.ggml.merges': \"ab\" is not \"left right\""), std::string::npos) << error();
}

TEST_F(BadKeys, ATokenTwice) {
  edit(gguf_key::kTokens, [](std::vector<GgufValue>& v) { v[7] = std::string("<unused8>"); });
  EXPECT_NE(error().find("'tokenizer.ggml.tokens' has '<unused8>' twice (ids 7 and 8)"), std::string::npos)
      << error();
}

TEST_F(BadKeys, TokensThatAreNotStrings) {
  m.set(gguf_key::kTokens, GgufValue::array_of(std::vector<int32_t>{1, 2, 3}));
  EXPECT_NE(error().find("'tokenizer.ggml.tokens' must be an array of strings"), std::string::npos) << error();
}

TEST_F(BadKeys, ABosOutsideTheTokens) {
  m.set(gguf_key::kBosTokenId, uint32_t(4096));
  EXPECT_NE(error().find("'tokenizer.ggml.bos_token_id' = 4096 is outside the 4096 tokens"), std::string::npos)
      << error();
}

TEST_F(BadKeys, ThroughTheModelFileTheErrorNamesTheFile) {
  edit(gguf_key::kScores, [](std::vector<GgufValue>& v) { v.pop_back(); });
  const std::string path = rewrite(demo_export(), m, "bad_scores");
  const std::string e = error_of([&] { GgufModel model(path); });
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("tokenizer.ggml.scores"), std::string::npos) << e;
}

TEST_F(BadKeys, AnotherTokenizerModelIsNoTokenizer) {
  m.set(gguf_key::kTokenizerModel, std::string("llama"));
  EXPECT_FALSE(tokenizer_json_from_ggml(m).has_value());
}

TEST(GgufTokenizer, WriterRefusesWhatLlamaCppCannotExpress) {
  nlohmann::json t = nlohmann::json::parse(read_file(kDemoDir + "/tokenizer.json"));
  GgufMetadata m;
  EXPECT_NE(error_of([&] { write_ggml_tokenizer(t.dump(), 4000, m); }).find("outside the embedding's 4000 rows"),
            std::string::npos);
  // Extra embedding rows become unused padding tokens.
  write_ggml_tokenizer(t.dump(), 4100, m);
  EXPECT_EQ(strings(m, gguf_key::kTokens).back(), "[PAD4099]");
  EXPECT_EQ(m.get_int_array(gguf_key::kTokenType).back(), int64_t(GgmlTokenType::Unused));

  nlohmann::json gap = t;
  gap["model"]["vocab"].erase("<unused7>");
  EXPECT_NE(error_of([&] { write_ggml_tokenizer(gap.dump(), 4096, m); }).find("no token has id 7"), std::string::npos);
  nlohmann::json spaced = t;
  spaced["model"]["merges"][0] = {"a b", "c"};
  EXPECT_NE(error_of([&] { write_ggml_tokenizer(spaced.dump(), 4096, m); }).find("has a space inside a part"),
            std::string::npos);
  nlohmann::json no_fallback = t;
  no_fallback["model"]["byte_fallback"] = false;
  EXPECT_NE(error_of([&] { write_ggml_tokenizer(no_fallback.dump(), 4096, m); }).find("byte_fallback"),
            std::string::npos);
}

TEST(GgufTokenizer, ChatTemplateFromJinjaOrTokenizerConfig) {
  const std::string dir = test::temp_dir("gguf_tokenizer_chat");
  EXPECT_FALSE(read_chat_template(dir).has_value());
  std::ofstream(dir + "/tokenizer_config.json")
      << R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})";
  EXPECT_EQ(read_chat_template(dir), "D");
  std::ofstream(dir + "/tokenizer_config.json") << R"({"chat_template": "{{ bos_token }}"})";
  EXPECT_EQ(read_chat_template(dir), "{{ bos_token }}");
  std::ofstream(dir + "/chat_template.jinja") << "J";
  EXPECT_EQ(read_chat_template(dir), "J");
}

// The chat template travels through the file and back; a template in another model family's format
// (Gemma 3's <start_of_turn>) gets a note, since g4 always formats Gemma 4's turns.
TEST(GgufTokenizer, ChatTemplateIsReadBackAndAForeignOneIsNoted) {
  const GgufFile demo(demo_export());
  const std::string prompt = " run -n 1 --temperature 0 -p hello --model_path ";
  for (const std::string& chat_template : {std::string("{{ bos_token }}<|turn>user\n{{ m }}<turn|>"),
                                           std::string("{{ bos_token }}<start_of_turn>user\n{{ m }}<end_of_turn>")}) {
    GgufMetadata m = demo.metadata();
    m.set(gguf_key::kChatTemplate, chat_template);
    const std::string path = rewrite(demo_export(), m, "chat_template");
    auto backend = make_backend("cpu");
    EXPECT_EQ(load_program(path, *backend).chat_template, chat_template);
    const bool foreign = chat_template.find("<|turn>") == std::string::npos;
    const test::CommandResult run = test::run_g4(prompt + path);
    EXPECT_EQ(run.exit_code, 0) << run.output;
    EXPECT_EQ(run.output.find("chat template is not Gemma 4's") != std::string::npos, foreign) << run.output;
    const test::CommandResult raw = test::run_g4(prompt + path + " --raw_prompt");
    EXPECT_EQ(raw.output.find("chat template is not Gemma 4's"), std::string::npos) << raw.output;
  }
}

}  // namespace
}  // namespace g4
