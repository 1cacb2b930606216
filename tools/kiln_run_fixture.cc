// Test helper for kiln-run's CTest (tools/test_kiln_run.cmake), not installed:
//   kiln_run_fixture write DIR   exports a small MLP as DIR/mlp-symbol.json + DIR/mlp-0000.params
//                                with its input DIR/data.npy, the eager result DIR/expected0.npy
//                                and broken .npy files (fortran.npy, bigendian.npy, truncated.npy,
//                                wrongshape.npy of rank 3, int64.npy), and a batch of 5 rows,
//                                batch5.npy, with its eager result expected_batch5.npy.
//   kiln_run_fixture compare A.npy B.npy   exit 0 when both hold the same array (rtol 1e-5).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include "kiln/frontend/cached_graph.h"
#include "kiln/frontend/ops.h"
#include "kiln/runtime/error.h"
#include "npy.h"

namespace {

using namespace kiln;

ir::HostTensor ToHost(const Tensor& t) {
  ir::HostTensor h{t.dtype(), t.shape(), std::vector<uint8_t>(t.numel() * DTypeSize(t.dtype()))};
  t.CopyToHost(h.bytes.data());
  return h;
}

void Write(const std::string& dir) {
  std::filesystem::create_directories(dir);
  auto path = [&](const std::string& f) { return (std::filesystem::path(dir) / f).string(); };
  nd::random::seed(7);
  Tensor w1 = nd::random::normal(0, 0.5, {16, 8}), b1 = nd::random::normal(0, 0.1, {16});
  Tensor w2 = nd::random::normal(0, 0.5, {4, 16}), b2 = nd::random::normal(0, 0.1, {4});
  auto net = [&](const Tensor& x) { return nd::softmax(nd::linear(nd::relu(nd::linear(x, w1, b1)), w2, b2)); };
  Tensor x = nd::random::normal(0, 1, {2, 8});
  std::shared_ptr<CachedGraph> g;
  {
    trace::TraceScope scope;
    g = scope.Finish({net(scope.Input("data", x.shape(), x.dtype(), cpu()))});
  }
  std::vector<std::string> names = {"0.weight", "0.bias", "1.weight", "1.bias"};
  ir::SaveGraph(path("mlp-symbol.json"), g->graph(), {{"data"}, names, ir::OutputStructure::Leaf(0)});
  std::vector<ir::NamedHostTensor> params;
  for (size_t i = 0; i < names.size(); ++i) params.emplace_back(names[i], ToHost(g->captured()[i]));
  ir::SaveParams(path("mlp-0000.params"), params);

  ir::HostTensor hx = ToHost(x);
  tools::WriteNpy(path("data.npy"), hx);
  tools::WriteNpy(path("expected0.npy"), ToHost(net(x)));
  tools::WriteNpy(path("wrongshape.npy"), ToHost(nd::ones({2, 8, 1})));
  Tensor x5 = nd::random::normal(0, 1, {5, 8});
  tools::WriteNpy(path("batch5.npy"), ToHost(x5));
  tools::WriteNpy(path("expected_batch5.npy"), ToHost(net(x5)));
  tools::WriteNpy(path("int64.npy"), ToHost(nd::ones({2, 8}, DType::kInt64)));
  std::string good = tools::NpyBytes(hx);
  auto patch = [&](const std::string& from, const std::string& to) {
    std::string b = good;
    b.replace(b.find(from), from.size(), to);
    return b;
  };
  ir::WriteFileAtomic(path("fortran.npy"), patch("'fortran_order': False", "'fortran_order': True "));
  ir::WriteFileAtomic(path("bigendian.npy"), patch("'<f4'", "'>f4'"));
  ir::WriteFileAtomic(path("truncated.npy"), good.substr(0, good.size() - 4));
}

int Compare(const std::string& a_path, const std::string& b_path) {
  ir::HostTensor a = tools::ReadNpy(a_path), b = tools::ReadNpy(b_path);
  if (a.dtype != DType::kFloat32 || a.dtype != b.dtype || !(a.shape == b.shape)) {
    std::fprintf(stderr, "%s and %s differ in dtype or shape\n", a_path.c_str(), b_path.c_str());
    return 1;
  }
  const auto* x = reinterpret_cast<const float*>(a.bytes.data());
  const auto* y = reinterpret_cast<const float*>(b.bytes.data());
  for (int64_t i = 0; i < a.shape.numel(); ++i)
    if (std::fabs(x[i] - y[i]) > 1e-5f * (1 + std::fabs(y[i]))) {
      std::fprintf(stderr, "element %lld: %g != %g\n", static_cast<long long>(i), x[i], y[i]);
      return 1;
    }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "write" && argc == 3) {
      Write(argv[2]);
      return 0;
    }
    if (mode == "compare" && argc == 4) return Compare(argv[2], argv[3]);
    std::fprintf(stderr, "usage: kiln_run_fixture write DIR | compare A.npy B.npy\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln_run_fixture: %s\n", e.what());
    return 1;
  }
}
