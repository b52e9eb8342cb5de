#include "util/host_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "util/error.h"

namespace g4 {

namespace {

// From here on a block is mapped: the heap would hand back pages it must zero itself.
constexpr size_t kMappedFromBytes = size_t(1) << 20;

[[noreturn]] void refuse(size_t bytes) {
  throw Error(ErrorKind::kResourceExhausted,
              "out of host memory: cannot allocate " + std::to_string(bytes) + " bytes");
}

// A number read from the first line of `path` ("max" and missing files: none).
std::optional<size_t> number_in(const char* path) {
  std::ifstream in(path);
  size_t value = 0;
  if (in >> value) return value;
  return std::nullopt;
}

}  // namespace

std::optional<size_t> host_memory_available() {
  std::optional<size_t> available;
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (!available && std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key;
    size_t kib = 0;
    if (fields >> key >> kib && key == "MemAvailable:") available = kib * 1024;
  }
  // A container's limit (cgroup v2) binds before the machine's memory does.
  const std::optional<size_t> limit = number_in("/sys/fs/cgroup/memory.max");
  const std::optional<size_t> used = number_in("/sys/fs/cgroup/memory.current");
  if (limit && used) {
    const size_t left = *limit > *used ? *limit - *used : 0;
    available = available ? std::min(*available, left) : left;
  }
  return available;
}

std::shared_ptr<void> allocate_zeroed(size_t bytes) {
  bytes = std::max<size_t>(bytes, 1);
  if (bytes >= kMappedFromBytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) refuse(bytes);
    return std::shared_ptr<void>(p, [bytes](void* q) { munmap(q, bytes); });
  }
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) refuse(bytes);
  std::memset(p, 0, bytes);
  return std::shared_ptr<void>(p, std::free);
}

}  // namespace g4
