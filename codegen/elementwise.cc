// Expr helpers, the kernel caches of CompileElementwise (memory and disk) and the threaded Run.
// No LLVM here: lowering, object emission and linking are in llvm_jit.cc.
//
// The disk cache: one file per kernel in KILN_CACHE_DIR (default $XDG_CACHE_HOME/kiln or
// ~/.cache/kiln), named by a hash of the expression's exact form and the target key, holding a
// header (format, target key, expression, symbol, size and checksum of the object) and the
// object file. A file whose header does not match exactly, or whose checksum fails, is a miss
// and is rewritten. Files are written atomically, touched when used, and the least recently used
// are deleted when the directory holds more than KILN_CACHE_MAX_MB. Any failure of the disk cache
// (unwritable directory, corrupt file) costs a compile and one warning, never an answer.
#include "kiln/codegen/elementwise.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "kiln/codegen/llvm_jit.h"
#include "kiln/ir/serialize.h"
#include "kiln/runtime/cpu/loops.h"
#include "kiln/runtime/env.h"

namespace kiln::codegen {
namespace {

uint64_t Mix(uint64_t h, uint64_t v) {  // splitmix64 step folded into h
  v += 0x9e3779b97f4a7c15ULL + h;
  v = (v ^ (v >> 30)) * 0xbf58476d1ce4e5b9ULL;
  v = (v ^ (v >> 27)) * 0x94d049bb133111ebULL;
  return v ^ (v >> 31);
}

const char* UnaryName(UnaryFn f) {
  static const char* names[] = {
#define KILN_X(Id, name, nd_name, domain, doc) #name,
      KILN_UNARY_OPS(KILN_X)
#undef KILN_X
      "identity"};
  auto i = static_cast<size_t>(f);
  return i < std::size(names) ? names[i] : "unary?";
}

const char* BinaryName(BinaryFn f) {
  static const char* names[] = {
#define KILN_X(Id, name, nd_name, doc) #name,
      KILN_BINARY_OPS(KILN_X)
#undef KILN_X
  };
  auto i = static_cast<size_t>(f);
  return i < std::size(names) ? names[i] : "binary?";
}

struct ExprHash {
  size_t operator()(const Expr& e) const { return static_cast<size_t>(e.Hash()); }
};

struct Cache {
  std::mutex mu;  // held while compiling, so one expression is never built twice
  std::unordered_map<Expr, std::shared_ptr<CompiledKernel>, ExprHash> kernels;
  std::unordered_set<std::string> symbols;  // defined in the JIT (or failed to be): never reused
  CodegenStats stats;
  std::string last_ir;
  bool warned = false;  // the disk cache's one warning
  // The disk cache directory's size as this process knows it: listed on the first write to a
  // directory, then counted up by what is written, and listed again only past the bound (so N
  // cold compiles cost N writes, not N directory listings).
  std::string disk_dir;
  uint64_t disk_bytes = 0;
};

Cache& GetCache() {
  static Cache* cache = new Cache;  // leaked: kernels may be used during static destruction
  return *cache;
}

constexpr const char* kFormat = "kiln-kernel 1";
namespace fs = std::filesystem;

/// The exact form of `e` (constants as bit patterns): the disk cache compares it, so that two
/// expressions with the same hash never share a file.
std::string ExactForm(const Expr& e) {
  std::string s;
  char buf[96];
  for (const Expr::Node& n : e.nodes) {
    uint64_t bits;
    std::memcpy(&bits, &n.value, sizeof bits);
    std::snprintf(buf, sizeof buf, "%d:%d,%" PRId64 ",%" PRId64 ",%016" PRIx64 ",%d,%d,%d,%d;", static_cast<int>(n.kind),
                  n.input, n.inner, n.outer, bits, static_cast<int>(n.unary), static_cast<int>(n.binary), n.a, n.b);
    s += buf;
  }
  return s + "root " + std::to_string(e.Output());
}

uint64_t HashBytes(std::string_view b) {  // FNV-1a, then mixed: a checksum, not security
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : b) h = (h ^ c) * 0x100000001b3ULL;
  return Mix(h, b.size());
}

std::string Hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

void WarnOnce(Cache& cache, const std::string& what) {
  if (cache.warned) return;
  cache.warned = true;
  std::fprintf(stderr, "kiln: warning: kernel disk cache: %s; kernels are compiled instead (this warning is shown once)\n",
               what.c_str());
}

/// The disk cache's directory, or empty when it is off (KILN_CACHE_DIR=off, or no home).
fs::path CacheDir() {
  std::string dir = env::Get("KILN_CACHE_DIR");
  if (dir == "off") return {};
  if (!dir.empty()) return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return fs::path(xdg) / "kiln";
  if (const char* home = std::getenv("HOME"); home && *home) return fs::path(home) / ".cache" / "kiln";
  return {};
}

/// The header line block of a cache file for `form` under this target.
std::string Header(const std::string& form, const std::string& symbol) {
  return std::string(kFormat) + "\ntarget " + detail::TargetKey() + "\nexpr " + form + "\nsymbol " + symbol + "\n";
}

/// The object in `file` when its header is `header` and its checksum holds; empty otherwise.
std::string ReadCached(const fs::path& file, const std::string& header) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return {};
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.compare(0, header.size(), header) != 0) return {};
  size_t eol = bytes.find('\n', header.size());
  if (eol == std::string::npos) return {};
  unsigned long long size = 0, sum = 0;
  if (std::sscanf(bytes.c_str() + header.size(), "object %llu %llx", &size, &sum) != 2) return {};
  std::string object = bytes.substr(eol + 1);
  if (object.size() != size || HashBytes(object) != sum) return {};
  return object;
}

