// Wall-clock seconds for the reports (time to first token, draft and verify time).
#pragma once
#include <chrono>

namespace g4 {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace g4
