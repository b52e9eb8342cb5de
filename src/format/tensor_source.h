// Where weights come from: a checkpoint (safetensors) or a model file (GGUF), seen through one
// interface that names tensors the Hugging Face text-only way, without a prefix:
// "embed_tokens.weight", "layers.3.self_attn.q_proj.weight", "norm.weight", "lm_head.weight".
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "util/dtype.h"

namespace g4 {

struct HostTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // outermost first, as in the file ([out, in] for a linear weight)
  const void* data = nullptr;  // host memory (usually a mapped file)
  size_t bytes = 0;
  std::shared_ptr<void> owner;  // keeps `data` alive

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // nullptr when absent.
  virtual const HostTensor* find(const std::string& name) const = 0;
  virtual std::vector<std::string> names() const = 0;
};

}  // namespace g4
