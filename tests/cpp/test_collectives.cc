// In-process collectives (frontend/collectives.cc over runtime/collectives.cc) against a plain
// reference that accumulates in device order: every op and dtype on 1 to 4 CPU devices with odd
// sizes, bit-identical results on every device and for any chunking, the argument errors, and the
// engine contract (one task that waits for the producers of every device and passes their errors
// on; runs on the comm queue while compute workers are busy). GPU tests need a GPU.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "gpu_skip.h"
#include "kiln/frontend/collectives.h"
#include "kiln/runtime/collectives.h"
#include "kiln/runtime/engine.h"
#include "test_util.h"

using namespace kiln;

namespace {
using kiln::testing::ErrorOf;
using kiln::testing::Has;

// Raw bytes of one device's tensor, and values drawn to suit the dtype (floats with fractions and
// a wide range, so that a different summation order would show in the bits).
std::vector<char> Bytes(const Tensor& t) {
  std::vector<char> b(static_cast<size_t>(t.numel()) * DTypeSize(t.dtype()));
  t.CopyToHost(b.data());
  return b;
}

template <class T> std::vector<T> Values(int64_t n, std::mt19937& rng) {
  std::vector<T> v(static_cast<size_t>(n));
  if constexpr (std::is_integral_v<T>) {
    std::uniform_int_distribution<int> u(std::is_signed_v<T> ? -1000 : 0, std::is_signed_v<T> ? 1000 : 60);
    for (T& x : v) x = static_cast<T>(u(rng));
  } else {
    std::uniform_real_distribution<double> u(-1, 1);
    std::uniform_int_distribution<int> e(-8, 8);
    for (T& x : v) x = static_cast<T>(static_cast<float>(std::ldexp(u(rng), e(rng))));
  }
  return v;
}

// The reference: device order, compute type, as the header promises.
template <class T>
std::vector<T> Reference(const std::vector<std::vector<T>>& in, ReduceOp op, int64_t begin, int64_t n) {
  using C = compute_t<T>;
  std::vector<T> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    C acc = static_cast<C>(in[0][begin + i]);
    for (size_t d = 1; d < in.size(); ++d) {
      C x = static_cast<C>(in[d][begin + i]);
      if (op == ReduceOp::kSum || op == ReduceOp::kMean)
        acc = acc + x;
      else if (op == ReduceOp::kMax)
        acc = (x > acc || x != x) ? x : acc;
      else
        acc = (x < acc || x != x) ? x : acc;
    }
    if (op == ReduceOp::kMean) acc = acc / static_cast<C>(in.size());
    out[i] = static_cast<T>(acc);
  }
  return out;
}

template <class T> std::vector<char> AsBytes(const std::vector<T>& v) {
  const char* p = reinterpret_cast<const char*>(v.data());
  return std::vector<char>(p, p + v.size() * sizeof(T));
}

template <class T> Tensor Make(const std::vector<T>& v, Device d) {
  return Tensor::FromHost(v.data(), Shape({static_cast<int64_t>(v.size())}), DTypeOf<T>::value, d);
}

// A view of `t`'s storage: `n` elements from `offset` with stride `stride`.
Tensor ViewOf(const Tensor& t, int64_t offset, int64_t n, int64_t stride = 1) {
  auto impl = std::make_shared<TensorImpl>(*t.impl());
  impl->autograd = nullptr;
  impl->offset = t.offset() + offset;
  impl->shape = Shape({n});
  impl->strides = Shape({stride});
  return Tensor(impl);
}

// Waits for everything queued so far, dropping errors that earlier tests left unclaimed.
void Drain() {
  try {
    engine::Engine::Get().WaitForAll();
  } catch (const std::exception&) {
  }
}

const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax, ReduceOp::kMin};

template <class T> void CheckAllReduce(int D, int64_t n, ReduceOp op, std::mt19937& rng) {
  std::vector<std::vector<T>> in;
  std::vector<std::vector<Tensor>> groups;
  for (int d = 0; d < D; ++d) {
    in.push_back(Values<T>(n, rng));
    groups.push_back({Make(in.back(), cpu(d))});
  }
  AllReduce(groups, op);
  std::vector<char> want = AsBytes(Reference(in, op, 0, n));
  for (int d = 0; d < D; ++d) {
    INFO("dtype " << DTypeName(DTypeOf<T>::value) << ", op " << ReduceOpName(op) << ", " << D
                  << " devices, n " << n << ", device " << d);
    CHECK(Bytes(groups[d][0]) == want);
  }
}

