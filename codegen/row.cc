// CompileRow: RowProgram -> LLVM IR (a loop over rows, one inner loop per reduction and one for the
// elementwise outputs) -> O3 for the host CPU -> the process-wide LLJIT of CompileElementwise
// (detail::LoadObject). The per-element arithmetic is EmitExpr's (lower.cc), shared with the
// elementwise kernels, so both kinds of fused kernel compute the same functions the same way.
//
// Vectorizing the reductions: sums are fadd recurrences marked `reassoc` (that add only, not the
// arithmetic feeding it), max/min are llvm.maximum/llvm.minimum recurrences (NaN-propagating);
// the loop vectorizer turns both into lane-wise accumulators. Each row is in cache while its
// passes run, so the passes cost little more than one read of the row.
//
// Not here: the disk cache (row kernels are compiled in each process), PTX.
#include "kiln/codegen/row.h"

#include "lower.h"

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "kiln/codegen/llvm_jit.h"
#include "kiln/runtime/cpu/loops.h"

namespace kiln::codegen {
namespace {

uint64_t Mix(uint64_t h, uint64_t v) { // splitmix64 step folded into h
  v += 0x9e3779b97f4a7c15ULL + h;
  v = (v ^ (v >> 30)) * 0xbf58476d1ce4e5b9ULL;
  v = (v ^ (v >> 27)) * 0x94d049bb133111ebULL;
  return v ^ (v >> 31);
}


/// Builds `void name(const float** ins, float** outs, i64 row_begin, i64 row_end, i64 len)`.
class RowLowering {
public:
  RowLowering(llvm::Module& m, const detail::HostTarget& host) : m_(m), ctx_(m.getContext()), b_(ctx_), host_(host) {}

  void Build(const RowProgram& p, const std::string& name) {
    auto* i64 = b_.getInt64Ty();
    auto* ptr = b_.getPtrTy();
    auto* f32 = b_.getFloatTy();
    auto* fty = llvm::FunctionType::get(b_.getVoidTy(), {ptr, ptr, i64, i64, i64}, false);
    fn_ = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, name, m_);
    fn_->addFnAttr(llvm::Attribute::NoUnwind);
    fn_->addFnAttr("target-cpu", host_.cpu);
    fn_->addFnAttr("target-features", host_.features);
    for (unsigned a : {0u, 1u}) {
      fn_->addParamAttr(a, llvm::Attribute::NoCapture);
      fn_->addParamAttr(a, llvm::Attribute::ReadOnly);
    }
    llvm::Value *ins = fn_->getArg(0), *outs = fn_->getArg(1), *row_begin = fn_->getArg(2);
    llvm::Value *row_end = fn_->getArg(3), *len = fn_->getArg(4);

    auto* entry = llvm::BasicBlock::Create(ctx_, "entry", fn_);
    auto* row = llvm::BasicBlock::Create(ctx_, "row", fn_);
    auto* exit = llvm::BasicBlock::Create(ctx_, "exit", fn_);
    b_.SetInsertPoint(entry);
    std::vector<llvm::Value*> in_ptrs, out_ptrs;
    for (size_t k = 0; k < p.inputs.size(); ++k)
      in_ptrs.push_back(
          b_.CreateLoad(ptr, b_.CreateConstInBoundsGEP1_64(ptr, ins, k), "in" + std::to_string(k)));
    for (size_t k = 0; k < p.outputs.size(); ++k)
      out_ptrs.push_back(
          b_.CreateLoad(ptr, b_.CreateConstInBoundsGEP1_64(ptr, outs, k), "out" + std::to_string(k)));
    llvm::Value* inv_len =
        b_.CreateFDiv(llvm::ConstantFP::get(f32, 1.0), b_.CreateSIToFP(len, f32), "inv_len");
    std::vector<detail::InputRead> scalars(p.inputs.size());
    for (size_t k = 0; k < p.inputs.size(); ++k)
      if (p.inputs[k] == RowProgram::kScalar)
        scalars[k] = {detail::InputRead::kValue, nullptr, b_.CreateLoad(f32, in_ptrs[k])};
    b_.CreateCondBr(b_.CreateICmpSLT(row_begin, row_end), row, exit);

