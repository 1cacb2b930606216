// CompileRow: RowProgram -> LLVM IR (a loop over rows, one inner loop per reduction and one for the
// elementwise outputs) -> O3 for the host CPU -> the process-wide LLJIT of CompileElementwise
// (detail::LoadObject), through the kernel cache (kernel_cache.cc: memory and disk). The per-element
// arithmetic is EmitExpr's (lower.cc), shared with the elementwise kernels, so both kinds of fused
// kernel compute the same functions the same way.
//
// Vectorizing the reductions: sums are fadd recurrences marked `reassoc` (that add only, not the
// arithmetic feeding it), max/min are llvm.maximum/llvm.minimum recurrences (NaN-propagating);
// the loop vectorizer turns both into lane-wise accumulators. Each row is in cache while its
// passes run, so the passes cost little more than one read of the row (a batch-norm channel of
// (256, C, 14, 14) is 200 KB: in L2).
//
// Strided rows (RowProgram::kStrided) loop over their stretches around the vectorized loop over a
// stretch's contiguous elements; a stretch's sum is added into a double. One-hot labels are
// loaded once per row and compared with the element's position in the row.
//
// Not here: PTX.
#include "kiln/codegen/row.h"

#include "lower.h"

#include <llvm/Analysis/ValueTracking.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/MDBuilder.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>

#include "kernel_cache.h"
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

/// Whether elementwise output k only repeats what a step stashed into its own array (a value read
/// outside the group that is also a reduction's operand): the kernel stores it once, in the step.
bool OwnStash(const RowProgram& p, size_t k) {
  const RowProgram::Output& o = p.outputs[k];
  return o.row_value < 0 && o.expr.nodes.size() == 1 && o.expr.nodes[0].kind == Expr::Kind::kInput &&
         o.expr.nodes[0].input == static_cast<int>(p.inputs.size() + p.steps.size() + k);
}

/// Builds `void name(const float** ins, float** outs, i64 row_begin, i64 row_end, i64 len, i64 rows,
/// i64 inner)`.
class RowLowering {
public:
  RowLowering(llvm::Module& m, const detail::HostTarget& host)
      : m_(m), ctx_(m.getContext()), b_(ctx_), host_(host) {}

