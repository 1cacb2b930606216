// GeneratePtx: Expr -> LLVM IR kernel (grid-stride loop) -> libdevice linked, internalized -> O3
// with the NVPTX target machine (which also runs NVVMReflect) -> PTX text, kept in the kernel cache
// (kernel_cache.cc: memory and disk) by expression, architecture and libdevice. Also
// GenerateReducePtx: the row reductions (sum, max, min) of the GPU's reduction ops.
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
#include <functional>

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

/// A kernel function `name`(params) in `m`: external, nounwind, listed as a kernel (the NVPTX
/// backend emits an .entry for functions in nvvm.annotations).
llvm::Function* NewKernel(llvm::Module& m, const std::string& name, const std::vector<llvm::Type*>& params) {
  llvm::LLVMContext& ctx = m.getContext();
  auto* fn = llvm::Function::Create(llvm::FunctionType::get(llvm::Type::getVoidTy(ctx), params, false),
                                    llvm::Function::ExternalLinkage, name, m);
  fn->addFnAttr(llvm::Attribute::NoUnwind);
  llvm::Metadata* md[] = {llvm::ValueAsMetadata::get(fn), llvm::MDString::get(ctx, "kernel"),
                          llvm::ValueAsMetadata::get(llvm::ConstantInt::get(llvm::Type::getInt32Ty(ctx), 1))};
  m.getOrInsertNamedMetadata("nvvm.annotations")->addOperand(llvm::MDNode::get(ctx, md));
  return fn;
}

/// A special register (threadIdx.x, ...) as an i64.
llvm::Value* Sreg(llvm::IRBuilder<>& b, llvm::Intrinsic::ID id) {
  return b.CreateZExt(b.CreateIntrinsic(id, {}, {}), b.getInt64Ty());
}

/// Fills `fn` with a grid-stride loop over i < n: i = blockIdx.x * blockDim.x + threadIdx.x,
/// then + gridDim.x * blockDim.x; `body` emits the work of one i. `prologue` (optional) emits
/// values computed once, before the loop.
void GridStrideLoop(llvm::IRBuilder<>& b, llvm::Function* fn, llvm::Value* n,
                    const std::function<void(llvm::Value* i)>& body,
                    const std::function<void()>& prologue = nullptr) {
  llvm::LLVMContext& ctx = fn->getContext();
  auto* entry = llvm::BasicBlock::Create(ctx, "entry", fn);
  auto* loop = llvm::BasicBlock::Create(ctx, "loop", fn);
  auto* exit = llvm::BasicBlock::Create(ctx, "exit", fn);
  b.SetInsertPoint(entry);
  if (prologue) prologue();
  llvm::Value* first = b.CreateAdd(b.CreateMul(Sreg(b, llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_x),
                                               Sreg(b, llvm::Intrinsic::nvvm_read_ptx_sreg_ntid_x)),
                                   Sreg(b, llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x));
  llvm::Value* stride = b.CreateMul(Sreg(b, llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_x),
                                    Sreg(b, llvm::Intrinsic::nvvm_read_ptx_sreg_ntid_x));
  auto* from = b.GetInsertBlock();
  b.CreateCondBr(b.CreateICmpSLT(first, n), loop, exit);
  b.SetInsertPoint(loop);
  auto* i = b.CreatePHI(b.getInt64Ty(), 2, "i");
  i->addIncoming(first, from);
  body(i);
  llvm::Value* next = b.CreateAdd(i, stride, "next", /*HasNUW=*/true, /*HasNSW=*/true);
  i->addIncoming(next, b.GetInsertBlock());
  b.CreateCondBr(b.CreateICmpSLT(next, n), loop, exit);
  b.SetInsertPoint(exit);
  b.CreateRetVoid();
}