/// When the directory holds more than `max_bytes` of cache files, deletes the least recently used
/// until it holds at most 80% of that. Returns the bytes of cache files left.
uint64_t Evict(const fs::path& dir, uint64_t max_bytes) {
  struct File {
    fs::path path;
    fs::file_time_type used;
    uint64_t bytes;
  };
  std::vector<File> files;
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() != ".kobj" || !entry.is_regular_file(ec)) continue;
    File f{entry.path(), entry.last_write_time(ec), entry.file_size(ec)};
    if (ec) continue;  // deleted meanwhile by another process
    total += f.bytes;
    files.push_back(std::move(f));
  }
  if (total <= max_bytes) return total;
  std::sort(files.begin(), files.end(), [](const File& a, const File& b) { return a.used < b.used; });
  for (const File& f : files) {
    if (total <= max_bytes / 10 * 8) break;
    if (fs::remove(f.path, ec)) total -= f.bytes;
  }
  return total;
}

uint64_t DiskKey(const std::string& form) { return Mix(HashBytes(form), HashBytes(detail::TargetKey())); }

/// Compiles `e` through the disk cache: loads its object when a valid file exists, otherwise
/// compiles and stores it. Sets `from_disk`.
CompiledKernel::Fn CompileCached(Cache& cache, const Expr& e, bool* from_disk) {
  *from_disk = false;
  std::string form = ExactForm(e);
  uint64_t key = DiskKey(form);
  std::string symbol = "kiln_ew_" + Hex(key);
  fs::path dir = CacheDir();
  if (cache.symbols.count(symbol)) {  // a hash collision in this process, or a failed link: no disk
    symbol += "_" + std::to_string(cache.symbols.size());
    dir.clear();
  }
  fs::path file = dir.empty() ? fs::path() : dir / (Hex(key) + ".kobj");
  std::string header = Header(form, symbol);
  if (!dir.empty()) {
    std::string object = ReadCached(file, header);
    if (!object.empty()) {
      cache.symbols.insert(symbol);
      try {
        CompiledKernel::Fn fn = detail::LoadObject(object, symbol);
        std::error_code ec;
        fs::last_write_time(file, fs::file_time_type::clock::now(), ec);  // recently used
        *from_disk = true;
        cache.last_ir.clear();
        return fn;
      } catch (const InternalError& err) {  // linked badly: compile under a fresh name
        WarnOnce(cache, "'" + file.string() + "' did not link (" + err.what() + ")");
        symbol += "_" + std::to_string(cache.symbols.size());
        header = Header(form, symbol);
      }
    }
  }
  cache.symbols.insert(symbol);
  std::string object = detail::CompileObject(e, symbol, &cache.last_ir);
  CompiledKernel::Fn fn = detail::LoadObject(object, symbol);
  if (!dir.empty()) {
    try {
      std::error_code ec;
      fs::create_directories(dir, ec);
      std::string bytes = header + "object " + std::to_string(object.size()) + " " + Hex(HashBytes(object)) + "\n" + object;
      ir::WriteFileAtomic(file.string(), bytes);
      ++cache.stats.disk_writes;
      uint64_t max_bytes = static_cast<uint64_t>(std::max<int64_t>(env::GetInt("KILN_CACHE_MAX_MB"), 1)) << 20;
      if (cache.disk_dir != dir.string()) {
        cache.disk_dir = dir.string();
        cache.disk_bytes = Evict(dir, max_bytes);
      } else if ((cache.disk_bytes += bytes.size()) > max_bytes) {
        cache.disk_bytes = Evict(dir, max_bytes);
      }
    } catch (const Error& err) {
      WarnOnce(cache, err.what());
    }
  }
  return fn;
}

}  // namespace

int Expr::NumInputs() const {
  int n = 0;
  for (const Node& node : nodes)
    if (node.kind == Kind::kInput) n = std::max(n, node.input + 1);
  return n;
}