  void Build(const RowProgram& p, const std::string& name) {
    auto* i64 = b_.getInt64Ty();
    auto* ptr = b_.getPtrTy();
    auto* f32 = b_.getFloatTy();
    auto* fty = llvm::FunctionType::get(b_.getVoidTy(), {ptr, ptr, i64, i64, i64, i64, i64}, false);
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
    strided_ = p.layout == RowProgram::kStrided;
    len_ = len;

    auto* entry = llvm::BasicBlock::Create(ctx_, "entry", fn_);
    auto* row = llvm::BasicBlock::Create(ctx_, "row", fn_);
    auto* exit = llvm::BasicBlock::Create(ctx_, "exit", fn_);
    b_.SetInsertPoint(entry);
    if (strided_) { // outer = len / inner stretches of inner elements, rows * inner apart
      llvm::Value *rows = fn_->getArg(5), *inner = fn_->getArg(6);
      llvm::Value* positive = b_.CreateICmpSGT(inner, b_.getInt64(0));
      inner_ = inner;
      outer_ = b_.CreateSelect(positive, b_.CreateSDiv(len, b_.CreateSelect(positive, inner, b_.getInt64(1))),
                               b_.getInt64(0), "outer");
      stretch_stride_ = b_.CreateMul(rows, inner, "stretch_stride", true, true);
    }
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
    if (p.layout == RowProgram::kColumns) {
      row->eraseFromParent();
      BuildColumns(p, in_ptrs, out_ptrs, scalars, inv_len, fn_->getArg(5), exit);
      return;
    }
    b_.CreateCondBr(b_.CreateICmpSLT(row_begin, row_end), row, exit);

    b_.SetInsertPoint(row);
    auto* r = b_.CreatePHI(i64, 2, "r");
    r->addIncoming(row_begin, entry);
    row_base_ = b_.CreateMul(r, strided_ ? inner_ : len, "base", /*HasNUW=*/true, /*HasNSW=*/true);
    // How each operand is read in this row; row values are appended as they are computed. Element
    // arrays and one-hot labels are read per element: ElementReads fills them in inside the loops.
    std::vector<detail::InputRead> reads(p.inputs.size());
    element_arrays_.clear();
    labels_.clear();
    for (size_t k = 0; k < p.inputs.size(); ++k) {
      detail::InputRead& rd = reads[k];
      switch (p.inputs[k]) {
      case RowProgram::kElement: element_arrays_.emplace_back(k, in_ptrs[k]); break;
      case RowProgram::kColumn: rd.ptr = in_ptrs[k]; break;
      case RowProgram::kRow:
        rd.kind = detail::InputRead::kValue;
        rd.value = b_.CreateLoad(f32, b_.CreateInBoundsGEP(f32, in_ptrs[k], r));
        break;
      case RowProgram::kScalar: rd = scalars[k]; break;
      case RowProgram::kOneHot:
      case RowProgram::kOneHot32: {
        llvm::Type* t = p.inputs[k] == RowProgram::kOneHot ? i64 : b_.getInt32Ty();
        llvm::Value* label = b_.CreateLoad(t, b_.CreateInBoundsGEP(t, in_ptrs[k], r), "label");
        labels_.emplace_back(k, b_.CreateSExt(label, i64));
        rd.kind = detail::InputRead::kValue; // the value is set per element
        break;
      }
      }
    }
    for (const RowProgram::Step& s : p.steps) {
      llvm::Value* v =
          s.kind == RowProgram::kPerRow
              ? detail::EmitExpr(b_, m_, s.expr, detail::MathLib::kHost, b_.getInt64(0), reads)
              : Reduce(s, reads, s.stash >= 0 ? out_ptrs[static_cast<size_t>(s.stash)] : nullptr);
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
        elementwise |= !OwnStash(p, k);
    }
    if (elementwise) {
      for (size_t k = 0; k < p.outputs.size(); ++k) { // stashes, read where they were stored
        element_arrays_.emplace_back(reads.size(), out_ptrs[k]);
        reads.push_back({});
      }
      Outputs(p, out_ptrs, reads);
    }
    auto* next = b_.CreateAdd(r, b_.getInt64(1), "r.next", true, true);
    r->addIncoming(next, b_.GetInsertBlock());
    b_.CreateCondBr(b_.CreateICmpSLT(next, row_end), row, exit);
    b_.SetInsertPoint(exit);
    b_.CreateRetVoid();
  }

private:
  /// Rows in a block of a kColumns kernel: each row value is an array of this many floats.
  static constexpr int64_t kBlock = 256;

