#include "support/generation.h"

#include "runtime/decode_graph.h"

namespace g4::test {

std::vector<int64_t> generate_plain(Session& s, std::span<const int32_t> prompt, SamplingParams p, int n) {
  s.prefill(prompt);
  std::vector<int64_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(s.sample(p));
    p.seed += 1;
    if (i + 1 < n) s.decode(int32_t(out.back()));
  }
  return out;
}

std::vector<int64_t> generate_with_graph(Session& s, std::span<const int32_t> prompt, SamplingParams p, int n) {
  s.prefill(prompt);
  std::vector<int64_t> out = {s.sample(p)};
  DecodeGraph graph(s);
  p.seed += 1;
  graph.start(int32_t(out.back()), p);
  while (int(out.size()) < n) out.push_back(graph.next());
  return out;
}

}  // namespace g4::test
