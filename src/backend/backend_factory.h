// Creates a backend by name ("cpu" or "cuda"), with a clear error when CUDA is unavailable.
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"

namespace g4 {

// `device` picks the CUDA device (the calling thread's current one from then on; -1 = the current
// one): a tensor-parallel rank thread makes its backend on the GPU of its rank.
std::unique_ptr<Backend> make_backend(const std::string& name, int device = -1);
// CUDA devices present (0 in a build without CUDA).
int cuda_devices();
// True when this build has the CUDA backend and a CUDA device is present.
bool cuda_available();

}  // namespace g4
