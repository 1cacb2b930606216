// Helpers shared by the doctest files: the message of an expected typed error, substring tests.
#pragma once

#include <doctest/doctest.h>

#include <exception>
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

}  // namespace kiln::testing
