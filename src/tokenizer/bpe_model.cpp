#include "tokenizer/bpe_model.h"

#include <cstdio>
#include <queue>

#include <nlohmann/json.hpp>

#include "tokenizer/utf8.h"
#include "util/error.h"

namespace g4 {
namespace {

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// "" and null both mean "not used" in tokenizer.json.
bool is_unset(const nlohmann::json& model, const char* key) {
  const auto it = model.find(key);
  return it == model.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty());
}

void require_supported_options(const nlohmann::json& model) {
  const auto type = model.find("type");
  if (type != model.end()) {
    const std::string name = type->get<std::string>();
    G4_CHECK(name == "BPE", "tokenizer.json: unsupported model type '" + name +
                                "' (only BPE is implemented; Gemma uses BPE)");
  }
  G4_CHECK(model.contains("vocab") && model.contains("merges"),
           "tokenizer.json: model has no \"vocab\" or no \"merges\" (not a BPE model)");
  const auto dropout = model.find("dropout");
  G4_CHECK(dropout == model.end() || dropout->is_null() || dropout->get<double>() == 0.0,
           "tokenizer.json: BPE dropout is not supported (encoding must be deterministic)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    G4_CHECK(is_unset(model, key),
             std::string("tokenizer.json: BPE option \"") + key + "\" is not supported");
  }
}

// A merge is either ["left", "right"] (tokenizers >= 0.20) or the legacy "left right".
std::pair<std::string, std::string> merge_parts(const nlohmann::json& merge) {
  if (merge.is_array()) {
    G4_CHECK(merge.size() == 2, "tokenizer.json: a merge must have two parts: " + merge.dump());
    return {merge[0].get<std::string>(), merge[1].get<std::string>()};
  }
  const std::string line = merge.get<std::string>();
  const size_t space = line.find(' ');
  G4_CHECK(space != std::string::npos && line.find(' ', space + 1) == std::string::npos,
           "tokenizer.json: a merge must be \"left right\": \"" + line + "\"");
  return {line.substr(0, space), line.substr(space + 1)};
}

int32_t require_token(const Vocabulary& vocab, const std::string& token, const nlohmann::json& merge) {
  const auto id = vocab.find(token);
  G4_CHECK(id.has_value(), "tokenizer.json: merge " + merge.dump() + " uses '" + token +
                               "', which is not in the vocabulary");
  return *id;
}

}  // namespace

void BpeModel::MergeTable::reserve(size_t count) {
  size_t capacity = 16;
  while (capacity < 2 * count) capacity *= 2;
  slots_.assign(capacity, Slot{});
  mask_ = capacity - 1;
}

size_t BpeModel::MergeTable::slot_of(uint64_t key) const {
  size_t slot = static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 20) & mask_;
  while (slots_[slot].key != kEmpty && slots_[slot].key != key) slot = (slot + 1) & mask_;
  return slot;
}

void BpeModel::MergeTable::insert(int32_t left, int32_t right, Merge merge) {
  const uint64_t key = pair_key(left, right);
  Slot& slot = slots_[slot_of(key)];
  // A repeated pair keeps its last rank, as Hugging Face's and transformers.js' maps do.
  slot = Slot{key, merge};
}

const BpeModel::Merge* BpeModel::MergeTable::find(int32_t left, int32_t right) const {
  if (slots_.empty()) return nullptr;
  const Slot& slot = slots_[slot_of(pair_key(left, right))];
  return slot.key == kEmpty ? nullptr : &slot.merge;
}

BpeModel BpeModel::from_json(const nlohmann::json& model, Vocabulary& vocab) {
  G4_CHECK(model.is_object(), "tokenizer.json: \"model\" must be an object");
  require_supported_options(model);
  const nlohmann::json& entries = model.at("vocab");
  G4_CHECK(entries.is_object(), "tokenizer.json: BPE \"vocab\" must be an object token → id");
  vocab.reserve(entries.size());
  for (const auto& [token, id] : entries.items()) vocab.assign(token_id_from_json(id, "vocab token '" + token + "'"), token);

  BpeModel bpe;
  bpe.byte_fallback_ = model.value("byte_fallback", false);
  bpe.fuse_unk_ = model.value("fuse_unk", false);
  bpe.ignore_merges_ = model.value("ignore_merges", false);
  if (!is_unset(model, "unk_token")) {
    const std::string unk = model.at("unk_token").get<std::string>();
    bpe.unk_id_ = vocab.find(unk);
    G4_CHECK(bpe.unk_id_.has_value(), "tokenizer.json: unk_token '" + unk + "' is not in the vocabulary");
  }
  for (int byte = 0; byte < 256; ++byte) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", byte);
    bpe.byte_ids_[static_cast<size_t>(byte)] = vocab.find(name);
  }
  bpe.load_merges(model.at("merges"), vocab);
  return bpe;
}

