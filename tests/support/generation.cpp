#include "support/generation.h"

#include "runtime/decode_graph.h"
#include "sampling/sampler.h"

namespace g4::test {

std::vector<int64_t> generate_plain(Session& s, std::span<const int32_t> prompt, SamplingParams p, int n) {
  const Sampler sampler(p);
  s.prefill(prompt);
  std::vector<int64_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(s.sample(sampler, i));
    if (i + 1 < n) s.decode(int32_t(out.back()));
  }
  return out;
}

std::vector<int64_t> generate_with_graph(Session& s, std::span<const int32_t> prompt, SamplingParams p, int n) {
  const Sampler sampler(p);
  s.prefill(prompt);
  std::vector<int64_t> out = {s.sample(sampler, 0)};
  DecodeGraph graph(s);
  graph.start(int32_t(out.back()), sampler, 1);
  while (int(out.size()) < n) out.push_back(graph.next());
  return out;
}

}  // namespace g4::test