/// Builds `name`(out, in0.., n) computing `e` with a grid-stride loop.
void BuildKernel(llvm::Module& m, const Expr& e, const std::string& name) {
  llvm::IRBuilder<> b(m.getContext());
  std::vector<llvm::Type*> params(1 + static_cast<size_t>(e.NumInputs()), b.getPtrTy());
  params.push_back(b.getInt64Ty());
  llvm::Function* fn = NewKernel(m, name, params);
  std::vector<detail::InputRead> ins;
  for (int k = 0; k < e.NumInputs(); ++k) ins.push_back({.ptr = fn->getArg(static_cast<unsigned>(1 + k))});
  GridStrideLoop(b, fn, fn->getArg(static_cast<unsigned>(1 + e.NumInputs())), [&](llvm::Value* i) {
    llvm::Value* result = detail::EmitExpr(b, m, e, detail::MathLib::kLibdevice, i, ins);
    b.CreateStore(result, b.CreateInBoundsGEP(b.getFloatTy(), fn->getArg(0), i));
  });
}

/// `offset` += the element offset of linear index `i` over kGpuIndexDims dims (row-major, the last
/// fastest) whose sizes and strides are the i64 arguments of `fn` from `first` on (sizes, then
/// strides). Unused leading dims have size 1 and stride 0.
llvm::Value* EmitOffset(llvm::IRBuilder<>& b, llvm::Function* fn, unsigned first, llvm::Value* i) {
  llvm::Value* offset = b.getInt64(0);
  for (int d = kGpuIndexDims - 1; d >= 0; --d) {
    llvm::Value* size = fn->getArg(first + static_cast<unsigned>(d));
    llvm::Value* stride = fn->getArg(first + kGpuIndexDims + static_cast<unsigned>(d));
    offset = b.CreateAdd(offset, b.CreateMul(b.CreateURem(i, size), stride));
    if (d > 0) i = b.CreateUDiv(i, size);
  }
  return offset;
}

