// The one exception type of g4: every user-facing failure carries a message that names the problem.
#pragma once
#include <stdexcept>
#include <string>

namespace g4 {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// check(cond, msg): throw g4::Error(msg) unless cond. The message is built only on failure.
// Variadic so that a message containing commas needs no extra parentheses.
#define G4_CHECK(cond, ...)                                       \
  do {                                                            \
    if (!(cond)) throw ::g4::Error(std::string() + __VA_ARGS__);  \
  } while (0)

}  // namespace g4
