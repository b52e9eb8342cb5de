// Host memory: how much the system can still give, and allocations that cost nothing until used.
#pragma once
#include <cstddef>
#include <memory>
#include <optional>

namespace g4 {

// The memory the kernel estimates is available for new allocations without swapping (Linux:
// /proc/meminfo's MemAvailable), less within a container's cgroup limit; nullopt where the system
// does not say.
std::optional<size_t> host_memory_available();

// `bytes` of zeros, 64-byte aligned (at least 1 byte). Large blocks are mapped from the kernel,
// which supplies zero pages only when they are first touched, so a large pool costs memory as it
// is used; small ones come from the heap. Throws Error(kResourceExhausted) naming the bytes when the
// system refuses.
std::shared_ptr<void> allocate_zeroed(size_t bytes);

}  // namespace g4
