// Expr helpers, CompileElementwise through the kernel cache (kernel_cache.cc: memory and disk) and
// the threaded Run. No LLVM here: lowering, object emission and linking are in llvm_jit.cc.
#include "kiln/codegen/elementwise.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <sstream>

#include "kernel_cache.h"
#include "kiln/codegen/llvm_jit.h"
#include "kiln/runtime/cpu/loops.h"

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
  detail::KernelRequest r;
  r.kind = KernelKind::kElementwise;
  r.form = detail::ExactForm(e);
  r.target = detail::TargetKey();
  r.build = [&](const std::string& symbol, std::string* ir) { return detail::CompileObject(e, symbol, ir); };
  r.link = [](std::string_view object, const std::string& symbol, std::shared_ptr<void>* code) {
    return reinterpret_cast<void*>(detail::LoadObject(object, symbol, code));
  };
  r.make = [&](void* fn, std::string_view, const std::string&, const detail::Obtained& how) {
    return std::make_shared<CompiledKernel>(reinterpret_cast<CompiledKernel::Fn>(fn), e.NumInputs(), how.ms,
                                            e.ToString(), how.from_disk, how.code);
  };
  try {
    return detail::GetOrBuildAs<CompiledKernel>(r);
  } catch (const InternalError& err) {  // LLVM refused: the caller runs the ops unfused
    std::fprintf(stderr, "kiln: warning: codegen could not compile %s (%s); it runs unfused\n", e.ToString().c_str(),
                 err.what());
    KILN_THROW(codegen::UnsupportedError) << "codegen: compiling " << e.ToString() << " failed: " << err.what();
  }
}

CodegenStats GetCodegenStats() { return GetKernelStats(KernelKind::kElementwise); }

std::string DiskCacheFile(const Expr& e) {
  return detail::DiskCacheFileOf(KernelKind::kElementwise, detail::ExactForm(e), detail::TargetKey());
}

std::string LastOptimizedIR() { return detail::LastIR(KernelKind::kElementwise); }

}  // namespace kiln::codegen
