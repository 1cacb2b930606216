// Export and C++ deployment (d2l.ai "Deployment"; DESIGN.md section 1): an exported LeNet is
// loaded with kiln::load, with no Python, and classifies the Fashion-MNIST test set.
//
//   example_deploy_lenet [PREFIX] [--small]
//
// PREFIX (default "lenet") names PREFIX-symbol.json and PREFIX-0000.params, exported from Python
// with net.export("lenet") after training. With --small (CI) it uses 1000 test images and, when
// those files do not exist, exports a LeNet-shaped model with random weights first (its accuracy
// is chance, about 0.1).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "kiln/frontend/cached_graph.h"
#include "kiln/frontend/load.h"
#include "kiln/frontend/ops.h"
#include "kiln/ir/serialize.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

constexpr char kData[] = "/usr/share/datasets/fashion-mnist";

// The decompressed bytes of a .gz file, read through `gzip -dc` (no zlib dependency).
std::vector<uint8_t> Gunzip(const std::string& path) {
  if (!fs::exists(path)) return {};
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(("gzip -dc '" + path + "'").c_str(), "r"), pclose);
  std::vector<uint8_t> out;
  if (!p) return out;
  uint8_t buf[1 << 16];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), p.get())) > 0;) out.insert(out.end(), buf, buf + n);
  return out;
}

uint32_t BigEndian32(const std::vector<uint8_t>& b, size_t at) {
  return uint32_t(b[at]) << 24 | uint32_t(b[at + 1]) << 16 | uint32_t(b[at + 2]) << 8 | b[at + 3];
}

struct TestSet {
  std::vector<float> images;  // N x 1 x 28 x 28, in [0, 1] as ToTensor gives
  std::vector<int64_t> labels;
};

// The IDX files of the test set (magic 2051 for images, 2049 for labels), at most `limit` items.
TestSet ReadTestSet(size_t limit) {
  std::vector<uint8_t> img = Gunzip(std::string(kData) + "/t10k-images-idx3-ubyte.gz");
  std::vector<uint8_t> lab = Gunzip(std::string(kData) + "/t10k-labels-idx1-ubyte.gz");
  TestSet t;
  if (img.size() < 16 || lab.size() < 8 || BigEndian32(img, 0) != 2051 || BigEndian32(lab, 0) != 2049) return t;
  size_t n = std::min<size_t>({BigEndian32(img, 4), BigEndian32(lab, 4), limit});
  if (img.size() < 16 + n * 784 || lab.size() < 8 + n) return t;
  for (size_t i = 0; i < n * 784; ++i) t.images.push_back(img[16 + i] / 255.0f);
  for (size_t i = 0; i < n; ++i) t.labels.push_back(lab[8 + i]);
  return t;
}

// A LeNet-shaped model with random weights, traced for batches of `batch` and exported as
// PREFIX-symbol.json + PREFIX-0000.params, as net.export does from Python.
void ExportRandomLeNet(const std::string& prefix, int64_t batch) {
  std::vector<std::pair<std::string, Tensor>> p = {
      {"0.weight", nd::random::normal(0, 0.3, {20, 1, 3, 3})},  {"0.bias", nd::zeros({20})},
      {"2.weight", nd::random::normal(0, 0.05, {50, 20, 5, 5})}, {"2.bias", nd::zeros({50})},
      {"5.weight", nd::random::normal(0, 0.05, {128, 800})},     {"5.bias", nd::zeros({128})},
      {"6.weight", nd::random::normal(0, 0.1, {10, 128})},       {"6.bias", nd::zeros({10})}};
  auto w = [&](int i) { return p[static_cast<size_t>(i)].second; };
  std::shared_ptr<CachedGraph> g;
  {
    trace::TraceScope scope;
    Tensor x = scope.Input("data", {batch, 1, 28, 28}, DType::kFloat32, cpu());
    x = nd::avg_pool2d(nd::relu(nd::conv2d(x, w(0), w(1))), {2, 2});   // 20 x 13 x 13
    x = nd::avg_pool2d(nd::relu(nd::conv2d(x, w(2), w(3))), {2, 2});   // 50 x 4 x 4
    x = nd::relu(nd::linear(nd::flatten(x), w(4), w(5)));               // 128
    g = scope.Finish({nd::linear(x, w(6), w(7))});                      // 10
  }
  std::vector<std::string> names;
  std::vector<ir::NamedHostTensor> host;
  for (const Tensor& t : g->captured()) {  // graph inputs in the order the trace read them
    auto it = std::find_if(p.begin(), p.end(), [&](const auto& np) { return np.second.SharesStorage(t); });
    ir::HostTensor h{t.dtype(), t.shape(), std::vector<uint8_t>(t.numel() * DTypeSize(t.dtype()))};
    t.CopyToHost(h.bytes.data());
    names.push_back(it->first);
    host.emplace_back(it->first, std::move(h));
  }
  ir::SaveGraph(prefix + "-symbol.json", g->graph(), {{"data"}, names, ir::OutputStructure::Leaf(0)});
  ir::SaveParams(prefix + "-0000.params", host);
}

}  // namespace

