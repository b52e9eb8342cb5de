// Reference implementations that run under node (docs/DESIGN.md §6): pinned npm packages
// installed once into the build tree's cache, shared by the test processes ctest runs in parallel.
// No node, npm or network makes these tests fail with the npm error, never pass silently.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace g4::test {

std::string read_text_file(const std::filesystem::path& path);
void write_text_file(const std::filesystem::path& path, const std::string& text);

// An exclusive flock on dir/.lock (dir is created), held for the object's lifetime.
class DirectoryLock {
 public:
  explicit DirectoryLock(const std::filesystem::path& dir);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

 private:
  int fd_ = -1;
};

// Runs a shell command with its output to log; throws with the log's tail if it fails.
void run_or_throw(const std::string& command, const std::filesystem::path& log, const std::string& what);

// `npm install` of `packages` ("name@version" each) under prefix unless a marker of that exact list
// is there; the caller holds a DirectoryLock. Throws with npm's output on failure.
void npm_install_pinned(const std::filesystem::path& prefix, const std::vector<std::string>& packages);

}  // namespace g4::test
