// codegen's kernel cache (kiln/codegen/kernel_cache.h): what the disk cache writes, corrupt and
// foreign files, unwritable directories, eviction, and row kernels and PTX in the same cache with
// their own counters. A kernel stored by one process and loaded by the next, and processes writing
// one directory at once, are tests/python/test_codegen_cache.py's (they need several processes).
// Compiled only when kiln_tests links kiln_codegen (LLVM found): KILN_WITH_CODEGEN.
#ifdef KILN_WITH_CODEGEN
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "kiln/codegen/elementwise.h"
#include "kiln/codegen/kernel_cache.h"
#include "kiln/codegen/ptx.h"
#include "kiln/codegen/row.h"
#include "test_util.h"

namespace {

using kiln::codegen::CompileElementwise;
using kiln::codegen::CompileRow;
using kiln::codegen::Expr;
using kiln::codegen::KernelKind;
using kiln::codegen::RowProgram;
using kiln::testing::ScopedEnv;
namespace fs = std::filesystem;

using kiln::testing::Random;

/// A fresh, empty directory under the test run's cache directory (tests/cpp/main.cc sets one).
fs::path FreshDir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("kiln-cache-test-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string ReadAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// An expression no other test compiles: x * c + 1 for a constant unique to the caller.
Expr Unique(double c) {
  Expr e;
  e.Add(e.Mul(e.Input(0), e.Const(c)), e.Const(1));
  return e;
}

bool Computes(const Expr& e, double c) {
  std::vector<float> x = Random(1001, -2, 2, 9), out(x.size());
  const float* ins[] = {x.data()};
  CompileElementwise(e)->Run(ins, out.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i)
    if (std::fabs(out[i] - static_cast<float>(x[i] * c + 1)) > 1e-5f) return false;
  return true;
}

} // namespace

TEST_CASE("codegen disk cache: a compiled kernel is written to KILN_CACHE_DIR") {
  fs::path dir = FreshDir("write");
  ScopedEnv env("KILN_CACHE_DIR", dir.string());
  CHECK(kiln::codegen::DiskCacheDir() == dir.string());
  Expr e = Unique(1.0625);
  std::string file = kiln::codegen::DiskCacheFile(e);
  CHECK(fs::path(file).parent_path() == dir);
  auto before = kiln::codegen::GetCodegenStats();
  CHECK(Computes(e, 1.0625));
  auto after = kiln::codegen::GetCodegenStats();
  CHECK(after.compiles == before.compiles + 1);
  CHECK(after.disk_writes == before.disk_writes + 1);
  CHECK(after.disk_hits == before.disk_hits);
  std::string bytes = ReadAll(file);
  CHECK(bytes.rfind("kiln-kernel 2\nkind elementwise\ntoolchain " + kiln::codegen::ToolchainKey() +
                        "\ntarget llvm ",
                    0) == 0);
  CHECK(bytes.find("\x7f"
                   "ELF") != std::string::npos); // the object file follows the header
  // No temporary file is left behind.
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir))
    files += entry.path().extension() == ".kobj" ? 1 : 100;
  CHECK(files == 1);
  fs::remove_all(dir);
}

TEST_CASE("codegen disk cache: a corrupt or foreign file is a miss and is rewritten") {
  fs::path dir = FreshDir("corrupt");
  ScopedEnv env("KILN_CACHE_DIR", dir.string());
  for (double c : {2.0625, 3.0625}) {
    Expr e = Unique(c);
    std::string file = kiln::codegen::DiskCacheFile(e);
    // 2.0625: garbage; 3.0625: a valid header whose object was truncated (checksum fails).
    std::string text = c == 2.0625 ? std::string("not a kernel")
                                   : "kiln-kernel 1\ntarget x\nexpr y\nsymbol z\nobject 100 0\nshort";
    std::ofstream(file, std::ios::binary) << text;
    auto before = kiln::codegen::GetCodegenStats();
    CHECK(Computes(e, c));
    auto after = kiln::codegen::GetCodegenStats();
    CHECK(after.compiles == before.compiles + 1); // compiled, not loaded
    CHECK(after.disk_hits == before.disk_hits);
    CHECK(ReadAll(file).rfind("kiln-kernel 2\nkind elementwise\n", 0) == 0); // rewritten
  }
  fs::remove_all(dir);
}

