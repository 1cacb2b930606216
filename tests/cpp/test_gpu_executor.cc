// The executor of compiled plans on a GPU (runtime/executor.cc): a plan's steps on the worker's
// stream with a device-memory arena, captured into a CUDA graph on the second call and replayed
// afterwards (inputs whose address changes go through the graph's own buffers), and plain
// launches, with the reason printed once, when a step cannot be captured.
#include <doctest/doctest.h>

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "gpu_skip.h"
#include "kiln/frontend/tensor.h"
#include "kiln/runtime/allocator.h"
#include "kiln/runtime/cuda.h"
#include "kiln/runtime/engine.h"
#include "kiln/runtime/executor.h"
#include "test_util.h"

namespace {

using namespace kiln;

// A plan over float32 vectors of n: value 0 = the input, 1 = an arena intermediate (a copy of the
// input), 2 = the output (a copy of the intermediate). `extra` runs inside the second step.
void MakePlan(exec::Plan& p, int64_t n, std::function<void()> extra) {
  for (int i = 0; i < 3; ++i) p.values.push_back({DType::kFloat32, Shape({n})});
  auto copy = [](const exec::StepArgs& a) {
    cuda::CopyAsync(a.out[0].data, a.in[0].data, static_cast<size_t>(a.in[0].shape.numel()) * 4,
                    cuda::CopyKind::kDeviceToDevice);
  };
  p.steps.push_back({{0}, {1}, copy});
  p.steps.push_back({{1}, {2}, [copy, extra](const exec::StepArgs& a) {
                       copy(a);
                       if (extra) extra();
                     }});
  p.serial.places = {{exec::Place::kInput, 0}, {exec::Place::kArena, 0}, {exec::Place::kOutput, 0}};
  p.serial.arena_bytes = static_cast<size_t>(n) * 4;
  p.name = "test plan";
}

// Runs `p` on gpu(0) as an engine task from x into y.
void CallInto(const exec::Plan& p, const Tensor& x, const Tensor& y) {
  engine::Var* reads[] = {x.storage()->var()};
  engine::Var* writes[] = {y.storage()->var()};
  engine::TaskOptions o;
  o.device = gpu(0);
  o.name = "test_plan";
  engine::Engine::Get().Push(
      [&p, x, y] {
        TensorView in[] = {x.View()}, out[] = {y.View()};
        exec::Run(p, in, out, exec::CallInfo{gpu(0)});
      },
      reads, writes, o);
}

// Runs `p` from x to a fresh output; returns the output.
Tensor Call(const exec::Plan& p, const Tensor& x) {
  Tensor y = Tensor::Empty(x.shape(), DType::kFloat32, gpu(0));
  CallInto(p, x, y);
  return y;
}

}  // namespace

TEST_CASE("gpu executor: a plan is captured once as a CUDA graph and replayed with fresh inputs") {
  KILN_REQUIRE_GPU();
  exec::Plan p;
  MakePlan(p, 1000, nullptr);
  exec::GraphCounters& c = exec::CudaGraphCounters();
  const int64_t captures = c.captures, replays = c.replays, plain = c.plain_runs;
  std::vector<Tensor> keep;  // held: every call gets an input and an output at a new address
  for (int k = 0; k < 6; ++k) {
    std::vector<float> v = testing::Random(1000, -1, 1, static_cast<uint32_t>(k));
    Tensor x = Tensor::FromVector(v, Shape({1000})).To(gpu(0));
    Tensor y = Call(p, x);
    CHECK(y.ToVector<float>() == v);
    keep.push_back(x), keep.push_back(y);
  }
  CHECK(c.plain_runs - plain == 1);  // the first call
  CHECK(c.captures - captures == 1);  // the second
  CHECK(c.replays - replays == 4);
}

// Found on an H200: a hybridized block called again and again with the same input arrays
// stopped capturing, "the addresses of its weights changed on almost every call". Its output was
// at the same address in the first two calls (the allocator handed the freed block back), so it
// was read in place, and every later address cost a capture until the plan gave up. An address
// that moves after the second call is now staged like one that moved at the second call.
TEST_CASE("gpu executor: an output at the same address twice, then at new ones, is replayed, not refused") {
  KILN_REQUIRE_GPU();
  exec::Plan p;
  MakePlan(p, 256, nullptr);
  p.name = "same inputs plan";
  exec::GraphCounters& c = exec::CudaGraphCounters();
  const int64_t refused = c.refused, captures = c.captures, replays = c.replays, plain = c.plain_runs;
  std::vector<float> v = testing::Random(256, -1, 1, 40);
  const Tensor x = Tensor::FromVector(v, Shape({256})).To(gpu(0));  // the same input every call
  const Tensor first = Tensor::Empty(Shape({256}), DType::kFloat32, gpu(0));
  std::vector<Tensor> outs = {first, first};  // calls 1 and 2: one address
  for (int k = 0; k < 30; ++k) outs.push_back(Tensor::Empty(Shape({256}), DType::kFloat32, gpu(0)));
  std::string err = testing::CapturedStderr([&] {
    for (const Tensor& y : outs) {
      CallInto(p, x, y);
      CHECK(y.ToVector<float>() == v);
    }
  });
  CHECK(err.find("one by one") == std::string::npos);
  CHECK(c.refused - refused == 0);
  CHECK(c.plain_runs - plain == 1);
  CHECK(c.captures - captures == 2);  // the second call's graph read the output in place
  CHECK(c.replays - replays == static_cast<int64_t>(outs.size()) - 3);
}

