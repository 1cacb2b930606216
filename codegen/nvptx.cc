// GeneratePtx: Expr -> LLVM IR kernel (grid-stride loop) -> libdevice linked, internalized -> O3
// with the NVPTX target machine (which also runs NVVMReflect) -> PTX text, kept in the kernel cache
// (kernel_cache.cc: memory and disk) by expression, architecture and libdevice.
#include "kiln/codegen/ptx.h"

#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/IR/IntrinsicsNVPTX.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IRReader/IRReader.h>
#include <llvm/Linker/Linker.h>
#include <llvm/MC/MCSubtargetInfo.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Support/SourceMgr.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/Transforms/IPO/Internalize.h>

#include <cstdlib>
#include <filesystem>

#include "kiln/runtime/error.h"
#include "kernel_cache.h"
#include "lower.h"

namespace kiln::codegen {
namespace {

constexpr const char* kTriple = "nvptx64-nvidia-cuda";

const llvm::Target& NvptxTarget() {
  static const llvm::Target* target = [] {
    LLVMInitializeNVPTXTargetInfo();
    LLVMInitializeNVPTXTarget();
    LLVMInitializeNVPTXTargetMC();
    LLVMInitializeNVPTXAsmPrinter();
    std::string err;
    const llvm::Target* t = llvm::TargetRegistry::lookupTarget(kTriple, err);
    KILN_CHECK(t) << "codegen: LLVM was built without the NVPTX target: " << err;
    return t;
  }();
  return *target;
}

/// The toolkit directories to look in, in order.
std::vector<std::filesystem::path> CudaRoots() {
  std::vector<std::filesystem::path> roots;
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"})
    if (const char* v = std::getenv(var); v && *v) roots.emplace_back(v);
  roots.emplace_back("/usr/local/cuda");
  return roots;
}

/// Builds `name`(out, in0.., n) computing `e` with a grid-stride loop, marked as a kernel.
void BuildKernel(llvm::Module& m, const Expr& e, const std::string& name) {
  llvm::LLVMContext& ctx = m.getContext();
  llvm::IRBuilder<> b(ctx);
  auto* ptr = b.getPtrTy();
  auto* i64 = b.getInt64Ty();
  std::vector<llvm::Type*> params(1 + static_cast<size_t>(e.NumInputs()), ptr);
  params.push_back(i64);
  auto* fn = llvm::Function::Create(llvm::FunctionType::get(b.getVoidTy(), params, false),
                                    llvm::Function::ExternalLinkage, name, m);
  fn->addFnAttr(llvm::Attribute::NoUnwind);
  llvm::Value* out = fn->getArg(0);
  std::vector<detail::InputRead> ins;
  for (int k = 0; k < e.NumInputs(); ++k) ins.push_back({.ptr = fn->getArg(static_cast<unsigned>(1 + k))});
  llvm::Value* n = fn->getArg(static_cast<unsigned>(1 + e.NumInputs()));

  auto* entry = llvm::BasicBlock::Create(ctx, "entry", fn);
  auto* loop = llvm::BasicBlock::Create(ctx, "loop", fn);
  auto* exit = llvm::BasicBlock::Create(ctx, "exit", fn);
  b.SetInsertPoint(entry);
  auto sreg = [&](llvm::Intrinsic::ID id) { return b.CreateZExt(b.CreateIntrinsic(id, {}, {}), i64); };
  llvm::Value* first = b.CreateAdd(b.CreateMul(sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_x),
                                               sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_ntid_x)),
                                   sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x));
  llvm::Value* stride = b.CreateMul(sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_x),
                                    sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_ntid_x));
  b.CreateCondBr(b.CreateICmpSLT(first, n), loop, exit);

  b.SetInsertPoint(loop);
  auto* i = b.CreatePHI(i64, 2, "i");
  i->addIncoming(first, entry);
  llvm::Value* result = detail::EmitExpr(b, m, e, detail::MathLib::kLibdevice, i, ins);
  b.CreateStore(result, b.CreateInBoundsGEP(b.getFloatTy(), out, i));
  llvm::Value* next = b.CreateAdd(i, stride, "next", /*HasNUW=*/true, /*HasNSW=*/true);
  i->addIncoming(next, loop);
  b.CreateCondBr(b.CreateICmpSLT(next, n), loop, exit);
  b.SetInsertPoint(exit);
  b.CreateRetVoid();

  // The NVPTX backend emits an .entry (a kernel) for functions listed as kernels here.
  llvm::Metadata* md[] = {llvm::ValueAsMetadata::get(fn), llvm::MDString::get(ctx, "kernel"),
                          llvm::ValueAsMetadata::get(b.getInt32(1))};
  m.getOrInsertNamedMetadata("nvvm.annotations")->addOperand(llvm::MDNode::get(ctx, md));
}

/// Links the libdevice functions `m` calls; everything but the kernel becomes internal so that O3
/// inlines what it uses and drops the rest.
void LinkLibdevice(llvm::Module& m, const std::string& kernel) {
  bool needs = false;
  for (const llvm::Function& f : m)
    needs |= f.isDeclaration() && f.getName().starts_with("__nv_");
  if (!needs) return;
  std::string path = FindLibdevice();
  if (path.empty())
    KILN_THROW(codegen::UnsupportedError) << "codegen: this GPU kernel calls libdevice functions, and no "
                                             "libdevice.10.bc was found under $CUDA_HOME, $CUDA_PATH or "
                                             "/usr/local/cuda/nvvm/libdevice; install the CUDA toolkit or set CUDA_HOME";
  llvm::SMDiagnostic diag;
  std::unique_ptr<llvm::Module> lib = llvm::getLazyIRFileModule(path, diag, m.getContext());
  KILN_CHECK(lib) << "codegen: cannot read libdevice '" << path << "': " << diag.getMessage().str();
  lib->setTargetTriple(m.getTargetTriple());
  lib->setDataLayout(m.getDataLayout());
  KILN_CHECK(!llvm::Linker::linkModules(m, std::move(lib), llvm::Linker::Flags::LinkOnlyNeeded))
      << "codegen: linking libdevice '" << path << "' failed";
  llvm::internalizeModule(m, [&](const llvm::GlobalValue& gv) { return gv.getName() == kernel; });
}

