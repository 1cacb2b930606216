// The test runner: doctest's, plus a final drain of the engine. Tests may end with work still
// queued; it must finish before static destructors run (a library such as oneDNN creates statics
// lazily on the engine's workers, after kiln's own atexit drain was registered, so they would be
// destroyed first).
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
