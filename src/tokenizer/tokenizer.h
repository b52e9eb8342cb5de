// A Hugging Face tokenizer.json tokenizer, as Gemma uses it: added tokens matched whole first,
// then normalizer (Replace), pre-tokenizer (Split on a string), BPE with byte fallback; the
// decoder (Replace, ByteFallback, Fuse) turns ids back into text.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/vocabulary.h"

namespace g4 {

class Tokenizer {
 public:
  // Reads a tokenizer.json file; errors name the path.
  static Tokenizer from_file(const std::string& path);
  // Parses tokenizer.json text (e.g. a model file's embedded tokenizer.huggingface.json).
  // Throws g4::Error for malformed JSON, a missing "model", a model type other than BPE, or
  // normalizer/pre-tokenizer/decoder steps this implementation does not have.
  static Tokenizer from_json(std::string_view json_text);

  // Token ids of text (valid UTF-8, else g4::Error). Added tokens are matched whole before
  // BPE; those marked special (<bos>, <|turn>, ...) only when parse_special is true, otherwise
  // their text is tokenized like any other. No BOS is added (see chat_template.h).
  std::vector<int32_t> encode(std::string_view text, bool parse_special) const;
  // Text of ids; skip_special drops special tokens. Byte-fallback bytes that do not form valid
  // UTF-8 become U+FFFD, one per byte. Throws g4::Error on an id outside [0, vocab_size()).
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  int32_t vocab_size() const { return vocab_.size(); }
  std::optional<int32_t> token_id(std::string_view piece) const { return vocab_.find(piece); }
  // The token string as stored in tokenizer.json ("▁the", "<0x0A>", "<bos>").
  const std::string& token(int32_t id) const;
  bool is_special(int32_t id) const;
  // The token the post-processor puts first (Gemma: <bos> = 2), if it declares one.
  std::optional<int32_t> bos_id() const { return bos_id_; }

  // Appends the bytes id decodes to on its own (a byte-fallback token gives one raw byte,
  // possibly part of a multi-byte character); decode() and StreamDecoder build on this.
  void append_token_bytes(int32_t id, bool skip_special, std::string& bytes) const;

 private:
  struct Replacement {
    std::string pattern, content;
  };
  Tokenizer(Vocabulary vocab, BpeModel bpe, const std::vector<AddedToken>& added);
  static Tokenizer build(const nlohmann::json& root);
  static std::string replace_all(std::string_view text, const std::vector<Replacement>& replacements);

  void encode_segment(std::string_view raw, std::vector<int32_t>& ids) const;
  void precompute_token_bytes(bool byte_fallback, const std::vector<Replacement>& decoder_replacements);
  void require_id(int32_t id) const;

  Vocabulary vocab_;
  BpeModel bpe_;
  AddedTokenMatcher added_;
  std::vector<bool> special_;
  std::vector<Replacement> normalizer_;
  std::string split_delimiter_;  // pre-tokenizer Split(String, MergedWithPrevious); "" = none
  std::vector<std::string> token_bytes_;
  std::optional<int32_t> bos_id_;
};

// Decodes a stream of generated ids into text pieces that are always complete UTF-8: the bytes
// of a character split across tokens (byte fallback) are held back until it is complete, so a
// terminal never shows half a character. The concatenated pieces equal decode() of all ids.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false)
      : tokenizer_(&tokenizer), skip_special_(skip_special) {}
  // Text that became complete with this id (possibly empty).
  std::string push(int32_t id);
  // Whatever is still held back, an unfinished character becoming U+FFFD per byte.
  std::string flush();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace g4
