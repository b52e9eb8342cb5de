// Marks arithmetic helpers as callable from host and device code, so that CPU and CUDA code (the
// samplers, the random fills) share one definition of every number they compute.
#pragma once

#if defined(__CUDACC__)
#define G4_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define G4_HOST_DEVICE inline
#endif
