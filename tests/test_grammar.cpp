// Constrained decoding (src/grammar, docs/DESIGN.md §4 "Constrained decoding") against xgrammar
// (@mlc-ai/web-xgrammar under node, tests/grammar/xgrammar_server.js): for each schema, seeded
// random walks drive g4's matcher and xgrammar's with the same tokens (each step picks an allowed
// token from g4's mask) over the embedded demo's tokenizer and Gemma's, and every mask must be
// bit-identical until termination on the tokens g4 may allow (text and stop tokens; g4 refuses
// control tokens, which xgrammar allows where their text fits). Every finished output must validate against its schema
// (valijson). Bad schemas fail with the right error kind.
//
// Gemma 4's tool calls (tool_call_grammar.h) have no oracle: random walks over the same two
// vocabularies, the call markers counted as text, must end in text that Gemma4OutputParser reads
// back (parse_gemma4_tool_call per call) as calls of declared functions whose arguments validate
// against their schemas (valijson); hand-written calls are accepted or refused token by token.
//
// Setup as test_tokenizer_gemma: the pinned npm packages installed once into the build tree (a lock
// file shared by the test processes). No node, npm or network means failure, never a skip.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

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

#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/tool_call_grammar.h"
#include "model/loader.h"
#include "support/demo_engine.h"
#include "support/grammar_oracle.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/gemma4_output_parser.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace g4 {
namespace {

using grammar::CompiledGrammar;
using grammar::GrammarMatcher;
using grammar::TokenVocabulary;
using grammar::ToolGrammarFunction;

struct TokenizerCase {
  std::string name;
  std::unique_ptr<Tokenizer> tokenizer;
  std::shared_ptr<TokenVocabulary> vocabulary;
  std::unique_ptr<test::XgrammarOracle> oracle;
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
  c.oracle = std::make_unique<test::XgrammarOracle>();
  c.oracle->load_vocabulary(name, *c.tokenizer, c.tokenizer->vocab_size(), stops);
  return c;
}

class GrammarOracle : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    test::install_grammar_packages();
    cases_ = new std::vector<TokenizerCase>;
    cases_->push_back(make_case("demo", Tokenizer::from_json(*model_tokenizer_json(test::embedded_demo_path()))));
    cases_->push_back(make_case(
        "gemma", Tokenizer::from_file(
                     (test::grammar_node_modules() / "@lenml" / "tokenizer-gemma3" / "models" / "tokenizer.json").string())));
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

// One of the shortest of `all` (non-empty) holding a byte of `closers`, else one of the shortest.
int32_t shortest_closing(const TokenVocabulary& vocab, const std::vector<int32_t>& all, const char* closers,
                         std::mt19937& rng) {
  std::vector<int32_t> best;
  size_t best_length = SIZE_MAX;
  bool best_closes = false;
  for (int32_t id : all) {
    const std::string& b = vocab.bytes(id);
    const bool closes = b.find_first_of(closers) != std::string::npos;
    if (closes > best_closes || (closes == best_closes && b.size() < best_length)) {
      best.clear();
      best_length = b.size();
      best_closes = closes;
    }
    if (closes == best_closes && b.size() == best_length) best.push_back(id);
  }
  return best[rng() % best.size()];
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
  return shortest_closing(*c.vocabulary, all, "\"]}", rng);
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
          c.oracle->mask(*c.vocabulary);
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
        test::expect_valid_json(schema, c.tokenizer->decode(ids));
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
          c.oracle->mask(*c.vocabulary);
      ASSERT_EQ(ours, theirs) << piece << describe_difference(c, ours, theirs);
      const bool accepted = matcher.accept_token(*id);
      EXPECT_EQ(accepted, c.oracle->call({{"op", "accept"}, {"token", *id}})["accepted"].get<bool>()) << piece;
      if (!accepted) break;
    }
    matcher.fill_next_token_mask(ours.data());
    const std::vector<uint32_t> theirs =
        c.oracle->mask(*c.vocabulary);
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

// The schema oracle checks every integer that fits in 64 bits, however many digits it has, and
// leaves only larger ones (which nlohmann holds as doubles) unchecked.
TEST(GrammarOracleJson, ChecksIntegersUpTo64Bits) {
  const std::string schema = R"({"type":"array","items":{"type":"string"}})";
  EXPECT_NONFATAL_FAILURE(test::expect_valid_json(schema, "[3630015547773544349]"), "against");
  EXPECT_NONFATAL_FAILURE(test::expect_valid_json(schema, "[-9223372036854775808]"), "against");
  EXPECT_NONFATAL_FAILURE(test::expect_valid_json(schema, "[18446744073709551615]"), "against");
  EXPECT_NONFATAL_FAILURE(test::expect_valid_json(schema, R"(["a", 1.25])"), "against");
  test::expect_valid_json(schema, R"(["0.1234567890123456789"])");
  test::expect_valid_json(schema, "[18446744073709551616]");  // beyond: reported, not checked
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

// Gemma 4's tool calls.

struct ToolVocabulary {
  std::string name;
  std::unique_ptr<Tokenizer> tokenizer;
  std::shared_ptr<TokenVocabulary> vocabulary;  // the call markers counted as text
};

std::vector<std::string> tool_call_markers() {
  return {grammar::kGemma4ToolCallMarkers.begin(), grammar::kGemma4ToolCallMarkers.end()};
}

class GrammarToolCalls : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    test::install_grammar_packages();
    vocabularies_ = new std::vector<ToolVocabulary>;
    const auto add = [](const std::string& name, Tokenizer tokenizer) {
      ToolVocabulary v{name, std::make_unique<Tokenizer>(std::move(tokenizer)), nullptr};
      v.vocabulary = std::make_shared<TokenVocabulary>(*v.tokenizer, stop_tokens(*v.tokenizer), 0, tool_call_markers());
      vocabularies_->push_back(std::move(v));
    };
    add("demo", Tokenizer::from_json(*model_tokenizer_json(test::embedded_demo_path())));
    add("gemma", Tokenizer::from_file(
                     (test::grammar_node_modules() / "@lenml" / "tokenizer-gemma3" / "models" / "tokenizer.json").string()));
  }
  static void TearDownTestSuite() {
    delete vocabularies_;
    vocabularies_ = nullptr;
  }
  static std::vector<ToolVocabulary>* vocabularies_;
};
std::vector<ToolVocabulary>* GrammarToolCalls::vocabularies_ = nullptr;

