// A Hugging Face checkpoint directory: config.json + model.safetensors, or shards listed in
// model.safetensors.index.json. Tensors are exposed under canonical text-model names
// (tensor_source.h); vision/audio towers are skipped.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "format/safetensors.h"
#include "model/config.h"
#include "format/tensor_source.h"

namespace g4 {

class HfCheckpoint : public TensorSource {
 public:
  // Throws naming the missing or malformed file.
  explicit HfCheckpoint(const std::string& dir, ModelRole role = ModelRole::kTarget);
  // What the directory's config.json describes (hf_config_role): `g4 export` writes either.
  static ModelRole role_of(const std::string& dir);
  const ModelConfig& config() const { return config_; }
  const std::string& dir() const { return dir_; }
  const HostTensor* find(const std::string& name) const override;
  std::vector<std::string> names() const override;

 private:
  std::string dir_;
  ModelConfig config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<const SafetensorsFile*, std::string>> canonical_;  // name -> (file, file name)
  mutable std::map<std::string, HostTensor> loaded_;
};

// "model.language_model.layers.0.x" / "model.layers.0.x" -> "layers.0.x", an assistant's
// "[model.]pre_projection.weight" -> "pre_projection.weight"; "" for non-text tensors.
std::string canonical_text_name(const std::string& file_name);

}  // namespace g4
