// RewriteForHost: NVPTX LLVM IR -> IR the host's JIT can run as GPU threads (DESIGN.md 4a).
//   - special registers (tid, ntid, ctaid, nctaid, warpsize, laneid) call the emulator's helper;
//   - __syncthreads (barrier0, barrier.sync, barrier0.popc/and/or) calls the barrier helper, which
//     switches fibers;
//   - addrspace(3) globals (static __shared__ arrays, extern __shared__) become offsets into the
//     block's shared buffer;
//   - every global or generic load, store, atomic and memory intrinsic whose address lies in the
//     simulated device memory window is moved by the window's alias delta (checked mode: the
//     helper checks the access against the live allocations and its alignment);
//   - the libdevice intrinsics (llvm.nvvm.*) and inline PTX libdevice uses become LLVM IR or host
//     helpers; anything else is refused with a DeviceError naming it;
//   - the module is retargeted to the host, each kernel gets a trampoline `entry(void** args)`, and
//     one external function stores the trampolines' addresses (the JIT needs one lookup).
// Warp-level operations (shuffles, votes, __syncwarp) are refused, not emulated.
#include <llvm/Analysis/ValueTracking.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/InlineAsm.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/IntrinsicInst.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/ReplaceConstant.h>

#include <map>
#include <set>

#include "gpusim_internal.h"
#include "kiln/runtime/error.h"
#include "lower.h"

namespace kiln::codegen::gpusim_detail {
namespace {

using llvm::IRBuilder;
using llvm::Value;

bool IsSpecialSpace(unsigned as) { return as == 3 || as == 4 || as == 5 || as == 101; }

class Rewriter {
public:
  Rewriter(llvm::Module& m, bool checked)
      : m_(m), ctx_(m.getContext()), checked_(checked), h_(HostHelpers()) {}

  RewriteResult Run(const std::string& unique) {
    FindKernels();
    if (auto* md = m_.getNamedMetadata("nvvm.annotations")) md->eraseFromParent();
    RelocateShared();
    std::vector<llvm::CallBase*> calls;
    for (llvm::Function& f : m_)
      for (llvm::BasicBlock& bb : f)
        for (llvm::Instruction& i : bb)
          if (auto* c = llvm::dyn_cast<llvm::CallBase>(&i)) calls.push_back(c);
    for (llvm::CallBase* c : calls) RewriteCall(c);
    TranslateMemory();
    Retarget(unique);
    return std::move(result_);
  }

private:
  [[noreturn]] void Refuse(const std::string& what, const llvm::Instruction* at) {
    std::string fn = at ? at->getFunction()->getName().str() : "";
    KILN_THROW(DeviceError)
        << "gpusim: the kernel emulator cannot translate " << what
        << (fn.empty() ? "" : " (in function '" + fn + "')")
        << "; it emulates special registers, __syncthreads, shared memory and libdevice's "
           "intrinsics, not warp-level or other PTX operations";
  }

  void FindKernels() {
    std::map<llvm::Function*, int> max_threads;
    std::set<llvm::Function*> kernels;
    if (auto* md = m_.getNamedMetadata("nvvm.annotations")) {
      for (llvm::MDNode* node : md->operands()) {
        if (node->getNumOperands() < 3) continue;
        auto* fv = llvm::mdconst::dyn_extract_or_null<llvm::Function>(node->getOperand(0));
        if (!fv) continue;
        for (unsigned k = 1; k + 1 < node->getNumOperands(); k += 2) {
          auto* key = llvm::dyn_cast<llvm::MDString>(node->getOperand(k));
          auto* val = llvm::mdconst::dyn_extract_or_null<llvm::ConstantInt>(node->getOperand(k + 1));
          if (!key || !val) continue;
          if (key->getString() == "kernel" && val->getZExtValue() == 1) kernels.insert(fv);
          if (key->getString() == "maxntidx") max_threads[fv] = static_cast<int>(val->getZExtValue());
        }
      }
    }
    for (llvm::Function& f : m_)
      if (f.getCallingConv() == llvm::CallingConv::PTX_Kernel) kernels.insert(&f);
    for (llvm::Function& f : m_) { // in module order, so that the table's order is stable
      if (!kernels.count(&f) || f.isDeclaration()) continue;
      RewriteResult::Kernel k;
      k.name = f.getName().str();
      if (auto it = max_threads.find(&f); it != max_threads.end()) k.max_threads = it->second;
      result_.kernels.push_back(k);
      kernel_fns_.push_back(&f);
    }
    if (kernel_fns_.empty())
      KILN_THROW(DeviceError)
          << "gpusim: the module defines no kernel (no function with the ptx_kernel calling "
             "convention or a nvvm.annotations 'kernel' entry)";
  }

