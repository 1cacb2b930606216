// The LLVM half of CompileElementwise: Expr -> LLVM IR loop -> O3 for the host CPU -> ORC LLJIT.
//
// Math functions (lower.cc): exp, log, sin, cos and pow are LLVM intrinsics; sqrt, fabs, floor, ceil
// and round are intrinsics that become single instructions. tanh, erf, log1p and expm1 call libm
// (tanhf, erff, log1pf, expm1f) resolved from the process's symbols. When glibc's libmvec loads, the vectorizer
// maps exp/log/sin/cos/pow to its 8-wide AVX2 variants; the libm calls stay scalar (LLVM 19 knows no
// vector form of them), so kernels using them are correct but not vectorized.
// LLVM headers are included only by codegen's .cc files (TOOLCHAIN.md: they are slow to compile).
#include "kiln/codegen/llvm_jit.h"

#include "lower.h"

#include <llvm/Config/llvm-config.h>
#include <llvm/ExecutionEngine/Orc/CompileUtils.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/ThreadSafeModule.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/DynamicLibrary.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
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
    // Kernels reach the JIT as object files (LoadObject), never as IR, and have no static
    // constructors: no compile function is built up front and the data layout is our target
    // machine's (the defaults build two more target machines), and no platform runtime is set up.
    // A process whose kernels all come from the disk cache starts the JIT in about 0.7 ms, not 1.2.
    lljit = Unwrap(llvm::orc::LLJITBuilder()
                       .setJITTargetMachineBuilder(std::move(jtmb))
                       .setDataLayout(tm->createDataLayout())
                       .setCompileFunctionCreator(
                           [](llvm::orc::JITTargetMachineBuilder b)
                               -> llvm::Expected<std::unique_ptr<llvm::orc::IRCompileLayer::IRCompiler>> {
                             return std::make_unique<llvm::orc::ConcurrentIRCompiler>(std::move(b));
                           })
                       .setPlatformSetUp(llvm::orc::setUpInactivePlatform)
                       .create(),
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

std::atomic<bool>& JitExiting() {
  static std::atomic<bool> exiting{false};
  return exiting;
}

Jit& GetJit() {
  static Jit* jit = [] {
    auto* j = new Jit;
    std::atexit([] { JitExiting().store(true); });  // runs before the destructors of LLVM's statics
    return j;
  }();
  return *jit;
}

/// The thread PrewarmJit starts, joined when the process exits (the Jit itself stays).
struct Prewarm {
  std::thread thread;
  ~Prewarm() {
    if (thread.joinable()) thread.join();
  }
};

/// Builds the host kernel function `name` in `m`: a loop over [begin, end) computing EmitExpr.
///
/// Broadcast inputs (a bias read at (i / inner) % outer) would cost a division per element and
/// keep the loop from vectorizing. When they all share one (inner, outer), the range is walked in
/// stretches over which their reads are simple: with inner > 1 each reads one value for up to
/// `inner` elements (loaded once per stretch); with inner == 1 each reads consecutive elements for
/// up to `outer` of them (a pointer moved to the stretch's start). The inner loop then vectorizes
/// as the plain one does. One-element inputs are loaded once. Other mixes keep the division.
class Lowering {
 public:
  Lowering(llvm::Module& m, const Jit& jit) : m_(m), ctx_(m.getContext()), b_(ctx_), jit_(jit) {}

  void Build(const Expr& e, const std::string& name) {
    auto* i64 = b_.getInt64Ty();
    auto* ptr = b_.getPtrTy();
    auto* fty = llvm::FunctionType::get(b_.getVoidTy(), {ptr, ptr, i64, i64}, false);
    auto* fn = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, name, m_);
    fn->addFnAttr(llvm::Attribute::NoUnwind);
    fn->addFnAttr("target-cpu", jit_.cpu);
    fn->addFnAttr("target-features", jit_.features);
    llvm::Value* ins = fn->getArg(0);
    out_ = fn->getArg(1);
    llvm::Value* begin = fn->getArg(2);
    end_ = fn->getArg(3);
    fn->addParamAttr(0, llvm::Attribute::NoCapture);
    fn->addParamAttr(0, llvm::Attribute::ReadOnly);
    fn->addParamAttr(1, llvm::Attribute::NoCapture);
    fn_ = fn;

    auto* entry = llvm::BasicBlock::Create(ctx_, "entry", fn);
    auto* exit = llvm::BasicBlock::Create(ctx_, "exit", fn);
    b_.SetInsertPoint(entry);
    // How each input is read: per element, or once (one element), or by stretches (a bias).
    std::vector<InputRead> reads(static_cast<size_t>(e.NumInputs()));
    std::vector<int> bias;  // inputs read by stretches
    int64_t inner = 0, outer = 0;
    bool one_pattern = true;
    for (size_t k = 0; k < reads.size(); ++k)
      reads[k].ptr = b_.CreateLoad(ptr, b_.CreateConstInBoundsGEP1_64(ptr, ins, k), "in" + std::to_string(k));
    for (const Expr::Node& node : e.nodes) {
      if (node.kind != Expr::Kind::kInput || node.outer == 0) continue;
      InputRead& r = reads[static_cast<size_t>(node.input)];
      if (node.outer == 1) {  // one element
        r.kind = InputRead::kValue;
        r.value = b_.CreateLoad(b_.getFloatTy(), r.ptr);
        continue;
      }
      if (!bias.empty() && (node.inner != inner || node.outer != outer)) one_pattern = false;
      inner = node.inner, outer = node.outer;
      bias.push_back(node.input);
    }
    if (bias.empty() || !one_pattern) {  // per element (bias inputs, if any, by division)
      b_.CreateCondBr(b_.CreateICmpSLT(begin, end_), Loop(e, begin, end_, reads, entry, exit), exit);
    } else {
      auto* stretch = llvm::BasicBlock::Create(ctx_, "stretch", fn, exit);
      auto* next_stretch = llvm::BasicBlock::Create(ctx_, "next_stretch", fn, exit);
      b_.CreateCondBr(b_.CreateICmpSLT(begin, end_), stretch, exit);
      b_.SetInsertPoint(stretch);
      auto* s = b_.CreatePHI(i64, 2, "s");
      s->addIncoming(begin, entry);
      llvm::Value* q = inner > 1 ? b_.CreateUDiv(s, b_.getInt64(static_cast<uint64_t>(inner))) : s;
      llvm::Value* c = b_.CreateURem(q, b_.getInt64(static_cast<uint64_t>(outer)), "c");
      llvm::Value* stop;
      std::vector<InputRead> here = reads;
      if (inner > 1) {  // the bias index changes when i / inner does
        stop = b_.CreateMul(b_.CreateAdd(q, b_.getInt64(1)), b_.getInt64(static_cast<uint64_t>(inner)));
        for (int k : bias) {
          InputRead& r = here[static_cast<size_t>(k)];
          r.kind = InputRead::kValue;
          r.value = b_.CreateLoad(b_.getFloatTy(), b_.CreateInBoundsGEP(b_.getFloatTy(), r.ptr, c));
        }
      } else {  // the bias index wraps to 0 after outer - c elements
        stop = b_.CreateAdd(s, b_.CreateSub(b_.getInt64(static_cast<uint64_t>(outer)), c));
        for (int k : bias) {
          InputRead& r = here[static_cast<size_t>(k)];
          r.kind = InputRead::kDirect;
          r.ptr = b_.CreateGEP(b_.getFloatTy(), r.ptr, b_.CreateSub(c, s));  // ptr[i] = bias[c + i - s]
        }
      }
      stop = b_.CreateSelect(b_.CreateICmpSLT(stop, end_), stop, end_, "stop");
      b_.CreateBr(Loop(e, s, stop, here, stretch, next_stretch));
      b_.SetInsertPoint(next_stretch);
      s->addIncoming(stop, next_stretch);
      b_.CreateCondBr(b_.CreateICmpSLT(stop, end_), stretch, exit);
    }
    b_.SetInsertPoint(exit);
    b_.CreateRetVoid();
  }

 private:
  /// Emits `for (i = from; i < to; ++i) out[i] = e(i)` (from < to on entry), entered from `pred`,
  /// leaving to `after`; returns its first block. The builder ends in `pred`'s block.
  llvm::BasicBlock* Loop(const Expr& e, llvm::Value* from, llvm::Value* to, const std::vector<InputRead>& reads,
                         llvm::BasicBlock* pred, llvm::BasicBlock* after) {
    llvm::BasicBlock* back = b_.GetInsertBlock();
    auto* loop = llvm::BasicBlock::Create(ctx_, "loop", fn_, after);
    b_.SetInsertPoint(loop);
    auto* i = b_.CreatePHI(b_.getInt64Ty(), 2, "i");
    i->addIncoming(from, pred);
    llvm::Value* result = EmitExpr(b_, m_, e, MathLib::kHost, i, reads);
    b_.CreateStore(result, b_.CreateInBoundsGEP(b_.getFloatTy(), out_, i));
    auto* next = b_.CreateAdd(i, b_.getInt64(1), "next", /*HasNUW=*/true, /*HasNSW=*/true);
    i->addIncoming(next, loop);
    b_.CreateCondBr(b_.CreateICmpSLT(next, to), loop, after);
    b_.SetInsertPoint(back);
    return loop;
  }

  llvm::Module& m_;
  llvm::LLVMContext& ctx_;
  llvm::IRBuilder<> b_;
  const Jit& jit_;
  llvm::Function* fn_ = nullptr;
  llvm::Value* out_ = nullptr;
  llvm::Value* end_ = nullptr;
};

}  // namespace

