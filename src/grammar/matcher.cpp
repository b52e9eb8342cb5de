#include "grammar/matcher.h"

#include <algorithm>
#include <array>
#include <climits>
#include <numeric>

#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace g4::grammar {

TokenVocabulary::TokenVocabulary(const Tokenizer& tokenizer, std::vector<int32_t> stop_tokens, int32_t mask_size,
                                 const std::vector<std::string>& text_markers)
    : size_(mask_size > 0 ? mask_size : tokenizer.vocab_size()), stop_tokens_(std::move(stop_tokens)) {
  G4_CHECK(size_ >= tokenizer.vocab_size(), "grammar: a mask of " + std::to_string(size_) +
                                                " tokens cannot cover the tokenizer's " +
                                                std::to_string(tokenizer.vocab_size()));
  bytes_.resize(size_);
  text_.assign(size_, false);
  for (int32_t id : stop_tokens_)
    G4_CHECK(id >= 0 && id < size_, "grammar: stop token " + std::to_string(id) + " outside the vocabulary");
  for (const std::string& marker : text_markers) G4_CHECK(!marker.empty(), "grammar: an empty text marker");
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    if (is_stop(id)) continue;
    std::string token_bytes;
    tokenizer.append_token_bytes(id, false, token_bytes);
    const bool marker = std::find(text_markers.begin(), text_markers.end(), token_bytes) != text_markers.end();
    if (tokenizer.is_special(id) && !marker) continue;
    bytes_[id] = std::move(token_bytes);
    // A token of no bytes, or whose text is "<…>" (three bytes or more), is a control token:
    // Gemma's tokenizer.json marks only a few of its markers special (not <unusedN>, the tool and
    // channel markers).
    const std::string& b = bytes_[id];
    if (!marker && (b.empty() || (b.size() >= 3 && b.front() == '<' && b.back() == '>'))) continue;
    G4_CHECK(bytes_[id].size() < 65535, "grammar: a token of 64 KiB or more");
    text_[id] = true;
    sorted_.push_back(id);
    max_token_bytes_ = std::max(max_token_bytes_, bytes_[id].size());
  }
  std::sort(sorted_.begin(), sorted_.end(), [&](int32_t a, int32_t b) { return bytes_[a] < bytes_[b]; });
  common_prefix_.resize(sorted_.size(), 0);
  for (size_t i = 1; i < sorted_.size(); ++i) {
    const std::string& a = bytes_[sorted_[i - 1]];
    const std::string& b = bytes_[sorted_[i]];
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    common_prefix_[i] = static_cast<uint16_t>(n);
  }
}

bool TokenVocabulary::is_stop(int32_t id) const {
  return std::find(stop_tokens_.begin(), stop_tokens_.end(), id) != stop_tokens_.end();
}

int32_t StackPool::push(int32_t position, int32_t below) {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(position)) << 32) | static_cast<uint32_t>(below);
  auto [it, inserted] = index_.try_emplace(key, static_cast<int32_t>(nodes_.size()));
  if (inserted) nodes_.push_back({position, below});
  return it->second;
}

void StackPool::clear() {
  nodes_.clear();
  index_.clear();
}

CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocabulary)
    : grammar_(std::move(grammar)), vocabulary_(std::move(vocabulary)) {}

void CompiledGrammar::expand(StackPool& pool, int32_t node, std::vector<int32_t>& out) const {
  const std::vector<Element>& elements = grammar_.elements();
  while (true) {
    if (node == StackPool::kEmptyStack) {
      out.push_back(node);
      return;
    }
    const int32_t p = pool.position(node);
    const Element& e = elements[p];
    if (e.kind == Element::kBytes) {
      out.push_back(node);
      return;
    }
    if (e.kind == Element::kEnd) {
      node = pool.below(node);
      continue;
    }
    // A rule reference: each alternative on top of the return position (none for a tail call).
    const int32_t below = elements[p + 1].kind == Element::kEnd ? pool.below(node) : pool.push(p + 1, pool.below(node));
    for (int32_t start : grammar_.alternatives(e.arg)) expand(pool, pool.push(start, below), out);
    return;
  }
}