  /// A call to the host helper at `address` of type `ty`.
  Value* CallHelper(IRBuilder<>& b, uintptr_t address, llvm::FunctionType* ty, llvm::ArrayRef<Value*> args) {
    Value* callee = llvm::ConstantExpr::getIntToPtr(b.getInt64(address), b.getPtrTy());
    return b.CreateCall(ty, callee, args);
  }

  void RelocateShared() {
    std::vector<llvm::GlobalVariable*> shared;
    for (llvm::GlobalVariable& g : m_.globals())
      if (g.getAddressSpace() == 3) shared.push_back(&g);
    if (shared.empty()) return;
    const llvm::DataLayout& dl = m_.getDataLayout();
    std::map<llvm::GlobalVariable*, uint64_t> offset;
    uint64_t end = 0;
    for (auto* g : shared) {
      if (g->isDeclaration()) continue;
      uint64_t align = std::max<uint64_t>(g->getAlign().valueOrOne().value(), 4);
      end = (end + align - 1) / align * align;
      offset[g] = end;
      end += dl.getTypeAllocSize(g->getValueType());
    }
    result_.static_smem_bytes = end;
    uint64_t dynamic = (end + 15) / 16 * 16; // extern __shared__ starts after the static arrays
    for (auto* g : shared)
      if (g->isDeclaration()) offset[g] = dynamic;
    std::vector<llvm::Constant*> consts(shared.begin(), shared.end());
    llvm::convertUsersOfConstantsToInstructions(consts);
    llvm::FunctionType* base_ty = llvm::FunctionType::get(llvm::PointerType::get(ctx_, 0), false);
    std::map<llvm::Function*, Value*> base; // the block's shared buffer, read once per function
    for (auto* g : shared) {
      std::vector<llvm::Use*> uses;
      for (llvm::Use& u : g->uses()) uses.push_back(&u);
      for (llvm::Use* u : uses) {
        auto* inst = llvm::dyn_cast<llvm::Instruction>(u->getUser());
        if (!inst) {
          auto* c = llvm::dyn_cast<llvm::Constant>(u->getUser());
          if (c && c->use_empty()) continue;
          Refuse("a use of the __shared__ variable '" + g->getName().str() + "' outside a function", nullptr);
        }
        llvm::Function* f = inst->getFunction();
        Value*& b0 = base[f];
        if (!b0) {
          IRBuilder<> b(&*f->getEntryBlock().getFirstInsertionPt());
          auto* call = llvm::cast<llvm::CallInst>(CallHelper(b, h_.shared_base, base_ty, {}));
          call->setDoesNotAccessMemory();
          call->setDoesNotThrow();
          b0 = call;
        }
        IRBuilder<> b(llvm::cast<llvm::Instruction>(b0)->getNextNode());
        Value* p = b.CreateConstGEP1_64(b.getInt8Ty(), b0, offset[g]);
        p = b.CreateAddrSpaceCast(p, g->getType());
        u->set(p);
      }
      g->removeDeadConstantUsers();
      if (g->use_empty()) g->eraseFromParent();
    }
  }

  static std::string Squeeze(const std::string& s) {
    std::string out;
    for (char c : s) {
      if (c == '{' || c == '}') continue;
      if (std::isspace(static_cast<unsigned char>(c))) {
        if (!out.empty() && out.back() != ' ') out += ' ';
      } else {
        out += c;
      }
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    if (!out.empty() && out.front() == ' ') out.erase(0, 1);
    return out;
  }

  Value* Ftz(IRBuilder<>& b, Value* x) {
    if (!x->getType()->isFloatTy()) return x;
    Value* tiny = b.CreateFCmpOLT(b.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, x),
                                  llvm::ConstantFP::get(x->getType(), 1.17549435e-38));
    return b.CreateSelect(
        tiny, b.CreateBinaryIntrinsic(llvm::Intrinsic::copysign, llvm::ConstantFP::get(x->getType(), 0.0), x),
        x);
  }