void BpeModel::load_merges(const nlohmann::json& merges, const Vocabulary& vocab) {
  G4_CHECK(merges.is_array(), "tokenizer.json: BPE \"merges\" must be an array");
  merges_.reserve(merges.size());
  int32_t rank = 0;
  for (const nlohmann::json& merge : merges) {
    const auto [left, right] = merge_parts(merge);
    const int32_t left_id = require_token(vocab, left, merge);
    const int32_t right_id = require_token(vocab, right, merge);
    const int32_t merged_id = require_token(vocab, left + right, merge);
    merges_.insert(left_id, right_id, Merge{rank++, merged_id});
  }
}

void BpeModel::push_char_symbols(std::string_view character, const Vocabulary& vocab,
                                 std::vector<int32_t>& symbols) const {
  if (const auto id = vocab.find(character)) {
    symbols.push_back(*id);
    return;
  }
  if (byte_fallback_) {
    bool all_bytes_known = true;
    for (const char byte : character) all_bytes_known &= byte_ids_[static_cast<uint8_t>(byte)].has_value();
    if (all_bytes_known) {
      for (const char byte : character) symbols.push_back(*byte_ids_[static_cast<uint8_t>(byte)]);
      return;
    }
  }
  G4_CHECK(unk_id_.has_value(), "tokenizer: character '" + std::string(character) +
                                    "' is not in the vocabulary and the model has no unk_token");
  if (fuse_unk_ && !symbols.empty() && symbols.back() == *unk_id_) return;
  symbols.push_back(*unk_id_);
}

// Repeatedly merges the adjacent pair with the lowest rank (leftmost first among equal ranks),
// as Hugging Face tokenizers does: a min-heap of candidate pairs over a linked list of symbols,
// O(n log n) in the length of the pre-token. Stale heap entries are detected on pop.
void BpeModel::apply_merges(std::vector<int32_t>& symbols) const {
  const int32_t count = static_cast<int32_t>(symbols.size());
  std::vector<int32_t> next(static_cast<size_t>(count)), prev(static_cast<size_t>(count));
  for (int32_t i = 0; i < count; ++i) {
    next[static_cast<size_t>(i)] = i + 1 < count ? i + 1 : -1;
    prev[static_cast<size_t>(i)] = i - 1;
  }
  struct Candidate {
    int32_t rank, left, left_id, right_id, merged_id;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : left > other.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  const auto consider = [&](int32_t left) {
    const int32_t right = next[static_cast<size_t>(left)];
    if (right < 0) return;
    const int32_t left_id = symbols[static_cast<size_t>(left)];
    const int32_t right_id = symbols[static_cast<size_t>(right)];
    if (const Merge* merge = merges_.find(left_id, right_id)) {
      heap.push(Candidate{merge->rank, left, left_id, right_id, merge->merged_id});
    }
  };
  for (int32_t i = 0; i + 1 < count; ++i) consider(i);

  while (!heap.empty()) {
    const Candidate top = heap.top();
    heap.pop();
    const int32_t right = next[static_cast<size_t>(top.left)];
    // Merging changes the left symbol's id, so a candidate whose ids no longer match is stale.
    if (right < 0 || symbols[static_cast<size_t>(top.left)] != top.left_id ||
        symbols[static_cast<size_t>(right)] != top.right_id) {
      continue;
    }
    symbols[static_cast<size_t>(top.left)] = top.merged_id;
    symbols[static_cast<size_t>(right)] = -1;
    const int32_t after = next[static_cast<size_t>(right)];
    next[static_cast<size_t>(top.left)] = after;
    if (after >= 0) prev[static_cast<size_t>(after)] = top.left;
    if (prev[static_cast<size_t>(top.left)] >= 0) consider(prev[static_cast<size_t>(top.left)]);
    consider(top.left);
  }
  std::erase(symbols, -1);
}

void BpeModel::encode(std::string_view word, const Vocabulary& vocab, std::vector<int32_t>& ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const auto id = vocab.find(word)) {
      ids.push_back(*id);
      return;
    }
  }
  std::vector<int32_t> symbols;
  symbols.reserve(word.size());
  for (size_t pos = 0; pos < word.size();) {
    const size_t length = static_cast<size_t>(utf8::sequence_length(word, pos));
    push_char_symbols(word.substr(pos, length), vocab, symbols);
    pos += length;
  }
  apply_merges(symbols);
  ids.insert(ids.end(), symbols.begin(), symbols.end());
}

}  // namespace g4
