#include "model/gguf_tokenizer.h"

#include <cctype>
#include <filesystem>
#include <set>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "util/error.h"
#include "util/files.h"

namespace g4 {
namespace {

using nlohmann::json;

// Special tokens llama.cpp's Gemma 4 converter stores as USER_DEFINED instead of CONTROL, so that
// llama.cpp always renders them and its chat parser can see channels and tool calls.
const std::set<std::string>& visible_tokens() {
  static const std::set<std::string> tokens = {"<|channel>",       "<channel|>",       "<|tool_call>", "<tool_call|>",
                                               "<|tool_response>", "<tool_response|>", "<|\"|>"};
  return tokens;
}

bool is_byte_token(const std::string& s) {
  return s.size() == 6 && s.starts_with("<0x") && s.back() == '>' && std::isxdigit(static_cast<unsigned char>(s[3])) &&
         std::isxdigit(static_cast<unsigned char>(s[4]));
}

// ---- writing ----

struct Entry {
  std::string text;
  bool set = false, added = false, special = false;
};

std::optional<int32_t> template_bos(const json& root) {
  const auto processor = root.find("post_processor");
  if (processor == root.end() || !processor->is_object() || processor->value("type", "") != "TemplateProcessing")
    return std::nullopt;
  const json& single = processor->at("single");
  if (single.empty() || !single[0].contains("SpecialToken")) return std::nullopt;
  const json& ids = processor->at("special_tokens").at(single[0]["SpecialToken"].at("id").get<std::string>()).at("ids");
  if (ids.size() != 1) return std::nullopt;
  return ids[0].get<int32_t>();
}

void write_keys(const json& root, int64_t vocab_size, GgufMetadata& m) {
  const json& model = root.at("model");
  G4_CHECK(model.value("type", "") == "BPE" && model.value("byte_fallback", false),
           "tokenizer.json: llama.cpp's gemma4 tokenizer needs a BPE model with byte_fallback");
  const json& vocab = model.at("vocab");
  const int64_t base = int64_t(vocab.size());
  std::vector<Entry> entries(size_t(std::max<int64_t>(vocab_size, 0)));
  auto slot = [&](int64_t id, const std::string& text) -> Entry& {
    G4_CHECK(id >= 0 && id < vocab_size, "tokenizer.json: token '" + text + "' has id " + std::to_string(id) +
                                             ", outside the embedding's " + std::to_string(vocab_size) + " rows");
    return entries[size_t(id)];
  };
  for (const auto& [text, id] : vocab.items()) {
    Entry& e = slot(id.get<int64_t>(), text);
    e.text = text;
    e.set = true;
  }
  if (const auto added = root.find("added_tokens"); added != root.end() && added->is_array()) {
    for (const json& a : *added) {
      const std::string text = a.at("content").get<std::string>();
      Entry& e = slot(a.at("id").get<int64_t>(), text);
      e.text = text;  // an added token renames a model token of the same id, as in Hugging Face
      e.set = e.added = true;
      e.special = a.value("special", false);
    }
  }
  int64_t named = vocab_size;
  while (named > 0 && !entries[size_t(named - 1)].set) --named;

  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  tokens.reserve(entries.size());
  types.reserve(entries.size());
  for (int64_t id = 0; id < vocab_size; ++id) {
    const Entry& e = entries[size_t(id)];
    if (!e.set) {
      G4_CHECK(id >= named, "tokenizer.json: no token has id " + std::to_string(id) + " (the ids must be 0.." +
                                std::to_string(named - 1) + " without gaps)");
      // Embedding rows past the tokenizer: unreachable ids, named the way llama.cpp's converters pad.
      tokens.push_back("[PAD" + std::to_string(id) + "]");
      types.push_back(int32_t(GgmlTokenType::Unused));
      continue;
    }
    GgmlTokenType type;
    if (id < base) {
      type = is_byte_token(e.text) ? GgmlTokenType::Byte : e.special ? GgmlTokenType::Control : GgmlTokenType::Normal;
    } else {
      type = e.special ? GgmlTokenType::Control : GgmlTokenType::UserDefined;
    }
    if (visible_tokens().count(e.text)) type = GgmlTokenType::UserDefined;
    tokens.push_back(e.text);
    types.push_back(int32_t(type));
  }

  std::vector<std::string> merges;
  merges.reserve(model.at("merges").size());
  for (const json& merge : model.at("merges")) {
    if (merge.is_string()) {
      merges.push_back(merge.get<std::string>());
      continue;
    }
    G4_CHECK(merge.is_array() && merge.size() == 2, "tokenizer.json: a merge must have two parts: " + merge.dump());
    const std::string left = merge[0].get<std::string>(), right = merge[1].get<std::string>();
    // "left right" cannot carry a part with a space (llama.cpp's converter rewrites it to U+0120,
    // which names another token); Gemma's vocabulary has "▁" instead of spaces.
    G4_CHECK(left.find(' ') == std::string::npos && right.find(' ') == std::string::npos,
             "tokenizer.json: merge " + merge.dump() + " has a space inside a part, which " + gguf_key::kMerges +
                 " cannot express");
    merges.push_back(left + " " + right);
  }

  m.set(gguf_key::kTokenizerModel, std::string(kGemma4TokenizerModel));
  m.set(gguf_key::kTokens, GgufValue::array_of(tokens));
  m.set(gguf_key::kScores, GgufValue::array_of(std::vector<float>(tokens.size(), -1000.0f)));
  m.set(gguf_key::kTokenType, GgufValue::array_of(types));
  m.set(gguf_key::kMerges, GgufValue::array_of(merges));
  if (const auto unk = model.find("unk_token"); unk != model.end() && unk->is_string() && vocab.contains(*unk))
    m.set(gguf_key::kUnknownTokenId, uint32_t(vocab.at(unk->get<std::string>()).get<int64_t>()));
  m.set(gguf_key::kAddBosToken, template_bos(root).has_value());
  m.set(gguf_key::kAddSpacePrefix, false);
}

// ---- reading ----

std::vector<std::string> string_array(const GgufMetadata& m, const char* key) {
  const GgufArray& array = m.get(key).to_array(key);
  G4_CHECK(array.element_type == GgufType::STRING, std::string("GGUF metadata '") + key + "' must be an array of strings");
  std::vector<std::string> out;
  out.reserve(array.items.size());
  for (const GgufValue& v : array.items) out.push_back(v.to_string(key));
  return out;
}

int32_t token_id(const GgufMetadata& m, const char* key, size_t count) {
  const int64_t id = m.get_int(key);
  G4_CHECK(id >= 0 && uint64_t(id) < count, std::string("GGUF metadata '") + key + "' = " + std::to_string(id) +
                                                " is outside the " + std::to_string(count) + " tokens");
  return int32_t(id);
}

std::string build_json(const GgufMetadata& m) {
  const auto tokens = string_array(m, gguf_key::kTokens);
  G4_CHECK(!tokens.empty(), std::string("GGUF metadata '") + gguf_key::kTokens + "' is empty");
  G4_CHECK(tokens.size() <= size_t(INT32_MAX), std::string("GGUF metadata '") + gguf_key::kTokens + "' is too long");
  const auto length_matches = [&](const char* key) {
    const size_t n = m.get(key).to_array(key).items.size();
    G4_CHECK(n == tokens.size(), std::string("GGUF metadata '") + key + "' has " + std::to_string(n) +
                                     " entries for " + std::to_string(tokens.size()) + " tokens");
  };
  if (m.find(gguf_key::kScores)) {
    length_matches(gguf_key::kScores);
    for (const GgufValue& v : m.get(gguf_key::kScores).to_array(gguf_key::kScores).items) v.to_float(gguf_key::kScores);
  }
  std::vector<GgmlTokenType> types(tokens.size(), GgmlTokenType::Normal);
  if (m.find(gguf_key::kTokenType)) {
    length_matches(gguf_key::kTokenType);
    const auto& items = m.get(gguf_key::kTokenType).to_array(gguf_key::kTokenType).items;
    for (size_t id = 0; id < items.size(); ++id) {
      const int64_t t = items[id].to_int(gguf_key::kTokenType);
      G4_CHECK(t >= int64_t(GgmlTokenType::Normal) && t <= int64_t(GgmlTokenType::Byte),
               std::string("GGUF metadata '") + gguf_key::kTokenType + "': token " + std::to_string(id) + " ('" +
                   tokens[id] + "') has type " + std::to_string(t) + " (valid: 1..6)");
      types[id] = GgmlTokenType(t);
      G4_CHECK(types[id] != GgmlTokenType::Byte || is_byte_token(tokens[id]),
               std::string("GGUF metadata '") + gguf_key::kTokenType + "': token " + std::to_string(id) + " ('" +
                   tokens[id] + "') is a BYTE token but not of the form <0xNN>");
    }
  }

  json vocab = json::object();
  std::unordered_map<std::string, int32_t> ids;
  ids.reserve(tokens.size());
  for (size_t id = 0; id < tokens.size(); ++id) {
    const auto [it, fresh] = ids.emplace(tokens[id], int32_t(id));
    G4_CHECK(fresh, std::string("GGUF metadata '") + gguf_key::kTokens + "' has '" + tokens[id] + "' twice (ids " +
                        std::to_string(it->second) + " and " + std::to_string(id) + ")");
    vocab[tokens[id]] = id;
  }

  json merges = json::array();
  for (const std::string& merge : string_array(m, gguf_key::kMerges)) {
    // Split at the first space after the first byte, as llama.cpp does.
    const size_t space = merge.size() > 1 ? merge.find(' ', 1) : std::string::npos;
    G4_CHECK(space != std::string::npos,
             std::string("GGUF metadata '") + gguf_key::kMerges + "': \"" + merge + "\" is not \"left right\"");
    const std::string left = merge.substr(0, space), right = merge.substr(space + 1);
    for (const std::string& part : {left, right}) {
      G4_CHECK(ids.count(part), std::string("GGUF metadata '") + gguf_key::kMerges + "': merge \"" + merge +
                                    "\" names '" + part + "', which is not in " + gguf_key::kTokens);
    }
    merges.push_back(json::array({left, right}));
  }

  json added = json::array();
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (types[id] != GgmlTokenType::Control && types[id] != GgmlTokenType::UserDefined) continue;
    // The converter's visible tokens were special in the checkpoint: keep them special, so that
    // g4 treats them alike whichever form of the tokenizer a file carries.
    const bool special = types[id] == GgmlTokenType::Control || visible_tokens().count(tokens[id]);
    added.push_back({{"id", id}, {"content", tokens[id]}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", special}});
  }

  json unk = nullptr;
  if (m.find(gguf_key::kUnknownTokenId)) unk = tokens[size_t(token_id(m, gguf_key::kUnknownTokenId, tokens.size()))];

  json post = nullptr;
  const bool add_bos = m.find(gguf_key::kAddBosToken) ? m.get_bool(gguf_key::kAddBosToken) : true;
  if (add_bos) {
    G4_CHECK(m.find(gguf_key::kBosTokenId), std::string("GGUF metadata '") + gguf_key::kAddBosToken +
                                                "' is true but there is no '" + gguf_key::kBosTokenId + "'");
    const int32_t bos = token_id(m, gguf_key::kBosTokenId, tokens.size());
    const std::string& name = tokens[size_t(bos)];
    post = {{"type", "TemplateProcessing"},
            {"single", json::array({{{"SpecialToken", {{"id", name}, {"type_id", 0}}}},
                                    {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
            {"pair", json::array({{{"SpecialToken", {{"id", name}, {"type_id", 0}}}},
                                  {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                  {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
            {"special_tokens", {{name, {{"id", name}, {"ids", json::array({bos})}, {"tokens", json::array({name})}}}}}};
  }

  const json root = {
      {"version", "1.0"},
      {"added_tokens", std::move(added)},
      {"normalizer", {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}},
      {"pre_tokenizer", nullptr},
      {"post_processor", std::move(post)},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                                  {{"type", "ByteFallback"}},
                                  {{"type", "Fuse"}}})}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", std::move(unk)},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"ignore_merges", false},
        {"vocab", std::move(vocab)},
        {"merges", std::move(merges)}}}};
  return root.dump();
}

}  // namespace

void write_ggml_tokenizer(std::string_view tokenizer_json, int64_t vocab_size, GgufMetadata& metadata) {
  json root;
  try {
    root = json::parse(tokenizer_json);
  } catch (const json::parse_error& e) {
    throw Error(std::string("tokenizer.json is malformed or truncated: ") + e.what());
  }
  try {
    G4_CHECK(root.is_object() && root.contains("model"), "tokenizer.json: no \"model\" object");
    write_keys(root, vocab_size, metadata);
  } catch (const json::exception& e) {
    throw Error(std::string("tokenizer.json: unexpected structure: ") + e.what());
  }
}

std::optional<std::string> tokenizer_json_from_ggml(const GgufMetadata& metadata) {
  if (!metadata.find(gguf_key::kTokenizerModel) ||
      metadata.get_string(gguf_key::kTokenizerModel) != kGemma4TokenizerModel)
    return std::nullopt;
  try {
    return build_json(metadata);
  } catch (const json::exception& e) {
    // e.g. a token that is not valid UTF-8
    throw Error(std::string("GGUF metadata '") + gguf_key::kTokens + "': cannot form a tokenizer: " + e.what());
  }
}

std::optional<std::string> read_chat_template(const std::string& checkpoint_dir) {
  const std::filesystem::path dir(checkpoint_dir);
  if (auto jinja = read_file_if_exists((dir / "chat_template.jinja").string())) return jinja;
  const auto config_text = read_file_if_exists((dir / "tokenizer_config.json").string());
  if (!config_text) return std::nullopt;
  json config;
  try {
    config = json::parse(*config_text);
  } catch (const json::parse_error& e) {
    throw Error((dir / "tokenizer_config.json").string() + " is malformed: " + e.what());
  }
  const auto t = config.find("chat_template");
  if (t == config.end()) return std::nullopt;
  if (t->is_string()) return t->get<std::string>();
  if (t->is_array()) {
    for (const json& entry : *t)
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string())
        return entry["template"].get<std::string>();
  }
  return std::nullopt;
}

}  // namespace g4
