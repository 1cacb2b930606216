// The test runner: doctest's, plus a final drain of the engine so that an error no test waited
// for is dropped here rather than at exit. (Exit itself is safe: the engine registers its drain
// again after oneDNN builds its lazy statics; see engine::DrainBeforeExit.)
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "kiln/runtime/engine.h"

int main(int argc, char** argv) {
  // Tests compile kernels into a disk cache of their own, removed at the end: cold compiles are
  // what the tests see, and the user's ~/.cache/kiln is left alone.
  char dir[] = "/tmp/kiln-test-cache-XXXXXX";
  bool own_cache = mkdtemp(dir) != nullptr;
  if (own_cache) setenv("KILN_CACHE_DIR", dir, 1);
  // Tests compare GPU convolutions with the CPU's float32 numbers, so they run in full float32
  // (as PyTorch's tests turn TF32 off) unless KILN_CONV_TF32 is set; the math-mode tests set it.
  setenv("KILN_CONV_TF32", "0", 0);
  doctest::Context context(argc, argv);
  int result = context.run();
  if (own_cache) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  try {
    kiln::engine::Engine::Get().WaitForAll();
  } catch (const std::exception&) {  // an error no test waited for; the tests already reported
  }
  return result;
}
