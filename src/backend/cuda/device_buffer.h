// An owned block of device memory, freed when the owner goes: the one place outside the backend's
// tensor allocator (CudaBackend::alloc) where g4 calls cudaMalloc/cudaFree, for the few buffers
// that live outside any backend (the sampler's workspace, the bandwidth probe's copies).
// Includable without the CUDA headers.
#pragma once
#include <cstddef>

namespace g4 {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Allocates `bytes` on the current device; throws g4::Error when CUDA cannot.
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace g4
