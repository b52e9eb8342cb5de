// The in-process CPU communicator (docs/DESIGN.md, "Tensor parallel"): ranks are threads of one
// process, so a collective is a rendezvous on shared memory. Each rank publishes a pointer to its
// buffer, waits for every rank, reads the others' buffers in rank order into private memory,
// waits again (no rank changes its buffer while another still reads it), then writes its own.
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <vector>

#include "backend/comm/communicator.h"

namespace g4 {

namespace {

const char* const kUnwound = "an error unwound this rank (its own message says which)";

// What the ranks of one group share.
class Rendezvous {
 public:
  Rendezvous(int size, std::chrono::milliseconds timeout) : size_(size), timeout_(timeout), slots_(size_t(size)) {}
  int size() const { return size_; }

  // Publishes `mine` as rank `rank`'s buffer and returns once every rank has published its own.
  const std::vector<const void*>& publish(int rank, const void* mine) {
    slots_[size_t(rank)] = mine;
    wait_all(rank);
    return slots_;
  }

  // Returns once every rank has called it as often as this one; throws PeerFailure when the group
  // failed, or fails the group when the others do not come within the timeout.
  void wait_all(int rank) {
    std::unique_lock lock(mutex_);
    throw_if_failed_locked();
    const uint64_t generation = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      changed_.notify_all();
      return;
    }
    const bool done = changed_.wait_for(lock, timeout_, [&] { return generation_ != generation || failed_; });
    if (generation_ != generation) return;
    if (!done)
      fail_locked("rank " + std::to_string(rank) + " waited " + std::to_string(timeout_.count()) +
                  " ms in a collective for its peers (a rank stopped responding)");
    throw PeerFailure(why_);
  }

  void abort(int rank, const std::string& what) {
    std::lock_guard lock(mutex_);
    fail_locked("rank " + std::to_string(rank) + " failed: " + what, rank);
  }
  int first_failed_rank() {
    std::lock_guard lock(mutex_);
    return failed_rank_;
  }
  void throw_if_failed() {
    std::lock_guard lock(mutex_);
    throw_if_failed_locked();
  }

 private:
  void fail_locked(const std::string& why, int rank = -1) {
    if (!failed_) {
      why_ = "tensor parallel: " + why;
      failed_rank_ = rank;
    }
    failed_ = true;
    changed_.notify_all();
  }
  void throw_if_failed_locked() const {
    if (failed_) throw PeerFailure(why_);
  }

  const int size_;
  const std::chrono::milliseconds timeout_;
  std::vector<const void*> slots_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool failed_ = false;
  int failed_rank_ = -1;
  std::string why_;
};

void check_f32_contiguous(const Tensor& t, const char* what) {
  G4_CHECK(t.dtype == DType::F32, std::string("cpu communicator: ") + what + " must be F32 (the cpu backend's activations), got " +
                                      dtype_name(t.dtype));
}

class CpuCommunicator final : public Communicator {
 public:
  CpuCommunicator(std::shared_ptr<Rendezvous> group, int rank) : group_(std::move(group)), rank_(rank) {}
  // Destroyed by an error that had not aborted the group yet (one thrown while an Engine is being
  // built, after its communicator joined): the peers must not wait for this rank.
  ~CpuCommunicator() override {
    if (std::uncaught_exceptions() > 0) group_->abort(rank_, kUnwound);
  }
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }

  // Every rank adds the same values in the same order (rank 0 + rank 1 + …), so all get the same bits.
  void all_reduce_sum(const Tensor& t) override {
    check_f32_contiguous(t, "all_reduce_sum");
    const auto& slots = group_->publish(rank_, t.data);
    sum_.assign(size_t(t.numel()), 0.0f);
    for (const void* peer : slots) {
      const float* p = static_cast<const float*>(peer);
      for (size_t i = 0; i < sum_.size(); ++i) sum_[i] += p[i];
    }
    group_->wait_all(rank_);  // every rank has read every buffer
    std::memcpy(t.data, sum_.data(), sum_.size() * sizeof(float));
  }

  void all_gather_cols(const Tensor& local, const Tensor& out) override {
    check_f32_contiguous(local, "all_gather_cols");
    check_f32_contiguous(out, "all_gather_cols");
    G4_CHECK(out.rows == local.rows && out.cols == local.cols * size(),
             "all_gather_cols: out must be [" + std::to_string(local.rows) + ", " +
                 std::to_string(local.cols * size()) + "]");
    const auto& slots = group_->publish(rank_, local.data);
    const size_t c = size_t(local.cols);
    for (int r = 0; r < size(); ++r) {
      const float* src = static_cast<const float*>(slots[size_t(r)]);
      for (int64_t i = 0; i < out.rows; ++i)
        std::memcpy(out.as<float>() + size_t(i) * out.cols + size_t(r) * c, src + size_t(i) * c, c * sizeof(float));
    }
    group_->wait_all(rank_);  // no rank reuses its local buffer while another still reads it
  }

  void barrier() override { group_->wait_all(rank_); }
  void abort(const std::string& what) override { group_->abort(rank_, what); }
  void throw_if_failed() override { group_->throw_if_failed(); }
  std::string all_reduce_path() const override { return "shared memory"; }

 private:
  std::shared_ptr<Rendezvous> group_;
  int rank_;
  std::vector<float> sum_;
};

class CpuCommGroup final : public CommGroup {
 public:
  CpuCommGroup(int size, std::chrono::milliseconds timeout) : rendezvous_(std::make_shared<Rendezvous>(size, timeout)) {}
  int size() const override { return rendezvous_->size(); }
  std::unique_ptr<Communicator> join(int rank, Backend& backend) override {
    G4_CHECK(backend.name() == "cpu", "the cpu communicator joins cpu backends only, not " + backend.name());
    G4_CHECK(rank >= 0 && rank < size(), "rank " + std::to_string(rank) + " outside a group of " + std::to_string(size()));
    return std::make_unique<CpuCommunicator>(rendezvous_, rank);
  }
  void abort(int rank, const std::string& what) override { rendezvous_->abort(rank, what); }
  int first_failed_rank() const override { return rendezvous_->first_failed_rank(); }

 private:
  std::shared_ptr<Rendezvous> rendezvous_;
};

}  // namespace

std::unique_ptr<CommGroup> make_cpu_comm_group(int size, std::chrono::milliseconds timeout) {
  G4_CHECK(size >= 1, "a tensor-parallel group needs at least one rank, got " + std::to_string(size));
  return std::make_unique<CpuCommGroup>(size, timeout);
}

}  // namespace g4
