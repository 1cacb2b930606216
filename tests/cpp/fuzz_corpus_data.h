// The fuzz corpora (tests/fuzz/corpus/<reader>/<name>) embedded in kiln_tests at build time by
// embed_corpus.cmake: test_fuzz_corpus.cc needs no source tree to replay them.
#pragma once

#include <cstddef>

namespace kiln::testing {

struct CorpusFile {
  const char* reader;  // the corpus folder: npy, idx, params, ...
  const char* name;    // valid-*, bad-* or a past finding
  const unsigned char* data;
  size_t size;
};
extern const CorpusFile kFuzzCorpus[];
extern const size_t kFuzzCorpusCount;

}  // namespace kiln::testing
