// Creates a backend by name ("cpu" or "cuda"), with a clear error when CUDA is unavailable.
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"

namespace g4 {

std::unique_ptr<Backend> make_backend(const std::string& name);
// True when this build has the CUDA backend and a CUDA device is present.
bool cuda_available();

}  // namespace g4
