// Helpers shared by the doctest files: the message of an expected typed error, substring tests.
#pragma once

#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::testing {

/// A directory of its own under the system temp directory ("<prefix>_<pid>_<n>"), removed
/// afterwards; `dir / "name"` is a path in it.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix = "kiln_test") {
    static int n = 0;
    path = std::filesystem::temp_directory_path() /
           (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return (path / name).string(); }
  /// The names in the directory, sorted.
  std::vector<std::string> Names() const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(path)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
};

/// The bytes of the file at `path` ("" when it cannot be read).
inline std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

/// How many times slower a sanitizer build runs (make test-asan, make test-tsan; ASan and UBSan
/// cost about 2-3x, TSan 5-15x): a test's time bound is for the optimized build, times this.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr double kSanitizerSlowdown = 4;
#elif defined(__SANITIZE_THREAD__)
inline constexpr double kSanitizerSlowdown = 15;
#else
inline constexpr double kSanitizerSlowdown = 1;
#endif

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

/// What `f` writes to the process's stderr (file descriptor 2, so C and C++ writes alike).
template <class F>
std::string CapturedStderr(F&& f) {
  std::fflush(stderr);
  FILE* capture = std::tmpfile();
  REQUIRE(capture);
  const int saved = dup(2);
  dup2(fileno(capture), 2);
  f();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::string text;
  std::rewind(capture);
  for (int ch; (ch = std::fgetc(capture)) != EOF;) text += static_cast<char>(ch);
  std::fclose(capture);
  return text;
}

/// n floats uniform in [lo, hi) from a seeded generator (the same numbers every run).
inline std::vector<float> Random(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

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
