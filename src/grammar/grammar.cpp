#include "grammar/grammar.h"

#include <functional>

#include "util/error.h"

namespace g4::grammar {

int32_t GrammarBuilder::add_rule() {
  rules_.emplace_back();
  return static_cast<int32_t>(rules_.size() - 1);
}

void GrammarBuilder::add_alternative(int32_t rule, Sequence sequence) { rules_[rule].push_back(std::move(sequence)); }

Element GrammarBuilder::bytes(const ByteSet& set) {
  auto [it, inserted] = byte_set_ids_.try_emplace(set, static_cast<int32_t>(byte_sets_.size()));
  if (inserted) byte_sets_.push_back(set);
  return {Element::kBytes, it->second};
}

Element GrammarBuilder::byte(uint8_t b) {
  ByteSet set;
  set.add(b);
  return bytes(set);
}

GrammarBuilder::Sequence GrammarBuilder::literal(std::string_view text) {
  Sequence sequence;
  for (char c : text) sequence.push_back(byte(static_cast<uint8_t>(c)));
  return sequence;
}

int32_t GrammarBuilder::repeat(const Sequence& item, int64_t min, int64_t max) {
  int32_t tail = add_rule();
  if (max < 0) {  // tail ::= item tail | ""
    Sequence again = item;
    again.push_back(ref(tail));
    add_alternative(tail, std::move(again));
    add_alternative(tail, {});
  } else {  // tail_k ::= "" | item tail_(k-1), k = max - min
    add_alternative(tail, {});
    for (int64_t k = 1; k <= max - min; ++k) {
      const int32_t next = add_rule();
      add_alternative(next, {});
      Sequence more = item;
      more.push_back(ref(tail));
      add_alternative(next, std::move(more));
      tail = next;
    }
  }
  const int32_t rule = add_rule();
  Sequence body;
  for (int64_t i = 0; i < min; ++i) body.insert(body.end(), item.begin(), item.end());
  body.push_back(ref(tail));
  add_alternative(rule, std::move(body));
  return rule;
}

Grammar GrammarBuilder::build(int32_t root) {
  const size_t n = rules_.size();
  // Nullable rules, to a fixed point.
  std::vector<bool> nullable(n, false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (const Sequence& alt : rules_[r]) {
        bool all = true;
        for (const Element& e : alt) all = all && e.kind == Element::kRule && nullable[e.arg];
        if (all) {
          nullable[r] = changed = true;
          break;
        }
      }
    }
  }
  // Left recursion: a cycle of rules each reachable from the last before any byte is consumed.
  std::vector<uint8_t> mark(n, 0);  // 0 unvisited, 1 on the path, 2 done
  std::function<void(size_t)> visit = [&](size_t r) {
    mark[r] = 1;
    for (const Sequence& alt : rules_[r]) {
      for (const Element& e : alt) {
        if (e.kind != Element::kRule) break;
        G4_CHECK(mark[e.arg] != 1, "grammar: a rule reaches itself without consuming input (a $ref cycle through anyOf "
                                   "or an empty schema), which no parser can leave");
        if (mark[e.arg] == 0) visit(e.arg);
        if (!nullable[e.arg]) break;
      }
    }
    mark[r] = 2;
  };
  for (size_t r = 0; r < n; ++r)
    if (mark[r] == 0) visit(r);

  Grammar g;
  g.byte_sets_ = byte_sets_;
  g.root_ = root;
  g.rules_.resize(n);
  for (size_t r = 0; r < n; ++r) {
    for (const Sequence& alt : rules_[r]) {
      g.rules_[r].push_back(static_cast<int32_t>(g.elements_.size()));
      g.elements_.insert(g.elements_.end(), alt.begin(), alt.end());
      g.elements_.push_back({Element::kEnd, 0});
    }
  }
  return g;
}

}  // namespace g4::grammar
