// The fork-join pool behind host::ParallelFor: back-to-back regions of different sizes must run
// each chunk exactly once (a straggling helper must not run a chunk of the next region), and an
// exception in any chunk reaches the caller.
#include <doctest/doctest.h>

#include <atomic>
#include <vector>

#include "kiln/runtime/cpu/loops.h"
#include "kiln/runtime/error.h"

using namespace kiln;

TEST_CASE("parallel: every chunk of back-to-back regions runs exactly once") {
  for (int round = 0; round < 3000; ++round) {
    int64_t chunks = 1 + (round * 7) % 9;
    std::vector<std::atomic<int>> hits(static_cast<size_t>(chunks));
    host::RunChunks(chunks, [&](int64_t c) { hits[static_cast<size_t>(c)].fetch_add(1); });
    for (int64_t c = 0; c < chunks; ++c) REQUIRE(hits[static_cast<size_t>(c)].load() == 1);
  }
}

TEST_CASE("parallel: an exception in a chunk is rethrown on the caller after the region") {
  std::atomic<int> ran{0};
  CHECK_THROWS_AS(host::ParallelFor(1 << 20, 1, [&](int64_t b, int64_t e) {
                    ran.fetch_add(1);
                    if (b == 0) throw ValueError("boom");
                  }),
                  ValueError);
  // The pool still works afterwards.
  std::atomic<int64_t> sum{0};
  host::ParallelFor(1000, 1, [&](int64_t b, int64_t e) { sum.fetch_add(e - b); });
  CHECK(sum.load() == 1000);
}
