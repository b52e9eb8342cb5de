// Gemma's tokenizer as llama.cpp's `tokenizer.ggml.*` keys (model "gemma4"), in both directions
// (docs/DESIGN.md §3, "Tokenizer keys").
//
// Writing follows llama.cpp's Gemma 4 converter as far as tokenizer.json alone allows: one string
// per id, every score -1000, types BYTE for "<0xNN>", CONTROL for added tokens marked special,
// USER_DEFINED for the few special tokens the converter keeps visible (channel, tool-call and
// quote markers) and for non-special added tokens past the model vocabulary, NORMAL otherwise;
// merges as "left right".
//
// Reading rebuilds the equivalent tokenizer.json (Gemma's pipeline: " " -> "▁", BPE with byte
// fallback, CONTROL/USER_DEFINED tokens matched whole before BPE, <bos> first when add_bos_token),
// so that Tokenizer::from_json is the one tokenizer g4 has.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "format/gguf.h"

namespace g4 {

namespace gguf_key {
inline constexpr const char* kTokenizerModel = "tokenizer.ggml.model";
inline constexpr const char* kTokens = "tokenizer.ggml.tokens";
inline constexpr const char* kScores = "tokenizer.ggml.scores";
inline constexpr const char* kTokenType = "tokenizer.ggml.token_type";
inline constexpr const char* kMerges = "tokenizer.ggml.merges";
inline constexpr const char* kBosTokenId = "tokenizer.ggml.bos_token_id";
inline constexpr const char* kUnknownTokenId = "tokenizer.ggml.unknown_token_id";
inline constexpr const char* kAddBosToken = "tokenizer.ggml.add_bos_token";
inline constexpr const char* kAddSpacePrefix = "tokenizer.ggml.add_space_prefix";
inline constexpr const char* kChatTemplate = "tokenizer.chat_template";
}  // namespace gguf_key

inline constexpr const char* kGemma4TokenizerModel = "gemma4";

// llama.cpp's token types (llama_token_type).
enum class GgmlTokenType : int32_t { Undefined = 0, Normal, Unknown, Control, UserDefined, Unused, Byte };

// Sets the tokenizer.ggml.* keys (all but bos/eos ids, which the model config writes) from a
// BPE tokenizer.json. `vocab_size` is the embedding's row count: ids the tokenizer does not name
// up to it become unused "[PAD<id>]" tokens, as llama.cpp's converters pad. Throws g4::Error for a
// tokenizer llama.cpp's gemma4 tokenizer cannot express (not BPE with byte fallback, a gap in the
// ids, more tokens than vocab_size, a merge part containing a space).
void write_ggml_tokenizer(std::string_view tokenizer_json, int64_t vocab_size, GgufMetadata& metadata);

// The tokenizer.json equivalent to a file's tokenizer.ggml.* keys; nullopt when the file has no
// tokenizer.ggml.model or one other than "gemma4". Throws g4::Error naming the key for missing or
// inconsistent keys (array lengths, a bad token type, a merge naming an unknown token, an id out of
// range).
std::optional<std::string> tokenizer_json_from_ggml(const GgufMetadata& metadata);

// The checkpoint's chat template: chat_template.jinja, else tokenizer_config.json's
// "chat_template" (a string, or the entry named "default" of a list); nullopt when neither has one.
std::optional<std::string> read_chat_template(const std::string& checkpoint_dir);

}  // namespace g4