  /// The kColumns kernel: rows [row_begin, row_end) in blocks of up to kBlock adjacent rows (the
  /// columns of a matrix), each pass a loop over the row's elements around a vectorized loop over
  /// the block, row values kept in arrays over the block. Element j of row r is at j * rows + r.
  void BuildColumns(const RowProgram& p, const std::vector<llvm::Value*>& in_ptrs,
                    const std::vector<llvm::Value*>& out_ptrs, const std::vector<detail::InputRead>& scalars,
                    llvm::Value* inv_len, llvm::Value* rows, llvm::BasicBlock* exit) {
    auto* f32 = b_.getFloatTy();
    auto* i64 = b_.getInt64Ty();
    llvm::Value *row_begin = fn_->getArg(2), *row_end = fn_->getArg(3);
    std::vector<llvm::Value*> values; // one array per step, in the entry block (static allocas)
    for (size_t v = 0; v < p.steps.size(); ++v)
      values.push_back(b_.CreateAlloca(llvm::ArrayType::get(f32, kBlock), nullptr, "v" + std::to_string(v)));
    llvm::BasicBlock* entry = b_.GetInsertBlock();
    auto* block = llvm::BasicBlock::Create(ctx_, "block", fn_);
    b_.CreateCondBr(b_.CreateICmpSLT(row_begin, row_end), block, exit);
    b_.SetInsertPoint(block);
    auto* r0 = b_.CreatePHI(i64, 2, "r0");
    r0->addIncoming(row_begin, entry);
    llvm::Value* left = b_.CreateSub(row_end, r0);
    llvm::Value* nb =
        b_.CreateSelect(b_.CreateICmpSLT(left, b_.getInt64(kBlock)), left, b_.getInt64(kBlock), "nb");
    // How operand k is read at position c of the block, elements of the row's element j at
    // `element` = j * rows + r0 (nullptr in per-row code); stashes only in the outputs.
    auto reads_at = [&](llvm::Value* element, bool stashes) {
      std::vector<detail::InputRead> r(p.inputs.size());
      for (size_t k = 0; k < p.inputs.size(); ++k) {
        switch (p.inputs[k]) {
        case RowProgram::kElement:
          if (element) r[k].ptr = b_.CreateInBoundsGEP(f32, in_ptrs[k], element);
          break;
        case RowProgram::kRow: r[k].ptr = b_.CreateInBoundsGEP(f32, in_ptrs[k], r0); break;
        case RowProgram::kScalar: r[k] = scalars[k]; break;
        default: break; // refused by Validate
        }
      }
      for (llvm::Value* v : values) r.push_back({detail::InputRead::kIndexed, v, nullptr});
      if (stashes)
        for (llvm::Value* o : out_ptrs)
          r.push_back({detail::InputRead::kIndexed, b_.CreateInBoundsGEP(f32, o, element), nullptr});
      return r;
    };
    for (size_t v = 0; v < p.steps.size(); ++v) {
      const RowProgram::Step& s = p.steps[v];
      const bool is_max = s.kind == RowProgram::kMax, is_min = s.kind == RowProgram::kMin;
      auto at = [&](llvm::Value* c) { return b_.CreateInBoundsGEP(f32, values[v], c); };
      if (s.kind == RowProgram::kPerRow) {
        std::vector<detail::InputRead> r = reads_at(nullptr, false);
        Loop c = OpenLoop(nb, "per_row");
        b_.CreateStore(detail::EmitExpr(b_, m_, s.expr, detail::MathLib::kHost, c.iv, r), at(c.iv));
        CloseLoop(c, nb);
        continue;
      }
      Loop c0 = OpenLoop(nb, "init");
      b_.CreateStore(llvm::ConstantFP::get(f32, is_max ? -INFINITY : is_min ? INFINITY : 0.0), at(c0.iv));
      CloseLoop(c0, nb);
      Loop j = OpenLoop(len_, "reduce.j");
      llvm::Value* element =
          b_.CreateAdd(b_.CreateMul(j.iv, rows, "", true, true), r0, "element", true, true);
      std::vector<detail::InputRead> r = reads_at(element, false);
      llvm::Value* stash =
          s.stash >= 0 ? b_.CreateInBoundsGEP(f32, out_ptrs[static_cast<size_t>(s.stash)], element) : nullptr;
      Loop c = OpenLoop(nb, "reduce");
      llvm::Value* x = detail::EmitExpr(b_, m_, s.expr, detail::MathLib::kHost, c.iv, r);
      if (stash) b_.CreateStore(x, b_.CreateInBoundsGEP(f32, stash, c.iv));
      llvm::Value* acc = b_.CreateLoad(f32, at(c.iv));
      b_.CreateStore(
          is_max || is_min
              ? b_.CreateBinaryIntrinsic(is_max ? llvm::Intrinsic::maximum : llvm::Intrinsic::minimum, acc, x)
              : b_.CreateFAdd(acc, x),
          at(c.iv));
      CloseLoop(c, nb);
      CloseLoop(j, len_);
      if (s.kind == RowProgram::kMean) {
        Loop c1 = OpenLoop(nb, "mean");
        b_.CreateStore(b_.CreateFMul(b_.CreateLoad(f32, at(c1.iv)), inv_len), at(c1.iv));
        CloseLoop(c1, nb);
      }
    }
    bool elementwise = false;
    for (size_t k = 0; k < p.outputs.size(); ++k) {
      const RowProgram::Output& o = p.outputs[k];
      if (o.row_value < 0) {
        elementwise |= !OwnStash(p, k);
        continue;
      }
      Loop c = OpenLoop(nb, "row_out");
      b_.CreateStore(
          b_.CreateLoad(f32, b_.CreateInBoundsGEP(f32, values[static_cast<size_t>(o.row_value)], c.iv)),
          b_.CreateInBoundsGEP(f32, b_.CreateInBoundsGEP(f32, out_ptrs[k], r0), c.iv));
      CloseLoop(c, nb);
    }
    if (elementwise) {
      Loop j = OpenLoop(len_, "elements.j");
      llvm::Value* element =
          b_.CreateAdd(b_.CreateMul(j.iv, rows, "", true, true), r0, "element", true, true);
      std::vector<detail::InputRead> r = reads_at(element, true);
      Loop c = OpenLoop(nb, "elements");
      // Every value before any store: an output may read a stash another output's store replaces.
      std::vector<std::pair<size_t, llvm::Value*>> vals;
      for (size_t k = 0; k < p.outputs.size(); ++k)
        if (p.outputs[k].row_value < 0 && !OwnStash(p, k))
          vals.emplace_back(k, detail::EmitExpr(b_, m_, p.outputs[k].expr, detail::MathLib::kHost, c.iv, r));
      for (auto [k, v] : vals)
        b_.CreateStore(v, b_.CreateInBoundsGEP(f32, b_.CreateInBoundsGEP(f32, out_ptrs[k], element), c.iv));
      CloseLoop(c, nb);
      CloseLoop(j, len_);
    }
    llvm::Value* next = b_.CreateAdd(r0, b_.getInt64(kBlock), "r0.next", true, true);
    r0->addIncoming(next, b_.GetInsertBlock());
    b_.CreateCondBr(b_.CreateICmpSLT(next, row_end), block, exit);
    b_.SetInsertPoint(exit);
    b_.CreateRetVoid();
  }