void CompiledGrammar::advance(StackPool& pool, const std::vector<int32_t>& from, uint8_t byte,
                              std::vector<int32_t>& to) const {
  to.clear();
  const std::vector<Element>& elements = grammar_.elements();
  const std::vector<ByteSet>& sets = grammar_.byte_sets();
  for (int32_t node : from) {
    if (node == StackPool::kEmptyStack) continue;
    const int32_t p = pool.position(node);
    if (!sets[elements[p].arg].has(byte)) continue;
    expand(pool, pool.push(p + 1, pool.below(node)), to);
  }
  if (to.size() > 1) {
    std::sort(to.begin(), to.end());
    to.erase(std::unique(to.begin(), to.end()), to.end());
  }
}

const CompiledGrammar::PositionTokens& CompiledGrammar::position_tokens(const std::vector<int32_t>& top) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::unique_ptr<PositionTokens>& slot = positions_[top];
  if (!slot) slot = std::make_unique<PositionTokens>(compute(top));
  return *slot;
}

CompiledGrammar::PositionTokens CompiledGrammar::compute(const std::vector<int32_t>& top) const {
  const TokenVocabulary& vocab = *vocabulary_;
  PositionTokens result;
  result.accepted.assign(vocab.mask_words(), 0);
  // The stack sets met on the walk, interned, with their transitions by byte filled in as they are
  // needed: a small DFA of this position, so that a byte of a token costs one table lookup.
  StackPool pool;
  constexpr int32_t kUnknown = -2, kDead = -1;
  std::vector<std::vector<int32_t>> set_stacks;
  std::vector<uint8_t> set_finished;  // the set holds kEmptyStack: the top's rule finished
  std::vector<std::array<int32_t, 256>> transitions;
  std::map<std::vector<int32_t>, int32_t> set_ids;
  const auto intern = [&](std::vector<int32_t> stacks) {
    if (stacks.empty()) return kDead;
    auto [it, inserted] = set_ids.try_emplace(stacks, static_cast<int32_t>(set_stacks.size()));
    if (inserted) {
      set_finished.push_back(stacks.front() == StackPool::kEmptyStack);
      set_stacks.push_back(std::move(stacks));
      transitions.emplace_back();
      transitions.back().fill(kUnknown);
    }
    return it->second;
  };
  std::vector<int32_t> scratch;
  const auto step = [&](int32_t set, uint8_t byte) {
    int32_t& next = transitions[set][byte];
    if (next == kUnknown) {
      advance(pool, set_stacks[set], byte, scratch);
      const int32_t id = intern(scratch);
      transitions[set][byte] = id;  // intern may have moved transitions
      return id;
    }
    return next;
  };

  const size_t depth_count = vocab.max_token_bytes() + 1;
  // sets[d]: the set after the current token's first d bytes; finished[d]: whether the top's rule
  // finished within those d bytes (at some depth 1..d).
  std::vector<int32_t> sets(depth_count);
  std::vector<uint8_t> finished(depth_count, 0);
  int32_t start = StackPool::kEmptyStack;
  for (size_t k = top.size(); k-- > 0;) start = pool.push(top[k], start);
  sets[0] = intern({start});
  size_t valid = 0;        // sets[0..valid] hold for the previous token's prefix
  size_t dead = SIZE_MAX;  // the previous token's prefix of this length matches nothing
  const std::vector<int32_t>& sorted = vocab.sorted();
  const std::vector<uint16_t>& common = vocab.common_prefix();
  for (size_t i = 0; i < sorted.size(); ++i) {
    const int32_t id = sorted[i];
    const std::string& bytes = vocab.bytes(id);
    if (common[i] >= dead) {
      if (finished[dead - 1]) result.uncertain.push_back(id);
      continue;
    }
    dead = SIZE_MAX;
    size_t d = std::min<size_t>(common[i], valid);
    bool alive = true;
    while (d < bytes.size()) {
      const int32_t next = step(sets[d], static_cast<uint8_t>(bytes[d]));
      ++d;
      if (next == kDead) {
        alive = false;
        break;
      }
      sets[d] = next;
      finished[d] = finished[d - 1] || set_finished[next];
    }
    if (alive) {
      valid = d;
      result.accepted[id >> 5] |= uint32_t{1} << (id & 31);
    } else {
      valid = d - 1;
      dead = d;
      if (finished[d - 1]) result.uncertain.push_back(id);
    }
  }
  return result;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar) : grammar_(std::move(grammar)) {
  reset();
}