struct ToolSet {
  std::string name;
  std::vector<ToolGrammarFunction> functions;
};

const std::vector<ToolSet>& tool_sets() {
  static const std::vector<ToolSet> sets = {
      {"one function",
       {{"get_weather", R"({"type":"object","properties":{"city":{"type":"string"},
           "unit":{"enum":["celsius","fahrenheit"]}},"required":["city"],"additionalProperties":false})"}}},
      // names sharing a prefix, and parameters left out (any object: extra keys, any values)
      {"three functions",
       {{"web.search-v2", R"({"type":"object","properties":{"query":{"type":"string","maxLength":12},
           "limit":{"type":"integer"}},"required":["query"],"additionalProperties":false})"},
        {"web.open", R"({"properties":{"url":{"type":"string","minLength":3}},"required":["url"],
           "additionalProperties":false})"},
        {"ping", ""}}},
      // every kind of value; properties out of the template's order (it sorts them)
      {"nested",
       {{"plan", R"({"type":"object","$defs":{"point":{"type":"object","properties":{"x":{"type":"number"},
           "y":{"type":"number"}},"required":["x","y"],"additionalProperties":false}},"properties":{
           "title":{"type":"string","minLength":1,"maxLength":8},
           "steps":{"type":"array","items":{"type":"object","properties":{"id":{"type":"integer"},
             "kind":{"enum":["a","b<|",1.5,null,true,{"k":[1,"x"]}]}},"required":["id"],"additionalProperties":false},
             "minItems":1,"maxItems":3},
           "weight":{"type":"number"},"done":{"type":"boolean"},"note":{"type":["string","null"]},
           "Priority":{"type":"integer"},"meta":{"type":"object","additionalProperties":{"type":"integer"}},
           "choice":{"anyOf":[{"type":"integer"},{"const":"auto"}]},"origin":{"$ref":"#/$defs/point"},"any":{}},
           "required":["title","steps"],"additionalProperties":false})"}}},
      {"a string",
       {{"echo", R"({"type":"object","properties":{"text":{"type":"string"}},"required":["text"],
           "additionalProperties":false})"}}},
  };
  return sets;
}

