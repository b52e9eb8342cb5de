// The device's copy bandwidth: the ceiling a memory-bound decode step is measured against
// (`g4 bench`). Includable without the CUDA headers; built only with CUDA.
#pragma once
#include <cstddef>

namespace g4 {

// Device-to-device copy bandwidth in bytes per second (bytes read + bytes written), median of a
// few copies of a `bytes`-sized buffer.
double measure_copy_bandwidth(size_t bytes);

}  // namespace g4
