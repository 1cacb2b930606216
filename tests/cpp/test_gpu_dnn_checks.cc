// The cuDNN calls' argument checks on simulated GPUs: every check with cuDNN's status and a message
// that says what was expected, found and what to do; the handle's stream binding; host pointers
// and short buffers, which fault on the stream as a GPU kernel would. In CUDA builds, kiln's
// descriptor checks against cuDNN's own descriptor functions (which run without a driver).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gpu_dnn_util.h"

using namespace kiln;
using namespace kiln::testing;

TEST_CASE("gpu dnn: every argument check fails with cuDNN's status and says what was expected and found") {
  gpurt::Platform& p = Sim();
  gpurt::DeviceGuard guard(0, p);
  gpurt::Stream s = p.StreamCreate();
  void* h = p.LibraryHandle(gpurt::Library::kDnn, s);
  void *x = p.Malloc(4096 * sizeof(float)), *w = p.Malloc(4096 * sizeof(float)),
       *y = p.Malloc(4096 * sizeof(float));
  using A = gpurt::ConvForwardArgs;
  struct Case {
    const char* name;
    std::function<void(A&)> mutate;
    int status;
    const char* says; // a part of the message that tells what to do
  };
  const Case conv_cases[] = {
      {"valid", [](A&) {}, 0, ""},
      {"output of the wrong spatial size",
       [](A& a) {
         a.y.h = 5;
         a.y.n_stride = 6 * 5 * 9, a.y.c_stride = 5 * 9;
       },
       gpurt::kDnnNotSupported, "cudnnGetConvolution2dForwardOutputDim gives [2, 6, 4, 9]"},
      {"output with the wrong channels",
       [](A& a) { a.y = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 4, 4, 9); }, gpurt::kDnnBadParam,
       "channels from the filter's K"},
      {"NHWC data described as NCHW", [](A& a) { a.x = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 7, 4, 9); },
       gpurt::kDnnBadParam, "describe it with NHWC strides"},
      {"negative pad", [](A& a) { a.conv.pad_h = -1; }, gpurt::kDnnBadParam, "pads must be >= 0"},
      {"stride 0", [](A& a) { a.conv.stride_w = 0; }, gpurt::kDnnBadParam, "strides and dilations >= 1"},
      {"dilation 0", [](A& a) { a.conv.dilation_h = 0; }, gpurt::kDnnBadParam, "strides and dilations >= 1"},
      {"group count 0", [](A& a) { a.conv.groups = 0; }, gpurt::kDnnBadParam, "at least 1"},
      {"filters not a multiple of the groups",
       [](A& a) {
         a.w.k = 5;
         a.y = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 5, 4, 9);
       },
       gpurt::kDnnBadParam, "not a multiple of the 2 groups"},
      {"filter larger than the padded input", [](A& a) { a.w.h = 7; }, gpurt::kDnnBadParam,
       "pad the input more"},
      {"bad convolution mode", [](A& a) { a.conv.mode = static_cast<gpurt::DnnConvMode>(5); },
       gpurt::kDnnBadParam, "CUDNN_CROSS_CORRELATION"},
      {"null input", [](A& a) { a.x_data = nullptr; }, gpurt::kDnnBadParam, "pass device memory"},
      {"double data", [](A& a) { a.x.dtype = a.y.dtype = a.w.dtype = gpurt::DnnDataType::kDouble; },
       gpurt::kDnnNotSupportedDataType, "convert the tensor to float32"},
      {"mixed data types", [](A& a) { a.w.dtype = gpurt::DnnDataType::kHalf; }, gpurt::kDnnBadParam,
       "cuDNN needs them to match"},
      {"zero stride", [](A& a) { a.x.w_stride = 0; }, gpurt::kDnnBadParam, "strides must be at least 1"},
      {"negative stride (a flipped view)", [](A& a) { a.x.h_stride = -7; }, gpurt::kDnnNotSupported,
       "strides must be at least 1"},
      {"output strides that overlap", [](A& a) { a.y.h_stride = 1; }, gpurt::kDnnBadParam,
       "share an address"},
      {"empty input", [](A& a) { a.x.n = 0; }, gpurt::kDnnBadParam, "at least 1"},
      {"NCHW_VECT_C filter", [](A& a) { a.w.format = DnnFormat::kNCHWVectC; }, gpurt::kDnnBadParam,
       "int8 data only"},
      {"misaligned pointer", [](A& a) { a.y_data = static_cast<char*>(a.y_data) + 2; },
       gpurt::kDnnBadParamMisalignedPointer, "aligned"},
  };
  for (const Case& c : conv_cases) {
    CAPTURE(std::string(c.name));
    A a = ValidConv(x, w, y);
    c.mutate(a);
    Outcome o = DnnOutcome([&] { p.DnnConvolutionForward(h, s, a); });
    CHECK(o.status == c.status);
    CHECK(o.message.find(c.says) != std::string::npos);
    if (c.status) CHECK(o.message.find("cudnnConvolutionForward: ") == 0); // names the call
  }

  using PA = gpurt::PoolingForwardArgs;
  struct PoolCase {
    const char* name;
    std::function<void(PA&)> mutate;
    int status;
    const char* says;
  };
  const PoolCase pool_cases[] = {
      {"valid", [](PA&) {}, 0, ""},
      {"window 0", [](PA& a) { a.pool.window_w = 0; }, gpurt::kDnnBadParam, "at least 1"},
      {"bad mode", [](PA& a) { a.pool.mode = static_cast<gpurt::DnnPoolingMode>(9); }, gpurt::kDnnBadParam,
       "CUDNN_POOLING_MAX"},
      {"window larger than the padded input", [](PA& a) { a.pool.window_h = 12; }, gpurt::kDnnBadParam,
       "larger than the padded input"},
      {"output of the wrong size", [](PA& a) { a.y = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 3, 4, 4); },
       gpurt::kDnnBadParam, "gives [2, 3, 4, 3]"},
      {"output with other channels", [](PA& a) { a.y = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 4, 4, 3); },
       gpurt::kDnnBadParam, "must match"},
      {"null output", [](PA& a) { a.y_data = nullptr; }, gpurt::kDnnBadParam, "y (the output) is null"},
  };
  for (const PoolCase& c : pool_cases) {
    CAPTURE(std::string(c.name));
    PA a;
    a.pool = {gpurt::DnnPoolingMode::kMax, 3, 3, 1, 1, 2, 2};
    a.x = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 3, 8, 6);
    a.y = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 3, 4, 3);
    a.x_data = x, a.y_data = y;
    c.mutate(a);
    Outcome o = DnnOutcome([&] { p.DnnPoolingForward(h, s, a); });
    CHECK(o.status == c.status);
    CHECK(o.message.find(c.says) != std::string::npos);
  }

  using B = gpurt::BatchNormArgs;
  struct BnCase {
    const char* name;
    std::function<void(B&)> mutate;
    int status;
    const char* says;
  };
  const BnCase bn_cases[] = {
      {"valid", [](B&) {}, 0, ""},
      {"spatial parameters of per-activation shape",
       [](B& a) { a.param = DnnTensorDesc::Packed(DnnFormat::kNCHW, 1, 3, 4, 4); }, gpurt::kDnnBadParam,
       "needs [1, 3, 1, 1]"},
      {"per-activation mode with spatial parameters",
       [](B& a) { a.mode = gpurt::DnnBatchNormMode::kPerActivation; }, gpurt::kDnnBadParam,
       "needs [1, 3, 4, 4]"},
      {"negative epsilon", [](B& a) { a.epsilon = -1e-5; }, gpurt::kDnnBadParam, "CUDNN_BN_MIN_EPSILON"},
      {"only one of the saved statistics", [](B& a) { a.save_inv_variance = nullptr; }, gpurt::kDnnBadParam,
       "pass both (for the backward pass) or neither"},
      {"only one of the running statistics", [](B& a) { a.running_mean = nullptr; }, gpurt::kDnnBadParam,
       "pass both (to update the running statistics) or neither"},
      {"momentum given as MXNet's 0.9-style factor above 1", [](B& a) { a.exponential_average_factor = 1.5; },
       gpurt::kDnnBadParam, "lies in [0, 1]"},
      {"output of another shape", [](B& a) { a.y = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 3, 4, 5); },
       gpurt::kDnnBadParam, "keeps the shape"},
      {"null scale", [](B& a) { a.scale = nullptr; }, gpurt::kDnnBadParam, "bnScale is null"},
      {"bad mode", [](B& a) { a.mode = static_cast<gpurt::DnnBatchNormMode>(7); }, gpurt::kDnnBadParam,
       "CUDNN_BATCHNORM_PER_ACTIVATION (0)"},
  };
  for (const BnCase& c : bn_cases) {
    CAPTURE(std::string(c.name));
    B a;
    a.x = a.y = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 3, 4, 4);
    a.param = DnnTensorDesc::Packed(DnnFormat::kNCHW, 1, 3, 1, 1);
    a.x_data = x, a.y_data = y, a.scale = w, a.bias = w;
    a.running_mean = static_cast<float*>(w) + 8, a.running_var = static_cast<float*>(w) + 16;
    a.save_mean = static_cast<float*>(w) + 24, a.save_inv_variance = static_cast<float*>(w) + 32;
    c.mutate(a);
    Outcome o = DnnOutcome([&] { p.DnnBatchNormForwardTraining(h, s, a); });
    CHECK(o.status == c.status);
    CHECK(o.message.find(c.says) != std::string::npos);
  }
  // Inference reads the running statistics: they are required there.
  B a;
  a.x = a.y = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 3, 4, 4);
  a.param = DnnTensorDesc::Packed(DnnFormat::kNCHW, 1, 3, 1, 1);
  a.x_data = x, a.y_data = y, a.scale = w, a.bias = w;
  CHECK(DnnOutcome([&] { p.DnnBatchNormForwardInference(h, s, a); }).status == gpurt::kDnnBadParam);

  // The backward calls: pooling's gradients share their tensors' layouts, batch norm's its shape.
  using PB = gpurt::PoolingBackwardArgs;
  struct PoolBackCase {
    const char* name;
    std::function<void(PB&)> mutate;
    int status;
    const char* says;
  };
  const PoolBackCase pool_back[] = {
      {"valid", [](PB&) {}, 0, ""},
      {"dy in NHWC, y in NCHW", [](PB& b) { b.dy = DnnTensorDesc::Packed(DnnFormat::kNHWC, 2, 3, 4, 3); },
       gpurt::kDnnBadParam, "the output and its gradient with the same sizes, strides and type"},
      {"dx of another shape", [](PB& b) { b.dx = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 3, 8, 5); },
       gpurt::kDnnBadParam, "the input and its gradient with the same sizes, strides and type"},
      {"y not what pooling x gives",
       [](PB& b) { b.y = b.dy = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 3, 3, 3); }, gpurt::kDnnBadParam,
       "gives [2, 3, 4, 3]"},
      {"null dx", [](PB& b) { b.dx_data = nullptr; }, gpurt::kDnnBadParam,
       "dx (the input's gradient) is null"},
  };
  for (const PoolBackCase& c : pool_back) {
    CAPTURE(std::string(c.name));
    PB b;
    b.pool = {gpurt::DnnPoolingMode::kMax, 3, 3, 1, 1, 2, 2};
    b.x = b.dx = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 3, 8, 6);
    b.y = b.dy = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 3, 4, 3);
    b.x_data = x, b.y_data = y, b.dy_data = y, b.dx_data = w;
    c.mutate(b);
    Outcome o = DnnOutcome([&] { p.DnnPoolingBackward(h, s, b); });
    CHECK(o.status == c.status);
    CHECK(o.message.find(c.says) != std::string::npos);
    if (c.status) CHECK(o.message.find("cudnnPoolingBackward: ") == 0);
  }
  using BB = gpurt::BatchNormBackwardArgs;
  struct BnBackCase {
    const char* name;
    std::function<void(BB&)> mutate;
    int status;
    const char* says;
  };
  const BnBackCase bn_back[] = {
      {"valid", [](BB&) {}, 0, ""},
      {"recomputing the statistics", [](BB& b) { b.saved_mean = b.saved_inv_variance = nullptr; }, 0, ""},
      {"only one saved statistic", [](BB& b) { b.saved_mean = nullptr; }, gpurt::kDnnBadParam,
       "pass both (from the training forward pass) or neither"},
      {"dy of another shape", [](BB& b) { b.dy = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 3, 4, 2); },
       gpurt::kDnnBadParam, "x, dy and dx must match"},
      {"per-activation parameters in spatial mode",
       [](BB& b) { b.param = DnnTensorDesc::Packed(DnnFormat::kNCHW, 1, 3, 4, 4); }, gpurt::kDnnBadParam,
       "dBnScaleBiasDesc is [1, 3, 4, 4]"},
      {"null dscale", [](BB& b) { b.dscale = nullptr; }, gpurt::kDnnBadParam, "dBnScaleResult is null"},
  };
  for (const BnBackCase& c : bn_back) {
    CAPTURE(std::string(c.name));
    BB b;
    b.x = b.dy = b.dx = DnnTensorDesc::Packed(DnnFormat::kNCHW, 2, 3, 4, 4);
    b.param = DnnTensorDesc::Packed(DnnFormat::kNCHW, 1, 3, 1, 1);
    b.x_data = x, b.dy_data = x, b.dx_data = y, b.scale = w;
    b.dscale = static_cast<float*>(w) + 8, b.dbias = static_cast<float*>(w) + 16;
    b.saved_mean = static_cast<float*>(w) + 24, b.saved_inv_variance = static_cast<float*>(w) + 32;
    c.mutate(b);
    Outcome o = DnnOutcome([&] { p.DnnBatchNormBackward(h, s, b); });
    CHECK(o.status == c.status);
    CHECK(o.message.find(c.says) != std::string::npos);
  }
  p.StreamSynchronize(s);
  for (void* d : {x, w, y}) p.Free(d);
  p.StreamDestroy(s);
}