template <class T> void AllReduceEveryOp(const std::vector<int64_t>& sizes) {
  std::mt19937 rng(7);
  for (int D = 1; D <= 4; ++D)
    for (int64_t n : sizes)
      for (ReduceOp op : kOps) CheckAllReduce<T>(D, n, op, rng);
}

} // namespace

TEST_CASE("collectives: allreduce matches the device-order reference, float32 and float64") {
  AllReduceEveryOp<float>({1, 7, 1000, 1000003});
  AllReduceEveryOp<double>({1, 7, 70001});
}

TEST_CASE("collectives: allreduce matches the device-order reference, 16-bit floats and integers") {
  AllReduceEveryOp<Half>({1, 7, 70001});
  AllReduceEveryOp<BFloat16>({1, 7, 70001});
  AllReduceEveryOp<int32_t>({1, 7, 70001});
  AllReduceEveryOp<int64_t>({1, 7, 70001});
  AllReduceEveryOp<uint8_t>({1, 7, 1001});
}

TEST_CASE("collectives: allreduce of several tensors per device, some empty, chunks spanning tensors") {
  std::mt19937 rng(3);
  const std::vector<int64_t> sizes = {3, 0, 70001, 1, 17};
  const int D = 3;
  std::vector<std::vector<std::vector<float>>> in(sizes.size()); // [k][d]
  std::vector<std::vector<Tensor>> groups(D);
  for (size_t k = 0; k < sizes.size(); ++k)
    for (int d = 0; d < D; ++d) {
      in[k].push_back(Values<float>(sizes[k], rng));
      groups[d].push_back(Make(in[k].back(), cpu(d)));
    }
  AllReduce(groups, ReduceOp::kMean);
  for (size_t k = 0; k < sizes.size(); ++k)
    for (int d = 0; d < D; ++d)
      CHECK(Bytes(groups[d][k]) == AsBytes(Reference(in[k], ReduceOp::kMean, 0, sizes[k])));
}

TEST_CASE("collectives: results do not depend on chunking or thread count, fused or blocked path") {
  std::mt19937 rng(11);
  const int64_t n = 100003;
  for (int D : {2, 4, 6}) { // up to 4 devices take the fused pass, more the accumulator blocks
    std::vector<std::vector<float>> in;
    for (int d = 0; d < D; ++d) {
      in.push_back(Values<float>(n, rng));
      for (float& x : in.back()) x *= (d % 2 ? 1e7f : 1e-3f); // rounding depends on the order
    }
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
      std::vector<char> want = AsBytes(Reference(in, op, 0, n));
      for (int64_t chunks : {1, 2, 3, 7, 64, 1000}) {
        for (int64_t grain : {1, 1000, 1 << 15}) {
          std::vector<std::vector<float>> bufs = in;
          coll::BufferSet b;
          b.dtype = DType::kFloat32;
          b.numel = {n};
          for (auto& v : bufs) b.ptrs.push_back(v.data());
          coll::HostAllReduce(b, static_cast<coll::ReduceOp>(op), {chunks, grain});
          for (int d = 0; d < D; ++d) {
            INFO(D << " devices, op " << ReduceOpName(op) << ", chunks " << chunks << " grain " << grain
                   << " device " << d);
            CHECK(AsBytes(bufs[d]) == want);
          }
        }
      }
    }
  }
}