  /// The replacement of `llvm.nvvm.<name>`; nullptr when the call is simply removed.
  Value* Nvvm(IRBuilder<>& b, llvm::CallBase* c, llvm::StringRef name) {
    auto arg = [&](unsigned k) { return c->getArgOperand(k); };
    auto* i32 = b.getInt32Ty();
    if (name.consume_front("read.ptx.sreg.")) {
      static const std::map<std::string, int> regs = {
          {"tid.x", kTidX},        {"tid.y", kTidY},       {"tid.z", kTidZ},       {"ntid.x", kNtidX},
          {"ntid.y", kNtidY},      {"ntid.z", kNtidZ},     {"ctaid.x", kCtaidX},   {"ctaid.y", kCtaidY},
          {"ctaid.z", kCtaidZ},    {"nctaid.x", kNctaidX}, {"nctaid.y", kNctaidY}, {"nctaid.z", kNctaidZ},
          {"warpsize", kWarpSize}, {"laneid", kLaneId},    {"warpid", kWarpId}};
      auto it = regs.find(name.str());
      if (it == regs.end()) Refuse("the special register %" + name.str(), c);
      auto* call = llvm::cast<llvm::CallInst>(
          CallHelper(b, h_.sreg, llvm::FunctionType::get(i32, {i32}, false), {b.getInt32(it->second)}));
      call->setDoesNotAccessMemory(); // constant for the thread's whole life
      call->setDoesNotThrow();
      return b.CreateZExtOrTrunc(call, c->getType());
    }
    auto barrier = [&](int kind, Value* pred) {
      result_.has_barrier = true;
      Value* r = CallHelper(b, h_.barrier, llvm::FunctionType::get(i32, {i32, i32}, false),
                            {b.getInt32(kind), pred ? b.CreateZExtOrTrunc(pred, i32) : b.getInt32(0)});
      return c->getType()->isVoidTy() ? nullptr : b.CreateZExtOrTrunc(r, c->getType());
    };
    if (name == "barrier0" || name == "barrier.sync" || name == "barrier.sync.aligned" || name == "barrier")
      return barrier(kBarPlain, nullptr);
    if (name == "barrier0.popc") return barrier(kBarPopc, arg(0));
    if (name == "barrier0.and") return barrier(kBarAnd, arg(0));
    if (name == "barrier0.or") return barrier(kBarOr, arg(0));
    if (name.starts_with("membar.") || name.starts_with("fence.")) return nullptr; // fibers run in turn

    // Math. Split "op.rnd.ftz.t" into its parts.
    llvm::SmallVector<llvm::StringRef, 4> parts;
    name.split(parts, '.');
    bool ftz = llvm::is_contained(parts, "ftz");
    llvm::StringRef op = parts[0];
    std::string rnd =
        parts.size() > 1 && (parts[1] == "rn" || parts[1] == "rz" || parts[1] == "rm" || parts[1] == "rp")
            ? parts[1].str()
            : ""; // f2i.rn, add.rz.f, ...: the rounding mode is the second part
    std::vector<Value*> xs;
    for (unsigned k = 0; k < c->arg_size(); ++k) xs.push_back(ftz ? Ftz(b, arg(k)) : arg(k));
    auto out = [&](Value* v) { return ftz ? Ftz(b, v) : v; };
    auto un = [&](llvm::Intrinsic::ID id) { return out(b.CreateUnaryIntrinsic(id, xs[0])); };
    auto bin = [&](llvm::Intrinsic::ID id) { return out(b.CreateBinaryIntrinsic(id, xs[0], xs[1])); };
    llvm::Type* ty = c->getType();
    auto one = [&] { return llvm::ConstantFP::get(ty, 1.0); };
    static const std::map<std::string, int> rounded_ops = {{"add", kRAdd}, {"mul", kRMul},   {"fma", kRFma},
                                                           {"div", kRDiv}, {"sqrt", kRSqrt}, {"rcp", kRRcp}};
    if (auto it = rounded_ops.find(op.str()); it != rounded_ops.end() && ty->isFloatingPointTy()) {
      if (rnd.empty() || rnd == "rn") { // nearest (also approx and full variants)
        switch (it->second) {
        case kRAdd: return out(b.CreateFAdd(xs[0], xs[1]));
        case kRMul: return out(b.CreateFMul(xs[0], xs[1]));
        case kRFma: return out(b.CreateIntrinsic(llvm::Intrinsic::fma, {ty}, {xs[0], xs[1], xs[2]}));
        case kRDiv: return out(b.CreateFDiv(xs[0], xs[1]));
        case kRSqrt: return un(llvm::Intrinsic::sqrt);
        case kRRcp: return out(b.CreateFDiv(one(), xs[0]));
        }
      }
      int mode = rnd == "rz" ? kRoundZero : rnd == "rm" ? kRoundDown : kRoundUp;
      while (xs.size() < 3) xs.push_back(llvm::ConstantFP::get(ty, 0.0));
      auto* fty = llvm::FunctionType::get(ty, {i32, i32, ty, ty, ty}, false);
      Value* r = CallHelper(b, ty->isFloatTy() ? h_.rounded_f32 : h_.rounded_f64, fty,
                            {b.getInt32(it->second), b.getInt32(mode), xs[0], xs[1], xs[2]});
      llvm::cast<llvm::CallInst>(r)->setDoesNotAccessMemory();
      return out(r);
    }
    if (op == "fabs") return un(llvm::Intrinsic::fabs);
    if (op == "fmin")
      return bin(llvm::is_contained(parts, "nan") ? llvm::Intrinsic::minimum : llvm::Intrinsic::minnum);
    if (op == "fmax")
      return bin(llvm::is_contained(parts, "nan") ? llvm::Intrinsic::maximum : llvm::Intrinsic::maxnum);
    if (op == "ex2") return un(llvm::Intrinsic::exp2);
    if (op == "lg2") return un(llvm::Intrinsic::log2);
    if (op == "sin") return un(llvm::Intrinsic::sin);
    if (op == "cos") return un(llvm::Intrinsic::cos);
    if (op == "rsqrt") return out(b.CreateFDiv(one(), b.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, xs[0])));
    if (op == "round") return un(llvm::Intrinsic::rint); // cvt.rni: nearest, ties to even
    if (op == "trunc") return un(llvm::Intrinsic::trunc);
    if (op == "floor") return un(llvm::Intrinsic::floor);
    if (op == "ceil") return un(llvm::Intrinsic::ceil);
    if (op == "saturate") { // NaN -> 0, else clamped to [0, 1]
      Value* x = xs[0];
      Value* hi = b.CreateSelect(b.CreateFCmpOLT(x, one()), x, one());
      return out(b.CreateSelect(b.CreateFCmpOGT(x, llvm::ConstantFP::get(ty, 0.0)), hi,
                                llvm::ConstantFP::get(ty, 0.0)));
    }
    if (op == "f2i" || op == "d2i" || op == "f2ui" || op == "d2ui" || op == "f2ll" || op == "d2ll" ||
        op == "f2ull" || op == "d2ull") {
      if (parts.size() >= 2 && (parts[1] == "lo" || parts[1] == "hi")) { // d2i.lo / d2i.hi: the halves
        Value* bits = b.CreateBitCast(xs[0], b.getInt64Ty());
        if (parts[1] == "hi") bits = b.CreateLShr(bits, 32);
        return b.CreateTrunc(bits, ty);
      }
      Value* x = xs[0];
      if (rnd == "rn") x = b.CreateUnaryIntrinsic(llvm::Intrinsic::rint, x);
      if (rnd == "rm") x = b.CreateUnaryIntrinsic(llvm::Intrinsic::floor, x);
      if (rnd == "rp") x = b.CreateUnaryIntrinsic(llvm::Intrinsic::ceil, x);
      bool is_unsigned = op.contains("u");
      return b.CreateIntrinsic(is_unsigned ? llvm::Intrinsic::fptoui_sat : llvm::Intrinsic::fptosi_sat,
                               {ty, x->getType()}, {x});
    }
    if (op == "lohi" && parts.size() == 2 && parts[1] == "i2d") {
      Value* lo = b.CreateZExt(arg(0), b.getInt64Ty());
      Value* hi = b.CreateShl(b.CreateZExt(arg(1), b.getInt64Ty()), 32);
      return b.CreateBitCast(b.CreateOr(lo, hi), ty);
    }
    if ((op == "i2f" || op == "ui2f" || op == "ll2f" || op == "ull2f" || op == "i2d" || op == "ui2d" ||
         op == "ll2d" || op == "ull2d") &&
        rnd == "rn")
      return op.starts_with("u") ? b.CreateUIToFP(arg(0), ty) : b.CreateSIToFP(arg(0), ty);
    if (op == "mulhi" || op == "mul24") {
      bool is_unsigned = parts.size() > 1 && parts[1].starts_with("u");
      auto* wide = b.getIntNTy(ty->getIntegerBitWidth() * 2);
      Value* a = is_unsigned ? b.CreateZExt(arg(0), wide) : b.CreateSExt(arg(0), wide);
      Value* d = is_unsigned ? b.CreateZExt(arg(1), wide) : b.CreateSExt(arg(1), wide);
      if (op == "mul24") { // the low 24 bits of each operand, sign-extended for the signed form
        a = b.CreateTrunc(a, ty), d = b.CreateTrunc(d, ty);
        auto ext = [&](Value* v) {
          return is_unsigned ? b.CreateAnd(v, 0xFFFFFF) : b.CreateAShr(b.CreateShl(v, 8), 8);
        };
        return b.CreateMul(ext(a), ext(d));
      }
      return b.CreateTrunc(b.CreateLShr(b.CreateMul(a, d), ty->getIntegerBitWidth()), ty);
    }
    if (op == "ldg" && parts.size() > 1 && parts[1] == "global")
      return b.CreateAlignedLoad(ty, arg(0),
                                 llvm::MaybeAlign(llvm::cast<llvm::ConstantInt>(arg(1))->getZExtValue()));
    if (op == "ptr") return b.CreateAddrSpaceCast(arg(0), ty); // ptr.gen.to.global and back
    Refuse("the intrinsic llvm.nvvm." + name.str(), c);
  }

