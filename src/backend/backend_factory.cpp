#include "backend/backend_factory.h"

#include "backend/cpu/cpu_backend.h"
#include "util/error.h"

#ifdef G4_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace g4 {

int cuda_devices() {
#ifdef G4_HAVE_CUDA
  return cuda_device_count();
#else
  return 0;
#endif
}

bool cuda_available() { return cuda_devices() > 0; }

std::unique_ptr<Backend> make_backend(const std::string& name, int device) {
  if (name == "cpu") return std::make_unique<CpuBackend>();
  if (name == "cuda") {
#ifdef G4_HAVE_CUDA
    G4_CHECK(cuda_device_count() > 0, "--backend cuda: no CUDA GPU is present on this machine");
    return make_cuda_backend(device);
#else
    (void)device;
    throw Error(ErrorKind::kUnsupported, "--backend cuda: this g4 was built without CUDA (no nvcc at configure time)");
#endif
  }
  throw Error("unknown backend '" + name + "' (expected cpu or cuda)");
}

}  // namespace g4
