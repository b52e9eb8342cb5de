#include "runtime/engine.h"

#include <algorithm>
#include <thread>

#include "backend/backend_factory.h"
#include "backend/cpu/cpu_backend.h"
#include "util/error.h"

namespace g4 {

namespace {

std::unique_ptr<Backend> backend_for(const EngineOptions& options) {
  if (options.backend == "cpu" && options.tp > 1) {
    // The ranks share the machine's cores.
    const int all = options.threads > 0 ? options.threads : int(std::thread::hardware_concurrency());
    return std::make_unique<CpuBackend>(std::max(1, all / options.tp));
  }
  if (options.backend == "cpu" && options.threads > 0) return std::make_unique<CpuBackend>(options.threads);
  return make_backend(options.backend, options.tp > 1 ? options.tp_rank : -1);
}

}  // namespace

std::unique_ptr<Backend> make_engine_backend(const EngineOptions& options) {
  G4_CHECK(options.threads >= 0, "threads must be >= 0 (0 = one per hardware thread), got " +
                                     std::to_string(options.threads));
  G4_CHECK(options.tp == 1 || options.tp_group, "an engine of a model split over " + std::to_string(options.tp) +
                                                    " ranks is made per rank by run_tensor_parallel");
  std::unique_ptr<Backend> backend = backend_for(options);
  if (options.bf16_weight_copies) backend->set_bf16_weight_copies(true);  // before any weight is written
  return backend;
}

namespace {

std::unique_ptr<Communicator> communicator_for(const EngineOptions& options, Backend& backend) {
  if (!options.tp_group) return nullptr;
  return options.tp_group->join(options.tp_rank, backend);
}

// A rank that fails to load aborts the group first, so that its peers stop waiting for it.
LoadedProgram load_for(const EngineOptions& options, Backend& backend, Communicator* comm) {
  auto load = [&] {
    return options.model_image ? load_program(*options.model_image, backend, comm)
                               : load_program(options.model_path, backend, comm);
  };
  if (!comm) return load();
  return run_or_abort([&](const std::string& what) { comm->abort(what); }, load);
}

}  // namespace

Engine::Engine(const EngineOptions& options)
    : backend_(make_engine_backend(options)),
      comm_(communicator_for(options, *backend_)),
      loaded_(load_for(options, *backend_, comm_.get())) {
  RunnerOptions ro;
  ro.max_seq_len = options.max_seq_len > 0 ? options.max_seq_len : loaded_.program.max_seq_len;
  ro.max_prefill_chunk = options.max_prefill_chunk > 0
                             ? options.max_prefill_chunk
                             : std::min(loaded_.program.max_prefill_chunk, config().max_prefill_chunk(ro.max_seq_len));
  ro.max_batch_sequences = options.max_batch_sequences;
  ro.kv_budget_bytes = options.kv_budget_bytes;
  ro.kv_budget_sequences = options.kv_budget_sequences;
  ro.kv_types = options.kv_types.over(loaded_.program.kv_types);
  // The assistant's weights before the runner: its KV pool takes what the device then has free.
  if (!options.draft_model.empty() || options.draft_image) {
    G4_REQUIRE(kUnsupported, !comm_, "a draft model with a split model (--tp > 1) is not supported yet");
    check_draft_tokens(options.draft_tokens);
    assistant_ = options.draft_image ? load_assistant(*options.draft_image, *backend_, config())
                                     : load_assistant(options.draft_model, *backend_, config());
    draft_tokens_ = options.draft_tokens > 0 ? options.draft_tokens : assistant_->default_draft_tokens();
    // A scheduler's verify chunk draws every one of its rows in one forward.
    ro.max_batch_sequences = std::max<int64_t>(ro.max_batch_sequences, draft_tokens_ + 1);
  }
  runner_ = std::make_unique<ModelRunner>(*loaded_.model, *backend_, ro);
  if (comm_) comm_->barrier();  // every rank loaded: a failed peer shows here, before any work
}

std::unique_ptr<Session> Engine::create_session(SessionOptions options) {
  return std::make_unique<Session>(*runner_, options);
}

ForwardResult Engine::forward(Session& session, std::span<const int32_t> tokens, std::span<const int32_t> input_pos,
                              const Sampler& sampler, int64_t j) {
  G4_CHECK(tokens.size() == input_pos.size(), "input_pos has " + std::to_string(input_pos.size()) +
                                                  " entries for " + std::to_string(tokens.size()) + " tokens");
  G4_CHECK(!tokens.empty(), "no tokens to run");
  for (size_t i = 1; i < input_pos.size(); ++i)
    G4_CHECK(input_pos[i] == input_pos[0] + int32_t(i), "input_pos must be consecutive positions");
  const int64_t start = input_pos[0];
  G4_CHECK(start == 0 || start == session.position(),
           "input_pos starts at " + std::to_string(start) + " but the session is at position " +
               std::to_string(session.position()) + " (continue it, or start again at 0)");
  session.check_input(tokens, start);
  if (start == 0) session.reset();
  session.prefill(tokens);
  ForwardResult result;
  if (use_sampling()) {
    result.token = session.sample(sampler, j);
  } else {
    result.logits = session.last_logits_host();
  }
  return result;
}

int64_t Engine::token_of(const ForwardResult& result, const Sampler& sampler, int64_t j) const {
  if (result.token >= 0) return result.token;
  return sampler.sample_host(result.logits.data(), int64_t(result.logits.size()), j);
}

}  // namespace g4
