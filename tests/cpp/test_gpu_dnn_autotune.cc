// Measured convolution algorithms on simulated GPUs: the simulator's Find (a model of each
// algorithm's time and workspace, runtime/gpusim/sim_dnn.cc) and the platform seam it answers
// (gpu.h DnnFindConvolutionAlgorithms, Conv*Args.algo). The choice's caches (memory, disk) are
// tested from Python (test_gpu_dnn_autotune.py), across processes.
#include <doctest/doctest.h>

#include <vector>

#include "gpu_dnn_util.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

// A 3x3 unstrided convolution, 8x16x14x14 by 32x16x3x3, over device buffers.
struct Problem {
  gpurt::Platform& p;
  gpurt::Stream s;
  void *x, *w, *y;
  gpurt::ConvForwardArgs a;
  explicit Problem(gpurt::Platform& p) : p(p), s(p.StreamCreate()) {
    x = Upload(p, Random(8 * 16 * 14 * 14, 1), s), w = Upload(p, Random(32 * 16 * 3 * 3, 2), s);
    y = p.Malloc(8 * 32 * 14 * 14 * sizeof(float));
    a.x = DnnTensorDesc::Packed(DnnFormat::kNCHW, 8, 16, 14, 14);
    a.w = {gpurt::DnnDataType::kFloat, DnnFormat::kNCHW, 32, 16, 3, 3};
    a.conv = Conv(1, 1, 1, 1, 1, 1, 1);
    a.y = DnnTensorDesc::Packed(DnnFormat::kNCHW, 8, 32, 14, 14);
    a.x_data = x, a.w_data = w, a.y_data = y;
  }
  ~Problem() {
    for (void* d : {x, w, y}) p.Free(d);
    p.StreamDestroy(s);
  }
  void* handle() { return p.LibraryHandle(gpurt::Library::kDnn, s); }
};

}  // namespace

TEST_CASE("gpu dnn autotune: the simulator's Find ranks every algorithm by a modelled time, the same on every call") {
  Problem pr(Sim());
  gpurt::ConvForwardArgs a = pr.a;
  void* ws = pr.p.Malloc(64 << 20);
  a.workspace = ws, a.workspace_bytes = 64 << 20;
  std::vector<gpurt::DnnAlgoPerf> first = pr.p.DnnFindConvolutionAlgorithms(pr.handle(), pr.s, a);
  std::vector<gpurt::DnnAlgoPerf> again = pr.p.DnnFindConvolutionAlgorithms(pr.handle(), pr.s, a);
  REQUIRE(first.size() == 8);  // cuDNN's forward algorithms, each reported once
  REQUIRE(again.size() == first.size());
  for (size_t i = 0; i < first.size(); ++i) {
    CHECK(first[i].algo == again[i].algo);
    CHECK(first[i].time_ms == again[i].time_ms);
  }
  // those that ran first, fastest first; then those that could not (DIRECT is never implemented)
  bool failed = false;
  for (size_t i = 0; i < first.size(); ++i) {
    if (first[i].status != 0) failed = true;
    CHECK((first[i].status == 0) != failed);
    if (i > 0 && first[i].status == 0) CHECK(first[i - 1].time_ms <= first[i].time_ms);
    if (first[i].algo == 3) CHECK(first[i].status == gpurt::kDnnNotSupported);
  }
  // the fastest is a Winograd algorithm, not the heuristic's implicit precomputed GEMM (1); the
  // workspace each reports is what the call with that algorithm asks for
  CHECK((first[0].algo == 6 || first[0].algo == 7));
  for (const gpurt::DnnAlgoPerf& r : first) {
    if (r.status != 0) continue;
    gpurt::ConvForwardArgs b = pr.a;
    b.algo = r.algo;
    CHECK(pr.p.DnnConvolutionWorkspaceSize(pr.handle(), pr.s, b) == r.workspace);
  }
  pr.p.Free(ws);
}

TEST_CASE("gpu dnn autotune: an algorithm that needs more workspace than given is reported, not run") {
  Problem pr(Sim());
  gpurt::ConvForwardArgs a = pr.a;  // no workspace at all
  int ran = 0, refused = 0;
  for (const gpurt::DnnAlgoPerf& r : pr.p.DnnFindConvolutionAlgorithms(pr.handle(), pr.s, a)) {
    if (r.status == 0) CHECK(r.workspace == 0);
    (r.status == 0 ? ran : refused) += 1;
  }
  CHECK(ran > 0);      // implicit GEMM needs no workspace
  CHECK(refused > 0);  // Winograd, FFT and the heuristic's precomputed GEMM need some
}

TEST_CASE("gpu dnn autotune: the chosen algorithm runs and gives the heuristic's numbers, and a strided problem has no Winograd") {
  Problem pr(Sim());
  std::vector<float> heuristic, chosen;
  for (int algo : {-1, 7}) {
    gpurt::ConvForwardArgs a = pr.a;
    a.algo = algo;
    const size_t bytes = pr.p.DnnConvolutionWorkspaceSize(pr.handle(), pr.s, a);
    void* ws = bytes ? pr.p.Malloc(bytes) : nullptr;
    a.workspace = ws, a.workspace_bytes = bytes;
    pr.p.DnnConvolutionForward(pr.handle(), pr.s, a);
    (algo < 0 ? heuristic : chosen) = Download(pr.p, pr.y, 8 * 32 * 14 * 14, pr.s);
    if (ws) pr.p.Free(ws);
  }
  CHECK(chosen == heuristic);
  gpurt::ConvForwardArgs strided = pr.a;
  strided.conv = Conv(1, 1, 2, 2, 1, 1, 1);
  strided.y = DnnTensorDesc::Packed(DnnFormat::kNCHW, 8, 32, 7, 7);
  strided.algo = 7;
  CHECK(DnnOutcome([&] { pr.p.DnnConvolutionWorkspaceSize(pr.handle(), pr.s, strided); }).status ==
        gpurt::kDnnNotSupported);
  strided.algo = 42;
  CHECK(DnnOutcome([&] { pr.p.DnnConvolutionWorkspaceSize(pr.handle(), pr.s, strided); }).status ==
        gpurt::kDnnBadParam);
}

TEST_CASE("gpu dnn autotune: Find is refused while the stream captures a graph") {
  Problem pr(Sim());
  pr.p.StreamSynchronize(pr.s);
  pr.p.StreamBeginCapture(pr.s);
  bool refused = false;
  try {
    pr.p.DnnFindConvolutionAlgorithms(pr.handle(), pr.s, pr.a);
  } catch (const Error&) {
    refused = true;
  }
  CHECK(refused);
  try {
    pr.p.GraphDestroy(pr.p.StreamEndCapture(pr.s));
  } catch (const Error&) {  // the capture was invalidated, as CUDA's is
  }
}
