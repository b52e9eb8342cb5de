// Access to the Hugging Face reference fixtures (tests/fixtures/hf-gemma4/*, tests/fixtures/demo/transformers),
// made by tools/fixtures/make_fixtures.py and tools/fixtures/demo_reference_logits.py (docs/DESIGN.md, "Oracles").
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/perplexity.h"
#include "util/error.h"

namespace g4::test {

// How transformers itself lands from the float64 reference when it runs the fixture in one dtype.
struct TransformersError {
  double relative_l2 = 0;              // over the stored rows
  double clear_greedy_agreement = 1;   // at the positions whose top-2 margin exceeds kClearMargin
};

struct Reference {
  std::string dir;
  std::vector<int32_t> tokens;
  int64_t positions = 0, vocab = 0;
  std::vector<int64_t> rows;   // the position of each stored logits row (every position for short fixtures)
  std::vector<float> logits;   // [rows][vocab]
  std::vector<int32_t> greedy_next;  // the reference's argmax at every position
  std::vector<float> top2_margin;    // its top-2 gap at every position
  TransformersError transformers_bf16, transformers_f32;
};

// A position whose reference top-2 margin exceeds this has an unambiguous greedy token: the rule
// g4 perplexity's clear positions follow.
inline constexpr double kClearMargin = kClearTopMargin;

std::string fixture_dir(const std::string& name);
Reference load_reference(const std::string& name);
// transformers' float64 logits of the demo model (tools/fixtures/demo_reference_logits.py).
Reference load_demo_reference();
// The rows of `every_position` ([positions][vocab]) that the reference stores, in its order.
std::vector<float> stored_rows(const std::vector<float>& every_position, const Reference& ref);
// max |a - b| over all elements (a and b must have the same size; NaN counts as infinitely far).
double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b);
// ||got - want|| / ||want|| (NaN in got gives NaN, which fails every bound).
double relative_l2(const std::vector<float>& got, const std::vector<float>& want);

// The greedy token of `every_position` ([positions][vocab]) against the reference's, at the clear positions.
struct GreedyAgreement {
  int clear = 0, agreed = 0;
  int64_t first_disagreement = -1;
  double fraction() const { return clear == 0 ? 1.0 : double(agreed) / clear; }
};
GreedyAgreement greedy_agreement(const std::vector<float>& every_position, const Reference& ref);

// A fresh empty directory under the build tree for one test's files: `name` plus the process id
// and a counter, so tests running in parallel (ctest -j) never share one; removed at exit.
std::string temp_dir(const std::string& name);
// A file shared by every test process of a build (e.g. a model exported once), at
// G4_CACHE_DIR/name: the first process to need it runs make(path) under a lock file, writing a
// unique temporary name that is renamed into place; the others wait for it and reuse it.
std::string shared_artifact(const std::string& name, const std::function<void(const std::string& path)>& make);
// G4_REQUIRE_GPU=1 (tools/gpu/gpu_check.sh sets it on the GPU machine): a test that needs a GPU fails
// instead of skipping when none is usable, so a broken CUDA setup cannot pass as "skipped".
bool gpu_required();
#define G4_SKIP_OR_FAIL_WITHOUT_GPU(gpu_usable)                                                        \
  do {                                                                                                 \
    if (gpu_usable) break;                                                                             \
    if (::g4::test::gpu_required()) FAIL() << "G4_REQUIRE_GPU=1 but no CUDA GPU is usable (or no CUDA build)"; \
    GTEST_SKIP() << "no CUDA GPU (or built without CUDA): skipped";                                    \
  } while (0)

// The message of the g4::Error that `action` throws, or "(no g4::Error thrown)".
std::string error_of(const std::function<void()>& action);
// The kind of the g4::Error that `action` throws; FAILs the test (and answers kInternal) when it
// throws none.
ErrorKind error_kind_of(const std::function<void()>& action);
// The float32 values (native order) of the file at `path`; empty when it cannot be read.
std::vector<float> read_floats(const std::string& path);
// Writes `values` (float32, native order) to a file `name` in a fresh temp_dir; returns its path.
std::string write_floats(const std::vector<float>& values, const std::string& name);
// Runs a shell command, returns its exit status and combined stdout+stderr.
int run_command(const std::string& command, std::string* output);

struct CommandResult {
  int exit_code;
  std::string output;  // stdout and stderr
};
// Runs the g4 binary with `arguments` (shell syntax), after `environment` (e.g. "VAR=value").
CommandResult run_g4(const std::string& arguments, const std::string& environment = "");

}  // namespace g4::test
