// The exception type of g4: every user-facing failure carries a kind (what went wrong, for callers
// that act on it: the server maps it to an HTTP status in one place) and a message that names the
// problem (for people). Callers never tell failures apart by message text.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

namespace g4 {

enum class ErrorKind : uint8_t {
  kInvalidArgument,    // a value the caller gave is wrong: a flag, a request field, a prompt, a file's contents
  kNotFound,           // a named thing does not exist: a file, a model, a route
  kUnsupported,        // well-formed, but g4 does not do it: a tensor type, a request field, an architecture
  kTooLarge,           // beyond a fixed limit of the input itself: a request body, a JSON nesting depth
  kResourceExhausted,  // the memory (KV budget, device memory) cannot hold the work
  kBusy,               // every slot is taken and the queue is full: the same request may succeed later
  kUnavailable,        // not taking work: stopping, or its engine failed
  kUnauthenticated,    // a credential is missing or wrong
  kMethodNotAllowed,   // a known resource asked with a method it does not take
  kCancelled,          // ended on request before it finished
  kPeerFailure,        // another rank of a split model failed, so this one cannot go on
  kInternal,           // an invariant of g4 itself does not hold: a bug, never the caller's fault
};

// "invalid argument", "not found", ...: the kind in words, for logs and messages.
const char* to_string(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  // The common case: the caller's input is wrong.
  explicit Error(const std::string& message) : Error(ErrorKind::kInvalidArgument, message) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// G4_CHECK(cond, msg...): the caller's input is checked; throws Error(kInvalidArgument, msg)
// unless cond. The message is built only on failure. Variadic so that a message containing commas
// needs no extra parentheses.
#define G4_CHECK(cond, ...)                                       \
  do {                                                            \
    if (!(cond)) throw ::g4::Error(std::string() + __VA_ARGS__);  \
  } while (0)

// G4_REQUIRE(kind, cond, msg...): as G4_CHECK, with another kind (kNotFound, kUnsupported, ...).
#define G4_REQUIRE(kind, cond, ...)                                                \
  do {                                                                             \
    if (!(cond)) throw ::g4::Error(::g4::ErrorKind::kind, std::string() + __VA_ARGS__); \
  } while (0)

// G4_ASSERT(cond, msg...): an invariant of g4 itself, not of its input; throws Error(kInternal)
// naming the source line, so that a broken invariant is reported as a bug, never as bad input.
#define G4_ASSERT(cond, ...)                                                                           \
  do {                                                                                                 \
    if (!(cond))                                                                                       \
      throw ::g4::Error(::g4::ErrorKind::kInternal, std::string("internal error (") + __FILE__ + ":" + \
                                                        std::to_string(__LINE__) + "): " + __VA_ARGS__); \
  } while (0)

}  // namespace g4
