// Constrained decoding's per-step mask cost (docs/DESIGN.md §4, "Constrained decoding"): a seeded
// random walk through a JSON Schema's grammar over a tokenizer's vocabulary, timing every
// fill_next_token_mask. The first visit of a grammar position walks the whole vocabulary once
// (cached in the CompiledGrammar); later steps OR cached bitsets and check the few tokens that
// finish the top rule against the rest of the stack.
//
//   bench_grammar TOKENIZER_JSON [SCHEMA_JSON] [STEPS] [WALKS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "tokenizer/tokenizer.h"

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int main(int argc, char** argv) {
  using namespace g4;
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_grammar TOKENIZER_JSON [SCHEMA_JSON] [STEPS] [WALKS]\n");
    return 2;
  }
  const std::string schema = argc > 2 && *argv[2] ? argv[2]
                                      : R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},
      "tags":{"type":"array","items":{"type":"string"}},"address":{"type":"object","properties":{"city":{"type":"string"},
      "zip":{"type":"string"}},"required":["city"],"additionalProperties":false}},"required":["name","age","tags"],
      "additionalProperties":false})";
  const int steps = argc > 3 ? std::atoi(argv[3]) : 200;
  const int walks = argc > 4 ? std::atoi(argv[4]) : 5;
  auto t0 = std::chrono::steady_clock::now();
  const Tokenizer tokenizer = Tokenizer::from_file(argv[1]);
  std::printf("tokenizer: %d tokens, %.0f ms\n", tokenizer.vocab_size(), ms_since(t0));
  std::vector<int32_t> stops;
  for (const char* s : {"<eos>", "<end_of_turn>", "<turn|>"})
    if (auto id = tokenizer.token_id(s)) stops.push_back(*id);
  t0 = std::chrono::steady_clock::now();
  auto vocab = std::make_shared<grammar::TokenVocabulary>(tokenizer, stops);
  std::printf("vocabulary: %zu text tokens, longest %zu bytes, %.0f ms\n", vocab->sorted().size(),
              vocab->max_token_bytes(), ms_since(t0));
  t0 = std::chrono::steady_clock::now();
  auto compiled = std::make_shared<grammar::CompiledGrammar>(grammar::json_schema_grammar(schema), vocab);
  std::printf("grammar: %zu elements, %.2f ms\n", compiled->grammar().elements().size(), ms_since(t0));

  std::vector<uint32_t> mask(vocab->mask_words());
  std::vector<double> first, later;
  std::mt19937 rng(7);
  for (int w = 0; w < walks; ++w) {
    grammar::GrammarMatcher matcher(compiled);
    for (int step = 0; step < steps && !matcher.is_terminated(); ++step) {
      t0 = std::chrono::steady_clock::now();
      matcher.fill_next_token_mask(mask.data());
      const double ms = ms_since(t0);
      (w == 0 ? first : later).push_back(ms);
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < vocab->size(); ++id)
        if ((mask[id >> 5] >> (id & 31)) & 1) allowed.push_back(id);
      if (allowed.empty()) break;
      // Prefer text tokens so that walks get somewhere; stop when only stops are left or by chance.
      int32_t pick = allowed[rng() % allowed.size()];
      matcher.accept_token(pick);
    }
  }
  const auto report = [](const char* what, std::vector<double> v) {
    if (v.empty()) return;
    std::sort(v.begin(), v.end());
    double sum = 0;
    for (double x : v) sum += x;
    std::printf("%s: %zu masks, median %.3f ms, p90 %.3f ms, max %.3f ms, mean %.3f ms\n", what, v.size(),
                v[v.size() / 2], v[v.size() * 9 / 10], v.back(), sum / v.size());
  };
  report("first walk (fills the position cache)", first);
  report("later walks (cache warm)", later);
  return 0;
}
