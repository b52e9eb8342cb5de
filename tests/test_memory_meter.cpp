// Backends count their allocations for the end-of-run report's peak memory.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/memory_meter.h"

namespace g4 {
namespace {

TEST(MemoryMeter, PeakOutlivesFreedMemory) {
  CpuBackend backend(1);
  EXPECT_EQ(backend.peak_memory_bytes(), 0u);
  {
    Tensor a = backend.alloc(DType::F32, 256, 256);  // 256 KiB
    Tensor b = backend.alloc(DType::BF16, 256, 256);  // 128 KiB
    EXPECT_EQ(backend.peak_memory_bytes(), 3u * 128 * 1024);
  }
  Tensor c = backend.alloc(DType::F32, 16, 16);  // after a and b are freed: the peak stays
  EXPECT_EQ(backend.peak_memory_bytes(), 3u * 128 * 1024);
  Tensor d = backend.alloc(DType::F32, 512, 256);  // 512 KiB + c's 1 KiB is a new peak
  EXPECT_EQ(backend.peak_memory_bytes(), 512u * 1024 + 1024);
}

TEST(MemoryMeter, ViewsShareOneCount) {
  MemoryMeter meter;
  int released = 0;
  {
    auto owner = meter.track(&released, 100, [&](void*) { ++released; });
    auto view = owner;
    EXPECT_EQ(meter.peak_bytes(), 100u);
  }
  EXPECT_EQ(released, 1);
}

}  // namespace
}  // namespace g4