#if KILN_WITH_CUDNN
TEST_CASE("dnn descriptors: kiln's checks and output dims agree with cuDNN's own descriptor functions") {
  // cuDNN's descriptor functions run without a driver: every case is asked of both.
  struct Case {
    DnnTensorDesc x;
    gpurt::DnnFilterDesc w;
    gpurt::DnnConvDesc c;
  };
  auto X = [](int n, int c, int h, int w) { return DnnTensorDesc::Packed(DnnFormat::kNCHW, n, c, h, w); };
  auto F = [](int k, int c, int h, int w, DnnFormat f = DnnFormat::kNCHW) {
    return gpurt::DnnFilterDesc{gpurt::DnnDataType::kFloat, f, k, c, h, w};
  };
  std::vector<Case> cases = {
      {X(2, 4, 9, 7), F(6, 2, 3, 3), Conv(1, 2, 2, 1, 2, 1, 2)},
      {X(1, 3, 32, 32), F(16, 3, 5, 5), Conv(2, 2, 1, 1, 1, 1, 1)},
      {X(1, 3, 32, 31), F(16, 3, 3, 3), Conv(0, 0, 3, 2, 1, 1, 1)},
      {X(4, 8, 10, 10), F(8, 1, 3, 3), Conv(1, 1, 1, 1, 3, 3, 8)},
      {X(1, 3, 5, 5), F(4, 3, 5, 5), Conv(0, 0, 1, 1, 1, 1, 1)},
      {X(1, 3, 5, 5), F(4, 3, 2, 2, DnnFormat::kNHWC), Conv(0, 0, 4, 4, 1, 1, 1)},
      {X(2, 4, 9, 7), F(6, 4, 3, 3), Conv(0, 0, 1, 1, 1, 1, 2)},  // channels x groups mismatch
      {X(2, 4, 9, 7), F(6, 2, 30, 3), Conv(1, 2, 2, 1, 2, 1, 2)}, // filter larger than the input
      {X(1, 3, 5, 5), F(4, 3, 3, 3), Conv(0, 0, 1, 1, 3, 1, 1)},  // dilated filter larger
      {X(1, 3, 5, 5), F(4, 3, 3, 3), Conv(-1, 0, 1, 1, 1, 1, 1)}, // negative pad
      {X(1, 3, 5, 5), F(4, 3, 3, 3), Conv(0, 0, 0, 1, 1, 1, 1)},  // stride 0
      {X(1, 3, 5, 5), F(4, 3, 3, 3), Conv(0, 0, 1, 1, 1, 0, 1)},  // dilation 0
      {X(1, 3, 5, 5), F(4, 3, 3, 3), Conv(0, 0, 1, 1, 1, 1, 0)},  // no groups
      {X(0, 3, 5, 5), F(4, 3, 3, 3), Conv(0, 0, 1, 1, 1, 1, 1)},  // empty batch
      {X(1, 3, 5, 5), F(0, 3, 3, 3), Conv(0, 0, 1, 1, 1, 1, 1)},  // no filters
      {X(1, 4, 5, 5), F(4, 4, 1, 1, DnnFormat::kNCHWVectC), Conv(0, 0, 1, 1, 1, 1, 1)},
      {X(1, 3, 5, 5), F(4, 3, 3, 3), Conv(0, 0, 1, 1, 1, 1, 1, static_cast<gpurt::DnnConvMode>(5))},
  };
  DnnTensorDesc zero_stride = X(1, 2, 3, 4);
  zero_stride.w_stride = 0;
  cases.push_back({zero_stride, F(4, 2, 1, 1), Conv(0, 0, 1, 1, 1, 1, 1)});
  int rejected = 0;
  for (const Case& c : cases) {
    CAPTURE(c.x.ToString());
    CAPTURE(c.w.k);
    CAPTURE(c.w.c);
    CAPTURE(c.w.h);
    CAPTURE(c.w.w);
    int ours[4] = {}, theirs[4] = {};
    Outcome o = DnnOutcome([&] {
      gpurt::CheckTensorDesc(c.x, "x", "test");
      gpurt::CheckFilterDesc(c.w, "test");
      gpurt::ConvForwardOutputDim(c.x, c.w, c.c, ours);
    });
    int status = gpurt::CudnnConvForwardOutputDim(c.x, c.w, c.c, theirs);
    CHECK(o.status == status);
    if (status == 0)
      for (int i = 0; i < 4; ++i) CHECK(ours[i] == theirs[i]);
    rejected += status != 0;
  }
  CHECK(rejected == 12);

  struct PoolCase {
    gpurt::DnnPoolingDesc p;
    DnnTensorDesc x;
  };
  const PoolCase pools[] = {
      {{gpurt::DnnPoolingMode::kMax, 3, 2, 1, 0, 2, 2}, X(2, 4, 9, 7)},
      {{gpurt::DnnPoolingMode::kAverageCountExcludePadding, 2, 2, 0, 0, 2, 2}, X(1, 1, 7, 7)},
      {{gpurt::DnnPoolingMode::kAverageCountIncludePadding, 3, 3, 1, 1, 1, 1}, X(1, 2, 4, 4)},
      {{gpurt::DnnPoolingMode::kMax, 30, 2, 1, 0, 2, 2}, X(2, 4, 9, 7)}, // window larger than the input
      {{gpurt::DnnPoolingMode::kMax, 0, 2, 0, 0, 1, 1}, X(2, 4, 9, 7)},  // window 0
      {{gpurt::DnnPoolingMode::kMax, 2, 2, 0, 0, 0, 1}, X(2, 4, 9, 7)},  // stride 0
      {{static_cast<gpurt::DnnPoolingMode>(9), 2, 2, 0, 0, 1, 1}, X(2, 4, 9, 7)},
  };
  for (const PoolCase& c : pools) {
    int ours[4] = {}, theirs[4] = {};
    Outcome o = DnnOutcome([&] { gpurt::PoolingForwardOutputDim(c.p, c.x, ours); });
    int status = gpurt::CudnnPoolingForwardOutputDim(c.p, c.x, theirs);
    CHECK(o.status == status);
    if (status == 0)
      for (int i = 0; i < 4; ++i) CHECK(ours[i] == theirs[i]);
  }
}
#endif