    b_.SetInsertPoint(row);
    auto* r = b_.CreatePHI(i64, 2, "r");
    r->addIncoming(row_begin, entry);
    llvm::Value* base = b_.CreateMul(r, len, "base", /*HasNUW=*/true, /*HasNSW=*/true);
    // How each operand is read in this row; row values are appended as they are computed.
    std::vector<detail::InputRead> reads(p.inputs.size());
    for (size_t k = 0; k < p.inputs.size(); ++k) {
      detail::InputRead& rd = reads[k];
      switch (p.inputs[k]) {
      case RowProgram::kElement: rd.ptr = b_.CreateInBoundsGEP(f32, in_ptrs[k], base); break;
      case RowProgram::kColumn: rd.ptr = in_ptrs[k]; break;
      case RowProgram::kRow:
        rd.kind = detail::InputRead::kValue;
        rd.value = b_.CreateLoad(f32, b_.CreateInBoundsGEP(f32, in_ptrs[k], r));
        break;
      case RowProgram::kScalar: rd = scalars[k]; break;
      }
    }
    for (const RowProgram::Step& s : p.steps) {
      llvm::Value* v =
          s.kind == RowProgram::kPerRow
              ? detail::EmitExpr(b_, m_, s.expr, detail::MathLib::kHost, b_.getInt64(0), reads)
              : Reduce(s, len, reads,
                       s.stash >= 0 ? b_.CreateInBoundsGEP(f32, out_ptrs[s.stash], base) : nullptr);
      if (s.kind == RowProgram::kMean) v = b_.CreateFMul(v, inv_len);
      reads.push_back({detail::InputRead::kValue, nullptr, v});
    }
    bool elementwise = false;
    for (size_t k = 0; k < p.outputs.size(); ++k) {
      const RowProgram::Output& o = p.outputs[k];
      if (o.row_value >= 0)
        b_.CreateStore(reads[p.inputs.size() + static_cast<size_t>(o.row_value)].value,
                       b_.CreateInBoundsGEP(f32, out_ptrs[k], r));
      else
        elementwise = true;
    }
    if (elementwise) {
      for (size_t k = 0; k < p.outputs.size(); ++k) // stashes, read where they were stored
        reads.push_back({detail::InputRead::kIndexed, b_.CreateInBoundsGEP(f32, out_ptrs[k], base), nullptr});
      Outputs(p, len, base, out_ptrs, reads);
    }
    auto* next = b_.CreateAdd(r, b_.getInt64(1), "r.next", true, true);
    r->addIncoming(next, b_.GetInsertBlock());
    b_.CreateCondBr(b_.CreateICmpSLT(next, row_end), row, exit);
    b_.SetInsertPoint(exit);
    b_.CreateRetVoid();
  }

private:
  /// Opens `for (j = 0; j < len; ++j)` (skipped when len <= 0); returns j, with the builder in the body.
  llvm::PHINode* OpenLoop(llvm::Value* len, const char* label) {
    llvm::BasicBlock* pre = b_.GetInsertBlock();
    loop_ = llvm::BasicBlock::Create(ctx_, label, fn_);
    after_ = llvm::BasicBlock::Create(ctx_, std::string(label) + ".done", fn_);
    b_.CreateCondBr(b_.CreateICmpSGT(len, b_.getInt64(0)), loop_, after_);
    b_.SetInsertPoint(loop_);
    auto* j = b_.CreatePHI(b_.getInt64Ty(), 2, "j");
    j->addIncoming(b_.getInt64(0), pre);
    pre_ = pre;
    return j;
  }
  /// Closes the loop opened last; the builder continues after it.
  void CloseLoop(llvm::PHINode* j, llvm::Value* len) {
    auto* next = b_.CreateAdd(j, b_.getInt64(1), "j.next", true, true);
    body_end_ = b_.GetInsertBlock();
    j->addIncoming(next, body_end_);
    b_.CreateCondBr(b_.CreateICmpSLT(next, len), loop_, after_);
    b_.SetInsertPoint(after_);
  }

