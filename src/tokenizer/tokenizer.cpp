#include "tokenizer/tokenizer.h"

#include <cctype>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "tokenizer/utf8.h"
#include "util/error.h"
#include "util/files.h"

namespace g4 {
namespace {

using nlohmann::json;

std::string type_of(const json& step) { return step.value("type", std::string("(no type)")); }

// Replace steps of normalizers and decoders carry {"pattern": {"String": s}, "content": c}.
std::pair<std::string, std::string> string_replacement(const json& step, const char* where) {
  const json& pattern = step.at("pattern");
  G4_CHECK(pattern.contains("String"), std::string("tokenizer.json: ") + where +
                                           " Replace with a regex pattern is not supported");
  std::string from = pattern.at("String").get<std::string>();
  G4_CHECK(!from.empty(), std::string("tokenizer.json: ") + where + " Replace has an empty pattern");
  return {std::move(from), step.at("content").get<std::string>()};
}

// The steps of a "Sequence" (under `list_key`), or the one step itself.
std::vector<json> steps_of(const json& component, const char* list_key) {
  if (type_of(component) == "Sequence") return component.at(list_key).get<std::vector<json>>();
  return {component};
}

std::vector<AddedToken> parse_added_tokens(const json& root) {
  std::vector<AddedToken> added;
  const auto list = root.find("added_tokens");
  if (list == root.end() || list->is_null()) return added;
  G4_CHECK(list->is_array(), "tokenizer.json: \"added_tokens\" must be an array");
  for (const json& entry : *list) {
    const std::string content = entry.at("content").get<std::string>();
    AddedToken token{token_id_from_json(entry.at("id"), "added token '" + content + "'"), content,
                     entry.value("special", false)};
    // transformers.js (our reference) matches every added token in the raw text, so the
    // "normalized" flag is ignored like there; stripping and single-word rules are not.
    for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
      G4_CHECK(!entry.value(flag, false), "tokenizer.json: added token '" + token.content + "' sets \"" +
                                              flag + "\", which is not supported");
    }
    added.push_back(std::move(token));
  }
  return added;
}

std::optional<int32_t> parse_bos(const json& root) {
  const auto processor = root.find("post_processor");
  if (processor == root.end() || processor->is_null() || type_of(*processor) != "TemplateProcessing") {
    return std::nullopt;
  }
  const json& single = processor->at("single");
  if (single.empty() || !single[0].contains("SpecialToken")) return std::nullopt;
  const std::string name = single[0]["SpecialToken"].at("id").get<std::string>();
  const json& ids = processor->at("special_tokens").at(name).at("ids");
  if (ids.size() != 1) return std::nullopt;
  return token_id_from_json(ids[0], "post_processor token '" + name + "'");
}

}  // namespace

Tokenizer::Tokenizer(Vocabulary vocab, BpeModel bpe, const std::vector<AddedToken>& added)
    : vocab_(std::move(vocab)), bpe_(std::move(bpe)), added_(added) {
  for (const AddedToken& token : added) vocab_.assign(token.id, token.content);
  special_.assign(static_cast<size_t>(vocab_.size()), false);
  for (const AddedToken& token : added) special_[static_cast<size_t>(token.id)] = token.special;
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  G4_CHECK(std::filesystem::is_regular_file(path), "cannot open tokenizer file '" + path + "'");
  const std::string text = read_file(path);
  try {
    return from_json(text);
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

Tokenizer Tokenizer::from_json(std::string_view json_text) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::parse_error& e) {
    throw Error(std::string("tokenizer.json is malformed or truncated: ") + e.what());
  }
  G4_CHECK(root.is_object(), "tokenizer.json: the top level must be an object");
  G4_CHECK(root.contains("model") && root["model"].is_object(), "tokenizer.json: no \"model\" object");
  try {
    return build(root);
  } catch (const json::exception& e) {
    throw Error(std::string("tokenizer.json: unexpected structure: ") + e.what());
  }
}

