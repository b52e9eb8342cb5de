#include "util/progress.h"

#include <unistd.h>

#include <cstdio>

namespace g4 {

Progress::Progress(std::string label, uint64_t total, std::string unit)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      terminal_(stderr_is_terminal()),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

Progress::~Progress() { finish(); }

bool Progress::stderr_is_terminal() { return isatty(STDERR_FILENO) == 1; }

std::string Progress::amount(uint64_t n) const {
  char text[64];
  if (unit_ != "B") {
    std::snprintf(text, sizeof text, "%llu %s", static_cast<unsigned long long>(n), unit_.c_str());
  } else if (n >= (uint64_t(1) << 30)) {
    std::snprintf(text, sizeof text, "%.2f GiB", double(n) / double(uint64_t(1) << 30));
  } else {
    std::snprintf(text, sizeof text, "%.1f MiB", double(n) / double(1 << 20));
  }
  return text;
}

void Progress::advance(uint64_t amount_done) {
  done_ += amount_done;
  const auto now = std::chrono::steady_clock::now();
  if (terminal_ && now - last_draw_ >= std::chrono::milliseconds(100)) {
    last_draw_ = now;
    draw(false);
  }
}

void Progress::draw(bool final_line) {
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double rate = seconds > 0 ? double(done_) / seconds : 0;
  const int width = 24;
  const int filled = total_ ? int(double(width) * double(std::min(done_, total_)) / double(total_)) : width;
  std::string bar = std::string(size_t(filled), '#') + std::string(size_t(width - filled), '-');
  std::fprintf(stderr, "%s%s [%s] %s / %s, %s/s, %.1f s%s", terminal_ ? "\r" : "", label_.c_str(), bar.c_str(),
               amount(done_).c_str(), amount(total_).c_str(), amount(uint64_t(rate)).c_str(), seconds,
               final_line ? "\n" : "\x1b[K");
  std::fflush(stderr);
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  draw(true);
}

}  // namespace g4
