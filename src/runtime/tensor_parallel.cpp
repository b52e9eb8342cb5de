#include "runtime/tensor_parallel.h"

#include <thread>
#include <vector>

#include "backend/backend_factory.h"
#include "util/error.h"

namespace g4 {

void check_tensor_parallel_options(const EngineOptions& o) {
  G4_CHECK(o.tp >= 1, "--tp must be at least 1, got " + std::to_string(o.tp));
  if (o.tp == 1 || o.backend != "cuda") return;
  const int gpus = cuda_devices();
  G4_CHECK(o.tp <= gpus, "--tp " + std::to_string(o.tp) + " needs " + std::to_string(o.tp) + " CUDA GPUs, and " +
                             std::to_string(gpus) + " " + (gpus == 1 ? "is" : "are") + " present");
  G4_CHECK(nccl_available(), "--tp " + std::to_string(o.tp) +
                                 " on CUDA needs NCCL, and this g4 was built without it (CMake found no nccl.h and "
                                 "libnccl with the CUDA toolkit)");
}

std::unique_ptr<CommGroup> make_comm_group(const EngineOptions& o) {
  check_tensor_parallel_options(o);
  if (o.backend == "cpu") return make_cpu_comm_group(o.tp);
  if (o.backend == "cuda") return make_nccl_comm_group(o.tp, kDefaultCollectiveTimeout, o.tp_all_reduce);
  throw Error("unknown backend '" + o.backend + "' (expected cpu or cuda)");
}

namespace {

// What one rank thread ended with: nothing, its own failure, or a peer's.
struct RankOutcome {
  std::string own_error, peer_error;
};

void run_rank(CommGroup& group, int rank, const std::function<void(int)>& rank_main, RankOutcome& outcome) {
  try {
    rank_main(rank);
  } catch (const PeerFailure& e) {
    outcome.peer_error = e.what();
  } catch (const std::exception& e) {
    outcome.own_error = e.what();
    group.abort(rank, e.what());  // the first failure stays
  }
}

}  // namespace

void run_rank_threads(CommGroup& group, const std::function<void(int rank)>& rank_main) {
  std::vector<RankOutcome> outcomes(size_t(group.size()));
  std::vector<std::thread> ranks;
  for (int r = 0; r < group.size(); ++r)
    ranks.emplace_back([&, r] { run_rank(group, r, rank_main, outcomes[size_t(r)]); });
  for (std::thread& t : ranks) t.join();
  // The root cause: the rank that failed the group first (its peers may have failed otherwise
  // since: a CUDA stream cut short by the abort), else the lowest rank that failed by itself, else
  // a peer's report (a timeout names the rank that stopped).
  const int first = group.first_failed_rank();
  if (first >= 0 && !outcomes[size_t(first)].own_error.empty()) throw Error(outcomes[size_t(first)].own_error);
  for (const RankOutcome& o : outcomes)
    if (!o.own_error.empty()) throw Error(o.own_error);
  for (const RankOutcome& o : outcomes)
    if (!o.peer_error.empty()) throw Error(o.peer_error);
}

// A rank's failure must reach its peers while its communicator still exists (the Engine's), so
// the body's errors abort the group inside the Engine's lifetime.
void run_tensor_parallel(const EngineOptions& options, const std::function<void(Engine&)>& body) {
  check_tensor_parallel_options(options);
  if (options.tp == 1) {
    Engine engine(options);
    body(engine);
    return;
  }
  const std::unique_ptr<CommGroup> group = make_comm_group(options);
  run_rank_threads(*group, [&](int rank) {
    EngineOptions mine = options;
    mine.tp_group = group.get();
    mine.tp_rank = rank;
    Engine engine(mine);
    run_or_abort([&](const std::string& what) { group->abort(rank, what); }, [&] { body(engine); });
  });
}

}  // namespace g4
