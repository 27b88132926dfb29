// Helpers of the argument-validation tests: fake device addresses (validate() never dereferences a
// pointer) and a matcher for hmla::InvalidArgument that checks the entry point, the argument, the
// value received and that an expectation is stated.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <exception>
#include <string>

#include "hmla/types.h"

namespace hmla::test {

template <class T>
T* Fake(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

// Calls f and checks it threw hmla::InvalidArgument from `where` about `argument`, received `got`.
template <class F>
::testing::AssertionResult ThrowsInvalid(F f, const std::string& where, const std::string& argument,
                                         const std::string& got) {
  try {
    f();
  } catch (const hmla::InvalidArgument& e) {
    const std::string what = e.what();
    if (e.argument() != argument) {
      return ::testing::AssertionFailure()
             << "argument() is '" << e.argument() << "', expected '" << argument << "': " << what;
    }
    if (what.rfind(where + ": ", 0) != 0) {
      return ::testing::AssertionFailure() << "message does not start with '" << where << ": ': " << what;
    }
    const std::string needle = "argument '" + argument + "' is " + got;
    if (what.find(needle) == std::string::npos) {
      return ::testing::AssertionFailure() << "message lacks \"" << needle << "\": " << what;
    }
    if (what.find(", expected ") == std::string::npos) {
      return ::testing::AssertionFailure() << "message lacks the expected value: " << what;
    }
    return ::testing::AssertionSuccess() << what;
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw another exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw (argument '" << argument << "')";
}

}  // namespace hmla::test
