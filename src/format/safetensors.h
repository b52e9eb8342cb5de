// Reader of the safetensors format (memory-mapped; header validated before any tensor is used).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "format/tensor_source.h"
#include "util/mapped_file.h"

namespace g4 {

struct SafetensorsEntry {
  std::string dtype;  // as written in the header ("F32", "BF16", ...)
  std::vector<int64_t> shape;
  size_t begin = 0, end = 0;  // byte offsets into the data section
};

class SafetensorsFile {
 public:
  // Throws g4::Error naming the file for a missing, truncated or malformed file.
  explicit SafetensorsFile(const std::string& path);
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  // The tensor as a HostTensor (throws for a dtype g4 cannot compute with).
  HostTensor tensor(const std::string& name) const;
  const std::string& path() const { return file_->path(); }

 private:
  std::shared_ptr<MappedFile> file_;
  size_t data_offset_ = 0;
  std::map<std::string, SafetensorsEntry> entries_;
};

// Maps a safetensors dtype string to g4's; throws naming the tensor for unsupported ones.
DType safetensors_dtype(const std::string& dtype, const std::string& tensor_name);

// Writes tensors as one safetensors file (used by tests to build checkpoints, e.g. sharded ones).
void write_safetensors(const std::string& path, const std::vector<HostTensor>& tensors);

}  // namespace g4
