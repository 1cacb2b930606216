// The LLVM half of CompileElementwise: Expr -> LLVM IR loop -> O3 for the host CPU -> ORC LLJIT.
//
// Math functions: exp, log, sin, cos and pow are LLVM intrinsics; sqrt, fabs, floor, ceil and round
// are intrinsics that become single instructions. tanh, erf, log1p and expm1 call libm (tanhf, erff,
// log1pf, expm1f) resolved from the process's symbols. When glibc's libmvec loads, the vectorizer
// maps exp/log/sin/cos/pow to its 8-wide AVX2 variants; the libm calls stay scalar (LLVM 19 knows no
// vector form of them), so kernels using them are correct but not vectorized.
// The only translation unit of kiln that includes LLVM headers (TOOLCHAIN.md).
#include "kiln/codegen/llvm_jit.h"

#include <llvm/Analysis/TargetLibraryInfo.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/ExecutionEngine/Orc/CompileUtils.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/ThreadSafeModule.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/DynamicLibrary.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>

#include <string>
#include <vector>

namespace kiln::codegen::detail {
namespace {

/// Throws InternalError with LLVM's message when `e` holds an error.
template <class T>
T Unwrap(llvm::Expected<T> e, const char* what) {
  KILN_CHECK(static_cast<bool>(e)) << what << ": " << llvm::toString(e.takeError());
  return std::move(*e);
}

void Check(llvm::Error err, const char* what) {
  KILN_CHECK(!err) << what << ": " << llvm::toString(std::move(err));
}

/// The process-wide JIT: created on first use (a function-local static, so creation is
/// thread-safe) and never destroyed, because compiled kernels may outlive any owner.
struct Jit {
  std::unique_ptr<llvm::orc::LLJIT> lljit;
  std::unique_ptr<llvm::TargetMachine> tm;  // for the O3 pipeline's cost model
  llvm::Triple triple;
  std::string cpu, features;
  bool have_libmvec = false;
  std::string key;  // TargetKey()

  Jit() {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    auto jtmb = Unwrap(llvm::orc::JITTargetMachineBuilder::detectHost(), "codegen: detecting the host CPU");
    jtmb.setCodeGenOptLevel(llvm::CodeGenOptLevel::Aggressive);
    triple = jtmb.getTargetTriple();
    cpu = jtmb.getCPU();
    features = jtmb.getFeatures().getString();
    tm = Unwrap(jtmb.createTargetMachine(), "codegen: creating the target machine");
    lljit = Unwrap(llvm::orc::LLJITBuilder().setJITTargetMachineBuilder(std::move(jtmb)).create(),
                   "codegen: creating the ORC LLJIT");
    have_libmvec = !llvm::sys::DynamicLibrary::LoadLibraryPermanently("libmvec.so.1");
    // libmvec changes the code (vector math calls), so it is part of the key.
    key = "llvm " LLVM_VERSION_STRING "; " + triple.str() + "; " + cpu + "; " + features +
          (have_libmvec ? "; libmvec" : "");
    auto& dylib = lljit->getMainJITDylib();
    dylib.addGenerator(Unwrap(llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(
                                  lljit->getDataLayout().getGlobalPrefix()),
                              "codegen: exposing the process's symbols to the JIT"));
  }
};

Jit& GetJit() {
  static Jit* jit = new Jit;
  return *jit;
}

/// Builds one kernel function in `m`; throws UnsupportedError for a function it cannot lower.
class Lowering {
 public:
  Lowering(llvm::Module& m, const Jit& jit) : m_(m), ctx_(m.getContext()), b_(ctx_), jit_(jit) {}

  void Build(const Expr& e, const std::string& name) {
    auto* f32 = b_.getFloatTy();
    auto* i64 = b_.getInt64Ty();
    auto* ptr = b_.getPtrTy();
    auto* fty = llvm::FunctionType::get(b_.getVoidTy(), {ptr, ptr, i64, i64}, false);
    auto* fn = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, name, m_);
    fn->addFnAttr(llvm::Attribute::NoUnwind);
    fn->addFnAttr("target-cpu", jit_.cpu);
    fn->addFnAttr("target-features", jit_.features);
    llvm::Value* ins = fn->getArg(0);
    llvm::Value* out = fn->getArg(1);
    llvm::Value* begin = fn->getArg(2);
    llvm::Value* end = fn->getArg(3);
    fn->addParamAttr(0, llvm::Attribute::NoCapture);
    fn->addParamAttr(0, llvm::Attribute::ReadOnly);
    fn->addParamAttr(1, llvm::Attribute::NoCapture);

    auto* entry = llvm::BasicBlock::Create(ctx_, "entry", fn);
    auto* loop = llvm::BasicBlock::Create(ctx_, "loop", fn);
    auto* exit = llvm::BasicBlock::Create(ctx_, "exit", fn);

