#include "backend/cuda/device_buffer.h"

#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda/cuda_check.cuh"

namespace g4 {

DeviceBuffer::DeviceBuffer(size_t bytes) {
  G4_CUDA(cudaMalloc(&data_, bytes));
  bytes_ = bytes;
}

// Unchecked: a destructor must not throw, and a failed free leaves nothing to recover.
DeviceBuffer::~DeviceBuffer() { cudaFree(data_); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

}  // namespace g4
