// The Gemma 4 text model's weights in a backend's memory, checked against the config first.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "format/tensor_source.h"
#include "model/tensor_parallel.h"

namespace g4 {

// An assistant's layers (ModelConfig::is_assistant) have no k_proj, v_proj or k_norm.
struct LayerWeights {
  Tensor attn_norm, q_proj, k_proj, v_proj /* empty on K=V layers */, o_proj, q_norm, k_norm;
  Tensor post_attn_norm, ffn_norm, gate_proj, up_proj, down_proj, post_ffn_norm, layer_scalar;
  Tensor rope_inv_freq;  // F32 [head_dim/2, 1]
};

struct ModelWeights {
  Tensor embed;    // [vocab, hidden]
  Tensor lm_head;  // the embedding when tied
  Tensor final_norm;
  // An assistant's: [hidden, 2 * backbone] from the target's embedding and hidden state, and
  // [backbone, hidden] back to the target's width.
  Tensor pre_projection, post_projection;
  std::vector<LayerWeights> layers;
};

// One expected tensor: canonical name and [out, in] shape (1-D tensors have one dimension).
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};

// Every tensor the config implies, in load order.
std::vector<TensorSpec> expected_tensors(const ModelConfig& c);

// Throws g4::Error naming the first missing tensor or wrong shape.
void validate_tensors(const ModelConfig& c, const TensorSource& source);

// Validates, then uploads every tensor with backend.upload_weight, reporting progress on stderr
// when the weights are large (see util/progress.h). A shard of a tensor-parallel group reads only
// its slices (rank_slice); its LM head is its vocabulary rows, also when tied to the embedding,
// which every rank holds whole (docs/DESIGN.md, "Tensor parallel").
ModelWeights load_weights(const ModelConfig& c, const TensorSource& source, Backend& backend, TpShard shard = {});
// Bytes of the weights in backend memory per storage type (a tied LM head counted once): the
// memory report of `g4 bench` and `g4 run`.
std::map<DType, uint64_t> weight_bytes_by_type(const ModelWeights& w);
// "F32 3.28 MiB, Q4_K 15.21 GiB, Q6_K 2.10 GiB" (GiB from 1 GiB up)
std::string describe_weight_bytes(const std::map<DType, uint64_t>& bytes_by_type);

// A layer's RoPE inverse frequencies (LayerConfig::rope_inv_freq) on the backend, F32 [head_dim/2, 1].
Tensor upload_rope_inv_freq(const LayerConfig& layer, Backend& backend);

}  // namespace g4