TEST_CASE("collectives: more devices than the fused pass handles, through the frontend") {
  std::mt19937 rng(17);
  for (ReduceOp op : kOps) {
    CheckAllReduce<float>(6, 70001, op, rng);
    CheckAllReduce<Half>(5, 1001, op, rng);
  }
  const int D = 6;
  const int64_t n = 1001;
  std::vector<std::vector<double>> in;
  std::vector<Tensor> inputs, outputs;
  std::vector<int64_t> counts = coll::SplitCounts(n, D);
  for (int d = 0; d < D; ++d) {
    in.push_back(Values<double>(n, rng));
    inputs.push_back(Make(in.back(), cpu(d)));
    outputs.push_back(Tensor::Empty(Shape({counts[d]}), DType::kFloat64, cpu(d)));
  }
  ReduceScatter(inputs, outputs, ReduceOp::kMean);
  int64_t off = 0;
  for (int d = 0; d < D; ++d) {
    CHECK(Bytes(outputs[d]) == AsBytes(Reference(in, ReduceOp::kMean, off, counts[d])));
    off += counts[d];
  }
}

TEST_CASE("collectives: broadcast from every root") {
  std::mt19937 rng(5);
  for (int D = 1; D <= 4; ++D)
    for (int root = 0; root < D; ++root) {
      std::vector<std::vector<double>> in;
      std::vector<std::vector<Tensor>> groups;
      for (int d = 0; d < D; ++d) {
        in.push_back(Values<double>(1009, rng));
        groups.push_back({Make(in.back(), cpu(d)), Make(std::vector<double>{double(d)}, cpu(d))});
      }
      Broadcast(groups, root);
      for (int d = 0; d < D; ++d) {
        CHECK(Bytes(groups[d][0]) == AsBytes(in[root]));
        CHECK(groups[d][1].Item() == root);
      }
    }
}

TEST_CASE("collectives: reduce_scatter gives each device its np.array_split part, also in place") {
  std::mt19937 rng(9);
  CHECK(coll::SplitCounts(10, 4) == std::vector<int64_t>{3, 3, 2, 2});
  CHECK(coll::SplitCounts(2, 3) == std::vector<int64_t>{1, 1, 0});
  for (int D = 1; D <= 4; ++D)
    for (int64_t n : {1, 7, 12, 1000003})
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax})
        for (bool in_place : {false, true}) {
          std::vector<std::vector<float>> in;
          std::vector<Tensor> inputs, outputs;
          std::vector<int64_t> counts = coll::SplitCounts(n, D);
          int64_t off = 0;
          std::vector<int64_t> offs;
          for (int d = 0; d < D; ++d) {
            in.push_back(Values<float>(n, rng));
            inputs.push_back(Make(in.back(), cpu(d)));
            outputs.push_back(in_place ? ViewOf(inputs[d], off, counts[d])
                                       : Tensor::Empty(Shape({counts[d]}), DType::kFloat32, cpu(d)));
            offs.push_back(off);
            off += counts[d];
          }
          ReduceScatter(inputs, outputs, op);
          for (int d = 0; d < D; ++d) {
            INFO(D << " devices, n " << n << ", op " << ReduceOpName(op) << ", in place " << in_place
                   << ", device " << d);
            CHECK(Bytes(outputs[d]) == AsBytes(Reference(in, op, offs[d], counts[d])));
          }
        }
}

TEST_CASE("collectives: all_gather concatenates uneven parts in device order, also in place") {
  std::mt19937 rng(13);
  for (int D = 1; D <= 4; ++D)
    for (bool in_place : {false, true}) {
      std::vector<int64_t> counts;
      std::vector<int32_t> all;
      std::vector<Tensor> inputs, outputs;
      for (int d = 0; d < D; ++d) counts.push_back(d == 1 ? 0 : 1000 + 7 * d);
      int64_t total = 0;
      for (int64_t c : counts) total += c;
      std::vector<std::vector<int32_t>> parts;
      for (int d = 0; d < D; ++d) {
        parts.push_back(Values<int32_t>(counts[d], rng));
        all.insert(all.end(), parts[d].begin(), parts[d].end());
      }
      int64_t off = 0;
      for (int d = 0; d < D; ++d) {
        outputs.push_back(Make(std::vector<int32_t>(static_cast<size_t>(total), -1), cpu(d)));
        if (in_place) {
          inputs.push_back(ViewOf(outputs[d], off, counts[d]));
          Make(parts[d], cpu(d)).CopyTo(inputs[d]);
        } else {
          inputs.push_back(Make(parts[d], cpu(d)));
        }
        off += counts[d];
      }
      AllGather(inputs, outputs);
      for (int d = 0; d < D; ++d) {
        INFO(D << " devices, in place " << in_place << ", device " << d);
        CHECK(outputs[d].ToVector<int32_t>() == all);
      }
    }
}