int main(int argc, char** argv) {
  bool small = false;
  std::string prefix = "lenet";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--small") small = true;
    else prefix = a;
  }
  try {
    // 1. Find the exported model, or (CI) export a random one to a temporary directory.
    std::string symbol = prefix + "-symbol.json", params = prefix + "-0000.params";
    fs::path tmp;
    if (!fs::exists(symbol) && small) {
      tmp = fs::temp_directory_path() / ("kiln_deploy_lenet_" + std::to_string(::getpid()));
      fs::create_directories(tmp);
      ExportRandomLeNet((tmp / "lenet").string(), 256);  // 1000 = 3 * 256 + 232: a smaller last batch
      symbol = (tmp / "lenet-symbol.json").string();
      params = (tmp / "lenet-0000.params").string();
      std::printf("no %s-symbol.json: exported a LeNet with random weights to %s\n", prefix.c_str(), tmp.c_str());
    }

    // 2. Load it: both files are checked against each other, the weights go to the device.
    Module net = load(symbol, params, cpu());
    const Shape in_shape = net.input_types().at(0).shape;  // (batch, 1, 28, 28)
    const int64_t batch = in_shape[0];
    std::printf("loaded %s: input %s%s, %zu parameters\n", symbol.c_str(), net.input_names()[0].c_str(),
                in_shape.str().c_str(), net.param_names().size());

    // 3. The test set, scaled to [0, 1] like ToTensor.
    TestSet test = ReadTestSet(small ? 1000 : 10000);
    if (test.labels.empty()) {
      std::printf("Fashion-MNIST not found under %s; nothing to classify\n", kData);
      if (!tmp.empty()) fs::remove_all(tmp);
      return small ? 0 : 1;
    }
    const int64_t n = static_cast<int64_t>(test.labels.size());

    // 4. Classify in batches of the exported size; the last one is smaller, and the model re-shapes
    //    its graph for it (compiled on that call, as MXNet rebinds its executor).
    int64_t correct = 0;
    double seconds = 0;
    const int64_t per_image = 784;
    for (int64_t start = 0; start < n; start += batch) {
      int64_t count = std::min(batch, n - start);
      std::vector<float> chunk(test.images.begin() + start * per_image,
                               test.images.begin() + (start + count) * per_image);
      Tensor x = Tensor::FromVector(chunk, {count, 1, 28, 28});
      auto t0 = std::chrono::steady_clock::now();
      Tensor logits = net({x})[0];
      logits.WaitToRead();
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::vector<int64_t> pred = nd::argmax(logits, 1).ToVector<int64_t>();
      for (int64_t i = 0; i < count; ++i) correct += pred[static_cast<size_t>(i)] == test.labels[static_cast<size_t>(start + i)];
    }
    std::printf("test accuracy %.4f on %lld images, %.0f images/s\n", static_cast<double>(correct) / n,
                static_cast<long long>(n), static_cast<double>(n) / seconds);
    if (!tmp.empty()) fs::remove_all(tmp);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "deploy_lenet: %s\n", e.what());
    return 1;
  }
}