  struct Loop {
    llvm::BasicBlock *pre, *body, *after, *latch = nullptr;
    llvm::PHINode* iv;
  };
  /// Opens `for (i = 0; i < count; ++i)` (skipped when count <= 0), the builder in the body.
  Loop OpenLoop(llvm::Value* count, const std::string& label) {
    Loop l;
    l.pre = b_.GetInsertBlock();
    l.body = llvm::BasicBlock::Create(ctx_, label, fn_);
    l.after = llvm::BasicBlock::Create(ctx_, label + ".done", fn_);
    b_.CreateCondBr(b_.CreateICmpSGT(count, b_.getInt64(0)), l.body, l.after);
    b_.SetInsertPoint(l.body);
    l.iv = b_.CreatePHI(b_.getInt64Ty(), 2, label + ".i");
    l.iv->addIncoming(b_.getInt64(0), l.pre);
    return l;
  }
  /// Closes loop `l`; the builder continues after it.
  void CloseLoop(Loop& l, llvm::Value* count) {
    auto* next = b_.CreateAdd(l.iv, b_.getInt64(1), "", true, true);
    l.latch = b_.GetInsertBlock();
    l.iv->addIncoming(next, l.latch);
    b_.CreateCondBr(b_.CreateICmpSLT(next, count), l.body, l.after);
    b_.SetInsertPoint(l.after);
  }