void GrammarMatcher::reset() {
  pool_.clear();
  mask_cache_.clear();
  terminated_ = false;
  state_.clear();
  const Grammar& g = grammar_->grammar();
  // The root's alternatives on an empty stack.
  for (int32_t start : g.alternatives(g.root())) grammar_->expand(pool_, pool_.push(start, StackPool::kEmptyStack), state_);
  std::sort(state_.begin(), state_.end());
  state_.erase(std::unique(state_.begin(), state_.end()), state_.end());
}

bool GrammarMatcher::can_end() const {
  return !terminated_ && !state_.empty() && state_.front() == StackPool::kEmptyStack;
}

bool GrammarMatcher::accepts_from(int32_t node, const std::string& bytes) {
  scratch_a_.assign(1, node);
  for (char c : bytes) {
    grammar_->advance(pool_, scratch_a_, static_cast<uint8_t>(c), scratch_b_);
    scratch_a_.swap(scratch_b_);
    if (scratch_a_.empty()) return false;
  }
  return true;
}

bool GrammarMatcher::accept_token(int32_t id) {
  if (terminated_) return false;
  const TokenVocabulary& vocab = grammar_->vocabulary();
  if (vocab.is_stop(id)) {
    if (!can_end()) return false;
    terminated_ = true;
    return true;
  }
  if (!vocab.is_text(id)) return false;
  scratch_a_ = state_;
  for (char c : vocab.bytes(id)) {
    grammar_->advance(pool_, scratch_a_, static_cast<uint8_t>(c), scratch_b_);
    scratch_a_.swap(scratch_b_);
    if (scratch_a_.empty()) return false;
  }
  state_ = scratch_a_;
  return true;
}

void GrammarMatcher::fill_next_token_mask(uint32_t* words) {
  const TokenVocabulary& vocab = grammar_->vocabulary();
  const size_t n = static_cast<size_t>(vocab.mask_words());
  std::fill(words, words + n, 0u);
  if (terminated_) return;
  if (auto it = mask_cache_.find(state_); it != mask_cache_.end()) {
    std::copy(it->second.begin(), it->second.end(), words);
    return;
  }
  const std::vector<int32_t> state = state_;
  for (int32_t node : state) {
    if (node == StackPool::kEmptyStack) {
      for (int32_t id : vocab.stop_tokens()) words[id >> 5] |= uint32_t{1} << (id & 31);
      continue;
    }
    top_.clear();
    for (int32_t n = node; n != StackPool::kEmptyStack && top_.size() < CompiledGrammar::kTopDepth; n = pool_.below(n))
      top_.push_back(pool_.position(n));
    const CompiledGrammar::PositionTokens& tokens = grammar_->position_tokens(top_);
    for (size_t w = 0; w < n; ++w) words[w] |= tokens.accepted[w];
    // The uncertain tokens, in full against this stack.
    for (int32_t id : tokens.uncertain) {
      if ((words[id >> 5] >> (id & 31)) & 1) continue;
      if (accepts_from(node, vocab.bytes(id))) words[id >> 5] |= uint32_t{1} << (id & 31);
    }
  }
  if (mask_cache_.size() >= 64) mask_cache_.clear();
  mask_cache_.emplace(state_, std::vector<uint32_t>(words, words + n));
}

}  // namespace g4::grammar
