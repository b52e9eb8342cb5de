// The CUDA backend: bf16 activations, bf16 or packed block-quantized weights, float32
// accumulation, on-device sampling.
// Only compiled when CUDA is present (G4_HAVE_CUDA).
#pragma once
#include <memory>

#include "backend/backend.h"

namespace g4 {

// Number of CUDA devices (0 when none or when the driver is missing).
int cuda_device_count();
// A backend on CUDA device `device` (made the calling thread's current device), or on the current
// one when device < 0; throws g4::Error when it cannot be created.
std::unique_ptr<Backend> make_cuda_backend(int device = -1);

}  // namespace g4
