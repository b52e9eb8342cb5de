// Progress of long work (loading or exporting a large model, a long generation) on stderr.
// On a terminal: one line redrawn in place at most 10 times a second. Otherwise (logs, pipes):
// nothing until finish(), which prints one summary line, so logs stay clean.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace g4 {

class Progress {
 public:
  // `unit` "B" shows byte sizes (KiB, MiB, GiB); any other unit is printed after the count.
  Progress(std::string label, uint64_t total, std::string unit);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void advance(uint64_t amount);
  void finish();  // idempotent; also called by the destructor
  static bool stderr_is_terminal();

 private:
  void draw(bool final_line);
  std::string amount(uint64_t n) const;

  std::string label_, unit_;
  uint64_t total_ = 0, done_ = 0;
  bool terminal_ = false, finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace g4