TEST_CASE("gpu dnn: a handle bound to another stream, or not a cuDNN handle, is rejected") {
  gpurt::Platform& p = Sim();
  gpurt::DeviceGuard guard(0, p);
  gpurt::Stream s1 = p.StreamCreate(), s2 = p.StreamCreate();
  void *x = p.Malloc(4096 * sizeof(float)), *w = p.Malloc(4096 * sizeof(float)),
       *y = p.Malloc(4096 * sizeof(float));
  gpurt::ConvForwardArgs a = ValidConv(x, w, y);
  void* h = p.LibraryHandle(gpurt::Library::kDnn, s1);
  Outcome o = DnnOutcome([&] { p.DnnConvolutionForward(h, s2, a); });
  CHECK(o.status == gpurt::kDnnBadParamStreamMismatch);
  CHECK(o.message.find("cudnnSetStream") != std::string::npos);
  CHECK(DnnOutcome([&] { p.DnnConvolutionForward(h, s1, a); }).status == 0);
  // Rebinding the device's handle to s2 makes s2 right and s1 wrong.
  CHECK(p.LibraryHandle(gpurt::Library::kDnn, s2) == h);
  CHECK(DnnOutcome([&] { p.DnnConvolutionForward(h, s2, a); }).status == 0);
  CHECK(DnnOutcome([&] { p.DnnConvolutionForward(h, s1, a); }).status == gpurt::kDnnBadParamStreamMismatch);
  // The default stream is a stream too.
  CHECK(DnnOutcome([&] { p.DnnConvolutionForward(h, nullptr, a); }).status ==
        gpurt::kDnnBadParamStreamMismatch);
  CHECK(DnnOutcome([&] {
          p.DnnConvolutionForward(p.LibraryHandle(gpurt::Library::kDnn, nullptr), nullptr, a);
        }).status == 0);
  Outcome blas =
      DnnOutcome([&] { p.DnnConvolutionForward(p.LibraryHandle(gpurt::Library::kBlasLt, s1), s1, a); });
  CHECK(blas.status == gpurt::kDnnBadParam);
  CHECK(blas.message.find("cuBLASLt handle") != std::string::npos);
  CHECK(DnnOutcome([&] { p.DnnConvolutionForward(nullptr, s1, a); }).status == gpurt::kDnnBadParam);
  // A platform without cuDNN says so with cuDNN's own status.
  std::unique_ptr<gpurt::Platform> none(gpurt::CreateNoPlatform());
  CHECK(DnnOutcome([&] { none->DnnPoolingForward(nullptr, nullptr, {}); }).status ==
        gpurt::kDnnNotInitialized);
  p.DeviceSynchronize();
  for (void* d : {x, w, y}) p.Free(d);
  p.StreamDestroy(s1), p.StreamDestroy(s2);
}

