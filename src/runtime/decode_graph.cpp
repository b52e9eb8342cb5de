#include "runtime/decode_graph.h"

#include "util/error.h"

namespace g4 {

DecodeGraph::DecodeGraph(Session& session) : session_(session) {
  G4_CHECK(!session.runner().model().communicator(),
           "CUDA graph decoding (--cuda_graph) does not run with --tp > 1 yet: decode eagerly");
}

DecodeGraph::~DecodeGraph() {
  if (session_.runner().graph_owner() == this) session_.runner().set_graph_owner(nullptr);
}

void DecodeGraph::start(int32_t token, const Sampler& sampler, int64_t j) {
  Session& s = session_;
  s.check_input(std::span<const int32_t>(&token, 1));
  Backend& be = s.backend();
  const DecodeStepTensors& step = s.decode_step_tensors();
  const int32_t position = int32_t(s.position());
  const SamplingParams params = sampler.for_token(j);
  be.upload(&token, step.id);
  be.upload(&position, step.position);
  be.upload(&params, step.params);
  const void* caches = s.kv().caches().front().k.data;
  if (s.runner().graph_owner() != this || recorded_caches_ != caches) record();
  started_ = true;
  input_ = token;
}

void DecodeGraph::record() {
  Backend& be = session_.backend();
  const DecodeStepTensors& step = session_.decode_step_tensors();
  be.begin_capture();
  try {
    session_.enqueue_decode_step();
    be.advance_step(step.token, step.id, step.position);
  } catch (...) {
    try {
      be.end_capture();
    } catch (...) {  // the first error is the one worth reporting
    }
    throw;
  }
  be.end_capture();
  session_.runner().set_graph_owner(this);
  recorded_caches_ = session_.kv().caches().front().k.data;
}

int64_t DecodeGraph::next() {
  Session& s = session_;
  G4_CHECK(started_, "DecodeGraph::next before start");
  G4_CHECK(s.position() < s.max_seq_len(), "context full (" + std::to_string(s.max_seq_len()) + " tokens)");
  G4_CHECK(s.runner().graph_owner() == this, "DecodeGraph::next: another graph was recorded since start");
  Backend& be = s.backend();
  be.replay();
  int64_t token = 0;
  be.download(s.decode_step_tensors().token, &token);
  // The replay made kNanLogitsToken the next input id: only a new start() may replay again.
  if (token == kNanLogitsToken) started_ = false;
  const int32_t fed = input_;
  input_ = int32_t(checked_token(token));
  s.note_fed(fed);
  return token;
}

}  // namespace g4
