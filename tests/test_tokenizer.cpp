// Tokenizer unit tests on a small hand-made tokenizer.json whose every id is known, so each
// rule (merge order, byte fallback, added tokens, decoder, errors) is checked in isolation.
// The real Gemma tokenizer against the reference implementation: test_tokenizer_gemma.cpp.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/fixtures.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "util/error.h"

namespace g4 {
namespace {

using test::error_of;

using Ids = std::vector<int32_t>;

constexpr int32_t kFirstByteId = 4;  // <0x00> .. <0xFF> are ids 4 .. 259
int32_t byte_id(uint8_t byte) { return kFirstByteId + byte; }

enum ToyId : int32_t {
  kPad = 0, kEos = 1, kBos = 2, kUnk = 3,
  kSpace = 260, kA, kB, kC, kAB, kBC, kABC, kSpaceA, kAA, kXX, kXXX, kTurn,
};

// Gemma's pipeline in miniature: same normalizer, pre-tokenizer, decoder and model options.
nlohmann::json toy_tokenizer_json() {
  nlohmann::json vocab = {{"<pad>", kPad}, {"<eos>", kEos}, {"<bos>", kBos}, {"<unk>", kUnk}};
  for (int byte = 0; byte < 256; ++byte) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", byte);
    vocab[name] = byte_id(static_cast<uint8_t>(byte));
  }
  const std::vector<std::pair<std::string, ToyId>> pieces = {
      {"▁", kSpace}, {"a", kA}, {"b", kB}, {"c", kC}, {"ab", kAB}, {"bc", kBC}, {"abc", kABC},
      {"▁a", kSpaceA}, {"aa", kAA}, {"xx", kXX}, {"xxx", kXXX}, {"<|turn>", kTurn}};
  for (const auto& [piece, id] : pieces) vocab[piece] = id;
  const auto added = [](int32_t id, const char* content, bool special) {
    return nlohmann::json{{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false},
                          {"rstrip", false}, {"normalized", false}, {"special", special}};
  };
  // Ranks: a+b first, then b+c, ab+c, ▁+a, a+a.
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& [left, right] : std::vector<std::pair<const char*, const char*>>{
           {"a", "b"}, {"b", "c"}, {"ab", "c"}, {"▁", "a"}, {"a", "a"}}) {
    merges.push_back(nlohmann::json::array({left, right}));
  }
  return {
      {"version", "1.0"},
      {"added_tokens", {added(kPad, "<pad>", true), added(kEos, "<eos>", true), added(kBos, "<bos>", true),
                        added(kUnk, "<unk>", true), added(kXX, "xx", false), added(kXXX, "xxx", false),
                        added(kTurn, "<|turn>", true)}},
      {"normalizer", {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}},
      {"pre_tokenizer",
       {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "MergedWithPrevious"}, {"invert", false}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"special_tokens", {{"<bos>", {{"id", "<bos>"}, {"ids", {kBos}}, {"tokens", {"<bos>"}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders", {{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
                      {{"type", "ByteFallback"}},
                      {{"type", "Fuse"}}}}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", "<unk>"}, {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}, {"fuse_unk", true}, {"byte_fallback", true}, {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merges}}},
  };
}

const Tokenizer& toy() {
  static const Tokenizer tokenizer = Tokenizer::from_json(toy_tokenizer_json().dump());
  return tokenizer;
}

TEST(Tokenizer, LowestRankMergesFirst) {
  EXPECT_EQ(toy().encode("abc", false), (Ids{kABC}));   // a+b (rank 0), then ab+c (rank 2)
  EXPECT_EQ(toy().encode("bcab", false), (Ids{kBC, kAB}));  // a+b at the end goes before b+c
}

TEST(Tokenizer, EqualRanksMergeLeftmostFirst) {
  EXPECT_EQ(toy().encode("aaa", false), (Ids{kAA, kA}));
}

TEST(Tokenizer, SpacesBecomeMetaspaceAndStayInOnePreToken) {
  EXPECT_EQ(toy().encode(" a", false), (Ids{kSpaceA}));
  EXPECT_EQ(toy().encode("a b", false), (Ids{kA, kSpace, kB}));
  EXPECT_EQ(toy().decode(Ids{kA, kSpace, kB, kSpaceA}), "a b a");
}

TEST(Tokenizer, UnknownCharactersFallBackToUtf8Bytes) {
  EXPECT_EQ(toy().encode("é", false), (Ids{byte_id(0xC3), byte_id(0xA9)}));
  EXPECT_EQ(toy().encode("a😀", false), (Ids{kA, byte_id(0xF0), byte_id(0x9F), byte_id(0x98), byte_id(0x80)}));
  EXPECT_EQ(toy().decode(toy().encode("zé😀 ab", false)), "zé😀 ab");
}

TEST(Tokenizer, AddedTokensMatchWholeLongestFirst) {
  // "xxx" wins over "xx" at the same start; the leftover "x" has no token, so it is a byte.
  EXPECT_EQ(toy().encode("xxxx", false), (Ids{kXXX, byte_id('x')}));
  EXPECT_EQ(toy().encode("abxxab", false), (Ids{kAB, kXX, kAB}));
}

TEST(Tokenizer, SpecialTokensMatchOnlyWithParseSpecial) {
  EXPECT_EQ(toy().encode("<bos>a<|turn>", true), (Ids{kBos, kA, kTurn}));
  const Ids plain = toy().encode("<bos>a", false);
  EXPECT_EQ(plain.front(), byte_id('<'));
  EXPECT_EQ(std::count(plain.begin(), plain.end(), kBos), 0);
  EXPECT_EQ(toy().decode(plain), "<bos>a");
}

TEST(Tokenizer, EmptyTextHasNoTokens) {
  EXPECT_TRUE(toy().encode("", true).empty());
  EXPECT_EQ(toy().decode(Ids{}), "");
}

TEST(Tokenizer, DecodeCanSkipSpecialTokens) {
  const Ids ids{kBos, kA, kTurn, kB, kEos};
  EXPECT_EQ(toy().decode(ids), "<bos>a<|turn>b<eos>");
  EXPECT_EQ(toy().decode(ids, /*skip_special=*/true), "ab");
}

TEST(Tokenizer, DecodeReplacesBytesThatAreNotUtf8) {
  EXPECT_EQ(toy().decode(Ids{byte_id(0xE6), kA}), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(toy().decode(Ids{byte_id(0xE6), byte_id(0x97)}), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(toy().decode(Ids{byte_id(0xFF), byte_id(0xC3), byte_id(0xA9)}), "\xEF\xBF\xBD" "é");
}

TEST(Tokenizer, LookupsAndMetadata) {
  EXPECT_EQ(toy().vocab_size(), kTurn + 1);
  EXPECT_EQ(toy().token_id("abc"), kABC);
  EXPECT_EQ(toy().token_id("nope"), std::nullopt);
  EXPECT_EQ(toy().token(kSpaceA), "▁a");
  EXPECT_EQ(toy().bos_id(), kBos);
  EXPECT_TRUE(toy().is_special(kTurn));
  EXPECT_FALSE(toy().is_special(kXX));
}

TEST(Tokenizer, RejectsIdsOutsideTheVocabulary) {
  EXPECT_NE(error_of([] { toy().decode(Ids{kA, kTurn + 1}); }).find("outside the vocabulary"), std::string::npos);
  EXPECT_NE(error_of([] { toy().decode(Ids{-1}); }).find("token id -1"), std::string::npos);
}

TEST(Tokenizer, RejectsInvalidUtf8Text) {
  for (const std::string bad : {"\xFF", "ab\xC3", "\xC0\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "a\x80"}) {
    const std::string message = error_of([&] { toy().encode(bad, true); });
    EXPECT_NE(message.find("not valid UTF-8"), std::string::npos) << message;
  }
  EXPECT_NE(error_of([] { toy().encode("abc\xFF", true); }).find("offset 3"), std::string::npos);
}

std::string load_error(const std::string& json_text) {
  return error_of([&] { Tokenizer::from_json(json_text); });
}

TEST(TokenizerLoading, MalformedOrTruncatedJsonIsAClearError) {
  const std::string full = toy_tokenizer_json().dump();
  EXPECT_NE(load_error(full.substr(0, full.size() / 2)).find("malformed or truncated"), std::string::npos);
  EXPECT_NE(load_error("").find("malformed or truncated"), std::string::npos);
  EXPECT_NE(load_error("not json").find("malformed or truncated"), std::string::npos);
  EXPECT_NE(load_error("[1, 2]").find("top level must be an object"), std::string::npos);
}

TEST(TokenizerLoading, MissingModelOrOtherModelTypesAreRejected) {
  nlohmann::json json = toy_tokenizer_json();
  json.erase("model");
  EXPECT_NE(load_error(json.dump()).find("no \"model\""), std::string::npos);

  json = toy_tokenizer_json();
  json["model"]["type"] = "Unigram";
  EXPECT_NE(load_error(json.dump()).find("unsupported model type 'Unigram'"), std::string::npos);

  json = toy_tokenizer_json();
  json["model"]["vocab"] = 7;
  EXPECT_NE(load_error(json.dump()).find("\"vocab\" must be an object"), std::string::npos);
}

TEST(TokenizerLoading, InconsistentOrUnsupportedContentIsRejected) {
  nlohmann::json json = toy_tokenizer_json();
  json["model"]["merges"].push_back(nlohmann::json::array({"c", "q"}));
  EXPECT_NE(load_error(json.dump()).find("'q', which is not in the vocabulary"), std::string::npos);

  json = toy_tokenizer_json();
  json["normalizer"] = {{"type", "NFKC"}};
  EXPECT_NE(load_error(json.dump()).find("unsupported normalizer 'NFKC'"), std::string::npos);

  json = toy_tokenizer_json();
  json["decoder"]["decoders"].push_back({{"type", "Strip"}});
  EXPECT_NE(load_error(json.dump()).find("unsupported decoder 'Strip'"), std::string::npos);

  json = toy_tokenizer_json();
  json["model"]["vocab"]["<0x41>"] = "sixty-nine";
  EXPECT_NE(load_error(json.dump()).find("vocab token '<0x41>' has id \"sixty-nine\", not an integer"),
            std::string::npos);
}

TEST(TokenizerLoading, LegacyStringMergesLoadTheSameModel) {
  nlohmann::json json = toy_tokenizer_json();
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& merge : json["model"]["merges"]) merges.push_back(merge[0].get<std::string>() + " " + merge[1].get<std::string>());
  json["model"]["merges"] = merges;
  const Tokenizer legacy = Tokenizer::from_json(json.dump());
  EXPECT_EQ(legacy.encode("bcab aaa", false), toy().encode("bcab aaa", false));
}

TEST(TokenizerLoading, MissingFileNamesThePath) {
  const std::string message = error_of([] { Tokenizer::from_file("/nonexistent/tokenizer.json"); });
  EXPECT_NE(message.find("/nonexistent/tokenizer.json"), std::string::npos) << message;
}

// Property: over random token streams (biased to byte tokens, which split characters), every
// piece the stream decoder emits is complete UTF-8, and the pieces add up to decode().
TEST(StreamDecoder, NeverEmitsIncompleteUtf8) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> any_id(0, toy().vocab_size() - 1);
  std::uniform_int_distribution<int> lead_or_continuation(0, 3);
  std::uniform_int_distribution<int32_t> continuation(0x80, 0xBF), lead(0xC2, 0xF4);
  for (int stream_index = 0; stream_index < 2000; ++stream_index) {
    Ids ids;
    const int length = 1 + stream_index % 24;
    for (int i = 0; i < length; ++i) {
      const int kind = lead_or_continuation(rng);
      ids.push_back(kind == 0 ? any_id(rng) : kind == 1 ? byte_id(static_cast<uint8_t>(lead(rng)))
                                                        : byte_id(static_cast<uint8_t>(continuation(rng))));
    }
    StreamDecoder stream(toy());
    std::string streamed;
    for (const int32_t id : ids) {
      const std::string piece = stream.push(id);
      ASSERT_TRUE(utf8::is_valid(piece)) << "stream " << stream_index;
      streamed += piece;
    }
    const std::string rest = stream.flush();
    ASSERT_TRUE(utf8::is_valid(rest));
    ASSERT_EQ(streamed + rest, toy().decode(ids)) << "stream " << stream_index;
  }
}

TEST(StreamDecoder, HoldsBackASplitCharacterUntilComplete) {
  StreamDecoder stream(toy());
  EXPECT_EQ(stream.push(kA), "a");
  EXPECT_EQ(stream.push(byte_id(0xF0)), "");
  EXPECT_EQ(stream.push(byte_id(0x9F)), "");
  EXPECT_EQ(stream.push(byte_id(0x98)), "");
  EXPECT_EQ(stream.push(byte_id(0x80)), "😀");
  EXPECT_EQ(stream.push(byte_id(0xC3)), "");
  EXPECT_EQ(stream.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(stream.flush(), "");
}

TEST(ChatTemplate, OneUserTurnWithThinkingOff) {
  EXPECT_EQ(format_gemma4_prompt("  Why is the sky blue?\n"),
            "<bos><|turn>user\nWhy is the sky blue?<turn|>\n<|turn>model\n<|channel>thought\n<channel|>");
}

TEST(ChatTemplate, MultiTurnWritesAssistantAsModel) {
  const std::vector<ChatMessage> messages = {
      {"system", "Be brief."}, {"user", "Hi"}, {"assistant", " Hello! "}, {"user", "Bye"}};
  EXPECT_EQ(format_gemma4_chat(messages),
            "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\nHello!<turn|>\n"
            "<|turn>user\nBye<turn|>\n<|turn>model\n<|channel>thought\n<channel|>");
}

// `| trim` is Python's str.strip under transformers: U+0085 and U+001F are whitespace there (not in
// JS's String.trim, so the Jinja comparison cannot cover them); U+FEFF is not (JS trims it).
TEST(ChatTemplate, TrimIsPythonsStrip) {
  EXPECT_EQ(format_gemma4_user_turn("\xC2\x85\x1F" "Hi\xE2\x80\xA8"),
            "<|turn>user\nHi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>");
  EXPECT_EQ(format_gemma4_user_turn("\xEF\xBB\xBFHi"),
            "<|turn>user\n\xEF\xBB\xBFHi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>");
  // Malformed UTF-8 at either end is kept, never cut into.
  EXPECT_EQ(format_gemma4_user_turn("\x80 Hi \xE3\x80"),
            "<|turn>user\n\x80 Hi \xE3\x80<turn|>\n<|turn>model\n<|channel>thought\n<channel|>");
}

TEST(ChatTemplate, BosIsPrependedOnceForRawPrompts) {
  EXPECT_EQ(encode_prompt(toy(), "ab", /*raw_prompt=*/true, kBos), (Ids{kBos, kAB}));
  EXPECT_EQ(encode_prompt(toy(), "<bos>ab", /*raw_prompt=*/true, kBos), (Ids{kBos, kAB}));
  const Ids templated = encode_prompt(toy(), "ab", /*raw_prompt=*/false, kBos);
  EXPECT_EQ(std::count(templated.begin(), templated.end(), kBos), 1);
  EXPECT_EQ(templated[1], kTurn);
}

TEST(ChatTemplate, StopTokens) {
  for (const int32_t id : {1, 106, 50}) EXPECT_TRUE(is_gemma4_stop_token(id)) << id;
  for (const int32_t id : {0, 2, 105, 107}) EXPECT_FALSE(is_gemma4_stop_token(id)) << id;
}

// ---- g4 tokenize / g4 detokenize --------------------------------------------------------

using test::CommandResult;
using test::run_g4;

class TokenizeCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ = test::temp_dir(std::string("tokenizer_cli_") +
                                ::testing::UnitTest::GetInstance()->current_test_info()->name());
    tokenizer_path_ = (directory_ / "tokenizer.json").string();
    std::ofstream(tokenizer_path_) << toy_tokenizer_json().dump();
  }
  std::filesystem::path directory_;
  std::string tokenizer_path_;
};

TEST_F(TokenizeCommand, PrintsIdsAsJsonArray) {
  EXPECT_EQ(run_g4("tokenize --tokenizer_path " + tokenizer_path_ + " --text 'abc ab'").output,
            "[266,260,264]\n");  // abc ▁ ab: a+b outranks ▁+a
  const std::string text_file = (directory_ / "text.txt").string();
  std::ofstream(text_file) << "<bos>abc";
  const CommandResult special = run_g4("tokenize --tokenizer-path " + tokenizer_path_ + " --text-file " + text_file + " --special");
  EXPECT_EQ(special.exit_code, 0);
  EXPECT_EQ(special.output, "[2,266]\n");
  EXPECT_NE(run_g4("tokenize --tokenizer_path " + tokenizer_path_ + " --text_file " + text_file).output, special.output);
  EXPECT_EQ(run_g4("tokenize --tokenizer_path " + tokenizer_path_ + " --text ''").output, "[]\n");
}

TEST_F(TokenizeCommand, DetokenizePrintsTheExactText) {
  const CommandResult result = run_g4("detokenize --tokenizer_path " + tokenizer_path_ + " --ids 2,266,267,262");
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_EQ(result.output, "<bos>abc ab");
}

TEST_F(TokenizeCommand, FailuresExitWithAnError) {
  const CommandResult missing = run_g4("tokenize --tokenizer_path /nonexistent.json --text a");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.output.find("error: cannot open tokenizer file '/nonexistent.json'"), std::string::npos);
  const CommandResult no_text = run_g4("tokenize --tokenizer_path " + tokenizer_path_);
  EXPECT_EQ(no_text.exit_code, 1);
  EXPECT_NE(no_text.output.find("--text"), std::string::npos);
  const CommandResult bad_utf8 = run_g4("tokenize --tokenizer_path " + tokenizer_path_ + " --text \"$(printf '\\377')\"");
  EXPECT_NE(bad_utf8.output.find("not valid UTF-8"), std::string::npos) << bad_utf8.output;
  const CommandResult bad_id = run_g4("detokenize --tokenizer_path " + tokenizer_path_ + " --ids 1,99999");
  EXPECT_EQ(bad_id.exit_code, 1);
  EXPECT_NE(bad_id.output.find("outside the vocabulary"), std::string::npos);
}

}  // namespace
}  // namespace g4
