// The one way g4 launches a kernel: launch_kernel() takes the grid, block, dynamic shared bytes and
// stream, optionally allows programmatic dependent launch (see pdl.cuh), raises the kernel's
// dynamic shared memory limit when a launch needs more than the default 48 KiB, and turns a launch
// error into g4::Error naming the kernel.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/pdl.cuh"

namespace g4 {

enum class Pdl : bool { kOff = false, kOn = true };

// Above this many dynamic shared bytes a kernel must opt in (cudaFuncAttributeMaxDynamicSharedMemorySize).
inline constexpr size_t kDefaultDynamicSmemBytes = size_t(48) << 10;

// Raises `kernel`'s dynamic shared memory limit on the current device to at least `bytes`. The
// attribute is set only when a launch asks for more than was set before (once per kernel for a
// fixed size), not on every launch; the attribute is per device, hence the device in the key.
inline void ensure_dynamic_smem(const void* kernel, size_t bytes) {
  if (bytes <= kDefaultDynamicSmemBytes) return;
  int device = 0;
  G4_CUDA(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, size_t> raised;
  const std::lock_guard<std::mutex> lock(mutex);
  size_t& limit = raised[{device, kernel}];
  if (bytes <= limit) return;
  G4_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  limit = bytes;
}

// Thread blocks of `kernel` (block threads, dynamic shared bytes `smem`) the current device holds
// at once: its multiprocessors times the blocks one of them holds. Known once per device, kernel
// and size, as ensure_dynamic_smem's attribute (which it sets first: it bounds the answer).
inline int resident_blocks(const void* kernel, int threads, size_t smem) {
  ensure_dynamic_smem(kernel, smem);
  int device = 0;
  G4_CUDA(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::map<std::tuple<int, const void*, int, size_t>, int> known;
  const std::lock_guard<std::mutex> lock(mutex);
  int& blocks = known[{device, kernel, threads, smem}];
  if (blocks > 0) return blocks;
  int per_sm = 0, sms = 0;
  G4_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  G4_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  blocks = std::max(1, per_sm * sms);
  return blocks;
}

// kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream serialisation allowed
// when pdl is Pdl::kOn; `name` names the kernel in a launch error.
template <typename... Params, typename... Args>
void launch_kernel(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, Pdl pdl, Args&&... args) {
  ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = pdl == Pdl::kOn ? &attribute : nullptr;
  config.numAttrs = pdl == Pdl::kOn ? 1 : 0;
  cuda_check(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...),
             (std::string("launching ") + name).c_str());
}

}  // namespace g4
