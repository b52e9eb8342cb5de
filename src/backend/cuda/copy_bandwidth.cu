#include "backend/cuda/copy_bandwidth.h"

#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/device_buffer.h"

namespace g4 {

double measure_copy_bandwidth(size_t bytes) {
  const DeviceBuffer src(bytes), dst(bytes);
  cudaEvent_t start, stop;
  G4_CUDA(cudaEventCreate(&start));
  G4_CUDA(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int i = 0; i < 11; ++i) {
    G4_CUDA(cudaEventRecord(start));
    G4_CUDA(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice));
    G4_CUDA(cudaEventRecord(stop));
    G4_CUDA(cudaEventSynchronize(stop));
    float t = 0;
    G4_CUDA(cudaEventElapsedTime(&t, start, stop));
    if (i > 0) ms.push_back(t);  // the first copy warms up
  }
  G4_CUDA(cudaEventDestroy(start));
  G4_CUDA(cudaEventDestroy(stop));
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return 2.0 * double(bytes) / (double(ms[ms.size() / 2]) * 1e-3);
}

}  // namespace g4
