#include "model/loader.h"

#include <filesystem>

#include "format/hf_checkpoint.h"
#include "util/error.h"

namespace g4 {

std::unique_ptr<Gemma4> load_model(const std::string& path, Backend& backend) {
  G4_CHECK(std::filesystem::exists(path), "model path '" + path + "' does not exist");
  HfCheckpoint checkpoint(path);
  ModelWeights weights = load_weights(checkpoint.config(), checkpoint, backend);
  return std::make_unique<Gemma4>(checkpoint.config(), std::move(weights));
}

}  // namespace g4