  /// The replacement of an inline PTX asm call (the sites libdevice's kiln uses have).
  Value* Asm(IRBuilder<>& b, llvm::CallBase* c, const llvm::InlineAsm* ia) {
    std::string s = Squeeze(ia->getAsmString());
    llvm::Type* ty = c->getType();
    if (s == "rcp.approx.ftz.f32 $0,$1;" || s == "rcp.approx.ftz.f64 $0,$1;" ||
        s == "rcp.approx.f32 $0,$1;") {
      bool ftz = s.find("ftz.f32") != std::string::npos;
      Value* x = ftz ? Ftz(b, c->getArgOperand(0)) : c->getArgOperand(0);
      Value* r = b.CreateFDiv(llvm::ConstantFP::get(ty, 1.0), x);
      return ftz ? Ftz(b, r) : r;
    }
    // {lo, hi} = a * b + c as one 64-bit product (mad.lo.cc + madc.hi with carry), u32 operands.
    if (s.rfind("mad.lo.cc.u32 $0, $2, $3, $4; madc.hi.u32 $1, $2, $3, 0;", 0) == 0) {
      auto* i64 = b.getInt64Ty();
      Value* p = b.CreateAdd(
          b.CreateMul(b.CreateZExt(c->getArgOperand(0), i64), b.CreateZExt(c->getArgOperand(1), i64)),
          b.CreateZExt(c->getArgOperand(2), i64));
      Value* r = llvm::PoisonValue::get(ty);
      r = b.CreateInsertValue(r, b.CreateTrunc(p, b.getInt32Ty()), 0);
      return b.CreateInsertValue(r, b.CreateTrunc(b.CreateLShr(p, 32), b.getInt32Ty()), 1);
    }
    // libdevice's 128-bit integer arithmetic in 32-bit pieces with carries (the double-precision
    // trigonometric argument reduction for large arguments), by its operand registers and first
    // instruction: {lo, hi} = a * b + c, a * b (u64 operands), or a + b, a - b (operands as
    // {lo, hi} pairs of u64).
    const auto starts = [&](const char* prefix) { return s.rfind(prefix, 0) == 0; };
    const char* kMulAdd = ".reg .u32 r0, r1, r2, r3, alo, ahi, blo, bhi, clo, chi; mov.b64 alo,ahi, $2; "
                          "mov.b64 blo,bhi, $3; mov.b64 clo,chi, $4; mad.lo.cc.u32 r0, alo, blo, clo;";
    const char* kMul = ".reg .u32 r0, r1, r2, r3, alo, ahi, blo, bhi; mov.b64 alo,ahi, $2; mov.b64 blo,bhi, $3; "
                       "mul.lo.u32 r0, alo, blo;";
    const char* kPairs = ".reg .u32 r0, r1, r2, r3, a0, a1, a2, a3, b0, b1, b2, b3; mov.b64 a0,a1, $2; "
                         "mov.b64 a2,a3, $3; mov.b64 b0,b1, $4; mov.b64 b2,b3, $5; ";
    const bool mul_add = starts(kMulAdd), mul = starts(kMul);
    const bool add = starts((std::string(kPairs) + "add.cc.u32 r0, a0, b0;").c_str());
    const bool sub = starts((std::string(kPairs) + "sub.cc.u32 r0, a0, b0;").c_str());
    if (mul_add || mul || add || sub) {
      auto* i128 = b.getInt128Ty();
      auto wide = [&](unsigned i) { return b.CreateZExt(c->getArgOperand(i), i128); };
      auto pair = [&](unsigned i) { return b.CreateOr(wide(i), b.CreateShl(wide(i + 1), 64)); };
      Value* p = mul_add ? b.CreateAdd(b.CreateMul(wide(0), wide(1)), wide(2))
                 : mul   ? b.CreateMul(wide(0), wide(1))
                 : add   ? b.CreateAdd(pair(0), pair(2))
                         : b.CreateSub(pair(0), pair(2));
      Value* r = llvm::PoisonValue::get(ty);
      r = b.CreateInsertValue(r, b.CreateTrunc(p, b.getInt64Ty()), 0);
      return b.CreateInsertValue(r, b.CreateTrunc(b.CreateLShr(p, 64), b.getInt64Ty()), 1);
    }
    Refuse("the inline PTX \"" + s + "\"", c);
  }