std::string CompileObject(const Expr& e, const std::string& name, std::string* ir) {
  Jit& jit = GetJit();
  llvm::LLVMContext ctx;
  llvm::Module m(name, ctx);
  m.setDataLayout(jit.lljit->getDataLayout());
  m.setTargetTriple(jit.triple.str());
  Lowering(m, jit).Build(e, name);
  CheckModule(m, e.ToString());
  OptimizeO3(m, jit.tm.get(), jit.have_libmvec);
  if (ir) {
    ir->clear();
    llvm::raw_string_ostream os(*ir);
    m.print(os, nullptr);
  }
  return EmitHostObject(m);
}

const HostTarget& Host() {
  static const HostTarget* host = [] {
    Jit& jit = GetJit();
    return new HostTarget{jit.tm.get(), jit.triple, jit.cpu, jit.features, jit.have_libmvec};
  }();
  return *host;
}

std::string EmitHostObject(llvm::Module& m) {
  // The same target machine LLJIT compiles with, so the object links as its own would.
  auto object = Unwrap(llvm::orc::SimpleCompiler(*GetJit().tm)(m), "codegen: emitting object code");
  return std::string(object->getBuffer());
}

CompiledKernel::Fn LoadObject(std::string_view object, const std::string& name) {
  Jit& jit = GetJit();
  Check(jit.lljit->addObjectFile(llvm::MemoryBuffer::getMemBufferCopy(llvm::StringRef(object.data(), object.size()), name)),
        "codegen: adding an object file to the JIT");
  auto addr = Unwrap(jit.lljit->lookup(name), "codegen: linking the compiled kernel");
  return addr.toPtr<CompiledKernel::Fn>();
}

