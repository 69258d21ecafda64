// Status and Result<T>: the error model of every layer below train/.
//
// A Status is a code plus a message. The code tells the caller what to do:
// kUnavailable -> the same call may work later (retry), kDeadlineExceeded -> it did not
// finish in time, kFailedPrecondition -> stop (retrying cannot help), kAborted -> the
// operation lost a race with another writer (etcd: the revision it watched was compacted).
// Result<T> holds either a value or a non-OK Status.
//
// Thread-safety: value types; a const object may be read from any thread.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "cohort/base/check.h"

namespace cohort {

enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument = 1,
  kNotFound = 2,
  kAlreadyExists = 3,
  kDeadlineExceeded = 4,
  kUnavailable = 5,
  kAborted = 6,
  kFailedPrecondition = 7,
  kPermissionDenied = 8,
  kCancelled = 9,
  kInternal = 10,
  kDataLoss = 11,
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "DEADLINE_EXCEEDED: message"
  std::string ToString() const;
  // Returns a copy whose message is "context: message".
  Status WithContext(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename... Args>
Status MakeStatus(StatusCode code, fmt::format_string<Args...> format, Args&&... args) {
  return Status(code, fmt::format(format, std::forward<Args>(args)...));
}
#define COHORT_STATUS_FACTORY(Name, Code)                                   \
  template <typename... Args>                                              \
  Status Name(fmt::format_string<Args...> format, Args&&... args) {        \
    return Status(StatusCode::Code, fmt::format(format, std::forward<Args>(args)...)); \
  }
COHORT_STATUS_FACTORY(InvalidArgument, kInvalidArgument)
COHORT_STATUS_FACTORY(NotFound, kNotFound)
COHORT_STATUS_FACTORY(AlreadyExists, kAlreadyExists)
COHORT_STATUS_FACTORY(DeadlineExceeded, kDeadlineExceeded)
COHORT_STATUS_FACTORY(Unavailable, kUnavailable)
COHORT_STATUS_FACTORY(Aborted, kAborted)
COHORT_STATUS_FACTORY(FailedPrecondition, kFailedPrecondition)
COHORT_STATUS_FACTORY(PermissionDenied, kPermissionDenied)
COHORT_STATUS_FACTORY(Cancelled, kCancelled)
COHORT_STATUS_FACTORY(Internal, kInternal)
COHORT_STATUS_FACTORY(DataLoss, kDataLoss)
#undef COHORT_STATUS_FACTORY

// Status from errno: "what: strerror(err)"; ECONNREFUSED etc. map to kUnavailable.
Status ErrnoStatus(std::string_view what, int err);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    COHORT_CHECK(!status_.ok()) << "Result constructed from an OK status without a value";
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & {
    COHORT_CHECK(ok()) << "Result::value() on error: " << status_.ToString();
    return *value_;
  }
  const T& value() const& {
    COHORT_CHECK(ok()) << "Result::value() on error: " << status_.ToString();
    return *value_;
  }
  T&& value() && {
    COHORT_CHECK(ok()) << "Result::value() on error: " << status_.ToString();
    return std::move(*value_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T value_or(T fallback) const { return ok() ? *value_ : std::move(fallback); }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace cohort

#define COHORT_CONCAT_INNER(a, b) a##b
#define COHORT_CONCAT(a, b) COHORT_CONCAT_INNER(a, b)

#define COHORT_RETURN_IF_ERROR(expr)          \
  do {                                        \
    ::cohort::Status _cohort_st = (expr);     \
    if (!_cohort_st.ok()) return _cohort_st;  \
  } while (0)

#define COHORT_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

#define COHORT_ASSIGN_OR_RETURN(lhs, expr) \
  COHORT_ASSIGN_OR_RETURN_IMPL(COHORT_CONCAT(_cohort_result_, __LINE__), lhs, expr)
