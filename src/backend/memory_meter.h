// Counts the bytes a backend has allocated, now and at the peak, for the end-of-run report.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>

namespace g4 {

class MemoryMeter {
 public:
  // Owns `p` (`bytes` long): `release` frees it when the last Tensor sharing it goes, and the
  // meter counts it until then. The counts outlive the backend if a tensor does.
  std::shared_ptr<void> track(void* p, size_t bytes, std::function<void(void*)> release) {
    const size_t now = counts_->now += bytes;
    size_t peak = counts_->peak.load();
    while (now > peak && !counts_->peak.compare_exchange_weak(peak, now)) {
    }
    return std::shared_ptr<void>(p, [counts = counts_, bytes, release = std::move(release)](void* q) {
      counts->now -= bytes;
      release(q);
    });
  }
  size_t peak_bytes() const { return counts_->peak.load(); }

 private:
  struct Counts {
    std::atomic<size_t> now{0}, peak{0};
  };
  std::shared_ptr<Counts> counts_ = std::make_shared<Counts>();
};

}  // namespace g4