uint64_t Expr::Hash() const {
  uint64_t h = Mix(0, nodes.size());
  for (const Node& n : nodes) {
    h = Mix(h, static_cast<uint64_t>(n.kind));
    switch (n.kind) {
      case Kind::kInput:
        h = Mix(Mix(Mix(h, static_cast<uint64_t>(n.input)), static_cast<uint64_t>(n.inner)),
                static_cast<uint64_t>(n.outer));
        break;
      case Kind::kConst: {
        uint64_t bits;
        std::memcpy(&bits, &n.value, sizeof bits);
        h = Mix(h, bits);
        break;
      }
      case Kind::kUnary: h = Mix(Mix(h, static_cast<uint64_t>(n.unary)), static_cast<uint64_t>(n.a)); break;
      case Kind::kBinary:
        h = Mix(Mix(Mix(h, static_cast<uint64_t>(n.binary)), static_cast<uint64_t>(n.a)),
                static_cast<uint64_t>(n.b));
        break;
    }
  }
  return Mix(h, static_cast<uint64_t>(Output()));
}

void Expr::Validate() const {
  if (nodes.empty()) throw UnsupportedError("codegen: empty elementwise expression");
  int out = Output();
  if (out < 0 || out >= static_cast<int>(nodes.size()))
    KILN_THROW(codegen::UnsupportedError) << "codegen: root " << out << " is not a node of an expression with "
                                 << nodes.size() << " nodes";
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    auto bad = [&](int32_t x) { return x < 0 || x >= static_cast<int32_t>(i); };
    if ((n.kind == Kind::kInput && (n.input < 0 || n.inner < 1 || n.outer < 0)) || (n.kind == Kind::kUnary && bad(n.a)) ||
        (n.kind == Kind::kBinary && (bad(n.a) || bad(n.b))))
      KILN_THROW(codegen::UnsupportedError) << "codegen: node " << i << " refers to a negative input or to a node "
                                   << "that does not come before it; nodes must be in topological order";
  }
}

std::string Expr::ToString() const {
  std::vector<std::string> s(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    std::ostringstream os;
    switch (n.kind) {
      case Kind::kInput:
        os << "in" << n.input;
        if (n.outer > 0) os << "[i/" << n.inner << "%" << n.outer << "]";
        break;
      case Kind::kConst: os << n.value; break;
      case Kind::kUnary: os << UnaryName(n.unary) << "(" << s.at(n.a) << ")"; break;
      case Kind::kBinary: os << BinaryName(n.binary) << "(" << s.at(n.a) << ", " << s.at(n.b) << ")"; break;
    }
    s[i] = os.str();
  }
  return nodes.empty() ? "<empty>" : s.at(Output());
}

void CompiledKernel::Run(const float* const* ins, float* out, int64_t n) const {
  // 32K floats per chunk at least: below that the fork-join costs more than the loop.
  host::ParallelFor(n, int64_t{1} << 15, [&](int64_t b, int64_t e) { fn_(ins, out, b, e); });
}

std::shared_ptr<CompiledKernel> CompileElementwise(const Expr& e) {
  e.Validate();
  Cache& cache = GetCache();
  std::lock_guard<std::mutex> lock(cache.mu);
  if (auto it = cache.kernels.find(e); it != cache.kernels.end()) {
    ++cache.stats.cache_hits;
    return it->second;
  }
  auto t0 = std::chrono::steady_clock::now();
  bool from_disk = false;
  CompiledKernel::Fn fn;
  try {
    fn = CompileCached(cache, e, &from_disk);
  } catch (const InternalError& err) {  // LLVM refused: the caller runs the ops unfused
    std::fprintf(stderr, "kiln: warning: codegen could not compile %s (%s); it runs unfused\n", e.ToString().c_str(),
                 err.what());
    KILN_THROW(codegen::UnsupportedError) << "codegen: compiling " << e.ToString() << " failed: " << err.what();
  }
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  auto kernel = std::make_shared<CompiledKernel>(fn, e.NumInputs(), ms, e.ToString(), from_disk);
  cache.kernels.emplace(e, kernel);
  ++(from_disk ? cache.stats.disk_hits : cache.stats.compiles);
  cache.stats.compile_ms += ms;
  return kernel;
}

CodegenStats GetCodegenStats() {
  Cache& cache = GetCache();
  std::lock_guard<std::mutex> lock(cache.mu);
  return cache.stats;
}

std::string DiskCacheDir() { return CacheDir().string(); }

std::string DiskCacheFile(const Expr& e) {
  fs::path dir = CacheDir();
  return dir.empty() ? std::string() : (dir / (Hex(DiskKey(ExactForm(e))) + ".kobj")).string();
}

std::string LastOptimizedIR() {
  Cache& cache = GetCache();
  std::lock_guard<std::mutex> lock(cache.mu);
  return cache.last_ir;
}

}  // namespace kiln::codegen
