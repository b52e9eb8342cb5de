// The id ↔ token-string table of a tokenizer (model vocabulary plus added tokens).
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace g4 {

class Vocabulary {
 public:
  // Maps id → token and token → id. Assigning an id again (an added token that renames a model
  // token) replaces its string; the old string keeps resolving to the id, as in Hugging Face.
  void assign(int32_t id, std::string token);
  std::optional<int32_t> find(std::string_view token) const;
  // The token string of id ("" for an id inside the range that no entry names).
  const std::string& token(int32_t id) const { return tokens_[static_cast<size_t>(id)]; }
  // One past the largest assigned id.
  int32_t size() const { return static_cast<int32_t>(tokens_.size()); }
  bool contains(int32_t id) const { return id >= 0 && id < size(); }
  void reserve(size_t count);

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
  };
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int32_t, Hash, std::equal_to<>> ids_;
};

}  // namespace g4
