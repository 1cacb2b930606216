// Fuzzes the graph JSON reader (NAME-symbol.json, ir::GraphFromJson). An accepted document must
// write back (GraphToJson) into one that reads again and writes the same bytes.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "kiln/ir/serialize.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  ir::LoadedGraph g;
  if (!fuzz::Accepts([&] { g = ir::GraphFromJson(text); })) return 0;
  std::string once, twice;
  fuzz::Require(fuzz::Accepts([&] { once = ir::GraphToJson(*g.graph, g.manifest); }),
                "an accepted graph writes back");
  ir::LoadedGraph again;
  fuzz::Require(fuzz::Accepts([&] { again = ir::GraphFromJson(once); }), "a written graph reads back");
  fuzz::Require(again.manifest == g.manifest, "the manifest survives a round trip");
  fuzz::Require(fuzz::Accepts([&] { twice = ir::GraphToJson(*again.graph, again.manifest); }) && twice == once,
                "a round trip writes the same bytes");
  return 0;
}