    b_.SetInsertPoint(entry);
    std::vector<llvm::Value*> in_ptrs(static_cast<size_t>(e.NumInputs()));
    for (size_t k = 0; k < in_ptrs.size(); ++k)
      in_ptrs[k] = b_.CreateLoad(ptr, b_.CreateConstInBoundsGEP1_64(ptr, ins, k), "in" + std::to_string(k));
    b_.CreateCondBr(b_.CreateICmpSLT(begin, end), loop, exit);

    b_.SetInsertPoint(loop);
    auto* i = b_.CreatePHI(i64, 2, "i");
    i->addIncoming(begin, entry);
    // a*b + c may become one FMA: the result differs from the unfused kernels by < 1 ulp.
    llvm::FastMathFlags fmf;
    fmf.setAllowContract();
    b_.setFastMathFlags(fmf);
    std::vector<llvm::Value*> v(e.nodes.size());
    for (size_t n = 0; n < e.nodes.size(); ++n) {
      const Expr::Node& node = e.nodes[n];
      switch (node.kind) {
        case Expr::Kind::kInput: {
          llvm::Value* at = i;
          if (node.outer > 0) {  // broadcast: (i / inner) % outer
            if (node.inner > 1) at = b_.CreateUDiv(at, b_.getInt64(static_cast<uint64_t>(node.inner)));
            at = b_.CreateURem(at, b_.getInt64(static_cast<uint64_t>(node.outer)));
          }
          v[n] = b_.CreateLoad(f32, b_.CreateInBoundsGEP(f32, in_ptrs[static_cast<size_t>(node.input)], at));
          break;
        }
        case Expr::Kind::kConst: v[n] = llvm::ConstantFP::get(f32, node.value); break;
        case Expr::Kind::kUnary: v[n] = LowerUnary(node.unary, v[static_cast<size_t>(node.a)]); break;
        case Expr::Kind::kBinary:
          v[n] = LowerBinary(node.binary, v[static_cast<size_t>(node.a)], v[static_cast<size_t>(node.b)]);
          break;
      }
    }
    b_.CreateStore(v[static_cast<size_t>(e.Output())], b_.CreateInBoundsGEP(f32, out, i));
    auto* next = b_.CreateAdd(i, b_.getInt64(1), "next", /*HasNUW=*/true, /*HasNSW=*/true);
    i->addIncoming(next, loop);
    b_.CreateCondBr(b_.CreateICmpSLT(next, end), loop, exit);

    b_.SetInsertPoint(exit);
    b_.CreateRetVoid();
  }

 private:
  llvm::Value* Intrinsic(llvm::Intrinsic::ID id, std::initializer_list<llvm::Value*> args) {
    return b_.CreateIntrinsic(id, {b_.getFloatTy()}, llvm::ArrayRef<llvm::Value*>(args));
  }

  /// A call to a float(float) function of libm, marked as reading no memory (kiln does not read errno).
  llvm::Value* Libm(const char* name, llvm::Value* x) {
    auto callee = m_.getOrInsertFunction(name, llvm::FunctionType::get(b_.getFloatTy(), {b_.getFloatTy()}, false));
    auto* f = llvm::cast<llvm::Function>(callee.getCallee());
    f->setDoesNotAccessMemory();
    f->setDoesNotThrow();
    f->setWillReturn();
    return b_.CreateCall(callee, {x});
  }

  llvm::Value* F(double c) { return llvm::ConstantFP::get(b_.getFloatTy(), c); }
  llvm::Value* Bool(llvm::Value* cond) { return b_.CreateSelect(cond, F(1), F(0)); }

  llvm::Value* LowerUnary(UnaryFn f, llvm::Value* x) {
    using I = llvm::Intrinsic::IndependentIntrinsics;
    switch (f) {
      case UnaryFn::kNeg: return b_.CreateFNeg(x);
      case UnaryFn::kAbs: return Intrinsic(I::fabs, {x});
      case UnaryFn::kSign:  // NaN -> 0, like (0 < x) - (x < 0)
        return b_.CreateSelect(b_.CreateFCmpOGT(x, F(0)), F(1), b_.CreateSelect(b_.CreateFCmpOLT(x, F(0)), F(-1), F(0)));
      case UnaryFn::kSquare: return b_.CreateFMul(x, x);
      case UnaryFn::kSqrt: return Intrinsic(I::sqrt, {x});
      case UnaryFn::kRsqrt: return b_.CreateFDiv(F(1), Intrinsic(I::sqrt, {x}));
      case UnaryFn::kReciprocal: return b_.CreateFDiv(F(1), x);
      case UnaryFn::kExp: return Intrinsic(I::exp, {x});
      case UnaryFn::kLog: return Intrinsic(I::log, {x});
      case UnaryFn::kLog1p: return Libm("log1pf", x);
      case UnaryFn::kExpm1: return Libm("expm1f", x);
      case UnaryFn::kSin: return Intrinsic(I::sin, {x});
      case UnaryFn::kCos: return Intrinsic(I::cos, {x});
      case UnaryFn::kTanh: return Libm("tanhf", x);
      case UnaryFn::kErf: return Libm("erff", x);
      case UnaryFn::kRelu: return b_.CreateSelect(b_.CreateFCmpOGT(x, F(0)), x, F(0));  // NaN -> 0
      case UnaryFn::kFloor: return Intrinsic(I::floor, {x});
      case UnaryFn::kCeil: return Intrinsic(I::ceil, {x});
      case UnaryFn::kRound: return Intrinsic(I::round, {x});  // half away from zero, like std::round
      case UnaryFn::kLogicalNot: return Bool(b_.CreateFCmpOEQ(x, F(0)));
      case UnaryFn::kIdentity: return x;
    }
    KILN_THROW(codegen::UnsupportedError) << "codegen: unary function " << static_cast<int>(f)
                                 << " has no LLVM lowering; run the group unfused";
  }

