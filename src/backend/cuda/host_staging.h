// Copies of many scattered device rows to and from pageable host memory (a swapped KV sequence's
// pages), through two pinned halves: the bus fills or drains one half while the host copies the
// other, and the stream waits once per half instead of once per row. A pageable copy of a 512 KiB
// page pays a host-side staging pass and a wait of its own (~0.38 ms a page, 1.3 GB/s).
// Includable without the CUDA headers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>

namespace g4 {

class HostStaging {
 public:
  // Each half holds at least `half_bytes` (and at least one row); pinned at first use.
  explicit HostStaging(size_t half_bytes = size_t(32) << 20) : min_half_bytes_(half_bytes) {}
  ~HostStaging();
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;

  // Rows `rows` of the device rows at `src` (row_bytes apart), in that order, into `host` back to
  // back; returns when they are there. Runs after the work already on `stream`.
  void download_rows(const std::byte* src, size_t row_bytes, std::span<const int32_t> rows, std::byte* host,
                     void* stream);
  // `host`'s rows, back to back, into rows `rows` of the device rows at `dst`, ordered on `stream`
  // before the work after it; `host` may be reused once this returns.
  void upload_rows(const std::byte* host, size_t row_bytes, std::span<const int32_t> rows, std::byte* dst,
                   void* stream);

 private:
  // Pins halves of at least row_bytes, and waits until neither is still being copied.
  void prepare(size_t row_bytes);

  size_t min_half_bytes_;
  size_t half_bytes_ = 0;
  std::byte* pinned_ = nullptr;  // two halves of half_bytes_
  void* copied_[2] = {};         // cudaEvent_t: the last copies through each half done
};

}  // namespace g4