const ToolSet& tool_set(const std::string& name) {
  for (const ToolSet& set : tool_sets())
    if (set.name == name) return set;
  throw std::runtime_error("no tool set " + name);
}

std::shared_ptr<const CompiledGrammar> compile_calls(const ToolSet& set, const ToolVocabulary& v) {
  return std::make_shared<CompiledGrammar>(grammar::gemma4_tool_calls_grammar(set.functions), v.vocabulary);
}

// Picks a token of a call: for `wander` steps uniformly among the allowed ones (a third of the time
// among those made of <|"|>'s bytes only, so that strings meet pieces of the delimiter); then closing:
// a stop token, else the token writing most of a <|"|> (else a <tool_call|>) that the text has begun
// or may begin, else the shortest holding '}' or ']', else the shortest.
int32_t pick_for_calls(const TokenVocabulary& vocab, const std::vector<uint32_t>& mask, const std::string& text,
                       int step, int wander, std::mt19937& rng) {
  std::vector<int32_t> all, delimiter_pieces;
  for (int32_t id = 0; id < vocab.size(); ++id) {
    if (!allowed(mask, id)) continue;
    all.push_back(id);
    const std::string& b = vocab.bytes(id);
    if (!b.empty() && b.find_first_not_of(kGemma4Quote) == std::string::npos) delimiter_pieces.push_back(id);
  }
  if (all.empty()) return -1;
  if (step < wander) {
    const std::vector<int32_t>& from = !delimiter_pieces.empty() && rng() % 3 == 0 ? delimiter_pieces : all;
    return from[rng() % from.size()];
  }
  for (int32_t id : vocab.stop_tokens())
    if (allowed(mask, id)) return id;
  for (std::string_view marker : {kGemma4Quote, kToolCallClose}) {
    size_t begun = 0;  // the longest proper beginning of the marker that ends the text
    for (size_t n = std::min(marker.size() - 1, text.size()); n > 0 && begun == 0; --n)
      if (std::string_view(text).ends_with(marker.substr(0, n))) begun = n;
    const std::string_view rest = marker.substr(begun);
    std::vector<int32_t> best;
    size_t best_length = 0;
    for (int32_t id : all) {
      const std::string_view b = vocab.bytes(id);
      if (b.empty() || (!rest.starts_with(b) && !b.starts_with(rest))) continue;
      const size_t length = std::min(b.size(), rest.size());
      if (length > best_length) best.clear(), best_length = length;
      if (length == best_length) best.push_back(id);
    }
    if (!best.empty()) return best[rng() % best.size()];
  }
  return shortest_closing(vocab, all, "]}", rng);
}

// The calls `text` holds, read as g4 serve reads a reply; fails unless it is calls and nothing else.
std::vector<ParsedToolCall> read_calls(const std::string& text) {
  Gemma4OutputParser parser({.parse_tool_calls = true});
  ParsedOutput out = parser.push(text);
  out.append(parser.finish());
  EXPECT_TRUE(out.content.empty() && out.reasoning.empty()) << "not only calls: " << nlohmann::json(text).dump();
  EXPECT_FALSE(out.tool_calls.empty()) << nlohmann::json(text).dump();
  return out.tool_calls;
}

