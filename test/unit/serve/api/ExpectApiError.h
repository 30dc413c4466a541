// The ApiError a call throws, for the API layer's tests.
#pragma once

#include <gtest/gtest.h>

#include <functional>

#include "runtime/serve/api/ApiError.h"

namespace dgemma::serve::test {

// The ApiError `f` throws; a test failure (and status 0) if it throws none.
inline ApiError expectApiError(const std::function<void()>& f) {
  try {
    f();
  } catch (const ApiError& error) {
    return error;
  }
  ADD_FAILURE() << "expected an ApiError";
  return ApiError(0, "", "");
}

}  // namespace dgemma::serve::test
