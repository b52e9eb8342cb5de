#include "tokenizer/added_tokens.h"

#include "util/error.h"

namespace g4 {
namespace {

uint64_t edge_key(int32_t node, uint8_t byte) { return (static_cast<uint64_t>(node) << 8) | byte; }

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens) {
  root_children_.fill(kNone);
  for (const AddedToken& token : tokens) {
    G4_CHECK(!token.content.empty(), "tokenizer.json: added token " + std::to_string(token.id) +
                                         " has empty content");
    int32_t node = 0;
    for (const char c : token.content) {
      const auto byte = static_cast<uint8_t>(c);
      int32_t next = child(node, byte);
      if (next == kNone) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_.push_back(Node{});
        if (node == 0) root_children_[byte] = next;
        else edges_.emplace(edge_key(node, byte), next);
      }
      node = next;
    }
    nodes_[static_cast<size_t>(node)] = Node{token.id, token.special};
  }
}

int32_t AddedTokenMatcher::child(int32_t node, uint8_t byte) const {
  if (node == 0) return root_children_[byte];
  const auto it = edges_.find(edge_key(node, byte));
  return it == edges_.end() ? kNone : it->second;
}

std::optional<AddedTokenMatcher::Match> AddedTokenMatcher::longest_at(std::string_view text, size_t pos,
                                                                      bool allow_special) const {
  std::optional<Match> longest;
  int32_t node = 0;
  for (size_t end = pos; end < text.size(); ++end) {
    node = child(node, static_cast<uint8_t>(text[end]));
    if (node == kNone) break;
    const Node& here = nodes_[static_cast<size_t>(node)];
    if (here.token_id != kNone && (allow_special || !here.special)) {
      longest = Match{here.token_id, end + 1 - pos};
    }
  }
  return longest;
}

}  // namespace g4
