// Constrained decoding's per-step token masks (docs/DESIGN.md §4, "Constrained decoding").
//
// A mask is a bitset of the vocabulary in 32-bit words, bit t of word t/32 set when token t is
// allowed: xgrammar's bitmask layout, so it can be copied to the device as is (mask_words() words).
//
// TokenVocabulary: the tokenizer's tokens as bytes (Tokenizer::append_token_bytes), sorted, once per
// tokenizer. CompiledGrammar: a grammar with that vocabulary and the cache of per-position token
// classes, shared by every matcher of the grammar (thread-safe). GrammarMatcher: one sequence's
// parser state (not thread-safe; one per sequence).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"

namespace g4 {
class Tokenizer;
}

namespace g4::grammar {

class TokenVocabulary {
 public:
  // mask_size: the ids a mask covers, the model's vocabulary (0: the tokenizer's size); ids the
  // tokenizer does not have are never allowed. stop_tokens: allowed exactly when the grammar can
  // end. Control tokens are never allowed: special ones (Tokenizer::is_special), those of no
  // bytes, and those whose bytes are "<…>" (three or more: Gemma's <unusedN> and markers, which
  // tokenizer.json leaves unmarked, and a few HTML tags with them). xgrammar allows all of these
  // where their text fits; g4 does not. text_markers: control tokens a grammar writes (Gemma's
  // tool-call markers, kGemma4ToolCallMarkers): a token whose bytes equal one of them is a text
  // token, special or not.
  TokenVocabulary(const Tokenizer& tokenizer, std::vector<int32_t> stop_tokens, int32_t mask_size = 0,
                  const std::vector<std::string>& text_markers = {});

  int32_t size() const { return size_; }
  int32_t mask_words() const { return (size_ + 31) / 32; }
  const std::vector<int32_t>& stop_tokens() const { return stop_tokens_; }
  bool is_stop(int32_t id) const;
  // A token the grammar may allow (not special, not a stop token, some bytes).
  bool is_text(int32_t id) const { return id >= 0 && id < size_ && text_[id]; }
  const std::string& bytes(int32_t id) const { return bytes_[id]; }

  // The text tokens sorted by their bytes, and each one's common prefix length with the one before.
  const std::vector<int32_t>& sorted() const { return sorted_; }
  const std::vector<uint16_t>& common_prefix() const { return common_prefix_; }
  size_t max_token_bytes() const { return max_token_bytes_; }

 private:
  int32_t size_ = 0;
  std::vector<std::string> bytes_;
  std::vector<bool> text_;
  std::vector<int32_t> stop_tokens_;
  std::vector<int32_t> sorted_;
  std::vector<uint16_t> common_prefix_;
  size_t max_token_bytes_ = 0;
};

// Parser stacks, shared and hash-consed: a stack is a node (a grammar position and the node below),
// so equal stacks are equal ids and pushing never copies. kEmptyStack: nothing left to parse.
class StackPool {
 public:
  static constexpr int32_t kEmptyStack = -1;
  int32_t push(int32_t position, int32_t below);
  int32_t position(int32_t node) const { return nodes_[node].position; }
  int32_t below(int32_t node) const { return nodes_[node].below; }
  void clear();

 private:
  struct Node {
    int32_t position, below;
  };
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> index_;
};

class CompiledGrammar {
 public:
  CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocabulary);

  const Grammar& grammar() const { return grammar_; }
  const TokenVocabulary& vocabulary() const { return *vocabulary_; }

  // A stack's top kTopDepth positions (top first; fewer when the stack is shorter) decide most
  // tokens alone; they key the cache of token classes.
  static constexpr size_t kTopDepth = 3;
  // The tokens a stack whose top positions are `top` accepts without looking further down:
  // `accepted`, read in full within them; `uncertain`, tokens that finish all of them with bytes to
  // spare, which the rest of the stack decides. Computed once per key by a walk of the sorted
  // vocabulary that skips every token sharing a dead prefix, over a DFA of stack sets built as it
  // goes.
  struct PositionTokens {
    std::vector<uint32_t> accepted;
    std::vector<int32_t> uncertain;
  };
  const PositionTokens& position_tokens(const std::vector<int32_t>& top) const;

  // The stacks (sorted node ids) after `byte` from each of `from`'s, fully expanded (tops are byte
  // sets or kEmptyStack). Shared by the matcher and the per-position walk.
  void advance(StackPool& pool, const std::vector<int32_t>& from, uint8_t byte, std::vector<int32_t>& to) const;
  // The expanded stacks of a stack whose top may be a rule reference or an alternative's end.
  void expand(StackPool& pool, int32_t node, std::vector<int32_t>& out) const;

 private:
  PositionTokens compute(const std::vector<int32_t>& top) const;

  Grammar grammar_;
  std::shared_ptr<const TokenVocabulary> vocabulary_;
  mutable std::mutex mutex_;
  mutable std::map<std::vector<int32_t>, std::unique_ptr<PositionTokens>> positions_;
};

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);

  // Accepts `id` when the mask allows it: the grammar goes on (a text token) or ends (a stop token
  // where can_end()); otherwise returns false and the state is unchanged.
  bool accept_token(int32_t id);
  // Writes vocabulary().mask_words() words: the tokens accept_token would take now. After
  // termination, nothing is allowed.
  void fill_next_token_mask(uint32_t* words);
  // The text so far is a whole sentence of the grammar (a stop token is allowed).
  bool can_end() const;
  // A stop token was accepted.
  bool is_terminated() const { return terminated_; }
  void reset();

  const CompiledGrammar& compiled() const { return *grammar_; }

 private:
  bool accepts_from(int32_t node, const std::string& bytes);

  std::shared_ptr<const CompiledGrammar> grammar_;
  StackPool pool_;
  std::vector<int32_t> state_;  // sorted stack ids
  bool terminated_ = false;
  std::vector<int32_t> scratch_a_, scratch_b_, top_;
  // Masks of recent states (a state inside a string repeats at every character).
  std::map<std::vector<int32_t>, std::vector<uint32_t>> mask_cache_;
};

}  // namespace g4::grammar
