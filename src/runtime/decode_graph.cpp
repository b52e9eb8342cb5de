#include "runtime/decode_graph.h"

#include "util/error.h"

namespace g4 {

namespace {

// Records `work` into `step` (new, or updated in place). A failed capture is ended before the
// error goes on, so the backend runs ops again.
void record(Backend& be, std::unique_ptr<Backend::RecordedStep>& step, const std::function<void()>& work) {
  be.begin_capture();
  try {
    work();
  } catch (...) {
    std::unique_ptr<Backend::RecordedStep> discarded;
    try {
      be.end_capture(discarded);
    } catch (...) {  // the first error is the one worth reporting
    }
    throw;
  }
  be.end_capture(step);
}

}  // namespace

std::vector<uintptr_t> cache_layout(std::span<const std::vector<KvCache>* const> sequences) {
  std::vector<uintptr_t> out;
  for (const std::vector<KvCache>* caches : sequences)
    for (const KvCache& c : *caches)
      out.insert(out.end(), {uintptr_t(c.k.data), uintptr_t(c.v.data), uintptr_t(c.table.data)});
  return out;
}

void check_graphs_run(const ModelRunner& runner) {
  G4_CHECK(runner.backend().records_steps(), "CUDA graph decoding (--cuda_graph) needs a backend with graphs (--backend "
                                             "cuda); the " + runner.backend().name() + " backend has none");
}

DecodeGraph::DecodeGraph(Session& session) : session_(session) { check_graphs_run(session.runner()); }

void DecodeGraph::start(int32_t token, const Sampler& sampler, int64_t j) {
  Session& s = session_;
  s.check_input(std::span<const int32_t>(&token, 1));
  Backend& be = s.backend();
  const DecodeStepTensors& step = s.decode_step_tensors();
  const int32_t position = int32_t(s.position());
  const SamplingParams params = sampler.for_token(j);
  be.upload(&token, step.id);
  be.upload(&position, step.position);
  be.upload_sampling_rows({&params, 1}, step.params);
  const std::vector<KvCache>* caches = &s.kv().caches();
  if (!recorded_ || !be.replayable(*recorded_) || recorded_caches_ != cache_layout(std::span(&caches, 1))) record();
  started_ = true;
  input_ = token;
}

void DecodeGraph::record() {
  Backend& be = session_.backend();
  const DecodeStepTensors& step = session_.decode_step_tensors();
  g4::record(be, recorded_, [&] {
    session_.enqueue_decode_step();
    be.advance_step(step.token, step.id, step.position);
  });
  const std::vector<KvCache>* caches = &session_.kv().caches();
  recorded_caches_ = cache_layout(std::span(&caches, 1));
}

int64_t DecodeGraph::next() {
  Session& s = session_;
  G4_CHECK(started_, "DecodeGraph::next before start");
  G4_CHECK(s.position() < s.max_seq_len(), "context full (" + std::to_string(s.max_seq_len()) + " tokens)");
  Backend& be = s.backend();
  s.prepare_decode_step();
  be.replay(*recorded_);
  int64_t token = 0;
  s.runner().download_result(s.decode_step_tensors().token, &token);
  // The replay made kNanLogitsToken the next input id: only a new start() may replay again.
  if (token == kNanLogitsToken) started_ = false;
  const int32_t fed = input_;
  input_ = int32_t(checked_token(token));
  s.note_fed(fed);
  return token;
}

DecodeBatchGraphs::DecodeBatchGraphs(const ModelRunner& runner) : backend_(runner.backend()) {
  check_graphs_run(runner);
}

bool DecodeBatchGraphs::run(int64_t forward, std::span<const std::vector<KvCache>* const> sequences,
                            const std::function<void()>& work) {
  auto [at, first] = recordings_.try_emplace(std::pair(forward, sequences.size()));
  if (first) {
    work();
    return false;
  }
  Recording& r = at->second;
  std::vector<uintptr_t> caches = cache_layout(sequences);
  if (!r.step || !backend_.replayable(*r.step) || r.caches != caches) {
    r.caches.clear();  // until the recording below succeeds
    record(backend_, r.step, work);
    r.caches = std::move(caches);
  }
  backend_.replay(*r.step);
  return true;
}

}  // namespace g4