  /// The reduction of step `s` over the row; with `stash`, also stores each element's value there.
  llvm::Value* Reduce(const RowProgram::Step& s, llvm::Value* len,
                      const std::vector<detail::InputRead>& reads, llvm::Value* stash) {
    auto* f32 = b_.getFloatTy();
    bool is_max = s.kind == RowProgram::kMax, is_min = s.kind == RowProgram::kMin;
    double init = is_max ? -INFINITY : is_min ? INFINITY : 0.0;
    llvm::Value* init_v = llvm::ConstantFP::get(f32, init);
    llvm::PHINode* j = OpenLoop(len, "reduce");
    llvm::BasicBlock* pre = pre_;
    auto* acc = b_.CreatePHI(f32, 2, "acc");
    acc->addIncoming(init_v, pre);
    llvm::Value* x = detail::EmitExpr(b_, m_, s.expr, detail::MathLib::kHost, j, reads);
    if (stash) b_.CreateStore(x, b_.CreateInBoundsGEP(f32, stash, j));
    llvm::Value* next;
    if (is_max || is_min) {
      next = b_.CreateBinaryIntrinsic(is_max ? llvm::Intrinsic::maximum : llvm::Intrinsic::minimum, acc, x);
    } else {
      next = b_.CreateFAdd(acc, x);
      llvm::cast<llvm::Instruction>(next)->setHasAllowReassoc(true); // this add only: vectorizable
    }
    CloseLoop(j, len);
    acc->addIncoming(next, body_end_);
    auto* result = b_.CreatePHI(f32, 2, "reduced");
    result->addIncoming(init_v, pre);
    result->addIncoming(next, body_end_);
    return result;
  }

  void Outputs(const RowProgram& p, llvm::Value* len, llvm::Value* base,
               const std::vector<llvm::Value*>& out_ptrs, const std::vector<detail::InputRead>& reads) {
    llvm::PHINode* j = OpenLoop(len, "elements");
    llvm::Value* at = b_.CreateAdd(base, j, "at", true, true);
    // Every value before any store: an output may read a stash another output's store replaces.
    std::vector<std::pair<size_t, llvm::Value*>> values;
    for (size_t k = 0; k < p.outputs.size(); ++k)
      if (p.outputs[k].row_value < 0)
        values.emplace_back(k, detail::EmitExpr(b_, m_, p.outputs[k].expr, detail::MathLib::kHost, j, reads));
    for (auto [k, v] : values) b_.CreateStore(v, b_.CreateInBoundsGEP(b_.getFloatTy(), out_ptrs[k], at));
    CloseLoop(j, len);
  }

