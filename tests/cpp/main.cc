// The test runner: doctest's, plus a final drain of the engine so that an error no test waited
// for is dropped here rather than at exit. (Exit itself is safe: the engine registers its drain
// again after oneDNN builds its lazy statics; see engine::DrainBeforeExit.)
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "kiln/runtime/engine.h"

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  int result = context.run();
  try {
    kiln::engine::Engine::Get().WaitForAll();
  } catch (const std::exception&) {  // an error no test waited for; the tests already reported
  }
  return result;
}
