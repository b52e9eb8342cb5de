// A context-free grammar over bytes, the language constrained decoding enforces (docs/DESIGN.md
// §4, "Constrained decoding"). Terminals are byte sets; a Unicode character class is a small rule of
// UTF-8 byte sequences, so the matcher never decodes characters and a character split across tokens
// (byte fallback) needs nothing special.
//
// The grammar is flat: every alternative of every rule is a run of elements in one array, closed by
// an kEnd element, so that a parser position is one int32 (an index into elements()).
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace g4::grammar {

// A set of bytes: bit b of word b/64.
struct ByteSet {
  std::array<uint64_t, 4> words{};
  bool has(uint8_t b) const { return (words[b >> 6] >> (b & 63)) & 1; }
  void add(uint8_t b) { words[b >> 6] |= uint64_t{1} << (b & 63); }
  void add_range(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) add(static_cast<uint8_t>(b));
  }
  auto operator<=>(const ByteSet&) const = default;
};

struct Element {
  enum Kind : uint8_t { kBytes, kRule, kEnd };
  Kind kind = kEnd;
  int32_t arg = 0;  // kBytes: index into byte_sets(); kRule: the rule
};

class Grammar {
 public:
  const std::vector<Element>& elements() const { return elements_; }
  const std::vector<ByteSet>& byte_sets() const { return byte_sets_; }
  // The first position of each alternative of `rule`.
  const std::vector<int32_t>& alternatives(int32_t rule) const { return rules_[rule]; }
  int32_t rule_count() const { return static_cast<int32_t>(rules_.size()); }
  int32_t root() const { return root_; }

 private:
  friend class GrammarBuilder;
  std::vector<Element> elements_;
  std::vector<ByteSet> byte_sets_;
  std::vector<std::vector<int32_t>> rules_;
  int32_t root_ = 0;
};

// Builds a Grammar rule by rule. A sequence is a vector of elements (no kEnd); the empty sequence
// is the empty string.
class GrammarBuilder {
 public:
  using Sequence = std::vector<Element>;

  int32_t add_rule();
  void add_alternative(int32_t rule, Sequence sequence);

  Element bytes(const ByteSet& set);
  Element byte(uint8_t b);
  static Element ref(int32_t rule) { return {Element::kRule, rule}; }
  Sequence literal(std::string_view text);

  // A rule of `item` repeated min..max times (max < 0: unbounded).
  int32_t repeat(const Sequence& item, int64_t min, int64_t max);

  // The finished grammar. Throws Error(kInvalidArgument) when a rule can reach itself without
  // consuming a byte (left recursion, e.g. a $ref cycle through anyOf), which no parser position
  // could leave.
  Grammar build(int32_t root);

 private:
  std::vector<std::vector<Sequence>> rules_;
  std::vector<ByteSet> byte_sets_;
  std::map<ByteSet, int32_t> byte_set_ids_;
};

}  // namespace g4::grammar
