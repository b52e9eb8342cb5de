#include "support/npm_reference.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>

namespace g4::test {

namespace fs = std::filesystem;

std::string read_text_file(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::runtime_error("cannot read " + path.string());
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

void write_text_file(const fs::path& path, const std::string& text) {
  std::ofstream file(path, std::ios::binary);
  file << text;
  if (!file.flush()) throw std::runtime_error("cannot write " + path.string());
}

DirectoryLock::DirectoryLock(const fs::path& dir) {
  fs::create_directories(dir);
  fd_ = open((dir / ".lock").c_str(), O_CREAT | O_RDWR, 0644);
  if (fd_ < 0 || flock(fd_, LOCK_EX) != 0) throw std::runtime_error("cannot lock " + dir.string());
}

DirectoryLock::~DirectoryLock() { close(fd_); }

void run_or_throw(const std::string& command, const fs::path& log, const std::string& what) {
  const int status = std::system((command + " > '" + log.string() + "' 2>&1").c_str());
  if (status == 0) return;
  std::string output = fs::exists(log) ? read_text_file(log) : "";
  if (output.size() > 2000) output = "..." + output.substr(output.size() - 2000);
  throw std::runtime_error(what + " failed (exit status " + std::to_string(WEXITSTATUS(status)) + "):\n" + output);
}

void npm_install_pinned(const fs::path& prefix, const std::vector<std::string>& packages) {
  std::string list;
  for (const std::string& package : packages) list += " " + package;
  // The marker names the exact list, so changing a pinned version reinstalls.
  const fs::path marker = prefix / ("installed-" + std::to_string(std::hash<std::string>{}(list)));
  if (fs::exists(marker)) return;
  fs::create_directories(prefix);
  run_or_throw("npm install --prefix '" + prefix.string() + "' --no-audit --no-fund --loglevel=error" + list,
               prefix / "npm-install.log", "npm install of" + list + " (needs the npm registry; CI has network)");
  write_text_file(marker, "");
}

}  // namespace g4::test