// Whether `text` was checked: not when it holds a number beyond what the reader (a double) and
// valijson (64-bit integers) take, which JSON's number grammar does not bound.
bool check_calls(const ToolSet& set, const std::string& text) {
  if (std::regex_search(text, std::regex("[eE][+-]?[0-9]{3,}|[0-9]{19,}"))) {
    std::printf("not checked (a number beyond double or 64 bits): %s\n", nlohmann::json(text).dump().c_str());
    return false;
  }
  for (const ParsedToolCall& call : read_calls(text)) {
    const auto function = std::find_if(set.functions.begin(), set.functions.end(),
                                       [&](const ToolGrammarFunction& f) { return f.name == call.name; });
    if (function == set.functions.end()) {
      ADD_FAILURE() << "a call of undeclared '" << call.name << "': " << nlohmann::json(text).dump();
      continue;
    }
    const std::string& schema = function->parameters_json;
    test::expect_valid_value(schema.empty() ? R"({"type":"object"})" : schema, call.arguments, nlohmann::json(text).dump());
  }
  return true;
}

struct WalkCounts {
  int finished = 0;  // reached a stop token
  int checked = 0;   // and were read back and validated
};

// Random walks of the tool-call matcher.
WalkCounts walk_calls(const ToolVocabulary& v, const ToolSet& set, int walks, int wander, uint32_t seed) {
  const auto compiled = compile_calls(set, v);
  std::vector<uint32_t> mask(v.vocabulary->mask_words());
  WalkCounts counts;
  for (int w = 0; w < walks; ++w) {
    GrammarMatcher matcher(compiled);
    std::mt19937 rng(seed + w);
    std::vector<int32_t> ids;
    std::string text;
    for (int step = 0; step < 800; ++step) {
      matcher.fill_next_token_mask(mask.data());
      const int32_t id = pick_for_calls(*v.vocabulary, mask, text, step, wander, rng);
      if (id < 0) {
        ADD_FAILURE() << v.name << ", " << set.name << ": no token allowed after " << nlohmann::json(text).dump();
        return counts;
      }
      if (!matcher.accept_token(id)) {
        ADD_FAILURE() << v.name << ", " << set.name << ": token " << id << " allowed but refused after "
                      << nlohmann::json(text).dump();
        return counts;
      }
      if (v.vocabulary->is_stop(id)) {
        ++counts.finished;
        counts.checked += check_calls(set, v.tokenizer->decode(ids));
        break;
      }
      ids.push_back(id);
      text += v.vocabulary->bytes(id);
    }
  }
  return counts;
}

TEST_F(GrammarToolCalls, RandomWalksAreCallsOfDeclaredFunctionsWithValidArguments) {
  for (const ToolVocabulary& v : *vocabularies_) {
    int finished = 0, checked = 0, total = 0;
    uint32_t seed = 7;
    for (const ToolSet& set : tool_sets()) {
      for (int wander : {25, 60}) {
        const WalkCounts counts = walk_calls(v, set, 8, wander, seed += 100);
        finished += counts.finished;
        checked += counts.checked;
        total += 8;
      }
      if (HasFailure()) return;
    }
    EXPECT_GE(finished, total * 3 / 4) << v.name << ": too few walks reached a stop token";
    EXPECT_GE(checked, total * 2 / 3) << v.name << ": too few walks were checked";
    std::printf("%s tokenizer: %d of %d tool-call walks finished, %d checked\n", v.name.c_str(), finished, total,
                checked);
  }
}

// Feeds `text` to a fresh matcher, as the tokenizer encodes it (the markers as their tokens) or
// byte by byte (byte-fallback tokens); true when the mask allows every token, the matcher takes
// each, and the text is a whole sentence. The mask and accept_token must agree throughout.
bool matcher_accepts(const ToolVocabulary& v, const std::shared_ptr<const CompiledGrammar>& compiled,
                     const std::string& text, bool byte_tokens) {
  std::vector<int32_t> ids;
  if (byte_tokens) {
    for (unsigned char b : text) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      const auto id = v.tokenizer->token_id(name);
      if (!id) throw std::runtime_error(v.name + " has no byte token " + name);
      ids.push_back(*id);
    }
  } else {
    ids = v.tokenizer->encode(text, /*parse_special=*/true);
  }
  GrammarMatcher matcher(compiled);
  std::vector<uint32_t> mask(v.vocabulary->mask_words());
  for (int32_t id : ids) {
    matcher.fill_next_token_mask(mask.data());
    const bool in_mask = allowed(mask, id);
    EXPECT_EQ(in_mask, matcher.accept_token(id)) << v.name << ": token " << id << " in " << nlohmann::json(text).dump();
    if (!in_mask) return false;
  }
  return matcher.can_end();
}

