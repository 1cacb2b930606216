// Shared helpers of the C++ benchmarks: a timer, medians of repeated runs, the --quick flag and
// the one-object-per-line JSON output of DESIGN.md section 11, for example
//   {"bench": "eager_dispatch", "case": "kiln_1elem", "metric": "us_per_op", "value": 0.8,
//    "unit": "us"}   (on one line)
// What it does not do: warm-up policy or statistics beyond the median (each bench decides).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln::bench {

/// Wall-clock time since construction (or the last Reset).
class Timer {
 public:
  Timer() { Reset(); }
  void Reset() { start_ = std::chrono::steady_clock::now(); }
  double Seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  double Ms() const { return Seconds() * 1e3; }
  double Us() const { return Seconds() * 1e6; }

 private:
  std::chrono::steady_clock::time_point start_;
};

/// The median (the mean of the middle two for an even count); 0 for an empty list.
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

/// The median of `repeats` calls of `run` (each returns one measurement).
inline double MedianOf(int repeats, const std::function<double()>& run) {
  std::vector<double> v;
  for (int i = 0; i < repeats; ++i) v.push_back(run());
  return Median(std::move(v));
}

/// Milliseconds of each of `repeats` calls of `f`, after `warmup` untimed calls.
inline std::vector<double> TimeEachMs(int warmup, int repeats, const std::function<void()>& f) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    Timer t;
    f();
    ms.push_back(t.Ms());
  }
  return ms;
}

/// Median milliseconds per call of `kiln` and of `reference` (a library called directly), timed
/// in alternating blocks so both see the same machine load. Both run once first: kiln's kernels
/// run on an engine worker whose OpenMP team coexists with the main thread's, and libgomp
/// spin-waits much longer while only one team exists (~8 ms per call on a loaded 2-core machine).
inline std::pair<double, double> AlternatingMedianMs(int rounds, int warmup, int per_round,
                                                     const std::function<void()>& kiln,
                                                     const std::function<void()>& reference) {
  kiln();
  reference();
  std::vector<double> a, b;
  for (int r = 0; r < rounds; ++r) {
    for (double t : TimeEachMs(warmup, per_round, kiln)) a.push_back(t);
    for (double t : TimeEachMs(warmup, per_round, reference)) b.push_back(t);
  }
  return {Median(std::move(a)), Median(std::move(b))};
}

/// True when `flag` (for example "--quick") is among the arguments.
inline bool HasFlag(int argc, char** argv, std::string_view flag) {
  for (int i = 1; i < argc; ++i)
    if (flag == argv[i]) return true;
  return false;
}

/// Prints one result line.
inline void Emit(std::string_view bench, std::string_view case_name, std::string_view metric,
                 double value, std::string_view unit) {
  auto quoted = [](std::string_view s) {
    std::string q = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') q += '\\';
      q += c;
    }
    return q + "\"";
  };
  std::printf("{\"bench\": %s, \"case\": %s, \"metric\": %s, \"value\": %.6g, \"unit\": %s}\n",
              quoted(bench).c_str(), quoted(case_name).c_str(), quoted(metric).c_str(), value,
              quoted(unit).c_str());
  std::fflush(stdout);
}

}  // namespace kiln::bench
