// What kind of build the tests run in, for the few tests whose volume (not their checks) must
// shrink under the sanitizers, which slow the CPU backend and every allocation ~10×.
#pragma once

namespace g4::test {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitizerBuild = true;
#else
inline constexpr bool kSanitizerBuild = false;
#endif

}  // namespace g4::test