TEST_F(GrammarToolCalls, TemplateRenderingIsAcceptedAndReadBack) {
  const nlohmann::json weather = {{"unit", "celsius"}, {"city", "Paris <|\"x\"|> <|\"|<tool_call|> é\n"}};
  const nlohmann::json plan = nlohmann::json::parse(R"({"title":"Trip é","steps":[{"id":1,"kind":"b<|"},
      {"id":-20,"kind":{"k":[1,"x"]}},{"id":0,"kind":null}],"weight":2.5e-7,"done":false,"note":null,"Priority":3,
      "meta":{"a_1":7,"B":-1},"choice":"auto","origin":{"x":-0.5,"y":1e300},
      "any":[1,{"x":"y","z":[true,null]},"<|",[]]})");
  struct Case {
    const char* set;
    std::vector<ChatToolCall> calls;
  };
  const Case cases[] = {
      {"one function", {{"get_weather", weather}, {"get_weather", {{"city", ""}}}}},
      {"nested", {{"plan", plan}}},
      {"three functions",
       {{"ping", nlohmann::json::object()}, {"web.open", {{"url", "a:/"}}}, {"ping", {{"x", {{"y", 1}}}}}}},
  };
  for (const ToolVocabulary& v : *vocabularies_) {
    for (const Case& c : cases) {
      ChatMessage message;
      message.role = "assistant";
      message.tool_calls = c.calls;
      const std::string rendered = format_gemma4_chat(std::span(&message, 1), {.add_generation_prompt = false});
      const size_t begin = rendered.find(kToolCallOpen), end = rendered.rfind(kToolCallClose) + kToolCallClose.size();
      ASSERT_NE(begin, std::string::npos) << rendered;
      const std::string text = rendered.substr(begin, end - begin);
      const auto compiled = compile_calls(tool_set(c.set), v);
      EXPECT_TRUE(matcher_accepts(v, compiled, text, /*byte_tokens=*/false)) << v.name << ": " << text;
      EXPECT_TRUE(matcher_accepts(v, compiled, text, /*byte_tokens=*/true)) << v.name << ": " << text;
      const std::vector<ParsedToolCall> read = read_calls(text);
      ASSERT_EQ(read.size(), c.calls.size()) << text;
      for (size_t i = 0; i < read.size(); ++i) {
        EXPECT_EQ(read[i].name, c.calls[i].name);
        EXPECT_EQ(read[i].arguments, nlohmann::json(c.calls[i].arguments)) << text;
      }
    }
  }
}

