#include "runtime/generator.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>

#include "runtime/decode_graph.h"
#include "util/error.h"

namespace g4 {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Draws token j of the generation: the seed advances after prefill and after every decode step.
int32_t step(Engine& engine, std::span<const int32_t> tokens, int32_t first_pos, SamplingParams params, int64_t j) {
  std::vector<int32_t> pos(tokens.size());
  std::iota(pos.begin(), pos.end(), first_pos);
  params.seed += uint64_t(j);  // uint64 wrap is the documented schedule
  return int32_t(engine.token_of(engine.forward(tokens, pos, params), params));
}

}  // namespace

GenerationResult generate(Engine& engine, const GenerationRequest& request,
                          const std::function<void(int32_t)>& on_token) {
  G4_CHECK(!request.prompt.empty(), "the prompt has no tokens");
  G4_CHECK(request.max_new_tokens >= 0, "max_new_tokens must be >= 0");
  validate_sampling_params(request.params);
  G4_CHECK(!request.graph || engine.use_sampling(),
           "graph decoding needs a sampling program (export the model with --sample)");
  GenerationResult result;
  if (request.max_new_tokens == 0) return result;
  const int64_t max_seq = engine.session().max_seq_len();

  auto t0 = std::chrono::steady_clock::now();
  const int32_t first_pos = request.continue_session ? int32_t(engine.session().position()) : 0;
  int32_t token = step(engine, request.prompt, first_pos, request.params, 0);
  result.prefill_seconds = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  std::unique_ptr<DecodeGraph> graph;
  for (int64_t j = 1;; ++j) {
    if (std::find(request.stop_ids.begin(), request.stop_ids.end(), token) != request.stop_ids.end()) {
      result.stop_token = token;
      break;
    }
    result.tokens.push_back(token);
    if (on_token) on_token(token);
    if (j >= request.max_new_tokens) break;
    if (request.stop && request.stop->load()) {
      result.stopped = true;
      break;
    }
    const int64_t pos = engine.session().position();
    if (pos >= max_seq) {
      result.context_full = true;
      break;
    }
    if (request.graph && !graph) {
      graph = std::make_unique<DecodeGraph>(engine.session());
      SamplingParams params = request.params;
      params.seed += uint64_t(j);  // the graph's sampler advances it by one per replay
      graph->start(token, params);
    }
    token = graph ? int32_t(graph->next()) : step(engine, std::span<const int32_t>(&token, 1), int32_t(pos), request.params, j);
  }
  result.decode_seconds = seconds_since(t0);
  return result;
}

}  // namespace g4