CompiledKernel::Fn LoadObject(std::string_view object, const std::string& name, std::shared_ptr<void>* code) {
  // The owner of one object's code: removes it from the JIT when destroyed, except at exit, when
  // LLVM's own statics may already be gone.
  class Code {
   public:
    explicit Code(llvm::orc::ResourceTrackerSP rt) : rt(std::move(rt)) {}
    Code(const Code&) = delete;
    ~Code() {
      if (!JitExiting().load()) llvm::consumeError(rt->remove());
    }
    llvm::orc::ResourceTrackerSP rt;
  };
  Jit& jit = GetJit();
  auto owner = std::make_shared<Code>(jit.lljit->getMainJITDylib().createResourceTracker());
  Check(jit.lljit->addObjectFile(
            owner->rt, llvm::MemoryBuffer::getMemBufferCopy(llvm::StringRef(object.data(), object.size()), name)),
        "codegen: adding an object file to the JIT");
  auto addr = Unwrap(jit.lljit->lookup(name), "codegen: linking the compiled kernel");
  *code = std::move(owner);
  return addr.toPtr<CompiledKernel::Fn>();
}

const std::string& TargetKey() { return GetJit().key; }

}  // namespace kiln::codegen::detail

namespace kiln::codegen {

void PrewarmJit() {
  static detail::Prewarm prewarm{std::thread([] {
    try {
      (void)detail::GetJit();
    } catch (...) {  // the first kernel's own GetJit reports the error
    }
  })};
}

}  // namespace kiln::codegen