  void RewriteCall(llvm::CallBase* c) {
    Value* callee = c->getCalledOperand();
    IRBuilder<> b(c);
    Value* with = nullptr;
    if (auto* ia = llvm::dyn_cast<llvm::InlineAsm>(callee)) {
      with = Asm(b, c, ia);
    } else if (auto* f = c->getCalledFunction(); f && f->getName().starts_with("llvm.nvvm.")) {
      with = Nvvm(b, c, f->getName().drop_front(strlen("llvm.nvvm.")));
    } else {
      return;
    }
    if (with)
      c->replaceAllUsesWith(with);
    else if (!c->getType()->isVoidTy())
      c->replaceAllUsesWith(llvm::PoisonValue::get(c->getType()));
    c->eraseFromParent();
  }

  /// Whether `p` may point into device memory (not shared, local, constant, a stack slot or a
  /// module global).
  bool MayBeDevice(Value* p) {
    if (IsSpecialSpace(p->getType()->getPointerAddressSpace()) || PointsToShared(p)) return false;
    const Value* u = llvm::getUnderlyingObject(p, 12);
    if (llvm::isa<llvm::AllocaInst>(u) || llvm::isa<llvm::GlobalVariable>(u)) return false;
    if (auto* a = llvm::dyn_cast<llvm::Argument>(u); a && a->hasByValAttr()) return false;
    if (auto* ac = llvm::dyn_cast<llvm::AddrSpaceCastOperator>(u);
        ac && IsSpecialSpace(ac->getSrcAddressSpace()))
      return false;
    return true;
  }

