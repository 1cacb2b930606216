// Tests of runtime/mpi.h that need no launcher: the reduction the ring allreduce applies, op
// names, the schedule hash, and the 1-process world (no mpirun: MPI is never started and every
// collective is the identity). Runs across processes are tests/python/test_distributed.py's.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "gpu_skip.h"
#include "kiln/frontend/distributed.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/mpi.h"

namespace mpi = kiln::mpi;

TEST_CASE("mpi ReduceInto sums, maxes and mins every dtype it accepts") {
  std::vector<float> a{1, -2, 3}, b{4, 5, -6};
  mpi::ReduceInto(a.data(), b.data(), 3, kiln::DType::kFloat32, mpi::ReduceOp::kSum);
  CHECK(a == std::vector<float>{5, 3, -3});
  std::vector<double> c{1, -2, 3}, d{4, -5, 2};
  mpi::ReduceInto(c.data(), d.data(), 3, kiln::DType::kFloat64, mpi::ReduceOp::kMax);
  CHECK(c == std::vector<double>{4, -2, 3});
  std::vector<int64_t> e{1, -2, 3}, f{4, -5, 2};
  mpi::ReduceInto(e.data(), f.data(), 3, kiln::DType::kInt64, mpi::ReduceOp::kMin);
  CHECK(e == std::vector<int64_t>{1, -5, 2});
  std::vector<int32_t> g{7}, h{8};
  mpi::ReduceInto(g.data(), h.data(), 1, kiln::DType::kInt32, mpi::ReduceOp::kMean); // mean reduces as sum
  CHECK(g[0] == 15);
  std::vector<uint16_t> half{1}, half2{2};
  CHECK_THROWS_AS(mpi::ReduceInto(half.data(), half2.data(), 1, kiln::DType::kFloat16, mpi::ReduceOp::kSum),
                  kiln::DTypeError);
}

TEST_CASE("mpi reduce op names round-trip and unknown names are rejected") {
  for (auto op : {mpi::ReduceOp::kSum, mpi::ReduceOp::kMean, mpi::ReduceOp::kMax, mpi::ReduceOp::kMin})
    CHECK(mpi::ParseReduceOp(mpi::ReduceOpName(op)) == op);
  CHECK_THROWS_WITH_AS(mpi::ParseReduceOp("prod"), doctest::Contains("sum, mean, max, min"),
                       kiln::ValueError);
}

TEST_CASE("mpi Fnv1a is the standard 64-bit FNV-1a") {
  CHECK(mpi::Fnv1a("") == 0xcbf29ce484222325ull);
  CHECK(mpi::Fnv1a("a") == 0xaf63dc4c8601ec8cull);
  CHECK(mpi::Fnv1a("w (3, 4) float32\n") != mpi::Fnv1a("w (4, 3) float32\n"));
}

TEST_CASE("distributed schedule entries print name, shape and dtype") {
  kiln::distributed::ScheduleEntry e{"fc1.weight", kiln::Shape({256, 512}), kiln::DType::kFloat32};
  CHECK(kiln::distributed::EntryText(e) == "fc1.weight (256, 512) float32");
}

TEST_CASE("distributed one-process world without a launcher is the identity") {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK")) return; // run under mpirun
  kiln::distributed::Init(30);
  CHECK(kiln::distributed::IsInitialized());
  CHECK(mpi::IsLocalWorld());
  CHECK(kiln::distributed::Rank() == 0);
  CHECK(kiln::distributed::Size() == 1);
  CHECK(kiln::distributed::LocalRank() == 0);
  kiln::Tensor t = kiln::Tensor::FromVector<float>({1, 2, 3}, kiln::Shape({3}));
  kiln::distributed::Allreduce({t}, mpi::ReduceOp::kMean);
  CHECK(t.ToVector<float>() == std::vector<float>{1, 2, 3});
  kiln::distributed::Broadcast({t}, 0);
  CHECK_THROWS_AS(kiln::distributed::Broadcast({t}, 1), kiln::ValueError);
  kiln::Tensor i = kiln::Tensor::FromVector<int32_t>({1}, kiln::Shape({1}));
  CHECK_THROWS_WITH_AS(kiln::distributed::Allreduce({i}, mpi::ReduceOp::kMean), doctest::Contains("float"),
                       kiln::DTypeError);
  CHECK_THROWS_AS(kiln::distributed::Allreduce({t, t}, mpi::ReduceOp::kSum), kiln::ValueError);
  kiln::distributed::Barrier();
  kiln::distributed::CheckSchedule({{"w", kiln::Shape({3}), kiln::DType::kFloat32}});
  CHECK(mpi::Timeout() == 30);
}

TEST_CASE("distributed GPU arrays in a one-process world stay as they are") {
  KILN_REQUIRE_GPU();
  if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK")) return;
  kiln::distributed::Init(30);
  kiln::Tensor t = kiln::Tensor::FromVector<float>({1, 2, 3}, kiln::Shape({3}), kiln::gpu(0));
  kiln::distributed::Allreduce({t}, mpi::ReduceOp::kSum);
  CHECK(t.ToVector<float>() == std::vector<float>{1, 2, 3});
}