std::string Compile(const Expr& e, const std::string& arch, const std::string& name, std::string* ir) {
  const llvm::Target& target = NvptxTarget();
  llvm::TargetOptions options;
  std::unique_ptr<llvm::TargetMachine> tm(target.createTargetMachine(
      kTriple, arch, "", options, std::nullopt, std::nullopt, llvm::CodeGenOptLevel::Aggressive));
  KILN_CHECK(tm) << "codegen: cannot create an NVPTX target machine for " << arch;
  llvm::LLVMContext ctx;
  llvm::Module m(name, ctx);
  m.setTargetTriple(kTriple);
  m.setDataLayout(tm->createDataLayout());
  // libdevice asks __nvvm_reflect("__CUDA_FTZ"): 0 keeps denormals, as the CPU kernels do.
  m.addModuleFlag(llvm::Module::Override, "nvvm-reflect-ftz", uint32_t{0});
  BuildKernel(m, e, name);
  LinkLibdevice(m, name);
  detail::CheckModule(m, "the GPU kernel of " + e.ToString());

  detail::OptimizeO3(m, tm.get(), /*libmvec=*/false);  // the NVPTX machine adds NVVMReflect
  {  // the IR the PTX is made of: what the simulated GPU's emulator runs
    llvm::raw_string_ostream os(*ir);
    m.print(os, nullptr);
  }

  llvm::SmallString<0> ptx;
  llvm::raw_svector_ostream ptx_os(ptx);
  llvm::legacy::PassManager pm;
  KILN_CHECK(!tm->addPassesToEmitFile(pm, ptx_os, nullptr, llvm::CodeGenFileType::AssemblyFile))
      << "codegen: the NVPTX target cannot emit assembly";
  pm.run(m);
  return std::string(ptx.str());
}

}  // namespace

std::string FindLibdevice() {
  for (const auto& root : CudaRoots()) {
    auto p = root / "nvvm" / "libdevice" / "libdevice.10.bc";
    if (std::filesystem::exists(p)) return p.string();
  }
  return {};
}

std::string FindPtxas() {
  for (const auto& root : CudaRoots()) {
    auto p = root / "bin" / "ptxas";
    if (std::filesystem::exists(p)) return p.string();
  }
  if (const char* path = std::getenv("PATH")) {
    std::string s = path;
    for (size_t pos = 0; pos <= s.size();) {
      size_t end = std::min(s.find(':', pos), s.size());
      auto p = std::filesystem::path(s.substr(pos, end - pos)) / "ptxas";
      if (end > pos && std::filesystem::exists(p)) return p.string();
      pos = end + 1;
    }
  }
  return {};
}

PtxKernel GeneratePtx(const Expr& e, const std::string& arch) {
  e.Validate();
  const llvm::Target& target = NvptxTarget();
  {  // an architecture the backend does not know would otherwise be a warning and generic code
    std::unique_ptr<llvm::MCSubtargetInfo> sti(target.createMCSubtargetInfo(kTriple, "", ""));
    if (!sti->isCPUStringValid(arch)) {
      std::string known;
      for (const auto& cpu : sti->getAllProcessorDescriptions())
        if (std::string(cpu.Key).rfind("sm_", 0) == 0) known += (known.empty() ? "" : ", ") + std::string(cpu.Key);
      KILN_THROW(ValueError) << "GeneratePtx: unknown GPU architecture '" << arch << "'; expected one of " << known;
    }
  }
  detail::KernelRequest r;
  r.kind = KernelKind::kPtx;
  r.form = detail::ExactForm(e);
  // What else the PTX depends on: the architecture, and libdevice (which one, and whether any).
  std::string libdevice = FindLibdevice();
  std::error_code ec;
  uintmax_t libdevice_bytes = libdevice.empty() ? 0 : std::filesystem::file_size(libdevice, ec);
  r.target = std::string(kTriple) + "; " + arch + "; libdevice " + (libdevice.empty() ? "none" : libdevice) + " " +
             std::to_string(libdevice_bytes);
  r.unique_symbols = false;  // each PTX module is loaded on its own: names need not differ
  r.symbol = "kiln_ew_" + std::to_string(e.Hash());
  // The artifact holds the PTX (what a GPU loads) and, after a NUL, the NVPTX IR it came from
  // (what the simulated GPU's kernel emulator runs), so both come back from disk together.
  r.build = [&](const std::string& name, std::string* ir) {
    ir->clear();  // the cache hands in the IR of its last build: Compile appends
    std::string ptx = Compile(e, arch, name, ir);
    return ptx + std::string(1, '\0') + *ir;
  };
  r.link = [](std::string_view, const std::string&) -> void* { return nullptr; };
  r.make = [&](void*, std::string_view ptx, const std::string& name, const detail::Obtained& how) {
    auto k = std::make_shared<PtxKernel>();
    k->name = name;
    k->arch = arch;
    size_t nul = ptx.find('\0');
    k->ptx = std::string(ptx.substr(0, nul));
    if (nul != std::string_view::npos) k->ir = std::string(ptx.substr(nul + 1));
    k->num_inputs = e.NumInputs();
    k->compile_ms = how.ms;
    return k;
  };
  return *detail::GetOrBuildAs<PtxKernel>(r);
}

}  // namespace kiln::codegen