Tokenizer Tokenizer::build(const json& root) {
  // Every id must be below the number of entries the file defines, checked before any table is
  // sized from an id.
  const auto model_vocab = root.at("model").find("vocab");
  const auto added_list = root.find("added_tokens");
  const size_t added_count = added_list != root.end() && added_list->is_array() ? added_list->size() : 0;
  Vocabulary vocab((model_vocab != root.at("model").end() ? model_vocab->size() : 0) + added_count);
  BpeModel bpe = BpeModel::from_json(root.at("model"), vocab);
  Tokenizer tokenizer(std::move(vocab), std::move(bpe), parse_added_tokens(root));
  tokenizer.bos_id_ = parse_bos(root);
  G4_CHECK(!tokenizer.bos_id_ || tokenizer.vocab_.contains(*tokenizer.bos_id_),
           "tokenizer.json: post_processor's BOS id " + std::to_string(tokenizer.bos_id_.value_or(0)) +
               " is outside the vocabulary");

  if (const json& normalizer = root.value("normalizer", json()); !normalizer.is_null()) {
    for (const json& step : steps_of(normalizer, "normalizers")) {
      G4_CHECK(type_of(step) == "Replace", "tokenizer.json: unsupported normalizer '" + type_of(step) +
                                               "' (supported: Replace, Sequence of Replace)");
      auto [pattern, content] = string_replacement(step, "normalizer");
      tokenizer.normalizer_.push_back({std::move(pattern), std::move(content)});
    }
  }

  if (const json& pre = root.value("pre_tokenizer", json()); !pre.is_null()) {
    const std::string behavior = pre.value("behavior", std::string());
    G4_CHECK(type_of(pre) == "Split" && behavior == "MergedWithPrevious" && !pre.value("invert", false) &&
                 pre.at("pattern").contains("String"),
             "tokenizer.json: unsupported pre_tokenizer " + pre.dump() +
                 " (supported: Split on a string, MergedWithPrevious)");
    tokenizer.split_delimiter_ = pre.at("pattern").at("String").get<std::string>();
  }

  const json& decoder = root.value("decoder", json());
  G4_CHECK(!decoder.is_null(), "tokenizer.json: no \"decoder\"");
  bool byte_fallback = false;
  std::vector<Replacement> decoder_replacements;
  for (const json& step : steps_of(decoder, "decoders")) {
    const std::string type = type_of(step);
    if (type == "Replace") {
      G4_CHECK(!byte_fallback, "tokenizer.json: a Replace decoder after ByteFallback is not supported");
      auto [pattern, content] = string_replacement(step, "decoder");
      decoder_replacements.push_back({std::move(pattern), std::move(content)});
    } else if (type == "ByteFallback") {
      byte_fallback = true;
    } else {
      // Fuse joins the pieces into one string, which decode() always does.
      G4_CHECK(type == "Fuse", "tokenizer.json: unsupported decoder '" + type +
                                   "' (supported: Replace, ByteFallback, Fuse)");
    }
  }
  tokenizer.precompute_token_bytes(byte_fallback, decoder_replacements);
  return tokenizer;
}

std::string Tokenizer::replace_all(std::string_view text, const std::vector<Replacement>& replacements) {
  std::string result(text);
  for (const Replacement& r : replacements) {
    if (result.find(r.pattern) == std::string::npos) continue;
    std::string replaced;
    replaced.reserve(result.size() + result.size() / 2);
    size_t from = 0;
    for (size_t at; (at = result.find(r.pattern, from)) != std::string::npos; from = at + r.pattern.size()) {
      replaced.append(result, from, at - from).append(r.content);
    }
    replaced.append(result, from);
    result = std::move(replaced);
  }
  return result;
}

void Tokenizer::precompute_token_bytes(bool byte_fallback, const std::vector<Replacement>& decoder_replacements) {
  token_bytes_.resize(static_cast<size_t>(vocab_.size()));
  for (int32_t id = 0; id < vocab_.size(); ++id) {
    const std::string& piece = vocab_.token(id);
    std::string& bytes = token_bytes_[static_cast<size_t>(id)];
    // ByteFallback recognizes "<0xNN>" exactly as Hugging Face does: six chars, two hex digits.
    if (byte_fallback && piece.size() == 6 && piece.starts_with("<0x") && piece.ends_with(">") &&
        std::isxdigit(static_cast<unsigned char>(piece[3])) && std::isxdigit(static_cast<unsigned char>(piece[4]))) {
      bytes.assign(1, static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
    } else {
      bytes = replace_all(piece, decoder_replacements);
    }
  }
}

const std::string& Tokenizer::token(int32_t id) const {
  require_id(id);
  return vocab_.token(id);
}

bool Tokenizer::is_special(int32_t id) const {
  require_id(id);
  return special_[static_cast<size_t>(id)];
}

void Tokenizer::require_id(int32_t id) const {
  G4_CHECK(vocab_.contains(id), "token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                    std::to_string(vocab_.size()) + ")");
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  utf8::require_valid(text, "text to tokenize");
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  size_t segment_start = 0;
  for (size_t pos = 0; pos < text.size();) {
    const auto match = added_.longest_at(text, pos, parse_special);
    if (!match) {
      ++pos;
      continue;
    }
    encode_segment(text.substr(segment_start, pos - segment_start), ids);
    ids.push_back(match->id);
    pos += match->length;
    segment_start = pos;
  }
  encode_segment(text.substr(segment_start), ids);
  return ids;
}

void Tokenizer::encode_segment(std::string_view raw, std::vector<int32_t>& ids) const {
  if (raw.empty()) return;
  const std::string normalized = replace_all(raw, normalizer_);
  const std::string_view text = normalized;
  if (split_delimiter_.empty()) {
    bpe_.encode(text, vocab_, ids);
    return;
  }
  // MergedWithPrevious: each piece ends with the delimiter that closes it.
  size_t start = 0;
  for (size_t at; (at = text.find(split_delimiter_, start)) != std::string_view::npos;) {
    const size_t end = at + split_delimiter_.size();
    bpe_.encode(text.substr(start, end - start), vocab_, ids);
    start = end;
  }
  bpe_.encode(text.substr(start), vocab_, ids);
}

void Tokenizer::append_token_bytes(int32_t id, bool skip_special, std::string& bytes) const {
  require_id(id);
  if (skip_special && special_[static_cast<size_t>(id)]) return;
  bytes += token_bytes_[static_cast<size_t>(id)];
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (const int32_t id : ids) append_token_bytes(id, skip_special, bytes);
  return utf8::take_valid(bytes, /*keep_incomplete_tail=*/false);
}

std::string StreamDecoder::push(int32_t id) {
  tokenizer_->append_token_bytes(id, skip_special_, pending_);
  return utf8::take_valid(pending_, /*keep_incomplete_tail=*/true);
}

std::string StreamDecoder::flush() { return utf8::take_valid(pending_, /*keep_incomplete_tail=*/false); }

}  // namespace g4
