// Verify chunks as a drafter and the target leave them, for tests of Backend::judge_drafts: K
// drafts of request `first` among `step` requests (draft i at row first + i·step of the drafter's
// tokens and logits), each drawn by the CPU sampler from its logits row with seed + i, and target
// rows near the drafter's (normal noise of `noise`), so that some drafts stand and others fall.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "sampling/sampling_params.h"

namespace g4::test {

struct DraftCase {
  int64_t k = 0, vocab = 0, first = 0, step = 1;
  SamplingParams params;              // the first draft's draw; verify row i draws with seed + i
  std::vector<float> target;          // [k + 1][vocab]
  std::vector<float> draft_logits;    // [k · step][vocab]
  std::vector<int64_t> draft_tokens;  // [k · step]; other requests' rows hold -1
  std::vector<SamplingParams> verify_rows() const;  // k + 1 rows
};

DraftCase make_draft_case(int64_t k, int64_t vocab, int64_t first, int64_t step, const SamplingParams& params,
                          float noise, uint32_t seed);

// The case in `be`'s memory, judged there: {accepted, token or code}.
struct DraftCaseVerdict {
  int64_t accepted = 0, token = 0;
  bool operator==(const DraftCaseVerdict&) const = default;
};
DraftCaseVerdict judge_on(Backend& be, const DraftCase& c);

}  // namespace g4::test