TEST_CASE("gpu executor: a step that synchronizes cannot be captured: plain launches, the reason said once") {
  KILN_REQUIRE_GPU();
  exec::Plan p;
  MakePlan(p, 64, [] { cuda::SynchronizeWorkerStream(); });
  exec::GraphCounters& c = exec::CudaGraphCounters();
  const int64_t refused = c.refused, captures = c.captures;
  std::string err = testing::CapturedStderr([&] {
    for (int k = 0; k < 4; ++k) {
      std::vector<float> v = testing::Random(64, 0, 1, static_cast<uint32_t>(10 + k));
      Tensor y = Call(p, Tensor::FromVector(v, Shape({64})).To(gpu(0)));
      CHECK(y.ToVector<float>() == v);  // the failed capture ran nothing; the plain run did
    }
  });
  CHECK(c.refused - refused == 1);
  CHECK(c.captures - captures == 0);
  CHECK(testing::Has(err, "'test plan' launches its kernels one by one"));
  CHECK(testing::Has(err, "capturing it failed"));
  CHECK(err.find("one by one") == err.rfind("one by one"));  // once
}

// Found on an H200: a step that takes scratch memory from the caching allocator (cuDNN's
// convolution workspace) while its plan is captured. The free recorded an event into the
// capture and the allocator later queried it, which invalidated the capture, and the free during
// the unwinding threw from a destructor (std::terminate). Now the allocation is refused during a
// capture, the capture is discarded and the plan runs its kernels one by one, with the values
// right.
TEST_CASE("gpu executor: a step that takes scratch memory runs plainly, never from a captured graph") {
  KILN_REQUIRE_GPU();
  exec::Plan p;
  MakePlan(p, 64, [] {
    Allocator& a = GetAllocator(gpu(0));
    a.Free(a.Allocate(4096), 4096);
  });
  p.name = "scratch plan";
  exec::GraphCounters& c = exec::CudaGraphCounters();
  const int64_t refused = c.refused, captures = c.captures, replays = c.replays;
  std::string err = testing::CapturedStderr([&] {
    for (int k = 0; k < 4; ++k) {
      std::vector<float> v = testing::Random(64, 0, 1, static_cast<uint32_t>(20 + k));
      Tensor y = Call(p, Tensor::FromVector(v, Shape({64})).To(gpu(0)));
      CHECK(y.ToVector<float>() == v);
    }
  });
  CHECK(c.refused - refused == 1);
  CHECK(c.captures - captures == 0);
  CHECK(c.replays - replays == 0);
  CHECK(testing::Has(err, "'scratch plan' launches its kernels one by one"));
  CHECK(testing::Has(err, "while a CUDA graph is being captured"));
  // The allocator is usable afterwards, on this stream and on others.
  Tensor z = Tensor::FromVector(std::vector<float>(1000, 2.f), Shape({1000})).To(gpu(0));
  CHECK(z.ToVector<float>() == std::vector<float>(1000, 2.f));
}

