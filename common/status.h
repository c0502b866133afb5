// Status and StatusOr<T>: the error type of every call that can fail from
// outside the process (network, disk, device, configuration). Modelled on
// absl::Status; no exception crosses a module boundary.
#ifndef COHORT_COMMON_STATUS_H_
#define COHORT_COMMON_STATUS_H_

#include <cstdlib>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>

namespace cohort {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kAlreadyExists,
  kFailedPrecondition,
  kOutOfRange,
  kDataLoss,
  kResourceExhausted,
  kUnavailable,
  kDeadlineExceeded,
  kInternal,
  kUnimplemented,
  kCancelled,
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: message", or "OK".
  std::string ToString() const;
  // Returns a copy whose message is "context: message". OK stays OK.
  Status WithContext(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }
Status InvalidArgumentError(std::string message);
Status NotFoundError(std::string message);
Status AlreadyExistsError(std::string message);
Status FailedPreconditionError(std::string message);
Status OutOfRangeError(std::string message);
Status DataLossError(std::string message);
Status ResourceExhaustedError(std::string message);
Status UnavailableError(std::string message);
Status DeadlineExceededError(std::string message);
Status InternalError(std::string message);
Status UnimplementedError(std::string message);
Status CancelledError(std::string message);

std::ostream& operator<<(std::ostream& os, const Status& status);

// Holds either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const Status& status) : status_(status) {  // NOLINT: implicit.
    if (status_.ok()) status_ = InternalError("StatusOr built from OK status");
  }
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit.

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  const T& value() const& { return *value_; }
  T& value() & { return *value_; }
  // On an rvalue the value is moved out and returned by value, not as T&&:
  // `for (auto& x : *Load())` would otherwise iterate a destroyed object.
  T value() && { return std::move(*value_); }
  const T& operator*() const& { return *value_; }
  T& operator*() & { return *value_; }
  T operator*() && { return std::move(*value_); }
  const T* operator->() const { return &*value_; }
  T* operator->() { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace cohort

#define COHORT_STATUS_CONCAT_INNER_(a, b) a##b
#define COHORT_STATUS_CONCAT_(a, b) COHORT_STATUS_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function if `expr` is not OK.
#define COHORT_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::cohort::Status cohort_status_ = (expr);        \
    if (!cohort_status_.ok()) return cohort_status_; \
  } while (0)

// `lhs` = value of the StatusOr `expr`, or returns its Status.
#define COHORT_ASSIGN_OR_RETURN(lhs, expr) \
  COHORT_ASSIGN_OR_RETURN_IMPL_(COHORT_STATUS_CONCAT_(cohort_or_, __LINE__), lhs, expr)
#define COHORT_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()

#endif  // COHORT_COMMON_STATUS_H_
