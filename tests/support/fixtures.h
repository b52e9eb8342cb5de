// Access to the Hugging Face reference fixtures (tests/fixtures/hf-gemma4/*, tests/fixtures/demo/transformers).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace g4::test {

struct Reference {
  std::string dir;
  std::vector<int32_t> tokens;
  int64_t positions = 0, vocab = 0;
  std::vector<float> logits;  // [positions][vocab]
};

std::string fixture_dir(const std::string& name);
Reference load_reference(const std::string& name);
// transformers' float64 logits of the committed demo model (tools/demo_reference_logits.py).
Reference load_demo_reference();
// max |a - b| over all elements (a and b must have the same size).
double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b);
// A fresh empty directory under the build tree for one test's files: `name` plus the process id
// and a counter, so tests running in parallel (ctest -j) never share one; removed at exit.
std::string temp_dir(const std::string& name);
// A file shared by every test process of a build (e.g. a model exported once), at
// G4_CACHE_DIR/name: the first process to need it runs make(path) under a lock file, writing a
// unique temporary name that is renamed into place; the others wait for it and reuse it.
std::string shared_artifact(const std::string& name, const std::function<void(const std::string& path)>& make);
// Runs a shell command, returns its exit status and combined stdout+stderr.
int run_command(const std::string& command, std::string* output);

struct CommandResult {
  int exit_code;
  std::string output;  // stdout and stderr
};
// Runs the g4 binary with `arguments` (shell syntax).
CommandResult run_g4(const std::string& arguments);

}  // namespace g4::test