  /// `reads` with the element arrays offset by `offset` (element `index` of the stretch is read at
  /// ptr[index]) and the one-hot values of the element at row position `pos`.
  std::vector<detail::InputRead> ElementReads(const std::vector<detail::InputRead>& reads,
                                              llvm::Value* offset, llvm::Value* pos) {
    std::vector<detail::InputRead> r = reads;
    for (auto [k, base] : element_arrays_)
      r[k] = {detail::InputRead::kIndexed, b_.CreateInBoundsGEP(b_.getFloatTy(), base, offset), nullptr};
    for (auto [k, label] : labels_)
      r[k].value = b_.CreateUIToFP(b_.CreateICmpEQ(pos, label), b_.getFloatTy());
    return r;
  }

  /// Emits `body(index, pos, offset, loop)` for every element of the row: element `pos` of the row
  /// is element `index` of the stretch that starts at element `offset` of the whole tensor (one
  /// stretch, the row, when contiguous). A strided row loops over stretches around the loop over
  /// elements: `open_outer` runs first in the outer loop's body (its phis), `fold` after the inner
  /// loop in it; a contiguous row calls `fold` after its one loop.
  void ForElements(const std::string& label,
                   const std::function<void(llvm::Value*, llvm::Value*, llvm::Value*, Loop&)>& body,
                   const std::function<void(Loop& inner, Loop& outer)>& open_outer = nullptr,
                   const std::function<void(Loop& inner, Loop& outer)>& fold = nullptr) {
    if (!strided_) {
      Loop l = OpenLoop(len_, label);
      Loop none{};
      body(l.iv, l.iv, row_base_, l);
      CloseLoop(l, len_);
      if (fold) fold(l, none);
      return;
    }
    Loop o = OpenLoop(outer_, label + ".outer");
    Loop none{};
    if (open_outer) open_outer(none, o);
    llvm::Value* offset =
        b_.CreateAdd(b_.CreateMul(o.iv, stretch_stride_, "", true, true), row_base_, "stretch", true, true);
    llvm::Value* first = b_.CreateMul(o.iv, inner_, "", true, true);
    Loop i = OpenLoop(inner_, label);
    body(i.iv, b_.CreateAdd(first, i.iv, "pos", true, true), offset, i);
    CloseLoop(i, inner_);
    if (fold) fold(i, o);
    CloseLoop(o, outer_);
  }

