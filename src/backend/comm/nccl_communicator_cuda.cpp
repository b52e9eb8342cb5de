// The CUDA communicator (docs/DESIGN.md, "Tensor parallel"): one NCCL communicator per rank
// thread, made with ncclCommInitRankConfig from one unique id, non-blocking so that no NCCL call
// can wait forever. When every pair of the group's GPUs reaches the other's memory, all-reduces of
// activations run as one kernel over peer memory instead (peer_all_reduce.h): a non-blocking NCCL
// collective hands its launch to a host thread on every call, which costs far more than moving a
// decode step's hidden row. Everything is enqueued on the rank's backend stream, and may be
// captured in a CUDA graph. A watchdog thread of the group polls every communicator's asynchronous
// error, the event recorded after each eager collective and the peer kernels' timeout flag: on an
// error, a timeout or a rank's abort() it raises the abort flag the peer kernels poll and aborts
// every communicator (ncclCommAbort ends kernels waiting for a dead peer), so each rank's next
// collective or stream synchronisation returns and the rank throws PeerFailure.
// Compiled only when CMake found nccl.h with the CUDA toolkit.
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "backend/comm/communicator.h"
#include "backend/comm/peer_all_reduce.h"

namespace g4 {

namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
    default: throw Error(ErrorKind::kUnsupported, "nccl communicator: no NCCL type for " + dtype_name(t));
  }
}

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw Error(ErrorKind::kInternal, std::string("nccl communicator: ") + what + ": " + cudaGetErrorString(status));
}

