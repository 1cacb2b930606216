// The fuzz corpora (tests/fuzz/corpus/<reader>/) replayed through their readers in the ordinary
// build, so that a past finding stays fixed without clang or libFuzzer: every file must get an
// answer (accepted, or a typed user error that is not an InternalError), the valid-* seeds must be
// accepted (a seed the reader refuses would leave the fuzzer mutating garbage: regenerate them
// with tests/fuzz/make_corpus.py when a format changes), and bad-* inputs refused.
#include <doctest/doctest.h>

#include <functional>
#include <string>

#include "fuzz_corpus_data.h"
#include "kiln/frontend/idx.h"
#include "kiln/ir/serialize.h"
#include "kiln/ir/text.h"
#include "tools/npy.h"
#ifdef KILN_WITH_CODEGEN
#include "codegen/kernel_file.h"
#endif

namespace kiln {
namespace {

/// Feeds every file of corpus/`reader` (embedded at build time) to `read` (which returns whether
/// it accepted the bytes).
void Replay(const std::string& reader, const std::function<bool(const std::string&)>& read) {
  int files = 0, valid = 0;
  for (size_t i = 0; i < testing::kFuzzCorpusCount; ++i) {
    const testing::CorpusFile& f = testing::kFuzzCorpus[i];
    if (reader != f.reader) continue;
    ++files;
    const std::string name = f.name, bytes(reinterpret_cast<const char*>(f.data), f.size);
    INFO(reader << "/" << name);
    bool accepted = false;
    try {
      accepted = read(bytes);
    } catch (const InternalError& e) {
      FAIL("InternalError: " << e.what());
    } catch (const Error& e) {
      CHECK(std::string(e.what()).size() > 10);
    }
    if (name.rfind("valid-", 0) == 0) {
      CHECK(accepted);
      ++valid;
    }
    if (name.rfind("bad-", 0) == 0) CHECK(!accepted);
  }
  REQUIRE_MESSAGE(files > 0, "no corpus/" << reader << " files were embedded (tests/cpp/embed_corpus.cmake)");
  CHECK(valid >= 2);
}

}  // namespace

TEST_CASE("fuzz corpus: graph json seeds load, and no input crashes the reader") {
  Replay("symbol_json", [](const std::string& b) { return ir::GraphFromJson(b).graph != nullptr; });
}

TEST_CASE("fuzz corpus: params seeds load, and no input crashes the reader") {
  Replay("params", [](const std::string& b) {
    ir::ParseParams(b, "corpus.params");
    return true;
  });
}

TEST_CASE("fuzz corpus: ir text seeds parse, and no input crashes the parser") {
  Replay("ir_text", [](const std::string& b) {
    std::string once = ir::PrintGraph(*ir::ParseGraph(b));
    CHECK(ir::PrintGraph(*ir::ParseGraph(once)) == once);
    return true;
  });
}

TEST_CASE("fuzz corpus: npy seeds read, and no input crashes the reader") {
  Replay("npy", [](const std::string& b) {
    tools::ParseNpy(b, "corpus.npy");
    return true;
  });
}

TEST_CASE("fuzz corpus: idx seeds read, and no input crashes the reader") {
  Replay("idx", [](const std::string& b) {
    const auto* p = reinterpret_cast<const uint8_t*>(b.data());
    IdxHeader h = ParseIdxHeader(p, b.size(), "corpus.idx");
    std::vector<uint8_t> out(b.size() - h.data_offset);
    CopyIdxData(p, b.size(), h, out.data());
    return true;
  });
}

#ifdef KILN_WITH_CODEGEN
TEST_CASE("fuzz corpus: kernel cache seeds read, and a damaged file is a miss") {
  // The header fuzz_kernel_cache.cc expects of every file.
  const std::string header =
      "kiln-kernel 2\nkind elementwise\ntoolchain kiln-codegen fuzz; llvm 19.1.7\ntarget x86_64 avx2\n"
      "form 0:0,0,0,0000000000000000,0,0,0,0;root 0\nsymbol kiln_ew_fuzz\n";
  Replay("kernel_cache", [&](const std::string& b) {
    std::string artifact = codegen::detail::KernelFileArtifact(b, header);
    if (!artifact.empty()) CHECK(codegen::detail::KernelFileBytes(header, artifact) == b);
    return !artifact.empty();
  });
}
#endif

}  // namespace kiln
