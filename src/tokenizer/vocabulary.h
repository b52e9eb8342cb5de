// The id ↔ token-string table of a tokenizer (model vocabulary plus added tokens).
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace g4 {

// A token id from tokenizer.json: a JSON integer in [0, 2^31). Anything else (a float, a string, a
// huge number whose conversion to int32 would be undefined or wrap) throws g4::Error naming `what`.
int32_t token_id_from_json(const nlohmann::json& value, const std::string& what);

class Vocabulary {
 public:
  // `entries`: how many ids the file defines (model vocab plus added tokens). Ids must lie below it,
  // so that a small file cannot make the id table huge.
  explicit Vocabulary(size_t entries = 0) : limit_(entries) {}
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
  size_t limit_;
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int32_t, Hash, std::equal_to<>> ids_;
};

}  // namespace g4