TEST_CASE("gpu dnn: a host pointer or a too small buffer faults on the stream as the GPU's kernel would") {
  struct Bad {
    const char* name;
    int which; // 0: x is host memory, 1: y is one element short, 2: w lies on the other device
    const char* says;
  };
  for (const Bad& b : {Bad{"host input", 0, "x (the input) is host memory"},
                       Bad{"short output", 1, "y (the output) is not 1728 bytes of one live allocation"},
                       Bad{"filter of the other device", 2, "w (the filter) is memory of gpu(1)"}}) {
    CAPTURE(std::string(b.name));
    // A private simulator: the fault leaves its device unusable, as on a GPU.
    std::unique_ptr<gpurt::Platform> p(gpurt::CreateSimulatedPlatform(2, size_t{16} << 20));
    std::vector<float> host(4096);
    void* other = nullptr;
    {
      gpurt::DeviceGuard g1(1, *p);
      other = p->Malloc(4096 * sizeof(float));
    }
    gpurt::DeviceGuard guard(0, *p);
    gpurt::Stream s = p->StreamCreate();
    void *x = p->Malloc(4096 * sizeof(float)), *w = p->Malloc(4096 * sizeof(float));
    void* y = p->Malloc(256 * sizeof(float)); // 432 floats needed (allocations are rounded to 512 bytes)
    void* big_y = p->Malloc(4096 * sizeof(float));
    gpurt::ConvForwardArgs a =
        ValidConv(b.which == 0 ? host.data() : x, b.which == 2 ? other : w, b.which == 1 ? y : big_y);
    // cuDNN does not look at the pointers: the call is queued, the kernel faults.
    CHECK(DnnOutcome([&] {
            p->DnnConvolutionForward(p->LibraryHandle(gpurt::Library::kDnn, s), s, a);
          }).status == 0);
    int code = 0;
    std::string what;
    try {
      p->StreamSynchronize(s);
    } catch (const gpurt::GpuError& e) {
      code = e.code(), what = e.what();
    }
    CHECK(code == gpurt::kIllegalAddress);
    CHECK(what.find(b.says) != std::string::npos);
    CHECK(what.find("cudnnConvolutionForward") != std::string::npos);
    // Sticky: later calls on the device fail too.
    CHECK(CodeOf([&] { p->DnnConvolutionForward(p->LibraryHandle(gpurt::Library::kDnn, s), s, a); }) ==
          gpurt::kIllegalAddress);
  }
}

#if KILN_WITH_CUDNN
TEST_CASE(
    "dnn cuda: the CUDA platform's cuDNN handle is cudnnCreate's, and fails as cuDNN does without a driver") {
  std::unique_ptr<gpurt::Platform> cuda(gpurt::CreateCudaPlatform());
  REQUIRE(cuda);
  if (cuda->DeviceCount() == 0) {
    // No driver here (CI): cudnnCreate reports NOT_INITIALIZED, as the toolchain notes measured.
    Outcome o = DnnOutcome([&] { cuda->LibraryHandle(gpurt::Library::kDnn, nullptr); });
    CHECK(o.status == gpurt::kDnnNotInitialized);
    CHECK(o.message.find("cudnnCreate") == 0);
  } else { // a real GPU: the handle is bound to the stream asked for, and one per device
    void* h = cuda->LibraryHandle(gpurt::Library::kDnn, nullptr);
    CHECK(h != nullptr);
    CHECK(cuda->LibraryHandle(gpurt::Library::kDnn, nullptr) == h);
  }
}
#endif