  /// The reduction of step `s` over the row; with `stash`, also stores each element's value at its
  /// place in that output array. A strided row reduces each stretch in float lanes, then the
  /// stretches (sums in double).
  llvm::Value* Reduce(const RowProgram::Step& s, const std::vector<detail::InputRead>& reads,
                      llvm::Value* stash) {
    auto* f32 = b_.getFloatTy();
    auto* f64 = b_.getDoubleTy();
    const bool is_max = s.kind == RowProgram::kMax, is_min = s.kind == RowProgram::kMin;
    const bool extremum = is_max || is_min;
    llvm::Value* init_v = llvm::ConstantFP::get(f32, is_max ? -INFINITY : is_min ? INFINITY : 0.0);
    llvm::Value* outer_init = extremum ? init_v : llvm::ConstantFP::get(f64, 0.0);
    auto combine = [&](llvm::Value* acc, llvm::Value* x) -> llvm::Value* {
      if (extremum)
        return b_.CreateBinaryIntrinsic(is_max ? llvm::Intrinsic::maximum : llvm::Intrinsic::minimum, acc, x);
      llvm::Value* sum = b_.CreateFAdd(acc, x);
      llvm::cast<llvm::Instruction>(sum)->setHasAllowReassoc(true); // this add only: vectorizable
      return sum;
    };
    llvm::PHINode *acc = nullptr, *outer_acc = nullptr;
    llvm::Value *next = nullptr, *stretch = nullptr, *outer_next = nullptr;
    llvm::BasicBlock* outer_pre = nullptr;
    llvm::BasicBlock* outer_latch = nullptr;
    llvm::BasicBlock *inner_pre = nullptr, *inner_latch = nullptr;
    ForElements(
        "reduce",
        [&](llvm::Value* index, llvm::Value* pos, llvm::Value* offset, Loop& l) {
          inner_pre = l.pre;
          acc = llvm::PHINode::Create(f32, 2, "acc");
          if (llvm::Instruction* first = l.body->getFirstNonPHI()) // with the loop's phis, before other code
            acc->insertBefore(first);
          else
            b_.Insert(acc);
          acc->addIncoming(init_v, l.pre);
          std::vector<detail::InputRead> r = ElementReads(reads, offset, pos);
          llvm::Value* x = detail::EmitExpr(b_, m_, s.expr, detail::MathLib::kHost, index, r);
          if (stash)
            b_.CreateStore(x, b_.CreateInBoundsGEP(f32, b_.CreateInBoundsGEP(f32, stash, offset), index));
          next = combine(acc, x);
        },
        [&](Loop&, Loop& o) {
          outer_pre = o.pre;
          outer_acc = b_.CreatePHI(outer_init->getType(), 2, "outer_acc");
          outer_acc->addIncoming(outer_init, o.pre);
        },
        [&](Loop& i, Loop&) {
          inner_latch = i.latch;
          acc->addIncoming(next, inner_latch);
          auto* result = b_.CreatePHI(f32, 2, "reduced");
          result->addIncoming(init_v, inner_pre);
          result->addIncoming(next, inner_latch);
          stretch = result;
          if (strided_) {
            outer_next = extremum ? combine(outer_acc, stretch)
                                  : b_.CreateFAdd(outer_acc, b_.CreateFPExt(stretch, f64));
            outer_latch = b_.GetInsertBlock(); // the outer loop's latch is closed right after this
          }
        });
    if (!strided_) return stretch;
    outer_acc->addIncoming(outer_next, outer_latch);
    auto* result = b_.CreatePHI(outer_init->getType(), 2, "reduced.row");
    result->addIncoming(outer_init, outer_pre);
    result->addIncoming(outer_next, outer_latch);
    return extremum ? static_cast<llvm::Value*>(result) : b_.CreateFPTrunc(result, f32);
  }

  void Outputs(const RowProgram& p, const std::vector<llvm::Value*>& out_ptrs,
               const std::vector<detail::InputRead>& reads) {
    ForElements("elements", [&](llvm::Value* index, llvm::Value* pos, llvm::Value* offset, Loop&) {
      std::vector<detail::InputRead> r = ElementReads(reads, offset, pos);
      // Every value before any store: an output may read a stash another output's store replaces.
      std::vector<std::pair<size_t, llvm::Value*>> values;
      for (size_t k = 0; k < p.outputs.size(); ++k)
        if (p.outputs[k].row_value < 0 && !OwnStash(p, k))
          values.emplace_back(k,
                              detail::EmitExpr(b_, m_, p.outputs[k].expr, detail::MathLib::kHost, index, r));
      for (auto [k, v] : values)
        b_.CreateStore(v, b_.CreateInBoundsGEP(b_.getFloatTy(),
                                               b_.CreateInBoundsGEP(b_.getFloatTy(), out_ptrs[k], offset),
                                               index));
    });
  }

  llvm::Module& m_;
  llvm::LLVMContext& ctx_;
  llvm::IRBuilder<> b_;
  const detail::HostTarget& host_;
  llvm::Function* fn_ = nullptr;
  bool strided_ = false;
  llvm::Value *len_ = nullptr, *inner_ = nullptr, *outer_ = nullptr, *stretch_stride_ = nullptr;
  llvm::Value* row_base_ = nullptr; ///< the row's first element: r * len, or r * inner (strided)
  std::vector<std::pair<size_t, llvm::Value*>> element_arrays_; ///< (read index, array) read per element
  std::vector<std::pair<size_t, llvm::Value*>> labels_;         ///< (read index, the row's label)
};