TEST_CASE("gpu executor: a step that gives memory back during the capture discards the graph") {
  KILN_REQUIRE_GPU();
  Allocator& a = GetAllocator(gpu(0));
  std::vector<void*> blocks;
  exec::Plan p;
  // Each call frees a block taken before it: during the capture the free is set aside (an event
  // recorded then would join the capture) and pooled after it.
  MakePlan(p, 64, [&a, &blocks] {
    if (blocks.empty()) return;
    a.Free(blocks.back(), 2048);
    blocks.pop_back();
  });
  p.name = "freeing plan";
  exec::GraphCounters& c = exec::CudaGraphCounters();
  const int64_t refused = c.refused, captures = c.captures;
  engine::Engine::Get().WaitForAll();
  const int64_t frees = a.Stats().num_frees;
  std::vector<Tensor> keep;  // so that only the plan's frees reach the allocator
  std::string err = testing::CapturedStderr([&] {
    for (int k = 0; k < 3; ++k) {
      engine::Engine::Get().WaitForAll();
      blocks.push_back(a.Allocate(2048));
      std::vector<float> v = testing::Random(64, 0, 1, static_cast<uint32_t>(30 + k));
      Tensor x = Tensor::FromVector(v, Shape({64})).To(gpu(0));
      Tensor y = Call(p, x);
      CHECK(y.ToVector<float>() == v);
      keep.push_back(x), keep.push_back(y);
    }
  });
  CHECK(blocks.empty());
  CHECK(c.refused - refused == 1);
  CHECK(c.captures - captures == 0);
  CHECK(testing::Has(err, "gave device memory back during the capture"));
  // Calls 1 and 3 pooled their block at once; call 2's, set aside during the capture, was pooled
  // by the worker's next free (call 3's): nothing was lost.
  engine::Engine::Get().WaitForAll();
  CHECK(a.Stats().num_frees - frees == 3);
}

TEST_CASE("gpu executor: independent branches run on streams of their own, ordered by events") {
  KILN_REQUIRE_GPU();
  // Values: 0 = input; 1, 2 = copies of it on lanes 0 and 1; 3, 4 = the outputs, both written on
  // lane 0 (output 1 from lane 1's value, after waiting for its event).
  const int64_t n = 1 << 18;
  exec::Plan p;
  for (int i = 0; i < 5; ++i) p.values.push_back({DType::kFloat32, Shape({n})});
  std::vector<void*> streams(3, nullptr);
  auto copy = [&streams](int k) {
    return [k, &streams](const exec::StepArgs& a) {
      streams[static_cast<size_t>(k)] = cuda::CurrentStream();
      cuda::CopyAsync(a.out[0].data, a.in[0].data, static_cast<size_t>(a.in[0].shape.numel()) * 4,
                      cuda::CopyKind::kDeviceToDevice);
    };
  };
  p.steps.push_back({{0}, {1}, copy(0)});
  p.steps.push_back({{0}, {2}, copy(1)});
  p.steps.push_back({{2}, {4}, copy(2)});
  p.steps.push_back({{1}, {3}, [](const exec::StepArgs& a) {
                       cuda::CopyAsync(a.out[0].data, a.in[0].data, static_cast<size_t>(a.in[0].shape.numel()) * 4,
                                       cuda::CopyKind::kDeviceToDevice);
                     }});
  p.concurrent = true;
  p.lanes.num_lanes = 2;
  p.lanes.lane = {0, 1, 0, 0};
  p.lanes.waits = {{}, {}, {1}, {}};
  p.lanes.lists = {{0, 2, 3}, {1}};
  const size_t bytes = static_cast<size_t>(n) * 4;
  p.per_lane.places = {{exec::Place::kInput, 0}, {exec::Place::kArena, 0}, {exec::Place::kArena, static_cast<int64_t>(bytes)},
                       {exec::Place::kOutput, 0}, {exec::Place::kOutput, 1}};
  p.per_lane.arena_bytes = 2 * bytes;
  p.serial = p.per_lane;
  p.name = "two lanes";
  std::atomic<bool>& graphs = exec::CudaGraphsEnabled();
  const bool before = graphs.exchange(false);  // lanes are for plans launched kernel by kernel
  for (int k = 0; k < 3; ++k) {
    std::vector<float> v = testing::Random(static_cast<size_t>(n), -1, 1, static_cast<uint32_t>(20 + k));
    Tensor x = Tensor::FromVector(v, Shape({n})).To(gpu(0));
    Tensor y0 = Tensor::Empty(x.shape(), DType::kFloat32, gpu(0)), y1 = Tensor::Empty(x.shape(), DType::kFloat32, gpu(0));
    engine::Var* reads[] = {x.storage()->var()};
    engine::Var* writes[] = {y0.storage()->var(), y1.storage()->var()};
    engine::TaskOptions o;
    o.device = gpu(0);
    o.name = "two_lanes";
    engine::Engine::Get().Push(
        [&p, x, y0, y1] {
          TensorView in[] = {x.View()}, out[] = {y0.View(), y1.View()};
          exec::Run(p, in, out, exec::CallInfo{gpu(0)});
        },
        reads, writes, o);
    CHECK(y0.ToVector<float>() == v);
    CHECK(y1.ToVector<float>() == v);  // lane 0 read lane 1's copy only after its event
  }
  graphs = before;
  CHECK(streams[0] != nullptr);
  CHECK(streams[0] == streams[2]);  // lane 0: the worker's stream
  CHECK(streams[1] != streams[0]);  // lane 1: a stream of its own
}
