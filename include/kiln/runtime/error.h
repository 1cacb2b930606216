// Errors in kiln come in two tiers (STYLE.md convention 7):
//  - KILN_CHECK(cond) << "..." for internal invariants: throws InternalError with file:line.
//  - Typed user errors (ShapeError, DTypeError, DeviceError, FormatError, ValueError, EngineError)
//    whose message says what was expected, what was found and what to do.
// The Python bindings map each typed error to a Python exception class.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace kiln {

/// Base of every error kiln throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A kiln bug: an internal invariant did not hold.
class InternalError : public Error { using Error::Error; };
/// Shapes that do not fit the op (mismatched dims, bad axis, wrong rank).
class ShapeError : public Error { using Error::Error; };
/// A dtype the op does not accept, or two dtypes that must agree and do not.
class DTypeError : public Error { using Error::Error; };
/// Tensors on different devices, or a device that does not exist.
class DeviceError : public Error { using Error::Error; };
/// A malformed file or serialized graph.
class FormatError : public Error { using Error::Error; };
/// A bad argument value (negative size, unknown option, bad attribute).
class ValueError : public Error { using Error::Error; };
/// Bad input a GPU kernel found without the host waiting for it (a class label out of range),
/// raised at a later sync point (cuda.h DeferredCheck); code that tries work and falls back on
/// an Error (freeze_fold's evaluator) lets this one through: it is the user's, from earlier.
class DeferredDeviceError : public ValueError { using ValueError::ValueError; };
/// An allocation that cannot be satisfied (device or host memory exhausted, absurd size).
class MemoryError : public Error { using Error::Error; };
/// Misuse of the engine or autograd state (for example backward twice without retain_graph).
class StateError : public Error { using Error::Error; };

namespace detail {
/// Collects a message with operator<< and throws E when it goes out of scope.
template <class E>
class Thrower {
 public:
  Thrower(const char* file, int line, const char* cond) {
    if (cond) os_ << "internal check failed at " << file << ":" << line << ": " << cond << ": ";
  }
  Thrower() = default;
  template <class T>
  Thrower& operator<<(const T& v) {
    os_ << v;
    return *this;
  }
  [[noreturn]] ~Thrower() noexcept(false) { throw E(os_.str()); }

 private:
  std::ostringstream os_;
};
}  // namespace detail

}  // namespace kiln

/// Internal invariant: throws kiln::InternalError naming file, line and condition.
#define KILN_CHECK(cond) \
  if (cond) {            \
  } else                 \
    ::kiln::detail::Thrower<::kiln::InternalError>(__FILE__, __LINE__, #cond)

/// Throws a typed user error: KILN_THROW(ShapeError) << "add: expected ...".
#define KILN_THROW(E) ::kiln::detail::Thrower<::kiln::E>()