TEST_F(GrammarToolCalls, RefusesWhatIsNoCallOfTheToolSet) {
  struct Case {
    const char* set;
    std::string text;
  };
  const Case refused[] = {
      {"one function", ""},  // at least one call
      {"one function", R"(<|tool_call>call:get_time{city:<|"|>Paris<|"|>}<tool_call|>)"},  // undeclared
      {"one function", R"(<|tool_call>call:get_weather{unit:<|"|>celsius<|"|>}<tool_call|>)"},  // city is required
      {"one function", R"(<|tool_call>call:get_weather{unit:<|"|>kelvin<|"|>,city:<|"|>Oslo<|"|>}<tool_call|>)"},
      {"one function", R"(<|tool_call>call:get_weather{city:<|"|>Oslo<|"|>, unit:<|"|>celsius<|"|>}<tool_call|>)"},
      {"one function", R"(<|tool_call>call:get_weather{city:<|"|>Oslo<|"|>}<tool_call|>done)"},
      {"one function", R"(<|tool_call>call:get_weather{city:<|"|>Oslo<|"|>}<tool_call|> <|tool_call>)"},
      {"a string", R"(<|tool_call>call:echo{text:<|"|>a<|"|>b<|"|>}<tool_call|>)"},  // the delimiter ends the string
      {"a string", R"(<|tool_call>call:echo{<|"|>text<|"|>:<|"|>a<|"|>}<tool_call|>)"},  // keys are bare
      {"a string", R"(<|tool_call>call:echo{text:"a"}<tool_call|>)"},
      {"nested", R"(<|tool_call>call:plan{steps:[{id:1}],title:<|"|>a<b<|"|>}<tool_call|>)"},  // no '<' under maxLength
      {"nested", R"(<|tool_call>call:plan{note:null,steps:[{id:1}],title:<|"|>a<|"|>}<tool_call|>)"},  // None
      {"nested", R"(<|tool_call>call:plan{title:<|"|>a<|"|>,steps:[{id:1}]}<tool_call|>)"},  // the template's order
      {"three functions", R"(<|tool_call>call:ping{"x":1}<tool_call|>)"},
      {"three functions", R"(<|tool_call>call:ping{x:1, y:2}<tool_call|>)"},
  };
  const Case accepted[] = {
      {"a string", R"(<|tool_call>call:echo{text:<|"|><|"|<<|"|>}<tool_call|>)"},  // "<|\"|<"
      {"a string",  // a call end inside a string; two calls
       R"(<|tool_call>call:echo{text:<|"|><tool_call|><|"|>}<tool_call|><|tool_call>call:echo{text:<|"|><|"|>}<tool_call|>)"},
      {"nested", R"(<|tool_call>call:plan{note:None,steps:[{id:1,kind:None}],title:<|"|>a"b\<|"|>}<tool_call|>)"},
      {"three functions", R"(<|tool_call>call:ping{_x9:[1,{a:None}],y:<|"|><|"|>}<tool_call|>)"},
  };
  for (const ToolVocabulary& v : *vocabularies_) {
    for (const Case& c : refused) {
      const auto compiled = compile_calls(tool_set(c.set), v);
      EXPECT_FALSE(matcher_accepts(v, compiled, c.text, /*byte_tokens=*/false)) << v.name << ": " << c.text;
      EXPECT_FALSE(matcher_accepts(v, compiled, c.text, /*byte_tokens=*/true)) << v.name << ": " << c.text;
    }
    for (const Case& c : accepted) {
      const auto compiled = compile_calls(tool_set(c.set), v);
      EXPECT_TRUE(matcher_accepts(v, compiled, c.text, /*byte_tokens=*/false)) << v.name << ": " << c.text;
      EXPECT_TRUE(matcher_accepts(v, compiled, c.text, /*byte_tokens=*/true)) << v.name << ": " << c.text;
      check_calls(tool_set(c.set), c.text);
    }
  }
}

TEST_F(GrammarToolCalls, VocabularyCountsTheListedMarkersAsText) {
  for (const ToolVocabulary& v : *vocabularies_) {
    const TokenVocabulary plain(*v.tokenizer, stop_tokens(*v.tokenizer));
    size_t markers = 0;
    for (std::string_view marker : grammar::kGemma4ToolCallMarkers) {
      const auto id = v.tokenizer->token_id(marker);
      if (!id) continue;
      ++markers;
      EXPECT_FALSE(plain.is_text(*id)) << marker;
      EXPECT_TRUE(v.vocabulary->is_text(*id)) << marker;
      EXPECT_EQ(v.vocabulary->bytes(*id), marker);
    }
    for (const char* control : {"<|turn>", "<|tool_response>", "<|channel>", "<|tool>", "<bos>", "<pad>", "<unused0>"})
      if (const auto id = v.tokenizer->token_id(control)) EXPECT_FALSE(v.vocabulary->is_text(*id)) << control;
    EXPECT_EQ(v.vocabulary->sorted().size(), plain.sorted().size() + markers) << v.name;
    if (v.name == "demo") EXPECT_EQ(markers, 3u) << "the demo's Gemma 4 vocabulary has every marker as a token";
  }
}

