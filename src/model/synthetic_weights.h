// Weights of a model shape filled with random values by the backend (no file): `g4 bench
// --synthetic` runs the 31B shape this way on any GPU that has the memory for it.
#pragma once
#include <cstdint>

#include "backend/backend.h"
#include "model/config.h"
#include "model/weights.h"

namespace g4 {

// Scaled like the fixtures: matrices (bf16) uniform with standard deviation 1/sqrt(in), norm
// weights 1 ± 0.2, layer scalars 1; tied embeddings unless the config says otherwise.
// Deterministic in `seed`, and the same values on every backend (Backend::fill_uniform).
ModelWeights synthetic_weights(const ModelConfig& c, Backend& backend, uint64_t seed);

}  // namespace g4
