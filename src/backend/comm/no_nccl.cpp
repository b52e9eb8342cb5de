// The NCCL entry points of a build without NCCL (docs/DESIGN.md, "Tensor parallel"): CMake
// compiles this file instead of nccl_communicator_cuda.cpp when it finds no nccl.h.
#ifndef G4_HAVE_NCCL
#include "backend/comm/communicator.h"

namespace g4 {

bool nccl_available() { return false; }

std::unique_ptr<CommGroup> make_nccl_comm_group(int size, std::chrono::milliseconds, CudaAllReduce) {
  throw Error(ErrorKind::kUnsupported, "--tp " + std::to_string(size) +
              " on CUDA needs NCCL, and this g4 was built without it (CMake found no nccl.h and libnccl "
              "with the CUDA toolkit; install NCCL there and configure again)");
}

}  // namespace g4
#endif