TEST_CASE("collectives: argument errors say what was expected and what was found") {
  auto f = [](std::vector<float> v, int d) { return Make(v, cpu(d)); };
  std::vector<std::vector<Tensor>> none;
  CHECK(Has(ErrorOf<ValueError>([&] { AllReduce(none); }), "empty list"));

  std::vector<std::vector<Tensor>> shapes = {{f({1, 2, 3}, 0)}, {f({1, 2}, 1)}};
  std::string e = ErrorOf<ShapeError>([&] { AllReduce(shapes); });
  CHECK(Has(e, "tensor 0 of device 1 has shape (2,)"));
  CHECK(Has(e, "tensor 0 of device 0 has shape (3,)"));

  std::vector<std::vector<Tensor>> same = {{f({1}, 0)}, {f({1}, 1)}, {f({1}, 0)}};
  e = ErrorOf<DeviceError>([&] { AllReduce(same); });
  CHECK(Has(e, "entries 0 and 2 are both on cpu(0)"));

  std::vector<std::vector<Tensor>> counts = {{f({1}, 0), f({1}, 0)}, {f({1}, 1)}};
  CHECK(Has(ErrorOf<ValueError>([&] { AllReduce(counts); }), "device 1 has 1 arrays but device 0 has 2"));

  std::vector<std::vector<Tensor>> dtypes = {{f({1}, 0)}, {Make(std::vector<double>{1}, cpu(1))}};
  e = ErrorOf<DTypeError>([&] { AllReduce(dtypes); });
  CHECK(Has(e, "tensor 0 of device 1 has dtype float64"));

  Tensor big = f({1, 2, 3, 4}, 1);
  std::vector<std::vector<Tensor>> strided = {{f({1, 2}, 0)}, {ViewOf(big, 0, 2, 2)}};
  CHECK(Has(ErrorOf<ValueError>([&] { AllReduce(strided); }),
            "tensor 0 of device 1 (shape (2,)) is a non-contiguous view"));

  Tensor t0 = f({1, 2}, 0);
  std::vector<std::vector<Tensor>> twice = {{t0, t0}, {f({1, 2}, 1), f({1, 2}, 1)}};
  CHECK(Has(ErrorOf<ValueError>([&] { AllReduce(twice); }), "share memory"));

  std::vector<std::vector<Tensor>> bools = {
      {Tensor::FromVector(std::vector<bool>{true}, Shape({1}), cpu(0))},
      {Tensor::FromVector(std::vector<bool>{true}, Shape({1}), cpu(1))}};
  CHECK(Has(ErrorOf<DTypeError>([&] { AllReduce(bools); }), "cannot reduce bool"));

  std::vector<std::vector<Tensor>> ok = {{f({1}, 0)}, {f({1}, 1)}};
  CHECK(Has(ErrorOf<ValueError>([&] { Broadcast(ok, 2); }),
            "root 2 is not a device of the call; expected 0 to 1"));
  CHECK(Has(ErrorOf<ValueError>([&] { ParseReduceOp("avg"); }), "expected one of sum, mean, max, min"));

  std::vector<Tensor> in = {f({1, 2, 3}, 0), f({1, 2, 3}, 1)};
  std::vector<Tensor> out = {f({0, 0}, 0), f({0, 0}, 1)};
  e = ErrorOf<ShapeError>([&] { ReduceScatter(in, out); });
  CHECK(Has(e, "outputs[1] has 2 elements"));
  CHECK(Has(e, "part 1 of 3 elements over 2 devices has 1"));
  std::vector<Tensor> out_dev = {f({0, 0}, 0), f({0}, 0)};
  CHECK(Has(ErrorOf<DeviceError>([&] { ReduceScatter(in, out_dev); }),
            "outputs[1] is on cpu(0) but inputs[1] is on cpu(1)"));
  std::vector<Tensor> one = {f({0}, 0)};
  CHECK(Has(ErrorOf<ValueError>([&] { ReduceScatter(in, one); }), "2 inputs but 1 outputs"));
  std::vector<Tensor> empty;
  CHECK(Has(ErrorOf<ValueError>([&] { AllGather(empty, empty); }), "empty list"));
  std::vector<Tensor> gathered = {f({0, 0, 0, 0, 0}, 0), f({0, 0, 0, 0, 0, 0}, 1)};
  CHECK(Has(ErrorOf<ShapeError>([&] { AllGather(in, gathered); }),
            "outputs[0] has 5 elements (shape (5,)) but the inputs add up to 6"));
  // In place means exactly the device's own part; any other overlap is refused.
  Tensor g0 = f({0, 0, 0, 0, 0, 0}, 0);
  std::vector<Tensor> wrong_part = {ViewOf(g0, 1, 3), f({1, 2, 3}, 1)};
  std::vector<Tensor> outs = {g0, f({0, 0, 0, 0, 0, 0}, 1)};
  CHECK(Has(ErrorOf<ValueError>([&] { AllGather(wrong_part, outs); }),
            "inputs[0] and outputs[0] share memory"));
}

