// Running a model split over several devices (docs/DESIGN.md, "Tensor parallel"): one thread per
// rank, each with its own Engine (backend, model shard, KV pool, sessions), all running the same
// front-end code. Every collective leaves the same bits on every rank, and every rank runs the same
// sampler on the same gathered logits, so every rank draws the same tokens.
#pragma once
#include <functional>

#include "runtime/engine.h"

namespace g4 {

// Calls body(engine) once per rank of options.tp, each on its own thread with that rank's Engine
// (options.tp == 1: once, on the calling thread, with an ordinary Engine). Output belongs to
// rank 0 (engine.tp_rank() == 0). A rank that throws aborts the group, so every other rank's next
// collective throws PeerFailure naming it instead of waiting; once all threads have ended, the
// failing rank's own error is rethrown here. Throws before starting any thread when the group
// cannot exist (more ranks than GPUs, no NCCL).
void run_tensor_parallel(const EngineOptions& options, const std::function<void(Engine&)>& body);

// The checks that need no model: tp >= 1, enough CUDA GPUs for the ranks, NCCL in this build.
void check_tensor_parallel_options(const EngineOptions& options);

// The layer under run_tensor_parallel, for work that makes its own models (g4 bench's synthetic
// one): the group of options.tp ranks of options.backend (after check_tensor_parallel_options),
// and rank_main(r) on one thread per rank with run_tensor_parallel's failure handling.
std::unique_ptr<CommGroup> make_comm_group(const EngineOptions& options);
void run_rank_threads(CommGroup& group, const std::function<void(int rank)>& rank_main);

}  // namespace g4
