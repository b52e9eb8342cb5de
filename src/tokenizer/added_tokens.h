// Added tokens of a tokenizer.json (specials, <unusedN>, whitespace runs, HTML tags): each is
// matched whole in the raw text before normalization and BPE, leftmost and then longest first.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace g4 {

struct AddedToken {
  int32_t id;
  std::string content;
  bool special;  // special tokens match only when the caller asks (parse_special)
};

class AddedTokenMatcher {
 public:
  struct Match {
    int32_t id;
    size_t length;  // bytes of text covered
  };

  explicit AddedTokenMatcher(const std::vector<AddedToken>& tokens);
  // The longest added token that starts at text[pos]; special ones only if allow_special.
  std::optional<Match> longest_at(std::string_view text, size_t pos, bool allow_special) const;

 private:
  static constexpr int32_t kNone = -1;
  struct Node {
    int32_t token_id = kNone;
    bool special = false;
  };
  int32_t child(int32_t node, uint8_t byte) const;

  // A byte trie: nodes_[0] is the root; edges live in one hash map keyed (node, byte), except
  // the root's, which are an array because every byte of the text probes them.
  std::vector<Node> nodes_{Node{}};
  std::array<int32_t, 256> root_children_{};
  std::unordered_map<uint64_t, int32_t> edges_;
};

}  // namespace g4