TEST_CASE("collectives: one engine task that waits for pending writes on every device") {
  engine::Engine& eng = engine::Engine::Get();
  std::vector<std::vector<Tensor>> groups = {{Make(std::vector<float>{1, 2}, cpu(0))},
                                             {Make(std::vector<float>{10, 20}, cpu(1))}};
  Drain();
  // A slow producer of device 1's tensor: the allreduce must see what it writes.
  float* p1 = static_cast<float*>(groups[1][0].View().data);
  engine::Var* v1 = groups[1][0].storage()->var();
  engine::TaskOptions o;
  o.device = cpu(1);
  o.name = "slow_producer";
  eng.Push(
      [p1] {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        p1[0] = 100, p1[1] = 200;
      },
      {}, std::span<engine::Var* const>(&v1, 1), o);
  int64_t before = eng.Stats().pushed;
  AllReduce(groups);
  CHECK(eng.Stats().pushed - before == 1);
  std::vector<std::vector<Tensor>> alone = {groups[0]};
  AllReduce(alone);  // one device: the identity, checked but not queued
  CHECK(eng.Stats().pushed - before == 1);
  CHECK(groups[0][0].ToVector<float>() == std::vector<float>{101, 202});
  CHECK(groups[1][0].ToVector<float>() == std::vector<float>{101, 202});
}

TEST_CASE("collectives: an error of a producer is stored on every output of the collective") {
  engine::Engine& eng = engine::Engine::Get();
  Drain();
  std::vector<std::vector<Tensor>> groups = {{Make(std::vector<float>{1}, cpu(0))},
                                             {Make(std::vector<float>{2}, cpu(1))}};
  engine::Var* v1 = groups[1][0].storage()->var();
  engine::TaskOptions o;
  o.device = cpu(1);
  o.name = "failing_producer";
  eng.Push([] { KILN_THROW(ValueError) << "the producer failed"; }, {}, std::span<engine::Var* const>(&v1, 1),
           o);
  AllReduce(groups);
  std::string e = ErrorOf<ValueError>([&] { groups[0][0].WaitToRead(); });
  CHECK(Has(e, "the producer failed"));
  CHECK(Has(e, "failing_producer"));
  CHECK_THROWS_AS(eng.WaitForAll(), ValueError);
}

TEST_CASE("collectives: a CPU collective runs while the device's compute worker is busy") {
  engine::Engine& eng = engine::Engine::Get();
  if (eng.IsNaive()) return; // the naive engine runs everything on the caller, in order
  std::vector<std::vector<Tensor>> groups = {{Make(std::vector<float>{1}, cpu(0))},
                                             {Make(std::vector<float>{2}, cpu(1))}};
  Tensor busy = Make(std::vector<float>{0}, cpu(0));
  engine::Var* vb = busy.storage()->var();
  auto released = std::make_shared<std::atomic<bool>>(false);
  auto timed_out = std::make_shared<std::atomic<bool>>(false);
  engine::TaskOptions o;
  o.device = cpu(0);
  o.name = "busy_compute";
  eng.Push(
      [released, timed_out] {
        auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!released->load()) {
          if (std::chrono::steady_clock::now() > until) return timed_out->store(true);
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      },
      {}, std::span<engine::Var* const>(&vb, 1), o);
  AllReduce(groups);
  CHECK(groups[0][0].ToVector<float>() == std::vector<float>{3}); // before the compute task ends
  released->store(true);
  eng.WaitForAll();
  CHECK(!timed_out->load());
}

