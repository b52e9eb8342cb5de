// Programmatic dependent launch (sm_90+): a decode step is ~800 small dependent kernels, and
// without PDL each one starts only after its predecessor has fully drained. A kernel launched with
// PDL (launch_kernel with Pdl::kOn, launch.cuh) may start while its predecessor is still running:
// it first does the work that does not depend on it (issuing its weight loads), then calls
// pdl_wait(), which returns once the predecessor has completed and its writes are visible. Every
// kernel calls pdl_launch_dependents() first, so its successor is scheduled as soon as all of its
// own blocks are running.
//
// The rule for a kernel launched with PDL: before pdl_wait() it reads only weights (never
// written during a forward) and writes nothing. Since each kernel waits for its predecessor's
// completion, and that one waited for its own predecessor, stream order still holds transitively.
// Both calls are no-ops for a kernel launched normally (or built for an older architecture).
#pragma once
#include <cuda_runtime.h>

namespace g4 {

__device__ inline void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ inline void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace g4
