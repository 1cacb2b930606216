// Helpers shared by the doctest files: the message of an expected typed error, substring tests.
#pragma once

#include <doctest/doctest.h>

#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <string_view>

namespace kiln::testing {

/// Runs f, which must throw E; returns the error's message. Another exception, or none, fails.
template <class E, class F>
std::string ErrorOf(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("expected a different error type, got: " << e.what());
  }
  FAIL("expected an error, none was thrown");
  return "";
}

inline bool Has(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }
inline bool Contains(std::string_view s, std::string_view part) { return Has(s, part); }

/// Sets an environment variable for the life of the object, then restores the previous value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace kiln::testing