/// Builds `name`(out, in, rows, len, scale, kept sizes and strides, reduced sizes and strides):
/// one block of kReduceThreads threads per output row (a grid-stride loop over rows); row r's
/// elements j < len at in[offset of r over the kept dims + offset of j over the reduced dims];
/// each thread combines a strided share of the row, a tree in shared memory combines the threads,
/// thread 0 writes out[r] = result * scale. max/min keep a NaN once seen and take a later one (the
/// CPU kernels' rule, cpu/combine.h).
void BuildReduceKernel(llvm::Module& m, GpuReduce kind, const std::string& name) {
  llvm::LLVMContext& ctx = m.getContext();
  llvm::IRBuilder<> b(ctx);
  auto* ptr = b.getPtrTy();
  auto* i64 = b.getInt64Ty();
  auto* f32 = b.getFloatTy();
  std::vector<llvm::Type*> params = {ptr, ptr, i64, i64, f32};
  params.insert(params.end(), 4 * kGpuIndexDims, i64);
  llvm::Function* fn = NewKernel(m, name, params);
  llvm::Value *out = fn->getArg(0), *in = fn->getArg(1), *rows = fn->getArg(2), *len = fn->getArg(3),
              *scale = fn->getArg(4);
  const unsigned kept_args = 5, reduced_args = 5 + 2 * kGpuIndexDims;
  auto* smem_ty = llvm::ArrayType::get(f32, kReduceThreads);
  auto* smem = new llvm::GlobalVariable(m, smem_ty, false, llvm::GlobalValue::InternalLinkage,
                                        llvm::UndefValue::get(smem_ty), name + "_smem", nullptr,
                                        llvm::GlobalValue::NotThreadLocal, /*AddressSpace=*/3);
  smem->setAlignment(llvm::Align(4));
  const bool sum = kind == GpuReduce::kSum;
  const bool is_max = kind == GpuReduce::kMax;
  llvm::Value* identity = sum ? llvm::ConstantFP::get(f32, 0.0)
                              : llvm::ConstantFP::getInfinity(f32, /*Negative=*/is_max);
  auto combine = [&](llvm::Value* a, llvm::Value* x) -> llvm::Value* {
    if (sum) return b.CreateFAdd(a, x);
    llvm::Value* better = is_max ? b.CreateFCmpUGT(x, a) : b.CreateFCmpULT(x, a);  // or x is NaN
    return b.CreateSelect(b.CreateFCmpUNO(a, a), a, b.CreateSelect(better, x, a));
  };
  auto sreg = [&](llvm::Intrinsic::ID id) { return Sreg(b, id); };
  auto slot = [&](llvm::Value* t) { return b.CreateInBoundsGEP(smem_ty, smem, {b.getInt64(0), t}); };
  auto* entry = llvm::BasicBlock::Create(ctx, "entry", fn);
  auto* row_loop = llvm::BasicBlock::Create(ctx, "row", fn);
  auto* elem_loop = llvm::BasicBlock::Create(ctx, "elem", fn);
  auto* tree = llvm::BasicBlock::Create(ctx, "tree", fn);
  auto* tree_step = llvm::BasicBlock::Create(ctx, "tree_step", fn);
  auto* tree_join = llvm::BasicBlock::Create(ctx, "tree_join", fn);
  auto* tree_next = llvm::BasicBlock::Create(ctx, "tree_next", fn);
  auto* write = llvm::BasicBlock::Create(ctx, "write", fn);
  auto* row_next = llvm::BasicBlock::Create(ctx, "row_next", fn);
  auto* exit = llvm::BasicBlock::Create(ctx, "exit", fn);

  b.SetInsertPoint(entry);
  llvm::Value* tid = sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x);
  llvm::Value* nthreads = sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_ntid_x);
  llvm::Value* first_row = sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_x);
  llvm::Value* row_stride = sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_x);
  b.CreateCondBr(b.CreateICmpSLT(first_row, rows), row_loop, exit);

  // for (r = blockIdx.x; r < rows; r += gridDim.x): every thread of the block takes the same r.
  b.SetInsertPoint(row_loop);
  auto* r = b.CreatePHI(i64, 2, "r");
  r->addIncoming(first_row, entry);
  llvm::Value* base = EmitOffset(b, fn, kept_args, r);
  auto* elem_pre = b.GetInsertBlock();
  b.CreateCondBr(b.CreateICmpSLT(tid, len), elem_loop, tree);

  // for (j = tid; j < len; j += blockDim.x) acc = combine(acc, in[base + j * inner])
  b.SetInsertPoint(elem_loop);
  auto* j = b.CreatePHI(i64, 2, "j");
  auto* acc = b.CreatePHI(f32, 2, "acc");
  j->addIncoming(tid, elem_pre);
  acc->addIncoming(identity, elem_pre);
  llvm::Value* x = b.CreateLoad(f32, b.CreateInBoundsGEP(f32, in, b.CreateAdd(base, EmitOffset(b, fn, reduced_args, j))));
  llvm::Value* acc_next = combine(acc, x);
  llvm::Value* j_next = b.CreateAdd(j, nthreads);
  j->addIncoming(j_next, elem_loop);
  acc->addIncoming(acc_next, elem_loop);
  b.CreateCondBr(b.CreateICmpSLT(j_next, len), elem_loop, tree);

  // Each thread's partial into shared memory, then halves combined until thread 0 holds the row.
  b.SetInsertPoint(tree);
  auto* partial = b.CreatePHI(f32, 2, "partial");
  partial->addIncoming(identity, elem_pre);
  partial->addIncoming(acc_next, elem_loop);
  b.CreateStore(partial, slot(tid));
  b.CreateIntrinsic(llvm::Intrinsic::nvvm_barrier0, {}, {});
  auto* tree_pre = b.GetInsertBlock();
  b.CreateBr(tree_step);

  b.SetInsertPoint(tree_step);
  auto* half = b.CreatePHI(i64, 2, "half");
  half->addIncoming(b.getInt64(kReduceThreads / 2), tree_pre);
  auto* combine_block = llvm::BasicBlock::Create(ctx, "tree_combine", fn, tree_join);
  b.CreateCondBr(b.CreateICmpULT(tid, half), combine_block, tree_join);
  b.SetInsertPoint(combine_block);
  b.CreateStore(combine(b.CreateLoad(f32, slot(tid)), b.CreateLoad(f32, slot(b.CreateAdd(tid, half)))), slot(tid));
  b.CreateBr(tree_join);
  b.SetInsertPoint(tree_join);
  b.CreateIntrinsic(llvm::Intrinsic::nvvm_barrier0, {}, {});
  llvm::Value* half_next = b.CreateLShr(half, 1);
  b.CreateBr(tree_next);
  b.SetInsertPoint(tree_next);
  half->addIncoming(half_next, tree_next);
  b.CreateCondBr(b.CreateICmpNE(half_next, b.getInt64(0)), tree_step, write);

  b.SetInsertPoint(write);
  auto* do_write = llvm::BasicBlock::Create(ctx, "write0", fn, row_next);
  b.CreateCondBr(b.CreateICmpEQ(tid, b.getInt64(0)), do_write, row_next);
  b.SetInsertPoint(do_write);
  b.CreateStore(b.CreateFMul(b.CreateLoad(f32, slot(b.getInt64(0))), scale), b.CreateInBoundsGEP(f32, out, r));
  b.CreateBr(row_next);

  // Nobody reads slot 0 of this row after the barrier: the next row's stores may begin.
  b.SetInsertPoint(row_next);
  b.CreateIntrinsic(llvm::Intrinsic::nvvm_barrier0, {}, {});
  llvm::Value* r_next = b.CreateAdd(r, row_stride);
  r->addIncoming(r_next, row_next);
  b.CreateCondBr(b.CreateICmpSLT(r_next, rows), row_loop, exit);
  b.SetInsertPoint(exit);
  b.CreateRetVoid();
}

