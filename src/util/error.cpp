#include "util/error.h"

namespace g4 {

const char* to_string(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return "invalid argument";
    case ErrorKind::kNotFound: return "not found";
    case ErrorKind::kUnsupported: return "unsupported";
    case ErrorKind::kTooLarge: return "too large";
    case ErrorKind::kResourceExhausted: return "resource exhausted";
    case ErrorKind::kBusy: return "busy";
    case ErrorKind::kUnavailable: return "unavailable";
    case ErrorKind::kUnauthenticated: return "unauthenticated";
    case ErrorKind::kMethodNotAllowed: return "method not allowed";
    case ErrorKind::kCancelled: return "cancelled";
    case ErrorKind::kPeerFailure: return "peer failure";
    case ErrorKind::kInternal: return "internal";
  }
  return "unknown";
}

}  // namespace g4
