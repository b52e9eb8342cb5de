#include "runtime/decode_graph.h"

#include "util/error.h"

namespace g4 {

void DecodeGraph::start(int32_t token, const SamplingParams& params) {
  Session& s = session_;
  validate_sampling_params(params);
  s.check_input(std::span<const int32_t>(&token, 1));
  const int32_t position = int32_t(s.position_);
  s.backend_.upload(&token, s.ids_.rows_view(0, 1));
  s.backend_.upload(&position, s.positions_.rows_view(0, 1));
  s.backend_.upload(&params, s.params_);
  if (!recorded_) record();
  started_ = true;
}

void DecodeGraph::record() {
  Session& s = session_;
  const Tensor ids = s.ids_.rows_view(0, 1), positions = s.positions_.rows_view(0, 1);
  s.backend_.begin_capture();
  try {
    s.model_.forward_layers(s.backend_, s.buffers_, s.caches_, ids, positions, 1);
    s.model_.logits(s.backend_, s.buffers_.x.rows_view(0, 1), s.buffers_.last_hidden, s.buffers_.logits_act,
                    s.logits_);
    s.backend_.sample(s.logits_, s.params_, s.token_);
    s.backend_.advance_step(s.token_, ids, positions);
  } catch (...) {
    try {
      s.backend_.end_capture();
    } catch (...) {  // the first error is the one worth reporting
    }
    throw;
  }
  s.backend_.end_capture();
  recorded_ = true;
}

int64_t DecodeGraph::next() {
  Session& s = session_;
  G4_CHECK(started_, "DecodeGraph::next before start");
  G4_CHECK(s.position_ < s.max_seq_len_, "context full (" + std::to_string(s.max_seq_len_) + " tokens)");
  s.backend_.replay();
  int64_t token = 0;
  s.backend_.download(s.token_, &token);
  ++s.position_;
  return token;
}

}  // namespace g4
