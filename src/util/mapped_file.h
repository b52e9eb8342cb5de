// A read-only memory-mapped file (weights are never copied into RAM on the CPU path).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace g4 {

class MappedFile {
 public:
  // Throws g4::Error naming the path when the file is missing or cannot be mapped.
  static std::shared_ptr<MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace g4
