// Fuzzes the IR text parser (ir::ParseGraph, what KILN_DUMP_IR prints and tests read). An accepted
// text must print (PrintGraph) into one that parses again and prints the same bytes (text.h).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "fuzz_common.h"
#include "kiln/ir/text.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  std::unique_ptr<ir::Graph> g;
  if (!fuzz::Accepts([&] { g = ir::ParseGraph(text); })) return 0;
  std::string once = ir::PrintGraph(*g);
  std::unique_ptr<ir::Graph> again;
  fuzz::Require(fuzz::Accepts([&] { again = ir::ParseGraph(once); }), "a printed graph parses back");
  fuzz::Require(ir::PrintGraph(*again) == once, "a round trip prints the same bytes");
  return 0;
}