void expect_tool_error(const std::vector<ToolGrammarFunction>& functions, ErrorKind kind, const std::string& words) {
  try {
    grammar::gemma4_tool_calls_grammar(functions);
    ADD_FAILURE() << "no error for "
                  << (functions.empty() ? "no functions" : functions[0].name + " " + functions[0].parameters_json);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

TEST(GrammarToolCallErrors, BadNamesSchemasAndKeys) {
  const std::string object = R"({"type":"object"})";
  expect_tool_error({}, ErrorKind::kInvalidArgument, "no functions");
  const std::vector<std::string> bad_names = {"", "get weather", "a/b", "naïve", "f{", std::string(65, 'f')};
  for (const std::string& name : bad_names)
    expect_tool_error({{name, object}}, ErrorKind::kInvalidArgument, "is not [A-Za-z0-9_.-]{1,64}");
  expect_tool_error({{"f", object}, {"f", ""}}, ErrorKind::kInvalidArgument, "given twice");
  EXPECT_NO_THROW(grammar::gemma4_tool_calls_grammar(std::vector<ToolGrammarFunction>{{std::string(64, 'f'), object},
                                                                                      {"a.B-c_9", ""}}));

  // The JSON Schema subset, errors named with the function.
  expect_tool_error({{"f", R"({"type":"object","properties":{"a":{"type":"string","pattern":"x"}}})"}},
                    ErrorKind::kUnsupported, "'pattern'");
  expect_tool_error({{"f", R"({"type":"object","properties":{"a":{"type":"integer","minimum":1}}})"}},
                    ErrorKind::kUnsupported, "function 'f' parameters");
  expect_tool_error({{"f", R"({"type":"object","allOf":[]})"}}, ErrorKind::kUnsupported, "'allOf'");
  expect_tool_error({{"f", R"({"type":)"}}, ErrorKind::kInvalidArgument, "not JSON");
  expect_tool_error({{"f", R"({"type":"object","properties":{"a":{"type":"strin"}}})"}}, ErrorKind::kInvalidArgument,
                    "strin");
  expect_tool_error({{"f", R"({"type":"object","properties":{"a":{"$ref":"#/$defs/b"}}})"}},
                    ErrorKind::kInvalidArgument, "names nothing");
  // Arguments are an object.
  expect_tool_error({{"f", R"({"type":"string"})"}}, ErrorKind::kInvalidArgument, "other than objects");
  expect_tool_error({{"f", R"({"type":["object","null"]})"}}, ErrorKind::kInvalidArgument, "other than objects");
  expect_tool_error({{"f", R"(42)"}}, ErrorKind::kInvalidArgument, "neither");
  expect_tool_error({{"f", R"({"anyOf":[{"type":"object"}]})"}}, ErrorKind::kUnsupported, "\"type\": \"object\"");

  // What Gemma 4's syntax cannot write: keys needing quotes, strings holding the delimiter.
  for (const char* key : {"first name", "a-b", "1st", "é", "a.b", ""})
    expect_tool_error({{"f", R"({"type":"object","properties":{")" + std::string(key) + R"(":{"type":"string"}}})"}},
                      ErrorKind::kUnsupported, "identifier");
  expect_tool_error({{"f", R"({"type":"object","properties":{"a":{"type":"object","properties":{"b c":{}}}}})"}},
                    ErrorKind::kUnsupported, "'b c'");
  expect_tool_error({{"f", R"({"type":"object","properties":{"a":{"enum":["x","<|\"|>"]}}})"}}, ErrorKind::kUnsupported,
                    "<|\"|>");
  expect_tool_error({{"f", R"({"type":"object","properties":{"a":{"const":{"b-c":1}}}})"}}, ErrorKind::kUnsupported,
                    "'b-c'");
}

}  // namespace
}  // namespace g4
