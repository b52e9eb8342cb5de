// Weights of a model shape filled with random values by the backend (no file): `g4 bench
// --synthetic` runs the 31B shape this way on any GPU that has the memory for it.
#pragma once
#include <cstdint>
#include <string>

#include "backend/backend.h"
#include "model/config.h"
#include "model/tensor_parallel.h"
#include "model/weights.h"

namespace g4 {

// Scaled like the fixtures: matrices uniform with standard deviation 1/sqrt(in) (block types:
// random blocks of about that spread, quant/random_blocks.h), norm weights 1 ± 0.2, layer scalars
// 1; tied embeddings unless the config says otherwise. Deterministic in `seed`, and the same values
// on every backend (Backend::fill_uniform). `weights` names the matrices' types: "bf16"; a block
// type as `g4 export --weights` names it ("q8_0", "q4_0", "q4_k", ...) for every matrix and the
// embedding; or "q4_k_m", llama.cpp's mix (requested_dtype) with its Q6_K embedding.
// With a split `shard`, the rank's shapes (rank_slice's) with its own random values, and a tied
// model's LM head as its vocabulary rows of their own (docs/DESIGN.md, "Tensor parallel").
ModelWeights synthetic_weights(const ModelConfig& c, Backend& backend, uint64_t seed,
                               const std::string& weights = "bf16", TpShard shard = {});

}  // namespace g4