/// Tags every float load and store of `f` as reading an input array or writing (or reading back)
/// an output array, in two alias scopes that do not alias: RowKernel::Run's contract (no output
/// overlaps an input) stated to LLVM, so that vectorized loops need no run-time overlap checks.
void MarkInputsAndOutputs(llvm::Function& f) {
  llvm::LLVMContext& ctx = f.getContext();
  llvm::MDBuilder mdb(ctx);
  llvm::MDNode* domain = mdb.createAnonymousAliasScopeDomain("kiln.row");
  llvm::MDNode* in_scope = llvm::MDNode::get(ctx, {mdb.createAnonymousAliasScope(domain, "inputs")});
  llvm::MDNode* out_scope = llvm::MDNode::get(ctx, {mdb.createAnonymousAliasScope(domain, "outputs")});
  llvm::Value *ins = f.getArg(0), *outs = f.getArg(1);
  for (llvm::BasicBlock& bb : f) {
    for (llvm::Instruction& i : bb) {
      llvm::Value* ptr = nullptr;
      llvm::Type* type = nullptr;
      if (auto* load = llvm::dyn_cast<llvm::LoadInst>(&i))
        ptr = load->getPointerOperand(), type = load->getType();
      else if (auto* store = llvm::dyn_cast<llvm::StoreInst>(&i))
        ptr = store->getPointerOperand(), type = store->getValueOperand()->getType();
      if (!ptr || !type->getScalarType()->isFloatingPointTy()) continue; // not the pointer tables
      // An array's base pointer is loaded from the ins or outs table.
      auto* base = llvm::dyn_cast<llvm::LoadInst>(llvm::getUnderlyingObject(ptr, 0));
      if (!base) continue; // a row value's stack array
      const llvm::Value* table = llvm::getUnderlyingObject(base->getPointerOperand(), 0);
      if (table != ins && table != outs) continue;
      i.setMetadata(llvm::LLVMContext::MD_alias_scope, table == ins ? in_scope : out_scope);
      i.setMetadata(llvm::LLVMContext::MD_noalias, table == ins ? out_scope : in_scope);
    }
  }
}

/// The exact form of `p` for the kernel cache: equal forms are equal programs.
std::string ExactForm(const RowProgram& p) {
  std::string s;
  auto num = [&](const char* before, int64_t v) { s.append(before).append(std::to_string(v)); };
  num("layout ", p.layout);
  s.append("; inputs");
  for (RowProgram::InputKind k : p.inputs) num(" ", k);
  for (const RowProgram::Step& st : p.steps) {
    num("; step ", st.kind);
    num(" ", st.stash);
    s.append(" ").append(detail::ExactForm(st.expr));
  }
  for (const RowProgram::Output& o : p.outputs) {
    if (o.row_value >= 0) num("; out v", o.row_value);
    else s.append("; out ").append(detail::ExactForm(o.expr));
  }
  return s;
}