// What a group's ranks share: the unique id, every rank's communicator and its last eager
// collective's completion event, the failure, and the watchdog.
class NcclShared {
 public:
  NcclShared(int size, std::chrono::milliseconds timeout, CudaAllReduce all_reduce)
      : size_(size), timeout_(timeout), all_reduce_(all_reduce), ranks_(size_t(size)) {
    const ncclResult_t r = ncclGetUniqueId(&id_);
    if (r != ncclSuccess) throw Error(ErrorKind::kInternal, std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(r));
    void* status = nullptr;
    check_cuda(cudaHostAlloc(&status, 2 * sizeof(int32_t), cudaHostAllocMapped | cudaHostAllocPortable),
               "cudaHostAlloc (the group's abort and timeout flags)");
    abort_flag_ = static_cast<int32_t*>(status);
    timed_out_flag_ = abort_flag_ + 1;
    *abort_flag_ = *timed_out_flag_ = 0;
    watchdog_ = std::thread([this] { watch(); });
  }
  ~NcclShared() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    watchdog_.join();
    cudaFreeHost(abort_flag_);
  }
  int size() const { return size_; }
  const ncclUniqueId& id() const { return id_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // Whether the ranks publish mailboxes for sums over peer memory (a group of at most
  // kMaxPeerRanks that may use them; whether it can is peer_view's to say).
  bool wants_peer_sums() const { return all_reduce_ == CudaAllReduce::kPeerWhenReachable && size_ <= kMaxPeerRanks; }

  struct Rank {
    std::mutex mutex;  // held around every NCCL call on `comm`, and by the watchdog's abort
    ncclComm_t comm = nullptr;
    bool aborted = false;
    cudaEvent_t event = nullptr;  // recorded after the last eager collective
    Clock::time_point since{};
    bool pending = false;
    int device = -1;      // published before ncclCommInitRank, read by the peers after it
    PeerMailbox mailbox;  // likewise (null when the group sums through NCCL)
  };
  Rank& rank(int r) { return ranks_[size_t(r)]; }

  // Rank `r`'s view of the group's mailboxes, or nullopt when some pair of the group's GPUs cannot
  // reach each other's memory. Every rank reads the same published devices, so all decide alike.
  // Call after ncclCommInitRank completed (every rank published its device and mailbox by then).
  std::optional<PeerGroupView> peer_view(int r) {
    if (!wants_peer_sums()) return std::nullopt;
    std::lock_guard lock(mutex_);
    PeerGroupView view;
    view.rank = r;
    view.size = size_;
    view.abort = abort_flag_;
    view.timed_out = timed_out_flag_;
    view.timeout_ns = uint64_t(timeout_.count()) * 1000000u;
    for (int p = 0; p < size_; ++p) {
      const Rank& peer = ranks_[size_t(p)];
      if (!peer.mailbox.inbox) return std::nullopt;
      for (int q = 0; q < size_; ++q) {
        const int a = peer.device, b = ranks_[size_t(q)].device;
        int reachable = a == b;
        if (!reachable) check_cuda(cudaDeviceCanAccessPeer(&reachable, a, b), "cudaDeviceCanAccessPeer");
        if (!reachable) return std::nullopt;
      }
      view.ranks[p] = peer.mailbox;
    }
    return view;
  }
  void publish(int r, int device, const PeerMailbox& mailbox) {
    std::lock_guard lock(mutex_);
    ranks_[size_t(r)].device = device;
    ranks_[size_t(r)].mailbox = mailbox;
  }

  // `rank`: the rank whose own failure this is (-1: a timeout or NCCL error seen by the group).
  void fail(const std::string& why, int rank = -1) {
    {
      std::lock_guard lock(mutex_);
      if (failed_) return;
      failed_ = true;
      failed_rank_ = rank;
      why_ = "tensor parallel: " + why;
    }
    wake_.notify_all();
  }
  int first_failed_rank() {
    std::lock_guard lock(mutex_);
    return failed_rank_;
  }
  bool failed() {
    std::lock_guard lock(mutex_);
    return failed_;
  }
  [[noreturn]] void throw_failure() {
    std::lock_guard lock(mutex_);
    throw PeerFailure(why_);
  }

 private:
  // Every 10 ms: each communicator's asynchronous error, each pending collective's age; on a
  // failure, abort every communicator once.
  void watch() {
    std::unique_lock lock(mutex_);
    while (!stop_) {
      wake_.wait_for(lock, std::chrono::milliseconds(10));
      if (stop_) return;
      if (!failed_) {
        lock.unlock();
        poll_ranks();
        lock.lock();
      }
      if (!failed_ && *static_cast<volatile int32_t*>(timed_out_flag_) != 0) {
        lock.unlock();
        fail("an all-reduce over peer memory did not complete in " + std::to_string(timeout_.count()) +
             " ms (a peer stopped responding)");
        lock.lock();
      }
      if (failed_ && !aborted_all_) {
        aborted_all_ = true;
        lock.unlock();
        abort_all();
        lock.lock();
      }
    }
  }

  void poll_ranks() {
    for (int r = 0; r < size_; ++r) {
      Rank& rank = ranks_[size_t(r)];
      std::lock_guard lock(rank.mutex);
      if (!rank.comm || rank.aborted) continue;
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(rank.comm, &async);
      if (async != ncclSuccess && async != ncclInProgress)
        return fail("rank " + std::to_string(r) + ": NCCL error: " + ncclGetErrorString(async));
      if (!rank.pending) continue;
      const cudaError_t done = cudaEventQuery(rank.event);
      if (done == cudaSuccess) {
        rank.pending = false;
      } else if (done != cudaErrorNotReady) {
        return fail("rank " + std::to_string(r) + ": " + cudaGetErrorString(done));
      } else if (Clock::now() - rank.since > timeout_) {
        return fail("rank " + std::to_string(r) + ": a collective did not complete in " +
                    std::to_string(timeout_.count()) + " ms (a peer stopped responding)");
      }
    }
  }

  void abort_all() {
    *static_cast<volatile int32_t*>(abort_flag_) = 1;  // ends every peer kernel's wait
    for (Rank& rank : ranks_) {
      std::lock_guard lock(rank.mutex);
      if (rank.comm && !rank.aborted) ncclCommAbort(rank.comm);
      rank.aborted = true;
    }
  }

  const int size_;
  const std::chrono::milliseconds timeout_;
  const CudaAllReduce all_reduce_;
  ncclUniqueId id_{};
  int32_t* abort_flag_ = nullptr;      // mapped host memory the peer kernels poll
  int32_t* timed_out_flag_ = nullptr;  // mapped host memory a peer kernel sets when it gives up
  std::vector<Rank> ranks_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool failed_ = false, stop_ = false, aborted_all_ = false;
  int failed_rank_ = -1;
  std::string why_;
  std::thread watchdog_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclShared> shared, int rank, Backend& backend)
      : shared_(std::move(shared)), rank_(rank), stream_(static_cast<cudaStream_t>(backend.stream_handle())) {
    G4_CHECK(stream_, "the nccl communicator needs a cuda backend, not " + backend.name());
    NcclShared::Rank& me = shared_->rank(rank_);
    check_cuda(cudaEventCreateWithFlags(&me.event, cudaEventDisableTiming), "cudaEventCreate");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every call returns; wait() polls with the group's failure and timeout
    int device = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    shared_->publish(rank_, device, make_mailbox());
    {
      std::lock_guard lock(me.mutex);
      nccl_call(ncclCommInitRankConfig(&me.comm, shared_->size(), shared_->id(), rank_, &config), "ncclCommInitRank");
    }
    wait("ncclCommInitRank");
    check_cuda(cudaMalloc(&flag_, sizeof(int32_t)), "cudaMalloc");
    peer_ = shared_->peer_view(rank_);
    if (peer_) enable_peer_access(device);
  }
  ~NcclCommunicator() override {
    // Destroyed by an error that had not aborted the group yet: the peers must not wait for us.
    if (std::uncaught_exceptions() > 0)
      shared_->fail("rank " + std::to_string(rank_) + " failed: an error unwound this rank (its own message says which)",
                    rank_);
    NcclShared::Rank& me = shared_->rank(rank_);
    {
      std::lock_guard lock(me.mutex);
      if (me.comm && !me.aborted) {
        if (shared_->failed()) {  // peers may be gone: nothing may wait for them
          ncclCommAbort(me.comm);
        } else {
          cudaStreamSynchronize(stream_);
          ncclCommDestroy(me.comm);
        }
      }
      me.aborted = true;  // the watchdog leaves it alone from now on
      me.pending = false;
    }
    if (me.event) cudaEventDestroy(me.event);
    if (scratch_) cudaFree(scratch_);
    if (flag_) cudaFree(flag_);
    // A failed group's peers may still be writing into this mailbox: it stays allocated.
    if (!shared_->failed())
      for (void* p : {static_cast<void*>(mailbox_.inbox), static_cast<void*>(mailbox_.flags), static_cast<void*>(epochs_)})
        if (p) cudaFree(p);
  }
  int rank() const override { return rank_; }
  int size() const override { return shared_->size(); }

  void all_reduce_sum(const Tensor& t) override {
    if (peer_ && peer_all_reduce_takes(t)) {
      if (shared_->failed()) shared_->throw_failure();
      peer_all_reduce(t, *peer_, stream_);
      watch_if_eager();
      return;
    }
    enqueue("ncclAllReduce", [&](ncclComm_t comm) {
      return ncclAllReduce(t.data, t.data, size_t(t.numel()), nccl_type(t.dtype), ncclSum, comm, stream_);
    });
  }

  // One row: the ranks' blocks are already side by side. More rows: gather rank-major into
  // scratch [size][n·c], then one strided copy per rank into its column block.
  void all_gather_cols(const Tensor& local, const Tensor& out) override {
    G4_CHECK(out.rows == local.rows && out.cols == local.cols * size() && out.dtype == local.dtype,
             "all_gather_cols: out must be [" + std::to_string(local.rows) + ", " +
                 std::to_string(local.cols * size()) + "] of the local dtype");
    const size_t count = size_t(local.numel());
    if (local.rows == 1) {
      enqueue("ncclAllGather", [&](ncclComm_t comm) {
        return ncclAllGather(local.data, out.data, count, nccl_type(local.dtype), comm, stream_);
      });
      return;
    }
    uint8_t* scratch = scratch_bytes(out.bytes());
    enqueue("ncclAllGather", [&](ncclComm_t comm) {
      return ncclAllGather(local.data, scratch, count, nccl_type(local.dtype), comm, stream_);
    });
    const size_t block = local.row_size(), pitch = out.row_size();
    for (int r = 0; r < size(); ++r)
      check_cuda(cudaMemcpy2DAsync(static_cast<uint8_t*>(out.data) + size_t(r) * block, pitch,
                                   scratch + size_t(r) * local.bytes(), block, block, size_t(local.rows),
                                   cudaMemcpyDeviceToDevice, stream_),
                 "cudaMemcpy2DAsync");
  }

  void barrier() override {
    Tensor flag;
    flag.data = flag_;
    flag.dtype = DType::I32;
    flag.rows = flag.cols = 1;
    all_reduce_sum(flag);
    // The watchdog aborts the communicators when a peer fails or the collective times out, which
    // ends the wait.
    const cudaError_t status = cudaStreamSynchronize(stream_);
    if (shared_->failed()) shared_->throw_failure();
    check_cuda(status, "barrier");
  }

  void abort(const std::string& what) override {
    shared_->fail("rank " + std::to_string(rank_) + " failed: " + what, rank_);
  }

  void throw_if_failed() override {
    if (shared_->failed()) shared_->throw_failure();
  }
  std::string all_reduce_path() const override { return peer_ ? "peer memory" : "nccl"; }

 private:
  template <typename Call>
  void enqueue(const char* what, Call call) {
    NcclShared::Rank& me = shared_->rank(rank_);
    {
      std::lock_guard lock(me.mutex);
      if (me.aborted) shared_->throw_failure();
      nccl_call(call(me.comm), what);
    }
    wait(what);
    watch_if_eager();
  }

  // Every eager collective records the event (a few µs): recording only while none is pending
  // would leave a collective enqueued then, and stuck after the older one completed, unwatched.
  void watch_if_eager() {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    check_cuda(cudaStreamIsCapturing(stream_, &capture), "cudaStreamIsCapturing");
    if (capture != cudaStreamCaptureStatusNone) return;  // a recorded collective runs at replay
    NcclShared::Rank& me = shared_->rank(rank_);
    std::lock_guard lock(me.mutex);
    check_cuda(cudaEventRecord(me.event, stream_), "cudaEventRecord");
    if (!me.pending) me.since = Clock::now();
    me.pending = true;
  }

  // This rank's inbox, flags and epoch counters, zeroed before any peer can write (null when the
  // group sums through NCCL).
  PeerMailbox make_mailbox() {
    if (!shared_->wants_peer_sums()) return {};
    const int n = shared_->size();
    check_cuda(cudaMalloc(&mailbox_.inbox, peer_inbox_bytes(n)), "cudaMalloc (peer all-reduce inbox)");
    check_cuda(cudaMalloc(&mailbox_.flags, peer_flag_bytes(n)), "cudaMalloc (peer all-reduce flags)");
    check_cuda(cudaMalloc(&epochs_, kPeerBlocks * sizeof(uint32_t)), "cudaMalloc (peer all-reduce epochs)");
    check_cuda(cudaMemset(mailbox_.flags, 0, peer_flag_bytes(n)), "cudaMemset");
    check_cuda(cudaMemset(epochs_, 0, kPeerBlocks * sizeof(uint32_t)), "cudaMemset");
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    return mailbox_;
  }

  void enable_peer_access(int device) {
    peer_->epochs = epochs_;
    for (int p = 0; p < size(); ++p) {
      const int other = shared_->rank(p).device;
      if (other == device) continue;
      const cudaError_t status = cudaDeviceEnablePeerAccess(other, 0);
      if (status == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();  // not an error: another communicator of this thread enabled it
        continue;
      }
      check_cuda(status, "cudaDeviceEnablePeerAccess");
    }
  }

  void nccl_call(ncclResult_t r, const char* what) {
    if (r == ncclSuccess || r == ncclInProgress) return;
    const std::string why = "rank " + std::to_string(rank_) + ": " + what + " failed: " + ncclGetErrorString(r);
    shared_->fail(why);
    throw Error("tensor parallel: " + why);
  }

  // Polls a non-blocking call to completion; gives up when the group failed or the time is over.
  void wait(const char* what) {
    NcclShared::Rank& me = shared_->rank(rank_);
    const Clock::time_point deadline = Clock::now() + shared_->timeout();
    for (;;) {
      ncclResult_t state = ncclSuccess;
      {
        std::lock_guard lock(me.mutex);
        if (me.aborted) shared_->throw_failure();
        ncclCommGetAsyncError(me.comm, &state);
      }
      if (state == ncclSuccess) return;
      nccl_call(state, what);
      if (shared_->failed()) shared_->throw_failure();
      if (Clock::now() > deadline) {
        shared_->fail("rank " + std::to_string(rank_) + ": " + what + " did not complete in " +
                      std::to_string(shared_->timeout().count()) + " ms (a peer stopped responding)");
        shared_->throw_failure();
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  uint8_t* scratch_bytes(size_t bytes) {
    if (bytes <= scratch_size_) return scratch_;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    check_cuda(cudaStreamIsCapturing(stream_, &capture), "cudaStreamIsCapturing");
    G4_CHECK(capture == cudaStreamCaptureStatusNone,
             "nccl communicator: a gather of " + std::to_string(bytes) +
                 " bytes while capturing a graph (run one forward of that size before capturing)");
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    if (scratch_) cudaFree(scratch_);
    scratch_ = nullptr;
    check_cuda(cudaMalloc(&scratch_, bytes), "cudaMalloc (gather scratch)");
    scratch_size_ = bytes;
    return static_cast<uint8_t*>(scratch_);
  }

  std::shared_ptr<NcclShared> shared_;
  int rank_;
  cudaStream_t stream_;
  uint8_t* scratch_ = nullptr;
  size_t scratch_size_ = 0;
  void* flag_ = nullptr;
  PeerMailbox mailbox_;
  uint32_t* epochs_ = nullptr;
  std::optional<PeerGroupView> peer_;  // set when all-reduces go over peer memory
};

class NcclCommGroup final : public CommGroup {
 public:
  NcclCommGroup(int size, std::chrono::milliseconds timeout, CudaAllReduce all_reduce)
      : shared_(std::make_shared<NcclShared>(size, timeout, all_reduce)) {}
  int size() const override { return shared_->size(); }
  std::unique_ptr<Communicator> join(int rank, Backend& backend) override {
    G4_CHECK(rank >= 0 && rank < size(), "rank " + std::to_string(rank) + " outside a group of " + std::to_string(size()));
    return std::make_unique<NcclCommunicator>(shared_, rank, backend);
  }
  void abort(int rank, const std::string& what) override {
    shared_->fail("rank " + std::to_string(rank) + " failed: " + what, rank);
  }
  int first_failed_rank() const override { return shared_->first_failed_rank(); }

 private:
  std::shared_ptr<NcclShared> shared_;
};

}  // namespace

bool nccl_available() { return true; }

std::unique_ptr<CommGroup> make_nccl_comm_group(int size, std::chrono::milliseconds timeout, CudaAllReduce all_reduce) {
  G4_CHECK(size >= 1, "a tensor-parallel group needs at least one rank, got " + std::to_string(size));
  return std::make_unique<NcclCommGroup>(size, timeout, all_reduce);
}

}  // namespace g4