TEST_CASE("codegen disk cache: an unusable directory costs a compile, never an answer") {
  fs::path dir = FreshDir("blocked");
  fs::path blocked = dir / "file";
  std::ofstream(blocked) << "a file where the cache directory should be";
  ScopedEnv env("KILN_CACHE_DIR", blocked.string());
  auto before = kiln::codegen::GetCodegenStats();
  CHECK(Computes(Unique(4.0625), 4.0625));
  auto after = kiln::codegen::GetCodegenStats();
  CHECK(after.compiles == before.compiles + 1);
  CHECK(after.disk_writes == before.disk_writes);
  fs::remove_all(dir);
}

TEST_CASE("codegen disk cache: KILN_CACHE_DIR=off writes nothing") {
  ScopedEnv env("KILN_CACHE_DIR", "off");
  CHECK(kiln::codegen::DiskCacheDir().empty());
  CHECK(kiln::codegen::DiskCacheFile(Unique(5.0625)).empty());
  auto before = kiln::codegen::GetCodegenStats();
  CHECK(Computes(Unique(5.0625), 5.0625));
  CHECK(kiln::codegen::GetCodegenStats().disk_writes == before.disk_writes);
}

TEST_CASE("codegen disk cache: beyond KILN_CACHE_MAX_MB the least recently used files go") {
  fs::path dir = FreshDir("evict");
  ScopedEnv env("KILN_CACHE_DIR", dir.string());
  ScopedEnv bound("KILN_CACHE_MAX_MB", "1");
  // Three old 450 KB files (1.35 MB with the new kernel's: over the bound), the oldest first.
  auto now = fs::file_time_type::clock::now();
  for (int k = 0; k < 3; ++k) {
    fs::path f = dir / ("old" + std::to_string(k) + ".kobj");
    std::ofstream(f, std::ios::binary) << std::string(450 << 10, 'x');
    fs::last_write_time(f, now - std::chrono::hours(10 - k));
  }
  std::ofstream(dir / "notes.txt") << "not a cache file: never deleted";
  Expr e = Unique(6.0625);
  CHECK(Computes(e, 6.0625));
  CHECK(fs::exists(kiln::codegen::DiskCacheFile(e))); // the newest stays
  CHECK_FALSE(fs::exists(dir / "old0.kobj"));         // the oldest went first
  CHECK_FALSE(fs::exists(dir / "old1.kobj"));         // down to 80% of the bound
  CHECK(fs::exists(dir / "old2.kobj"));
  CHECK(fs::exists(dir / "notes.txt"));
  fs::remove_all(dir);
}
// ---- row kernels and PTX in the same cache -------------------------------------------------------

namespace {

/// A row program no other test compiles: v0 = sum(x * c); out0 = v0 (a row sum scaled by c).
RowProgram UniqueRow(double c) {
  RowProgram p;
  p.inputs = {RowProgram::kElement};
  Expr s;
  s.Mul(s.Input(0), s.Const(c));
  p.AddReduce(RowProgram::kSum, s);
  p.AddRowOutput(0);
  return p;
}

bool RowComputes(const RowProgram& p, double c) {
  const int64_t rows = 3, len = 37;
  std::vector<float> x = Random(rows * len, -2, 2, 11), out(rows);
  const float* ins[] = {x.data()};
  float* outs[] = {out.data()};
  CompileRow(p)->Run(ins, outs, rows, len);
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (int64_t j = 0; j < len; ++j) sum += x[r * len + j] * c;
    if (std::fabs(out[r] - sum) > 1e-4) return false;
  }
  return true;
}

} // namespace

