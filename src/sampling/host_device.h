// Marks the sampler's arithmetic helpers as callable from host and device code, so that the CPU
// sampler and the CUDA kernel share one definition of every number that decides a token.
#pragma once

#if defined(__CUDACC__)
#define G4_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define G4_HOST_DEVICE inline
#endif