  /// Whether every object `p` may point into is the block's shared buffer (generic pointers
  /// made from __shared__ arrays, through casts, offsets, phis and selects).
  bool PointsToShared(Value* p) {
    llvm::SmallVector<const Value*, 4> objects;
    llvm::getUnderlyingObjects(p, objects, nullptr, 12);
    Value* base =
        llvm::ConstantExpr::getIntToPtr(llvm::ConstantInt::get(llvm::Type::getInt64Ty(ctx_), h_.shared_base),
                                        llvm::PointerType::get(ctx_, 0));
    return !objects.empty() && llvm::all_of(objects, [&](const Value* v) {
      auto* c = llvm::dyn_cast<llvm::CallInst>(v);
      return c && c->getCalledOperand() == base;
    });
  }

  struct Access {
    llvm::Instruction* inst;
    unsigned operand;
    Value* bytes;
    uint64_t align;
    bool store;
  };

  void TranslateMemory() {
    const llvm::DataLayout& dl = m_.getDataLayout();
    std::vector<Access> accesses;
    auto size_of = [&](llvm::Type* t) {
      return llvm::ConstantInt::get(llvm::Type::getInt64Ty(ctx_), dl.getTypeStoreSize(t));
    };
    for (llvm::Function& f : m_)
      for (llvm::BasicBlock& bb : f)
        for (llvm::Instruction& i : bb) {
          if (auto* l = llvm::dyn_cast<llvm::LoadInst>(&i))
            accesses.push_back(
                {&i, l->getPointerOperandIndex(), size_of(l->getType()), l->getAlign().value(), false});
          else if (auto* s = llvm::dyn_cast<llvm::StoreInst>(&i))
            accesses.push_back({&i, s->getPointerOperandIndex(), size_of(s->getValueOperand()->getType()),
                                s->getAlign().value(), true});
          else if (auto* r = llvm::dyn_cast<llvm::AtomicRMWInst>(&i))
            accesses.push_back({&i, r->getPointerOperandIndex(), size_of(r->getValOperand()->getType()),
                                r->getAlign().value(), true});
          else if (auto* x = llvm::dyn_cast<llvm::AtomicCmpXchgInst>(&i))
            accesses.push_back({&i, x->getPointerOperandIndex(), size_of(x->getNewValOperand()->getType()),
                                x->getAlign().value(), true});
          else if (auto* mi = llvm::dyn_cast<llvm::MemIntrinsic>(&i)) {
            accesses.push_back({&i, 0, mi->getLength(), mi->getDestAlign().valueOrOne().value(), true});
            if (auto* mt = llvm::dyn_cast<llvm::MemTransferInst>(&i))
              accesses.push_back({&i, 1, mi->getLength(), mt->getSourceAlign().valueOrOne().value(), false});
          }
        }
    // begin, size, delta of the launch's window (its platform's memory); read once per call
    std::map<llvm::Function*, std::array<Value*, 3>> window;
    auto* i64 = llvm::Type::getInt64Ty(ctx_);
    for (const Access& a : accesses) {
      Value* p = a.inst->getOperand(a.operand);
      // Shared accesses (also through generic pointers into the block's buffer) are checked
      // against the buffer's bounds in checked mode.
      bool shared = p->getType()->getPointerAddressSpace() == 3 || PointsToShared(p);
      if (!(checked_ && shared) && !MayBeDevice(p)) continue;
      IRBuilder<> b(a.inst);
      if (checked_) {
        auto* pty = b.getPtrTy();
        auto* fty = llvm::FunctionType::get(pty, {pty, i64, b.getInt32Ty(), i64}, false);
        Value* q = CallHelper(b, h_.check_access, fty,
                              {b.CreateAddrSpaceCast(p, pty), b.CreateZExtOrTrunc(a.bytes, i64),
                               b.getInt32((a.store ? 1 : 0) | (shared ? 2 : 0)), b.getInt64(a.align)});
        a.inst->setOperand(a.operand, b.CreateAddrSpaceCast(q, p->getType()));
        continue;
      }
      llvm::Function* f = a.inst->getFunction();
      auto& w = window[f];
      if (!w[0]) {
        IRBuilder<> e(&*f->getEntryBlock().getFirstInsertionPt());
        Value* base = CallHelper(e, h_.window, llvm::FunctionType::get(e.getPtrTy(), false), {});
        auto load = [&](int field) {
          auto* l = e.CreateLoad(i64, e.CreateConstGEP1_64(i64, base, field));
          l->setMetadata(llvm::LLVMContext::MD_invariant_load, llvm::MDNode::get(ctx_, {}));
          return l;
        };
        Value* begin = load(0);
        w = {begin, e.CreateSub(load(1), begin), load(2)};
      }
      Value* pi = b.CreatePtrToInt(p, i64);
      Value* inside = b.CreateICmpULT(b.CreateSub(pi, w[0]), w[1]);
      Value* q = b.CreateGEP(b.getInt8Ty(), p, b.CreateSelect(inside, w[2], b.getInt64(0)));
      a.inst->setOperand(a.operand, q);
    }
  }