  llvm::Value* LowerBinary(BinaryFn f, llvm::Value* a, llvm::Value* c) {
    using I = llvm::Intrinsic::IndependentIntrinsics;
    switch (f) {
      case BinaryFn::kAdd: return b_.CreateFAdd(a, c);
      case BinaryFn::kSub: return b_.CreateFSub(a, c);
      case BinaryFn::kMul: return b_.CreateFMul(a, c);
      case BinaryFn::kDiv: return b_.CreateFDiv(a, c);
      case BinaryFn::kPow: return Intrinsic(I::pow, {a, c});
      // (a != a || a > b) ? a : b, the runtime kernels' NaN-propagating form.
      case BinaryFn::kMaximum: return b_.CreateSelect(b_.CreateOr(b_.CreateFCmpUNO(a, a), b_.CreateFCmpOGT(a, c)), a, c);
      case BinaryFn::kMinimum: return b_.CreateSelect(b_.CreateOr(b_.CreateFCmpUNO(a, a), b_.CreateFCmpOLT(a, c)), a, c);
      case BinaryFn::kEqual: return Bool(b_.CreateFCmpOEQ(a, c));
      case BinaryFn::kNotEqual: return Bool(b_.CreateFCmpUNE(a, c));
      case BinaryFn::kLess: return Bool(b_.CreateFCmpOLT(a, c));
      case BinaryFn::kLessEqual: return Bool(b_.CreateFCmpOLE(a, c));
      case BinaryFn::kGreater: return Bool(b_.CreateFCmpOGT(a, c));
      case BinaryFn::kGreaterEqual: return Bool(b_.CreateFCmpOGE(a, c));
    }
    KILN_THROW(codegen::UnsupportedError) << "codegen: binary function " << static_cast<int>(f)
                                 << " has no LLVM lowering; run the group unfused";
  }

  llvm::Module& m_;
  llvm::LLVMContext& ctx_;
  llvm::IRBuilder<> b_;
  const Jit& jit_;
};

/// The default O3 pipeline with the host's cost model and, when loaded, libmvec's vector math.
void Optimize(llvm::Module& m, Jit& jit) {
  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  llvm::TargetLibraryInfoImpl tlii(jit.triple);
  if (jit.have_libmvec) tlii.addVectorizableFunctionsFromVecLib(llvm::TargetLibraryInfoImpl::LIBMVEC_X86, jit.triple);
  fam.registerPass([&] { return llvm::TargetLibraryAnalysis(tlii); });
  llvm::PassBuilder pb(jit.tm.get());
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3).run(m, mam);
}

}  // namespace

std::string CompileObject(const Expr& e, const std::string& name, std::string* ir) {
  Jit& jit = GetJit();
  llvm::LLVMContext ctx;
  llvm::Module m(name, ctx);
  m.setDataLayout(jit.lljit->getDataLayout());
  m.setTargetTriple(jit.triple.str());
  Lowering(m, jit).Build(e, name);
  std::string verify_msg;
  llvm::raw_string_ostream verify_os(verify_msg);
  KILN_CHECK(!llvm::verifyModule(m, &verify_os)) << "codegen produced invalid IR for " << e.ToString() << ": "
                                                 << verify_os.str();
  Optimize(m, jit);
  if (ir) {
    ir->clear();
    llvm::raw_string_ostream os(*ir);
    m.print(os, nullptr);
  }
  // The same target machine LLJIT compiles with, so the object links as its own would.
  auto object = Unwrap(llvm::orc::SimpleCompiler(*jit.tm)(m), "codegen: emitting object code");
  return std::string(object->getBuffer());
}

CompiledKernel::Fn LoadObject(std::string_view object, const std::string& name) {
  Jit& jit = GetJit();
  Check(jit.lljit->addObjectFile(llvm::MemoryBuffer::getMemBufferCopy(llvm::StringRef(object.data(), object.size()), name)),
        "codegen: adding an object file to the JIT");
  auto addr = Unwrap(jit.lljit->lookup(name), "codegen: linking the compiled kernel");
  return addr.toPtr<CompiledKernel::Fn>();
}

const std::string& TargetKey() { return GetJit().key; }

}  // namespace kiln::codegen::detail