  llvm::Module& m_;
  llvm::LLVMContext& ctx_;
  llvm::IRBuilder<> b_;
  const detail::HostTarget& host_;
  llvm::Function* fn_ = nullptr;
  llvm::BasicBlock *loop_ = nullptr, *after_ = nullptr, *pre_ = nullptr, *body_end_ = nullptr;
};

struct ProgramHash {
  size_t operator()(const RowProgram& p) const { return static_cast<size_t>(p.Hash()); }
};

struct Cache {
  std::mutex mu; // held while compiling, so one program is never built twice
  std::unordered_map<RowProgram, std::shared_ptr<RowKernel>, ProgramHash> kernels;
  CodegenStats stats;
  std::string last_ir;
  size_t attempts = 0; // numbers the symbols: one that failed to link is never reused
};

Cache& GetCache() {
  static Cache* cache = new Cache; // leaked: kernels may be used during static destruction
  return *cache;
}

/// `e` in Expr::ToString's form with operands k >= n (row values) named v(k - n), and k >= n + s
/// (stashes) named out(k - n - s).
std::string Render(const Expr& e, size_t n, size_t s_count) {
  std::string s = e.ToString(), out;
  for (size_t i = 0; i < s.size();) {
    bool word_start = i == 0 || !std::isalnum(static_cast<unsigned char>(s[i - 1]));
    if (word_start && s.compare(i, 2, "in") == 0 && i + 2 < s.size() &&
        std::isdigit(static_cast<unsigned char>(s[i + 2]))) {
      size_t j = i + 2;
      while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
      size_t k = std::stoul(s.substr(i + 2, j - i - 2));
      out += k < n             ? "in" + std::to_string(k)
             : k < n + s_count ? "v" + std::to_string(k - n)
                               : "out" + std::to_string(k - n - s_count);
      i = j;
    } else {
      out += s[i++];
    }
  }
  return out;
}

} // namespace

uint64_t RowProgram::Hash() const {
  uint64_t h = Mix(0, inputs.size());
  for (InputKind k : inputs) h = Mix(h, k);
  h = Mix(h, steps.size());
  for (const Step& s : steps) h = Mix(Mix(Mix(h, s.kind), s.expr.Hash()), static_cast<uint64_t>(s.stash));
  h = Mix(h, outputs.size());
  for (const Output& o : outputs)
    h = Mix(Mix(h, static_cast<uint64_t>(o.row_value)), o.row_value >= 0 ? 0 : o.expr.Hash());
  return h;
}

void RowProgram::Validate() const {
  if (outputs.empty()) throw UnsupportedError("codegen: a row program without outputs");
  const int n = static_cast<int>(inputs.size());
  const int num_steps = static_cast<int>(steps.size()), num_outputs = static_cast<int>(outputs.size());
  std::vector<bool> stashed(outputs.size(), false);
  for (const Step& s : steps) {
    if (s.stash < 0) continue;
    if (s.kind == kPerRow || s.stash >= num_outputs || outputs[static_cast<size_t>(s.stash)].row_value >= 0 ||
        stashed[static_cast<size_t>(s.stash)])
      KILN_THROW(codegen::UnsupportedError) << "codegen: a step stashes into output " << s.stash
                                            << ", which is not an elementwise output of its own";
    stashed[static_cast<size_t>(s.stash)] = true;
  }
  // Reads of `e` must be arrays or row values before `limit` (or, for outputs, stashes); per-row
  // code reads no element.
  auto check = [&](const Expr& e, int limit, bool per_row, const char* what) {
    e.Validate();
    for (const Expr::Node& node : e.nodes) {
      if (node.kind != Expr::Kind::kInput) continue;
      const int stash = node.input - n - num_steps;
      if (limit == num_steps && stash >= 0 && stash < num_outputs && stashed[static_cast<size_t>(stash)])
        continue;
      if (node.outer != 0 || node.input >= n + limit)
        KILN_THROW(codegen::UnsupportedError) << "codegen: " << what << " reads operand " << node.input
                                              << ", which is not an array or an earlier row value";
      if (per_row && node.input < n && (inputs[node.input] == kElement || inputs[node.input] == kColumn))
        KILN_THROW(codegen::UnsupportedError) << "codegen: " << what << " is computed once per row but reads "
                                              << "the row's elements (array " << node.input << ")";
    }
  };
  for (size_t v = 0; v < steps.size(); ++v)
    check(steps[v].expr, static_cast<int>(v), steps[v].kind == kPerRow, "a row step");
  for (const Output& o : outputs) {
    if (o.row_value >= static_cast<int>(steps.size()))
      KILN_THROW(codegen::UnsupportedError)
          << "codegen: an output writes row value " << o.row_value << " of " << steps.size();
    if (o.row_value < 0) check(o.expr, static_cast<int>(steps.size()), false, "an output");
  }
}