  void Retarget(const std::string& unique) {
    const detail::HostTarget& host = detail::Host();
    m_.setTargetTriple(host.triple.str());
    m_.setDataLayout(host.tm->createDataLayout());
    for (llvm::Function& f : m_) {
      // Every function and every call (below) takes the C convention, also libdevice's fastcc
      // internal functions (__internal_accurate_pow, the trigonometric slow path): a call whose
      // convention differs from its callee's is undefined behaviour, which O3 made garbage of.
      f.setCallingConv(llvm::CallingConv::C);
      for (llvm::User* u : f.users())
        if (auto* cb = llvm::dyn_cast<llvm::CallBase>(u)) cb->setCallingConv(llvm::CallingConv::C);
      if (f.isDeclaration()) continue;
      f.removeFnAttr("target-cpu");
      f.removeFnAttr("target-features");
      f.addFnAttr("target-cpu", host.cpu);
      f.addFnAttr("target-features", host.features);
      f.setLinkage(llvm::GlobalValue::InternalLinkage);
      f.setVisibility(llvm::GlobalValue::DefaultVisibility);
    }
    for (llvm::GlobalVariable& g : m_.globals())
      if (!g.isDeclaration() && !g.getName().starts_with("llvm."))
        g.setLinkage(llvm::GlobalValue::InternalLinkage);
    for (llvm::GlobalVariable& g : m_.globals())
      if (g.isDeclaration()) Refuse("the external variable '" + g.getName().str() + "'", nullptr);
    for (llvm::Function& f : m_)
      if (f.isDeclaration() && !f.isIntrinsic() && !f.use_empty())
        Refuse("a call of the external function '" + f.getName().str() + "'", nullptr);

    IRBuilder<> b(ctx_);
    auto* ptr = b.getPtrTy();
    std::vector<llvm::Function*> entries;
    for (size_t k = 0; k < kernel_fns_.size(); ++k) {
      llvm::Function* kf = kernel_fns_[k];
      auto* e =
          llvm::Function::Create(llvm::FunctionType::get(b.getVoidTy(), {ptr}, false),
                                 llvm::GlobalValue::InternalLinkage, kf->getName() + ".gpusim_entry", m_);
      e->addFnAttr("target-cpu", host.cpu);
      e->addFnAttr("target-features", host.features);
      b.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", e));
      std::vector<Value*> args;
      for (llvm::Argument& a : kf->args()) {
        Value* slot = b.CreateLoad(ptr, b.CreateConstGEP1_64(ptr, e->getArg(0), a.getArgNo()));
        args.push_back(a.hasByValAttr() ? b.CreateAddrSpaceCast(slot, a.getType())
                                        : b.CreateLoad(a.getType(), slot));
      }
      b.CreateCall(kf, args);
      b.CreateRetVoid();
      entries.push_back(e);
      result_.kernels[k].entry = e->getName().str();
    }
    auto* table = llvm::Function::Create(llvm::FunctionType::get(b.getVoidTy(), {ptr}, false),
                                         llvm::GlobalValue::ExternalLinkage, unique, m_);
    b.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", table));
    for (size_t k = 0; k < entries.size(); ++k)
      b.CreateStore(entries[k], b.CreateConstGEP1_64(ptr, table->getArg(0), k));
    b.CreateRetVoid();
    result_.table = unique;
  }

  llvm::Module& m_;
  llvm::LLVMContext& ctx_;
  bool checked_;
  const Helpers& h_;
  RewriteResult result_;
  std::vector<llvm::Function*> kernel_fns_;
};

} // namespace

RewriteResult RewriteForHost(llvm::Module& m, bool checked, const std::string& unique) {
  return Rewriter(m, checked).Run(unique);
}

} // namespace kiln::codegen::gpusim_detail
