// COHORT_CHECK: broken invariants abort the process with file, line and a message.
// Usage: COHORT_CHECK(ptr != nullptr) << "context " << value;
//
// Thread-safety: safe from any thread; a failing check writes to stderr and aborts.
#pragma once

#include <sstream>

namespace cohort::internal {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  [[noreturn]] ~CheckFailure();
  template <typename T>
  CheckFailure& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  std::ostringstream stream_;
};

// Lets `COHORT_CHECK(x) << ...` be an expression of type void in both branches.
struct Voidify {
  void operator&(CheckFailure&) {}
};

}  // namespace cohort::internal

#define COHORT_CHECK(condition)                           \
  (condition) ? (void)0                                   \
              : ::cohort::internal::Voidify() &           \
                    ::cohort::internal::CheckFailure(__FILE__, __LINE__, #condition)