TEST_CASE("collectives: GPU allreduce, broadcast, reduce_scatter and all_gather through NCCL") {
  KILN_REQUIRE_GPU();
  const int D = NumGPUs();
  std::mt19937 rng(1);
  for (int64_t n : {1, 7, 1000003}) {
    std::vector<std::vector<float>> in;
    std::vector<std::vector<Tensor>> groups;
    for (int d = 0; d < D; ++d) {
      in.push_back(Values<float>(n, rng));
      groups.push_back({Make(in.back(), gpu(d))});
    }
    AllReduce(groups, ReduceOp::kMax); // max is exact whatever the order
    std::vector<float> want = Reference(in, ReduceOp::kMax, 0, n);
    for (int d = 0; d < D; ++d) CHECK(groups[d][0].ToVector<float>() == want);
    AllReduce(groups, ReduceOp::kSum);
    std::vector<float> first = groups[0][0].ToVector<float>();
    for (int d = 1; d < D; ++d) CHECK(groups[d][0].ToVector<float>() == first);
    for (int64_t i = 0; i < n; ++i) CHECK(first[i] == doctest::Approx(want[i] * D).epsilon(1e-5));

    std::vector<Tensor> inputs, outputs, gathered;
    std::vector<int64_t> counts = coll::SplitCounts(n, D);
    for (int d = 0; d < D; ++d) {
      inputs.push_back(Make(in[d], gpu(d)));
      outputs.push_back(Tensor::Empty(Shape({counts[d]}), DType::kFloat32, gpu(d)));
      gathered.push_back(Tensor::Empty(Shape({n}), DType::kFloat32, gpu(d)));
    }
    ReduceScatter(inputs, outputs, ReduceOp::kMin);
    AllGather(outputs, gathered);
    std::vector<float> min = Reference(in, ReduceOp::kMin, 0, n);
    for (int d = 0; d < D; ++d) CHECK(gathered[d].ToVector<float>() == min);
    Broadcast(groups, D - 1);
    for (int d = 0; d < D; ++d) CHECK(groups[d][0].ToVector<float>() == first);
  }
}

TEST_CASE("collectives: the MPI ring's reduction step is the host collectives' loop, NaN included") {
  // coll::HostReduceInto (what mpi.cc reduces each received segment with) and a two-device HostAllReduce
  // give the same bits, and max/min propagate NaN as NumPy does, as the reduction kernels do.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> a{1.f, nan, -3.f, 2.f, 0.5f}, b{4.f, 2.f, nan, -7.f, 0.25f};
  for (coll::ReduceOp op : {coll::ReduceOp::kSum, coll::ReduceOp::kMax, coll::ReduceOp::kMin}) {
    std::vector<float> into = a, x = a, y = b;
    coll::HostReduceInto(DType::kFloat32, into.data(), b.data(), 5, op);
    coll::BufferSet set{DType::kFloat32, {5}, {x.data(), y.data()}};
    coll::HostAllReduce(set, op);
    CHECK(std::memcmp(into.data(), x.data(), sizeof(float) * 5) == 0);
    CHECK(std::isnan(into[1]));
    CHECK(std::isnan(into[2]));
  }
  std::vector<float> m = a;
  coll::HostReduceInto(DType::kFloat32, m.data(), b.data(), 5, coll::ReduceOp::kMean);  // sums: the caller divides
  CHECK(m[0] == 5.f);
  std::vector<int32_t> i{3, -4}, j{-5, 9};
  coll::HostReduceInto(DType::kInt32, i.data(), j.data(), 2, coll::ReduceOp::kMax);
  CHECK(i == std::vector<int32_t>{3, 9});
  bool t = true, f = false;
  CHECK(Has(ErrorOf<DTypeError>([&] { coll::HostReduceInto(DType::kBool, &t, &f, 1, coll::ReduceOp::kSum); }), "bool"));
}
