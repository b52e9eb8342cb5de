#include "backend/cuda/host_staging.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_check.cuh"

namespace g4 {
namespace {

cudaEvent_t event(void* e) { return static_cast<cudaEvent_t>(e); }

}  // namespace

// Unchecked: a destructor must not throw, and teardown has nothing to recover.
HostStaging::~HostStaging() {
  for (void* e : copied_)
    if (e) {
      cudaEventSynchronize(event(e));
      cudaEventDestroy(event(e));
    }
  cudaFreeHost(pinned_);
}

void HostStaging::prepare(size_t row_bytes) {
  for (void* e : copied_)
    if (e) G4_CUDA(cudaEventSynchronize(event(e)));
  if (!copied_[0])
    for (void*& e : copied_) {
      cudaEvent_t created = nullptr;
      G4_CUDA(cudaEventCreateWithFlags(&created, cudaEventDisableTiming));
      e = created;
    }
  const size_t wanted = std::max(min_half_bytes_, row_bytes);
  if (half_bytes_ >= wanted) return;
  G4_CUDA(cudaFreeHost(pinned_));
  pinned_ = nullptr;
  half_bytes_ = 0;
  void* p = nullptr;
  G4_CUDA(cudaHostAlloc(&p, 2 * wanted, cudaHostAllocPortable));  // pinned for every device's context
  pinned_ = static_cast<std::byte*>(p);
  half_bytes_ = wanted;
}

// Chunk c goes through half c % 2: its rows are copied into the half on the stream while the host
// drains chunk c − 1 from the other half, which chunk c + 1 reuses only after that.
void HostStaging::download_rows(const std::byte* src, size_t row_bytes, std::span<const int32_t> rows,
                                std::byte* host, void* stream) {
  if (rows.empty()) return;
  prepare(row_bytes);
  auto s = static_cast<cudaStream_t>(stream);
  const size_t per_half = half_bytes_ / row_bytes, chunks = (rows.size() + per_half - 1) / per_half;
  const auto drain = [&](size_t c) {
    const size_t first = c * per_half, n = std::min(per_half, rows.size() - first);
    G4_CUDA(cudaEventSynchronize(event(copied_[c % 2])));
    std::memcpy(host + first * row_bytes, pinned_ + (c % 2) * half_bytes_, n * row_bytes);
  };
  for (size_t c = 0; c < chunks; ++c) {
    const size_t first = c * per_half, n = std::min(per_half, rows.size() - first);
    std::byte* half = pinned_ + (c % 2) * half_bytes_;
    for (size_t i = 0; i < n; ++i)
      G4_CUDA(cudaMemcpyAsync(half + i * row_bytes, src + size_t(rows[first + i]) * row_bytes, row_bytes,
                              cudaMemcpyDeviceToHost, s));
    G4_CUDA(cudaEventRecord(event(copied_[c % 2]), s));
    if (c > 0) drain(c - 1);
  }
  drain(chunks - 1);
}

// Chunk c fills half c % 2 once the copies of chunk c − 2 out of it are done.
void HostStaging::upload_rows(const std::byte* host, size_t row_bytes, std::span<const int32_t> rows,
                              std::byte* dst, void* stream) {
  if (rows.empty()) return;
  prepare(row_bytes);
  auto s = static_cast<cudaStream_t>(stream);
  const size_t per_half = half_bytes_ / row_bytes;
  for (size_t first = 0, c = 0; first < rows.size(); first += per_half, ++c) {
    const size_t n = std::min(per_half, rows.size() - first);
    std::byte* half = pinned_ + (c % 2) * half_bytes_;
    G4_CUDA(cudaEventSynchronize(event(copied_[c % 2])));
    std::memcpy(half, host + first * row_bytes, n * row_bytes);
    for (size_t i = 0; i < n; ++i)
      G4_CUDA(cudaMemcpyAsync(dst + size_t(rows[first + i]) * row_bytes, half + i * row_bytes, row_bytes,
                              cudaMemcpyHostToDevice, s));
    G4_CUDA(cudaEventRecord(event(copied_[c % 2]), s));
  }
}

}  // namespace g4
