#include "runtime/generator.h"

#include <chrono>

#include "util/error.h"
#include "util/seconds.h"

namespace g4 {

GenerationResult generate(Session& session, const GenerationRequest& request,
                          const std::function<void(int32_t)>& on_token) {
  G4_CHECK(!request.prompt.empty(), "the prompt has no tokens");
  G4_CHECK(request.max_new_tokens >= 0, "max_new_tokens must be >= 0");
  session.check_input(request.prompt, 0);
  GenerationResult result;
  if (request.max_new_tokens == 0) return result;

  auto t0 = std::chrono::steady_clock::now();
  result.prefilled = session.start(request.prompt);
  session.begin_generation(request.sampler, GenerationLimits{request.max_new_tokens, request.stop_ids}, request.graph,
                           request.penalties, request.draft);
  DecodedToken drawn = session.next();
  result.prefill_seconds = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  for (;;) {
    if (drawn.stop == StopReason::kStopToken) {
      result.stop_token = drawn.token;
      break;
    }
    if (drawn.stop == StopReason::kCancelled) {
      result.stopped = true;
      break;
    }
    result.tokens.push_back(drawn.token);
    if (on_token) on_token(drawn.token);
    result.context_full = drawn.stop == StopReason::kContextFull;
    if (drawn.last()) break;
    if (request.stop && request.stop->load()) session.cancel();
    drawn = session.next();
  }
  result.decode_seconds = seconds_since(t0);
  return result;
}

}  // namespace g4