std::string RowProgram::ToString() const {
  static const char* kinds[] = {"sum", "mean", "max", "min", ""};
  std::string s;
  for (size_t v = 0; v < steps.size(); ++v) {
    std::string e = Render(steps[v].expr, inputs.size(), steps.size());
    s += (v ? "; v" : "v") + std::to_string(v) + " = " +
         (steps[v].kind == kPerRow ? e : std::string(kinds[steps[v].kind]) + "(" + e + ")");
    if (steps[v].stash >= 0) s += " -> out" + std::to_string(steps[v].stash);
  }
  for (size_t k = 0; k < outputs.size(); ++k)
    s += (s.empty() ? "out" : "; out") + std::to_string(k) + " = " +
         (outputs[k].row_value >= 0 ? "v" + std::to_string(outputs[k].row_value)
                                    : Render(outputs[k].expr, inputs.size(), steps.size()));
  return s;
}

void RowKernel::Run(const float* const* ins, float* const* outs, int64_t rows, int64_t len) const {
  // 32K elements per chunk at least: below that the fork-join costs more than the rows.
  host::ParallelFor(rows, std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(len, 1)),
                    [&](int64_t b, int64_t e) { fn_(ins, outs, b, e, len); });
}

std::shared_ptr<RowKernel> CompileRow(const RowProgram& p) {
  p.Validate();
  Cache& cache = GetCache();
  std::lock_guard<std::mutex> lock(cache.mu);
  if (auto it = cache.kernels.find(p); it != cache.kernels.end()) {
    ++cache.stats.cache_hits;
    return it->second;
  }
  auto t0 = std::chrono::steady_clock::now();
  RowKernel::Fn fn;
  try {
    const detail::HostTarget& host = detail::Host();
    char name[48];
    std::snprintf(name, sizeof name, "kiln_row_%016" PRIx64 "_%zu", p.Hash(), cache.attempts++);
    llvm::LLVMContext ctx;
    llvm::Module m(name, ctx);
    m.setDataLayout(host.tm->createDataLayout());
    m.setTargetTriple(host.triple.str());
    RowLowering(m, host).Build(p, name);
    detail::CheckModule(m, p.ToString());
    detail::OptimizeO3(m, host.tm, host.have_libmvec);
    cache.last_ir.clear();
    llvm::raw_string_ostream os(cache.last_ir);
    m.print(os, nullptr);
    std::string object = detail::EmitHostObject(m);
    // LoadObject returns the symbol typed as an elementwise kernel; it is this row kernel.
    fn = reinterpret_cast<RowKernel::Fn>(reinterpret_cast<void (*)()>(detail::LoadObject(object, name)));
  } catch (const InternalError& err) { // LLVM refused: the caller runs the ops unfused
    std::fprintf(stderr, "kiln: warning: codegen could not compile %s (%s); it runs unfused\n",
                 p.ToString().c_str(), err.what());
    KILN_THROW(codegen::UnsupportedError)
        << "codegen: compiling " << p.ToString() << " failed: " << err.what();
  }
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  auto kernel = std::make_shared<RowKernel>(fn, static_cast<int>(p.inputs.size()),
                                            static_cast<int>(p.outputs.size()), ms, p.ToString());
  cache.kernels.emplace(p, kernel);
  ++cache.stats.compiles;
  cache.stats.compile_ms += ms;
  return kernel;
}

CodegenStats GetRowStats() {
  Cache& cache = GetCache();
  std::lock_guard<std::mutex> lock(cache.mu);
  return cache.stats;
}

std::string LastRowIR() {
  Cache& cache = GetCache();
  std::lock_guard<std::mutex> lock(cache.mu);
  return cache.last_ir;
}

} // namespace kiln::codegen
