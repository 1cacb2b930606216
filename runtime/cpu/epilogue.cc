// The fallback of matmul/conv epilogues (onednn.h): the steps over a range of an output already
// in memory, in blocks that stay in L1 across the steps, with the scalar functions of
// runtime/cpu/elementwise.cc. Used where oneDNN does not run the epilogue as post-ops (the
// hand-written kernels, the few-rows matmul, steps its post-ops get wrong). Not here: choosing
// between the two (nn_dispatch.cc). Also RunEpilogueCall (epilogue_call.h), a plan step's entry.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kiln/runtime/cpu/epilogue_call.h"
#include "kiln/runtime/cpu/onednn.h"
#include "kiln/runtime/error.h"

namespace kiln::host {

namespace {

// The fallback's scalar functions: those of runtime/cpu/elementwise.cc, case by case.
template <UnaryFn F> void UnaryBlock(float* v, int64_t n) {
  for (int64_t k = 0; k < n; ++k) {
    const float x = v[k];
    if constexpr (F == UnaryFn::kRelu)
      v[k] = x > 0.f ? x : 0.f;
    else if constexpr (F == UnaryFn::kTanh)
      v[k] = std::tanh(x);
    else if constexpr (F == UnaryFn::kNeg)
      v[k] = -x;
    else if constexpr (F == UnaryFn::kAbs)
      v[k] = std::fabs(x);
    else if constexpr (F == UnaryFn::kSquare)
      v[k] = x * x;
    else if constexpr (F == UnaryFn::kSqrt)
      v[k] = std::sqrt(x);
    else if constexpr (F == UnaryFn::kExp)
      v[k] = std::exp(x);
    else if constexpr (F == UnaryFn::kLog)
      v[k] = std::log(x);
  }
}

template <BinaryFn F> void BinaryBlock(float* v, const float* o, int64_t n) {
  for (int64_t k = 0; k < n; ++k) {
    const float a = v[k], b = o[k];
    if constexpr (F == BinaryFn::kAdd)
      v[k] = a + b;
    else if constexpr (F == BinaryFn::kSub)
      v[k] = a - b;
    else if constexpr (F == BinaryFn::kMul)
      v[k] = a * b;
    else if constexpr (F == BinaryFn::kDiv)
      v[k] = a / b;
    else if constexpr (F == BinaryFn::kMaximum)
      v[k] = (a != a || a > b) ? a : b;
    else if constexpr (F == BinaryFn::kMinimum)
      v[k] = (a != a || a < b) ? a : b;
  }
}

void EpUnary(UnaryFn f, float* v, int64_t n) {
  switch (f) {
  case UnaryFn::kRelu: return UnaryBlock<UnaryFn::kRelu>(v, n);
  case UnaryFn::kTanh: return UnaryBlock<UnaryFn::kTanh>(v, n);
  case UnaryFn::kNeg: return UnaryBlock<UnaryFn::kNeg>(v, n);
  case UnaryFn::kAbs: return UnaryBlock<UnaryFn::kAbs>(v, n);
  case UnaryFn::kSquare: return UnaryBlock<UnaryFn::kSquare>(v, n);
  case UnaryFn::kSqrt: return UnaryBlock<UnaryFn::kSqrt>(v, n);
  case UnaryFn::kExp: return UnaryBlock<UnaryFn::kExp>(v, n);
  case UnaryFn::kLog: return UnaryBlock<UnaryFn::kLog>(v, n);
  default: KILN_CHECK(false) << "epilogue: unsupported unary function " << static_cast<int>(f);
  }
}

void EpBinary(BinaryFn f, float* v, const float* o, int64_t n) {
  switch (f) {
  case BinaryFn::kAdd: return BinaryBlock<BinaryFn::kAdd>(v, o, n);
  case BinaryFn::kSub: return BinaryBlock<BinaryFn::kSub>(v, o, n);
  case BinaryFn::kMul: return BinaryBlock<BinaryFn::kMul>(v, o, n);
  case BinaryFn::kDiv: return BinaryBlock<BinaryFn::kDiv>(v, o, n);
  case BinaryFn::kMaximum: return BinaryBlock<BinaryFn::kMaximum>(v, o, n);
  case BinaryFn::kMinimum: return BinaryBlock<BinaryFn::kMinimum>(v, o, n);
  default: KILN_CHECK(false) << "epilogue: unsupported binary function " << static_cast<int>(f);
  }
}

} // namespace

void ApplyEpilogue(float* y, int64_t begin, int64_t end, int64_t inner, int64_t channels, const Epilogue& e,
                   std::span<const TensorView> operands) {
  constexpr int64_t kBlock = 512; // floats: the block stays in L1 across the steps
  float chan[kBlock];
  for (int64_t b0 = begin; b0 < end; b0 += kBlock) {
    const int64_t n = std::min(kBlock, end - b0);
    float* v = y + b0;
    for (const EpilogueStep& s : e.steps) {
      switch (s.kind) {
      case EpilogueStep::kUnary: EpUnary(s.unary, v, n); break;
      case EpilogueStep::kLinear:
        for (int64_t k = 0; k < n; ++k) v[k] = s.alpha * v[k] + s.beta;
        break;
      case EpilogueStep::kBinary: {
        const float* o = operands[static_cast<size_t>(s.operand)].ptr<float>();
        if (s.per_channel && inner == 1 && b0 % channels + n <= channels) { // within one row
          o += b0 % channels;
        } else if (s.per_channel && inner == 1) { // the channel is the last axis: runs of the operand
          for (int64_t k = 0; k < n;) {
            const int64_t c = (b0 + k) % channels, run = std::min(n - k, channels - c);
            std::memcpy(chan + k, o + c, static_cast<size_t>(run) * sizeof(float));
            k += run;
          }
          o = chan;
        } else if (s.per_channel) { // runs of `inner` elements share a channel
          for (int64_t k = 0; k < n;) {
            const int64_t i = b0 + k, run = std::min(n - k, inner - i % inner);
            const float value = o[(i / inner) % channels];
            for (int64_t j = 0; j < run; ++j) chan[k + j] = value;
            k += run;
          }
          o = chan;
        } else {
          o += b0;
        }
        EpBinary(s.binary, v, o, n);
        break;
      }
      }
    }
  }
}

void RunEpilogueCall(const EpilogueCall& call, std::span<const TensorView> in, const TensorView& out) {
  KILN_CHECK(in.size() >= 2) << "an epilogue group reads its anchor's two inputs";
  if (call.anchor == EpilogueCall::kMatmul)
    MatmulEpilogue(in[0], in[1], out, call.matmul, call.epilogue, in.subspan(2));
  else
    Conv2dEpilogue(in[0], in[1], out, call.conv, call.epilogue, in.subspan(2));
}

} // namespace kiln::host
