// Generation loops the backend tests share: n tokens after a prompt by plain decode steps, or by
// replaying one captured decode step (DecodeGraph, CUDA). Token j is sampled with seed + j in both.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "runtime/session.h"
#include "sampling/sampling_params.h"

namespace g4::test {

std::vector<int64_t> generate_plain(Session& s, std::span<const int32_t> prompt, SamplingParams p, int n);
std::vector<int64_t> generate_with_graph(Session& s, std::span<const int32_t> prompt, SamplingParams p, int n);

}  // namespace g4::test