/// `e` in Expr::ToString's form with operands k >= n (row values) named v(k - n), k >= n + s
/// (stashes) named out(k - n - s), and one-hot labels onehot(ink).
std::string Render(const Expr& e, const std::vector<RowProgram::InputKind>& inputs, size_t s_count) {
  const size_t n = inputs.size();
  std::string s = e.ToString(), out;
  for (size_t i = 0; i < s.size();) {
    bool word_start = i == 0 || !std::isalnum(static_cast<unsigned char>(s[i - 1]));
    if (word_start && s.compare(i, 2, "in") == 0 && i + 2 < s.size() &&
        std::isdigit(static_cast<unsigned char>(s[i + 2]))) {
      size_t j = i + 2;
      while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
      size_t k = std::stoul(s.substr(i + 2, j - i - 2));
      const bool one_hot = k < n && (inputs[k] == RowProgram::kOneHot || inputs[k] == RowProgram::kOneHot32);
      out += one_hot           ? "onehot(in" + std::to_string(k) + ")"
             : k < n           ? "in" + std::to_string(k)
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
  uint64_t h = Mix(Mix(0, layout), inputs.size());
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
  for (InputKind k : inputs)
    if ((layout == kStrided && k == kColumn) ||
        (layout == kColumns && k != kElement && k != kRow && k != kScalar))
      throw UnsupportedError("codegen: a strided row program reads an array along the row or one-hot labels");
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
      if (per_row && node.input < n && inputs[node.input] != kRow && inputs[node.input] != kScalar)
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
  std::string s = layout == kStrided ? "strided: " : layout == kColumns ? "columns: " : "";
  const size_t prefix = s.size();
  for (size_t v = 0; v < steps.size(); ++v) {
    std::string e = Render(steps[v].expr, inputs, steps.size());
    s += (v ? "; v" : "v") + std::to_string(v) + " = " +
         (steps[v].kind == kPerRow ? e : std::string(kinds[steps[v].kind]) + "(" + e + ")");
    if (steps[v].stash >= 0) s += " -> out" + std::to_string(steps[v].stash);
  }
  for (size_t k = 0; k < outputs.size(); ++k)
    s += (s.size() == prefix ? "out" : "; out") + std::to_string(k) + " = " +
         (outputs[k].row_value >= 0 ? "v" + std::to_string(outputs[k].row_value)
                                    : Render(outputs[k].expr, inputs, steps.size()));
  return s;
}

void RowKernel::Run(const float* const* ins, float* const* outs, int64_t rows, int64_t len,
                    int64_t inner) const {
  // 32K elements per chunk at least: below that the fork-join costs more than the rows.
  host::ParallelFor(rows, std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(len, 1)),
                    [&](int64_t b, int64_t e) { fn_(ins, outs, b, e, len, rows, inner); });
}

std::shared_ptr<RowKernel> CompileRow(const RowProgram& p) {
  p.Validate();
  detail::KernelRequest r;
  r.kind = KernelKind::kRow;
  r.form = ExactForm(p);
  r.target = detail::TargetKey();
  r.build = [&](const std::string& name, std::string* ir) {
    const detail::HostTarget& host = detail::Host();
    llvm::LLVMContext ctx;
    llvm::Module m(name, ctx);
    m.setDataLayout(host.tm->createDataLayout());
    m.setTargetTriple(host.triple.str());
    RowLowering(m, host).Build(p, name);
    MarkInputsAndOutputs(*m.getFunction(name));
    detail::CheckModule(m, p.ToString());
    detail::OptimizeO3(m, host.tm, host.have_libmvec);
    ir->clear();
    llvm::raw_string_ostream os(*ir);
    m.print(os, nullptr);
    return detail::EmitHostObject(m);
  };
  r.link = [](std::string_view object, const std::string& name, std::shared_ptr<void>* code) {
    return reinterpret_cast<void*>(detail::LoadObject(object, name, code));
  };
  r.make = [&](void* fn, std::string_view, const std::string&, const detail::Obtained& how) {
    // LoadObject returns the symbol typed as an elementwise kernel; it is this row kernel.
    return std::make_shared<RowKernel>(reinterpret_cast<RowKernel::Fn>(fn), static_cast<int>(p.inputs.size()),
                                       static_cast<int>(p.outputs.size()), how.ms, p.ToString(), how.from_disk,
                                       how.code);
  };
  try {
    return detail::GetOrBuildAs<RowKernel>(r);
  } catch (const InternalError& err) { // LLVM refused: the caller runs the ops unfused
    std::fprintf(stderr, "kiln: warning: codegen could not compile %s (%s); it runs unfused\n",
                 p.ToString().c_str(), err.what());
    KILN_THROW(codegen::UnsupportedError)
        << "codegen: compiling " << p.ToString() << " failed: " << err.what();
  }
}

CodegenStats GetRowStats() { return GetKernelStats(KernelKind::kRow); }

std::string DiskCacheFile(const RowProgram& p) {
  return detail::DiskCacheFileOf(KernelKind::kRow, ExactForm(p), detail::TargetKey());
}

std::string LastRowIR() { return detail::LastIR(KernelKind::kRow); }

} // namespace kiln::codegen
