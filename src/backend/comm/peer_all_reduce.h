// The all-reduce of a tensor-parallel group whose ranks are threads of one process on GPUs that
// reach each other's memory (NVLink peer access): one kernel per piece, no NCCL call, no host
// synchronisation, capturable in a CUDA graph (docs/DESIGN.md, "Tensor parallel").
//
// One-shot protocol, per piece of at most kPeerSlotBytes: every rank pushes its piece into each
// peer's inbox (remote stores), raises a flag in the peer's memory, waits for every peer's flag in
// its own memory, then sums the N pieces in rank order 0 + 1 + … in float32 and stores the result
// in place. Every rank adds the same values in the same order, so every rank holds the same bits.
//
// Block b owns the 16-byte vectors of the tiles t ≡ b (mod kPeerBlocks), whatever the piece's
// size, and keeps its own epoch counter (device memory, so graph replays advance it); a block that
// owns no tile of a piece does not run. The inbox has two halves, used by the block's epoch parity:
// block b writes half e % 2 again only at its epoch e + 2, after it saw every peer's block-b flag of
// epoch e + 1, which that peer raised after its epoch-e kernel (which read half e % 2) had ended.
//
// A block that waits longer than the timeout, or sees the group's abort flag (host memory the
// watchdog sets when the group fails), gives up: it sets `timed_out` (host memory the watchdog
// reads) and leaves its vectors unreduced. The group has failed by then, so no rank uses them.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/tensor.h"

namespace g4 {

inline constexpr int kMaxPeerRanks = 8;
inline constexpr int kPeerBlocks = 64;
inline constexpr size_t kPeerSlotBytes = size_t(4) << 20;  // one sender's piece in one inbox half

// What one rank's GPU holds for its peers to write into.
struct PeerMailbox {
  uint8_t* inbox = nullptr;   // [2 halves][size senders][kPeerSlotBytes]
  uint32_t* flags = nullptr;  // [size senders][kPeerBlocks]: the last epoch each sender's block delivered
};

struct PeerGroupView {
  PeerMailbox ranks[kMaxPeerRanks];
  int rank = 0, size = 0;
  uint32_t* epochs = nullptr;              // this rank's [kPeerBlocks] counters, on its GPU
  const volatile int32_t* abort = nullptr;  // mapped host memory: non-zero once the group failed
  int32_t* timed_out = nullptr;             // mapped host memory: a block gave up waiting
  uint64_t timeout_ns = 0;
};

// Bytes of one rank's mailbox: the inbox and the flags.
size_t peer_inbox_bytes(int size);
size_t peer_flag_bytes(int size);

// Whether `t` can take this path: BF16, F16 or F32, whole 16-byte vectors, 16-byte aligned.
bool peer_all_reduce_takes(const Tensor& t);

// t = the sum of every rank's t, enqueued on `stream` (the current device's), piece by piece.
void peer_all_reduce(const Tensor& t, const PeerGroupView& group, cudaStream_t stream);

}  // namespace g4