/// Builds `name`(out, in, n, sizes, strides): out[i] = in[offset of i] for i < n, elements of
/// `bytes` bytes moved as integers.
void BuildStridedCopyKernel(llvm::Module& m, int bytes, const std::string& name) {
  llvm::IRBuilder<> b(m.getContext());
  llvm::Type* elem = b.getIntNTy(static_cast<unsigned>(8 * bytes));
  std::vector<llvm::Type*> params = {b.getPtrTy(), b.getPtrTy(), b.getInt64Ty()};
  params.insert(params.end(), 2 * kGpuIndexDims, b.getInt64Ty());
  llvm::Function* fn = NewKernel(m, name, params);
  GridStrideLoop(b, fn, fn->getArg(2), [&](llvm::Value* i) {
    llvm::Value* x = b.CreateLoad(elem, b.CreateInBoundsGEP(elem, fn->getArg(1), EmitOffset(b, fn, 3, i)));
    b.CreateStore(x, b.CreateInBoundsGEP(elem, fn->getArg(0), i));
  });
}

/// Builds `name`(out, n, bits): out[i] = the low 8 * `bytes` bits of `bits`, for i < n.
void BuildFillKernel(llvm::Module& m, int bytes, const std::string& name) {
  llvm::IRBuilder<> b(m.getContext());
  llvm::Type* elem = b.getIntNTy(static_cast<unsigned>(8 * bytes));
  llvm::Function* fn = NewKernel(m, name, {b.getPtrTy(), b.getInt64Ty(), b.getInt64Ty()});
  llvm::Value* value = nullptr;
  GridStrideLoop(
      b, fn, fn->getArg(1), [&](llvm::Value* i) { b.CreateStore(value, b.CreateInBoundsGEP(elem, fn->getArg(0), i)); },
      [&] { value = b.CreateTrunc(fn->getArg(2), elem); });
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

/// PTX for `arch` of the kernel `build` adds to a fresh module as `name` (`what` names it in
/// errors); the optimized NVPTX IR goes to `ir`.
std::string Compile(const std::function<void(llvm::Module&)>& build, const std::string& what,
                    const std::string& arch, const std::string& name, std::string* ir) {
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
  build(m);
  LinkLibdevice(m, name);
  detail::CheckModule(m, what);

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

/// An architecture the backend does not know would otherwise be a warning and generic code.
void CheckArch(const std::string& arch, const char* call) {
  const llvm::Target& target = NvptxTarget();
  std::unique_ptr<llvm::MCSubtargetInfo> sti(target.createMCSubtargetInfo(kTriple, "", ""));
  if (!sti->isCPUStringValid(arch)) {
    std::string known;
    for (const auto& cpu : sti->getAllProcessorDescriptions())
      if (std::string(cpu.Key).rfind("sm_", 0) == 0) known += (known.empty() ? "" : ", ") + std::string(cpu.Key);
    KILN_THROW(ValueError) << call << ": unknown GPU architecture '" << arch << "'; expected one of " << known;
  }
}

/// The kernel cache's artifact of a PTX kernel: the PTX, a NUL, the NVPTX IR.
std::shared_ptr<PtxKernel> FromArtifact(std::string_view artifact, const std::string& name, const std::string& arch,
                                        int num_inputs, double ms) {
  auto k = std::make_shared<PtxKernel>();
  k->name = name;
  k->arch = arch;
  size_t nul = artifact.find('\0');
  k->ptx = std::string(artifact.substr(0, nul));
  if (nul != std::string_view::npos) k->ir = std::string(artifact.substr(nul + 1));
  k->num_inputs = num_inputs;
  k->compile_ms = ms;
  return k;
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
  CheckArch(arch, "GeneratePtx");
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
    std::string ptx = Compile([&](llvm::Module& m) { BuildKernel(m, e, name); }, "the GPU kernel of " + e.ToString(),
                              arch, name, ir);
    return ptx + std::string(1, '\0') + *ir;
  };
  r.link = [](std::string_view, const std::string&, std::shared_ptr<void>*) -> void* { return nullptr; };
  r.make = [&](void*, std::string_view artifact, const std::string& name, const detail::Obtained& how) {
    return FromArtifact(artifact, name, arch, e.NumInputs(), how.ms);
  };
  return *detail::GetOrBuildAs<PtxKernel>(r);
}

namespace {

/// A PTX kernel that takes no expression (reductions, copies, fills), from the kernel cache.
PtxKernel GenerateFixedPtx(const std::string& form, const std::string& symbol, const std::string& what,
                           const std::string& arch, const std::function<void(llvm::Module&, const std::string&)>& build,
                           int num_inputs) {
  detail::KernelRequest r;
  r.kind = KernelKind::kPtx;
  r.form = form;
  r.target = std::string(kTriple) + "; " + arch;
  r.unique_symbols = false;
  r.symbol = symbol;
  r.build = [&](const std::string& name, std::string* ir) {
    ir->clear();
    std::string ptx = Compile([&](llvm::Module& m) { build(m, name); }, what, arch, name, ir);
    return ptx + std::string(1, '\0') + *ir;
  };
  r.link = [](std::string_view, const std::string&, std::shared_ptr<void>*) -> void* { return nullptr; };
  r.make = [&](void*, std::string_view artifact, const std::string& name, const detail::Obtained& how) {
    return FromArtifact(artifact, name, arch, num_inputs, how.ms);
  };
  return *detail::GetOrBuildAs<PtxKernel>(r);
}

/// 1, 2, 4 or 8 bytes: the element sizes the copy and fill kernels move.
std::string ElementBytes(int bytes, const char* call) {
  KILN_CHECK(bytes == 1 || bytes == 2 || bytes == 4 || bytes == 8) << call << ": elements of " << bytes << " bytes";
  return std::to_string(bytes);
}

}  // namespace

PtxKernel GenerateReducePtx(GpuReduce kind, const std::string& arch) {
  CheckArch(arch, "GenerateReducePtx");
  static const char* const kNames[] = {"sum", "max", "min"};
  const std::string what = kNames[static_cast<int>(kind)];
  return GenerateFixedPtx("reduce " + what + " " + std::to_string(kReduceThreads) + " dims " +
                              std::to_string(kGpuIndexDims),
                          "kiln_reduce_" + what, "the GPU " + what + " reduction", arch,
                          [&](llvm::Module& m, const std::string& name) { BuildReduceKernel(m, kind, name); }, 1);
}

PtxKernel GenerateStridedCopyPtx(int element_bytes, const std::string& arch) {
  CheckArch(arch, "GenerateStridedCopyPtx");
  const std::string what = ElementBytes(element_bytes, "GenerateStridedCopyPtx");
  return GenerateFixedPtx("strided copy " + what + " dims " + std::to_string(kGpuIndexDims), "kiln_strided_copy_" + what,
                          "the GPU strided copy", arch,
                          [&](llvm::Module& m, const std::string& name) { BuildStridedCopyKernel(m, element_bytes, name); },
                          1);
}

PtxKernel GenerateFillPtx(int element_bytes, const std::string& arch) {
  CheckArch(arch, "GenerateFillPtx");
  const std::string what = ElementBytes(element_bytes, "GenerateFillPtx");
  return GenerateFixedPtx("fill " + what, "kiln_fill_" + what, "the GPU fill", arch,
                          [&](llvm::Module& m, const std::string& name) { BuildFillKernel(m, element_bytes, name); }, 0);
}

}  // namespace kiln::codegen
