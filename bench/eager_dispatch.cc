// The per-op cost of queuing a tiny op from C++: `c = Invoke1("add", {a, b})` on 1 and 64
// float32 elements, N ops then one WaitForAll, total time / N (median of repeats). Target: below
// 1 us per op. With the producer ahead of the worker (peak_pending at the limit) this is the
// engine's throughput; the producer's own cost, queuing without meeting backpressure, is
// measured apart (kiln_1elem_enqueue). Two parts of the path are measured alone in the same run
// as references: a bare engine Push of an empty task (2 reads, 1 fresh write variable), which
// the ratio line compares with, and Tensor::Empty of the output.
//
//   bench_eager_dispatch [--quick]
#include <cstdint>
#include <vector>

#include "bench_util.h"
#include "kiln/frontend/dispatch.h"
#include "kiln/runtime/engine.h"

namespace {

using kiln::Tensor;
using kiln::bench::Emit;
using kiln::bench::MedianOf;
using kiln::bench::Timer;
using kiln::engine::Engine;

constexpr const char* kBench = "eager_dispatch";

double InvokeUsPerOp(int64_t elems, int ops) {
  Tensor a = Tensor::FromVector<float>(std::vector<float>(elems, 1.f), {elems});
  Tensor b = Tensor::FromVector<float>(std::vector<float>(elems, 2.f), {elems});
  Tensor c;
  Engine::Get().WaitForAll();
  Timer t;
  for (int i = 0; i < ops; ++i) c = kiln::Invoke1("add", {a, b});
  Engine::Get().WaitForAll();
  return t.Us() / ops;
}

// The producer's side alone: batches small enough never to meet backpressure, timed up to the
// last Invoke1 return (what an eager caller waits for), with a WaitForAll between batches.
double EnqueueUsPerOp(int ops) {
  constexpr int kBatch = 256;
  Tensor a = Tensor::FromVector<float>({1.f}, {1});
  Tensor b = Tensor::FromVector<float>({2.f}, {1});
  Tensor c;
  double us = 0;
  for (int done = 0; done < ops; done += kBatch) {
    Engine::Get().WaitForAll();
    Timer t;
    for (int i = 0; i < kBatch; ++i) c = kiln::Invoke1("add", {a, b});
    us += t.Us();
  }
  Engine::Get().WaitForAll();
  return us / ops;
}

double EnginePushUsPerOp(int ops) {
  Engine& e = Engine::Get();
  kiln::engine::Var* in[2] = {e.NewVar(), e.NewVar()};
  kiln::engine::TaskOptions o;
  o.name = "noop";
  e.WaitForAll();
  Timer t;
  for (int i = 0; i < ops; ++i) {
    kiln::engine::Var* out[1] = {e.NewVar()};
    e.Push([] {}, in, out, o);
    e.ReleaseVar(out[0]);
  }
  e.WaitForAll();
  double us = t.Us() / ops;
  for (auto* v : in) e.ReleaseVar(v);
  return us;
}

double EmptyUsPerOp(int ops) {
  Timer t;
  for (int i = 0; i < ops; ++i) Tensor c = Tensor::Empty({1}, kiln::DType::kFloat32);
  return t.Us() / ops;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = kiln::bench::HasFlag(argc, argv, "--quick");
  const int ops = quick ? 20000 : 200000;
  const int repeats = quick ? 3 : 7;
  Engine& e = Engine::Get();

  InvokeUsPerOp(1, ops / 10);  // warm-up: kernel table, allocator pools, worker threads
  double per_op[2] = {};
  int64_t elems[2] = {1, 64};
  const char* cases[2] = {"kiln_1elem", "kiln_64elem"};
  for (int k = 0; k < 2; ++k) {
    e.ResetPeak();
    per_op[k] = MedianOf(repeats, [&] { return InvokeUsPerOp(elems[k], ops); });
    Emit(kBench, cases[k], "us_per_op", per_op[k], "us");
    Emit(kBench, cases[k], "peak_pending", static_cast<double>(e.Stats().peak_pending), "tasks");
  }

  // The same add with inline execution off (KILN_ENGINE_INLINE_BYTES=0): every op handed to a
  // worker, the path every op takes when its inputs are still being computed.
  size_t inline_limit = kiln::SetInlineLimit(0);
  double queued = MedianOf(repeats, [&] { return InvokeUsPerOp(1, ops); });
  Emit(kBench, "kiln_1elem_queued", "us_per_op", queued, "us");

  // Queuing alone (no backpressure): the latency an eager caller sees per op.
  double enqueue = MedianOf(repeats, [&] { return EnqueueUsPerOp(ops); });
  Emit(kBench, "kiln_1elem_enqueue", "us_per_op", enqueue, "us");
  double push = MedianOf(repeats, [&] { return EnginePushUsPerOp(ops); });
  Emit(kBench, "engine_push_noop", "us_per_op", push, "us");
  double empty = MedianOf(repeats, [&] { return EmptyUsPerOp(ops); });
  Emit(kBench, "tensor_empty_1elem", "us_per_op", empty, "us");
  // How many bare engine pushes one eager add costs (above 1: dispatch adds to the engine).
  Emit(kBench, "kiln_1elem_queued/engine_push_noop", "cost_ratio", queued / push, "x");
  kiln::SetInlineLimit(inline_limit);
  return 0;
}
