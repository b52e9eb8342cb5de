// Opens a model for running: a Hugging Face checkpoint directory (or, later, a model file).
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"
#include "model/gemma4.h"
#include "model/tensor_source.h"

namespace g4 {

// Loads and validates the model at `path` (a checkpoint directory) onto `backend`.
std::unique_ptr<Gemma4> load_model(const std::string& path, Backend& backend);

}  // namespace g4
