// Collectives between the ranks of a tensor-parallel group (docs/DESIGN.md, "Tensor parallel"):
// one rank per thread, each with its own backend; a Communicator is one rank's end of the group.
// A CommGroup hands each rank thread its Communicator once that rank's backend exists (NCCL needs
// the backend's stream and device).
#pragma once
#include <chrono>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "util/error.h"

namespace g4 {

// Thrown on the ranks that did not fail themselves when a peer aborted the group (or a collective
// timed out): the message names the rank that failed and why. The failing rank's own error is the
// root cause; run_tensor_parallel reports that one.
class PeerFailure : public Error {
 public:
  explicit PeerFailure(const std::string& message) : Error(ErrorKind::kPeerFailure, message) {}
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: t = the sum of every rank's t, bit-identical on every rank.
  virtual void all_reduce_sum(const Tensor& t) = 0;
  // out [n, size·c]: column block r is rank r's `local` [n, c] (the vocabulary shards of the LM
  // head, side by side).
  virtual void all_gather_cols(const Tensor& local, const Tensor& out) = 0;
  // Returns once every rank has called it (and their enqueued work before it is done).
  virtual void barrier() = 0;
  // This rank failed because of `what`: marks the group failed, so that every rank in or entering a
  // collective throws PeerFailure("tensor parallel: rank R failed: <what>") instead of waiting for
  // this one. Safe from any thread, any number of times (the first failure stays).
  virtual void abort(const std::string& what) = 0;
  // Throws PeerFailure once the group has failed. Collectives check this themselves; a replayed
  // graph's collectives cannot, so its caller checks after the replay's results came back (a failed
  // group's replay leaves them unreduced).
  virtual void throw_if_failed() = 0;
  // How all_reduce_sum moves the data: "shared memory" (CPU ranks), "peer memory" (one kernel over
  // the GPUs' peer access) or "nccl".
  virtual std::string all_reduce_path() const = 0;
};

class CommGroup {
 public:
  virtual ~CommGroup() = default;
  virtual int size() const = 0;
  // Rank `rank`'s communicator over `backend` (that rank's). Every rank must join, each from its
  // own thread; joining may wait for the others.
  virtual std::unique_ptr<Communicator> join(int rank, Backend& backend) = 0;
  // As Communicator::abort, for rank `rank` (which may not have joined).
  virtual void abort(int rank, const std::string& what) = 0;
  // The rank whose abort failed the group first: the root cause, whatever its peers then threw.
  // -1 while the group has not failed, or when it failed otherwise (a timeout, an NCCL error).
  virtual int first_failed_rank() const = 0;
};

// Returns work(); when work throws (other than PeerFailure), first aborts the group with
// abort(<what>) so that no peer waits for this rank, then rethrows. A rank calls it while its
// communicator still exists: unwinding may destroy it.
template <typename Abort, typename Work>
auto run_or_abort(Abort&& abort, Work&& work) -> decltype(work()) {
  try {
    return work();
  } catch (const PeerFailure&) {
    throw;
  } catch (const std::exception& e) {
    abort(std::string(e.what()));
    throw;
  }
}

// How long a rank waits in a collective for its peers before it fails the group: long enough for
// the slowest step between two collectives (one layer of a CPU prefill chunk), short enough that a
// stuck peer gives an error instead of a hang.
inline constexpr std::chrono::seconds kDefaultCollectiveTimeout{600};

// The in-process group of `size` CPU ranks (threads sharing memory): sums in rank order 0 + 1 + …,
// the same on every rank, whatever the thread timing.
std::unique_ptr<CommGroup> make_cpu_comm_group(int size, std::chrono::milliseconds timeout = kDefaultCollectiveTimeout);

// True when this build has NCCL (found with the CUDA toolkit at configure time).
bool nccl_available();
// How a CUDA group sums: over peer memory (backend/comm/peer_all_reduce.h) when every pair of its
// GPUs reaches the other's memory, else NCCL; or NCCL always (for comparison and debugging).
enum class CudaAllReduce { kPeerWhenReachable, kNccl };
// The NCCL group of `size` CUDA ranks (rank r on device r): ncclCommInitRank from one unique id.
// Throws a clear error when this build has no NCCL.
std::unique_ptr<CommGroup> make_nccl_comm_group(int size, std::chrono::milliseconds timeout = kDefaultCollectiveTimeout,
                                                CudaAllReduce all_reduce = CudaAllReduce::kPeerWhenReachable);

}  // namespace g4
