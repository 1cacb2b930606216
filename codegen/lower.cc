// EmitExpr: the arithmetic of a fused expression in LLVM IR, for the host (intrinsics and libm)
// or for NVIDIA GPUs (libdevice). Semantics match the runtime's scalar kernels
// (kiln/runtime/scalar_fn.h): relu and sign map NaN to 0, maximum/minimum propagate a NaN first
// operand, comparisons yield 1.0f / 0.0f.
#include "lower.h"

#include <llvm/Analysis/TargetLibraryInfo.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Passes/PassBuilder.h>

#include <string>
#include <vector>

namespace kiln::codegen::detail {
namespace {

class Emitter {
 public:
  Emitter(llvm::IRBuilder<>& b, llvm::Module& m, MathLib lib) : b_(b), m_(m), lib_(lib) {}

  llvm::Value* Unary(UnaryFn f, llvm::Value* x) {
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
      case UnaryFn::kExp: return Math(I::exp, "expf", x);
      case UnaryFn::kLog: return Math(I::log, "logf", x);
      case UnaryFn::kLog1p: return Call("log1pf", {x});
      case UnaryFn::kExpm1: return Call("expm1f", {x});
      case UnaryFn::kSin: return Math(I::sin, "sinf", x);
      case UnaryFn::kCos: return Math(I::cos, "cosf", x);
      case UnaryFn::kTanh: return Call("tanhf", {x});
      case UnaryFn::kErf: return Call("erff", {x});
      case UnaryFn::kRelu: return b_.CreateSelect(b_.CreateFCmpOGT(x, F(0)), x, F(0));  // NaN -> 0
      case UnaryFn::kFloor: return Intrinsic(I::floor, {x});
      case UnaryFn::kCeil: return Intrinsic(I::ceil, {x});
      case UnaryFn::kRound: return Math(I::round, "roundf", x);  // half away from zero, like std::round
      case UnaryFn::kLogicalNot: return Bool(b_.CreateFCmpOEQ(x, F(0)));
      case UnaryFn::kIdentity: return x;
      default:
        if (IsComposite(f)) return ExpandUnary(*this, f, x);  // scalar_fn.h
        break;
    }
    KILN_THROW(codegen::UnsupportedError) << "codegen: unary function " << static_cast<int>(f)
                                          << " has no LLVM lowering; run the group unfused";
  }

  llvm::Value* Binary(BinaryFn f, llvm::Value* a, llvm::Value* c) {
    switch (f) {
      case BinaryFn::kAdd: return b_.CreateFAdd(a, c);
      case BinaryFn::kSub: return b_.CreateFSub(a, c);
      case BinaryFn::kMul: return b_.CreateFMul(a, c);
      case BinaryFn::kDiv: return b_.CreateFDiv(a, c);
      case BinaryFn::kPow:
        return lib_ == MathLib::kHost ? Intrinsic(llvm::Intrinsic::pow, {a, c}) : Call("powf", {a, c});
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

  llvm::Value* F(double c) { return llvm::ConstantFP::get(b_.getFloatTy(), c); }
  llvm::Value* Const(double c) { return F(c); }  // for ExpandUnary

 private:
  llvm::Value* Intrinsic(llvm::Intrinsic::ID id, std::initializer_list<llvm::Value*> args) {
    return b_.CreateIntrinsic(id, {b_.getFloatTy()}, llvm::ArrayRef<llvm::Value*>(args));
  }

  /// An LLVM intrinsic on the host (the vectorizer maps it to libmvec), libdevice's function on GPUs
  /// (NVPTX has no lowering of the transcendental intrinsics).
  llvm::Value* Math(llvm::Intrinsic::ID id, const char* name, llvm::Value* x) {
    return lib_ == MathLib::kHost ? Intrinsic(id, {x}) : Call(name, {x});
  }

  /// A call to the float function `name` of libm (host) or __nv_`name` of libdevice, marked as
  /// reading no memory (kiln does not read errno).
  llvm::Value* Call(const char* name, std::vector<llvm::Value*> args) {
    std::string fn = lib_ == MathLib::kHost ? std::string(name) : "__nv_" + std::string(name);
    std::vector<llvm::Type*> types(args.size(), b_.getFloatTy());
    auto callee = m_.getOrInsertFunction(fn, llvm::FunctionType::get(b_.getFloatTy(), types, false));
    auto* f = llvm::cast<llvm::Function>(callee.getCallee());
    f->setDoesNotAccessMemory();
    f->setDoesNotThrow();
    f->setWillReturn();
    return b_.CreateCall(callee, args);
  }

  llvm::Value* Bool(llvm::Value* cond) { return b_.CreateSelect(cond, F(1), F(0)); }

  llvm::IRBuilder<>& b_;
  llvm::Module& m_;
  MathLib lib_;
};

}  // namespace

llvm::Value* EmitExpr(llvm::IRBuilder<>& b, llvm::Module& m, const Expr& e, MathLib lib, llvm::Value* i,
                      const std::vector<InputRead>& inputs) {
  Emitter em(b, m, lib);
  auto load = [&](const Expr::Node& node) -> llvm::Value* {
    const InputRead& in = inputs.at(static_cast<size_t>(node.input));
    if (in.kind == InputRead::kValue) return in.value;
    if (in.kind == InputRead::kDirect)  // ptr was moved back by the stretch's start: not inbounds
      return b.CreateLoad(b.getFloatTy(), b.CreateGEP(b.getFloatTy(), in.ptr, i));
    llvm::Value* at = i;
    if (node.outer > 0) {  // broadcast: (i / inner) % outer
      if (node.inner > 1) at = b.CreateUDiv(at, b.getInt64(static_cast<uint64_t>(node.inner)));
      at = b.CreateURem(at, b.getInt64(static_cast<uint64_t>(node.outer)));
    }
    return b.CreateLoad(b.getFloatTy(), b.CreateInBoundsGEP(b.getFloatTy(), in.ptr, at));
  };
  llvm::FastMathFlags fmf;
  fmf.setAllowContract();
  b.setFastMathFlags(fmf);
  std::vector<llvm::Value*> v(e.nodes.size());
  for (size_t n = 0; n < e.nodes.size(); ++n) {
    const Expr::Node& node = e.nodes[n];
    switch (node.kind) {
      case Expr::Kind::kInput: v[n] = load(node); break;
      case Expr::Kind::kConst: v[n] = em.F(node.value); break;
      case Expr::Kind::kUnary: v[n] = em.Unary(node.unary, v[static_cast<size_t>(node.a)]); break;
      case Expr::Kind::kBinary:
        v[n] = em.Binary(node.binary, v[static_cast<size_t>(node.a)], v[static_cast<size_t>(node.b)]);
        break;
    }
  }
  return v[static_cast<size_t>(e.Output())];
}

void CheckModule(llvm::Module& m, const std::string& what) {
  std::string msg;
  llvm::raw_string_ostream os(msg);
  KILN_CHECK(!llvm::verifyModule(m, &os)) << "codegen produced invalid IR for " << what << ": " << os.str();
}

void OptimizeO3(llvm::Module& m, llvm::TargetMachine* tm, bool libmvec) {
  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  llvm::Triple triple(m.getTargetTriple());
  llvm::TargetLibraryInfoImpl tlii(triple);
  if (libmvec) tlii.addVectorizableFunctionsFromVecLib(llvm::TargetLibraryInfoImpl::LIBMVEC_X86, triple);
  fam.registerPass([&] { return llvm::TargetLibraryAnalysis(tlii); });
  llvm::PassBuilder pb(tm);
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3).run(m, mam);
}

}  // namespace kiln::codegen::detail
