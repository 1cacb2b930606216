// The environment switches of kiln, declared in one table (STYLE.md convention 12).
// Reading a switch that is not in the table is a bug (KILN_CHECK); a KILN_* variable in the
// environment that is not in the table gets one warning on stderr naming the closest switch; it
// never makes work fail (other programs may own names that start with KILN_).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kiln::env {

struct Switch {
  const char* name;
  const char* default_value;
  const char* doc;
};

/// Every switch kiln reads, with its default and one line of documentation.
const Switch* Table(int* count);
/// The value of a declared switch, or its default.
std::string Get(const char* name);
int64_t GetInt(const char* name);
/// Warns on stderr, once per name, about each KILN_* name in the environment that is not declared.
void CheckEnvironment();

/// Levenshtein distance, for "did you mean" suggestions (switches, ops, passes).
size_t EditDistance(std::string_view a, std::string_view b);

}  // namespace kiln::env
