// What `g4 bench --synthetic` needs from the GPU: a model's weights filled with random values on
// the device (no file) and the device's copy bandwidth, the ceiling a decode step is measured
// against. Includable without the CUDA headers; built only with CUDA.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/backend.h"
#include "model/config.h"
#include "model/weights.h"

namespace g4 {

// Weights of `c` generated on the device of `backend` (a CUDA backend), scaled like the fixtures:
// matrices uniform with standard deviation 1/sqrt(in), norm weights 1 ± 0.2, layer scalars 1;
// tied embeddings. Deterministic in `seed`.
ModelWeights random_weights_on_device(const ModelConfig& c, Backend& backend, uint64_t seed);

// Device-to-device copy bandwidth in bytes per second (bytes read + bytes written), median of a
// few copies of a `bytes`-sized buffer.
double measure_copy_bandwidth(size_t bytes);

}  // namespace g4
