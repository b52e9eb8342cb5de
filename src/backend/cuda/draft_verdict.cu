// One block judges a verify chunk (draft_verdict.h): thread 0 walks the drafts in order as
// judge_drafts does (sampling/speculative.cpp), and after a rejection the block draws the
// correction from max(p − q, 0): each thread sums the residual mass of a contiguous range of ids
// (exact 128-bit integers, so the sum does not depend on the order), thread 0 finds the range the
// draw's target falls in, and that range's thread finds the id.
#include "backend/cuda/draft_verdict.h"

#include "backend/cuda/launch.cuh"
#include "backend/cuda/pdl.cuh"
#include "sampling/philox.h"
#include "sampling/speculative.h"
#include "sampling/speculative_math.h"

namespace g4 {

namespace {

using namespace sampling;

constexpr int kThreads = 1024;

struct VerdictShared {
  u128 range_mass[kThreads];
  int rejected;       // the rejected draft, or -1 when thread 0's walk decided the verdict
  int found_range;    // the range that holds the correction's target
  u128 before_found;  // the residual mass of the ranges before it
  u128 target;
};

// Thread 0: the walk over the drafts. Returns the rejected draft that needs a correction, or -1
// when the verdict is written.
__device__ int walk_drafts(const DraftVerdictLaunch& a) {
  for (int i = 0; i < a.count; ++i) {
    const RowDistribution& p = a.p[i];
    auto decide = [&](int64_t token) {
      a.verdict[0] = i;
      a.verdict[1] = token;
      return -1;
    };
    if (p.has_nan) return decide(kNanLogitsToken);
    const int64_t x = a.drafts[i * a.draft_step];
    if (x < 0 || x >= a.vocab) return decide(kDraftNotAToken);
    if (is_greedy(a.params[i])) {
      const int64_t best = rank_id(p.best_rank);
      if (x != best) return decide(best);
      continue;
    }
    const RowDistribution& q = a.q[i];
    if (q.has_nan) return decide(kDraftLogitsNan);
    const uint32_t id = uint32_t(x);
    const uint64_t wp = kept_weight(p.kept, a.target[i * a.vocab + x], id);
    const uint64_t wq = kept_weight(q.kept, a.draft[i * a.draft_stride + x], id);
    if (wq == 0) return decide(kDraftOutsideItsDistribution);
    if (!draft_stands(philox_accept_bits(a.params[i].seed), wp, p.kept.total, wq, q.kept.total)) {
      a.verdict[0] = i;
      return i;
    }
  }
  a.verdict[0] = a.count;  // every draft stands: the bonus draw is verdict[1] already
  return -1;
}

__device__ u128 residual_at(const DraftVerdictLaunch& a, int row, int64_t id) {
  const RowDistribution &p = a.p[row], &q = a.q[row];
  const uint64_t wp = kept_weight(p.kept, a.target[row * a.vocab + id], uint32_t(id));
  const uint64_t wq = kept_weight(q.kept, a.draft[row * a.draft_stride + id], uint32_t(id));
  return residual_weight(wp, p.kept.total, wq, q.kept.total);
}

__global__ void __launch_bounds__(kThreads) draft_verdict_kernel(DraftVerdictLaunch a) {
  __shared__ VerdictShared shared;
  pdl_launch_dependents();
  pdl_wait();
  if (threadIdx.x == 0) shared.rejected = walk_drafts(a);
  __syncthreads();
  const int row = shared.rejected;
  if (row < 0) return;

  const int64_t range = (a.vocab + kThreads - 1) / kThreads;
  const int64_t first = threadIdx.x * range, end = min(first + range, a.vocab);
  u128 mass = 0;
  for (int64_t id = first; id < end; ++id) mass += residual_at(a, row, id);
  shared.range_mass[threadIdx.x] = mass;
  __syncthreads();
  if (threadIdx.x == 0) {
    u128 total = 0;
    for (int t = 0; t < kThreads; ++t) total += shared.range_mass[t];
    shared.found_range = -1;
    if (total == 0) {
      a.verdict[1] = kNoResidualMass;
    } else {
      const u128 target = draw_target_128(philox_correction_bits(a.params[row].seed), total);
      u128 before = 0;
      int t = 0;
      while (before + shared.range_mass[t] < target) before += shared.range_mass[t++];
      shared.found_range = t, shared.before_found = before, shared.target = target;
    }
  }
  __syncthreads();
  if (int(threadIdx.x) != shared.found_range) return;
  u128 cumulative = shared.before_found;
  for (int64_t id = first; id < end; ++id) {
    cumulative += residual_at(a, row, id);
    if (cumulative >= shared.target) {
      a.verdict[1] = id;
      return;
    }
  }
}

}  // namespace

void launch_draft_verdict(const DraftVerdictLaunch& a, cudaStream_t stream) {
  launch_kernel("draft_verdict_kernel", draft_verdict_kernel, dim3(1), dim3(kThreads), 0, stream, Pdl::kOn, a);
}

}  // namespace g4