TEST_CASE("kernel cache: a row kernel is written to KILN_CACHE_DIR and counted as a row kernel") {
  fs::path dir = FreshDir("row");
  ScopedEnv env("KILN_CACHE_DIR", dir.string());
  RowProgram p = UniqueRow(1.0625);
  std::string file = kiln::codegen::DiskCacheFile(p);
  CHECK(fs::path(file).parent_path() == dir);
  auto ew = kiln::codegen::GetCodegenStats();
  auto before = kiln::codegen::GetRowStats();
  CHECK(RowComputes(p, 1.0625));
  auto after = kiln::codegen::GetRowStats();
  CHECK(after.compiles == before.compiles + 1);
  CHECK(after.disk_writes == before.disk_writes + 1);
  CHECK(kiln::codegen::GetCodegenStats().compiles == ew.compiles); // not counted as elementwise
  std::string bytes = ReadAll(file);
  CHECK(bytes.rfind("kiln-kernel 2\nkind row\ntoolchain ", 0) == 0);
  CHECK(bytes.find("\x7f"
                   "ELF") != std::string::npos);
  CHECK(RowComputes(p, 1.0625)); // the memory cache answers
  CHECK(kiln::codegen::GetRowStats().cache_hits == after.cache_hits + 1);
  // An elementwise kernel and a row kernel never share a file.
  CHECK(kiln::codegen::DiskCacheFile(UniqueRow(1.0625).steps[0].expr) != file);
  fs::remove_all(dir);
}

TEST_CASE("kernel cache: a corrupt row kernel file is a miss and is rewritten") {
  fs::path dir = FreshDir("row-corrupt");
  ScopedEnv env("KILN_CACHE_DIR", dir.string());
  RowProgram p = UniqueRow(2.0625);
  std::string file = kiln::codegen::DiskCacheFile(p);
  std::ofstream(file, std::ios::binary) << "kiln-kernel 2\nkind row\ntoolchain t\nobject 5 0\nab";
  auto before = kiln::codegen::GetRowStats();
  CHECK(RowComputes(p, 2.0625));
  auto after = kiln::codegen::GetRowStats();
  CHECK(after.compiles == before.compiles + 1);
  CHECK(after.disk_hits == before.disk_hits);
  CHECK(ReadAll(file).rfind("kiln-kernel 2\nkind row\ntoolchain kiln-codegen ", 0) == 0);
  fs::remove_all(dir);
}

TEST_CASE("kernel cache: PTX is kept on disk by expression and architecture") {
  fs::path dir = FreshDir("ptx");
  ScopedEnv env("KILN_CACHE_DIR", dir.string());
  Expr e = Unique(7.0625); // add and mul only: no libdevice needed
  auto before = kiln::codegen::GetKernelStats(KernelKind::kPtx);
  auto a = kiln::codegen::GeneratePtx(e, "sm_80");
  auto b = kiln::codegen::GeneratePtx(e, "sm_80");
  auto c = kiln::codegen::GeneratePtx(e, "sm_90");
  auto after = kiln::codegen::GetKernelStats(KernelKind::kPtx);
  CHECK(a.ptx == b.ptx);
  CHECK(a.ptx != c.ptx); // .target sm_80 against sm_90
  CHECK(after.compiles == before.compiles + 2);
  CHECK(after.cache_hits == before.cache_hits + 1);
  CHECK(after.disk_writes == before.disk_writes + 2);
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::string bytes = ReadAll(entry.path());
    CHECK(bytes.rfind("kiln-kernel 2\nkind ptx\n", 0) == 0);
    CHECK(bytes.find(".visible .entry " + a.name) != std::string::npos);
    ++files;
  }
  CHECK(files == 2);
  fs::remove_all(dir);
}

TEST_CASE("kernel cache: the counters of all kinds are the sums of each kind's") {
  CHECK(RowComputes(UniqueRow(3.0625), 3.0625));
  CHECK(Computes(Unique(8.0625), 8.0625));
  auto all = kiln::codegen::GetAllKernelStats();
  kiln::codegen::CodegenStats sum;
  for (KernelKind k : {KernelKind::kElementwise, KernelKind::kRow, KernelKind::kPtx})
    sum += kiln::codegen::GetKernelStats(k);
  CHECK(all.compiles == sum.compiles);
  CHECK(all.cache_hits == sum.cache_hits);
  CHECK(all.disk_hits == sum.disk_hits);
  CHECK(all.disk_writes == sum.disk_writes);
  CHECK(all.compiles >= 2);
  CHECK(std::string(kiln::codegen::KernelKindName(KernelKind::kRow)) == "row");
}
#endif // KILN_WITH_CODEGEN
