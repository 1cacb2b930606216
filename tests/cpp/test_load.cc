// kiln::load: a traced and exported graph loads back in C++ and gives the traced and the eager
// results; every broken file or wrong call is a typed error that names the file or the input and
// says what differs.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <unistd.h>

#include "kiln/frontend/cached_graph.h"
#include "kiln/frontend/load.h"
#include "kiln/frontend/ops.h"
#include "kiln/ir/serialize.h"
#include "test_util.h"

namespace {

using namespace kiln;
namespace fs = std::filesystem;
using testing::TempDir;

void CheckClose(const Tensor& a, const Tensor& b, double tol = 1e-5) {
  REQUIRE(a.shape() == b.shape());
  REQUIRE(a.dtype() == b.dtype());
  std::vector<double> x = a.ToVector<double>(), y = b.ToVector<double>();
  for (size_t i = 0; i < x.size(); ++i) CHECK(x[i] == doctest::Approx(y[i]).epsilon(tol));
}

// A fresh directory per test case, removed afterwards.

struct Mlp {
  Tensor w1 = nd::random::normal(0, 0.5, {16, 8}), b1 = nd::random::normal(0, 0.1, {16});
  Tensor w2 = nd::random::normal(0, 0.5, {4, 16}), b2 = nd::random::normal(0, 0.1, {4});
  std::vector<std::string> names = {"0.weight", "0.bias", "1.weight", "1.bias"};
  Tensor operator()(const Tensor& x) const { return nd::linear(nd::relu(nd::linear(x, w1, b1)), w2, b2); }
};

using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

std::shared_ptr<CachedGraph> Trace(const Fn& f, const std::vector<std::string>& names,
                                   const std::vector<Tensor>& examples) {
  trace::TraceScope scope;
  std::vector<Tensor> in;
  for (size_t i = 0; i < examples.size(); ++i)
    in.push_back(scope.Input(names[i], examples[i].shape(), examples[i].dtype(), cpu()));
  return scope.Finish(f(in));
}

ir::HostTensor ToHost(const Tensor& t) {
  ir::HostTensor h{t.dtype(), t.shape(), std::vector<uint8_t>(t.numel() * DTypeSize(t.dtype()))};
  t.CopyToHost(h.bytes.data());
  return h;
}

// Writes `prefix`-symbol.json and `prefix`-0000.params as net.export does; `params` names the
// captured tensors in order.
void Export(const CachedGraph& g, const std::string& prefix, const std::vector<std::string>& inputs,
            const std::vector<std::string>& params, const ir::OutputStructure& structure) {
  REQUIRE(g.captured().size() == params.size());
  ir::SaveGraph(prefix + "-symbol.json", g.graph(), {inputs, params, structure});
  std::vector<ir::NamedHostTensor> host;
  for (size_t i = 0; i < params.size(); ++i) host.emplace_back(params[i], ToHost(g.captured()[i]));
  ir::SaveParams(prefix + "-0000.params", host);
}

// An exported MLP with input "data" float32(3, 8) under `dir`/mlp.
struct ExportedMlp {
  Mlp net;
  Tensor x = nd::random::normal(0, 1, {3, 8});
  std::shared_ptr<CachedGraph> g;
  std::string symbol, params;
  explicit ExportedMlp(const TempDir& dir) {
    g = Trace([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{net(in[0])}; }, {"data"}, {x});
    Export(*g, dir / "mlp", {"data"}, net.names, ir::OutputStructure::Leaf(0));
    symbol = dir / "mlp-symbol.json";
    params = dir / "mlp-0000.params";
  }
};

TEST_CASE("load: an exported MLP gives the traced and the eager results") {
  TempDir dir("kiln_test_load");
  ExportedMlp m(dir);
  Module model = load(m.symbol, m.params);
  CHECK(model.input_names() == std::vector<std::string>{"data"});
  REQUIRE(model.input_types().size() == 1);
  CHECK(model.input_types()[0] == ir::TensorType{{3, 8}, DType::kFloat32});
  CHECK(model.param_names() == m.net.names);
  CHECK(model.num_outputs() == 1);
  CHECK(model.output_structure() == ir::OutputStructure::Leaf(0));
  CHECK(model.device() == cpu());

  std::vector<Tensor> y = model({m.x});
  REQUIRE(y.size() == 1);
  CheckClose(y[0], m.g->Call({m.x})[0]);
  CheckClose(y[0], m.net(m.x));
  // Another batch, and a copy of the handle sharing the compiled graph.
  Tensor x2 = nd::random::normal(0, 1, {3, 8});
  Module copy = model;
  CheckClose(copy({x2})[0], m.net(x2));
  // The loaded parameters are independent of the tensors that were exported.
  (m.net.w2 * 0.0).CopyTo(m.net.w2);
  CHECK(model({x2})[0].ToVector<float>() != m.net(x2).ToVector<float>());
}

TEST_CASE("load: a two-input function returning a nested tuple keeps its output structure") {
  TempDir dir("kiln_test_load");
  Tensor w = nd::random::normal(0, 1, {4, 4});
  Tensor a = nd::random::normal(0, 1, {2, 4}), b = nd::random::normal(0, 1, {2, 4});
  auto f = [&](const std::vector<Tensor>& in) {
    Tensor h = nd::matmul(in[0], w);
    return std::vector<Tensor>{nd::add(h, in[1]), nd::tanh(h), nd::sum(in[1], {1})};
  };
  auto g = Trace(f, {"a", "b"}, {a, b});
  using OS = ir::OutputStructure;
  OS structure = OS::List({OS::Leaf(0), OS::List({OS::Leaf(1), OS::Leaf(2)})});
  Export(*g, dir / "pair", {"a", "b"}, {"w"}, structure);

  Module model = load(dir / "pair-symbol.json", dir / "pair-0000.params");
  CHECK(model.input_names() == std::vector<std::string>{"a", "b"});
  CHECK(model.num_outputs() == 3);
  CHECK(model.output_structure() == structure);
  std::vector<Tensor> got = model({a, b}), traced = g->Call({a, b}), eager = f({a, b});
  REQUIRE(got.size() == 3);
  for (int i = 0; i < 3; ++i) {
    CheckClose(got[i], traced[i]);
    CheckClose(got[i], eager[i]);
  }
}

TEST_CASE("load: the default params path follows the export naming") {
  CHECK(DefaultParamsPath("models/mlp-symbol.json") == "models/mlp-0000.params");
  CHECK(DefaultParamsPath("mlp.json") == "mlp-0000.params");
  CHECK(DefaultParamsPath("mlp") == "mlp-0000.params");
}

TEST_CASE("load: missing, truncated and foreign files are FormatErrors naming the file") {
  TempDir dir("kiln_test_load");
  ExportedMlp m(dir);
  SUBCASE("missing params file") {
    std::string missing = dir / "nope-0000.params";
    CHECK_THROWS_WITH_AS(load(m.symbol, missing), doctest::Contains(("cannot open '" + missing + "'").c_str()), FormatError);
  }
  SUBCASE("missing symbol file") {
    CHECK_THROWS_WITH_AS(load(dir / "nope-symbol.json", m.params), doctest::Contains("nope-symbol.json"),
                         FormatError);
  }
  SUBCASE("truncated params file") {
    fs::resize_file(m.params, fs::file_size(m.params) - 10);
    CHECK_THROWS_WITH_AS(load(m.symbol, m.params), doctest::Contains("truncated"), FormatError);
  }
  SUBCASE("params file with a cut header") {
    fs::resize_file(m.params, 20);
    CHECK_THROWS_WITH_AS(load(m.symbol, m.params), doctest::Contains(m.params.c_str()), FormatError);
  }
  SUBCASE("malformed symbol file") {
    std::ofstream(m.symbol) << "{\"format\": \"kiln-graph\", \"version\": ";
    CHECK_THROWS_WITH_AS(load(m.symbol, m.params), doctest::Contains(m.symbol.c_str()), FormatError);
  }
  SUBCASE("unknown version") {
    std::string text = ir::GraphToJson(m.g->graph(), {{"data"}, m.net.names, ir::OutputStructure::Leaf(0)});
    size_t at = text.find("\"version\":");
    REQUIRE(at != std::string::npos);
    size_t digit = text.find('1', at);
    text.replace(digit, 1, "99");
    std::ofstream(m.symbol) << text;
    CHECK_THROWS_WITH_AS(load(m.symbol, m.params), doctest::Contains("99"), FormatError);
  }
  SUBCASE("the params of another model") {
    std::ofstream(m.params, std::ios::binary | std::ios::trunc) << "not a params file at all";
    CHECK_THROWS_AS(load(m.symbol, m.params), FormatError);
  }
}

TEST_CASE("load: params that differ from the graph are listed, every one") {
  TempDir dir("kiln_test_load");
  ExportedMlp m(dir);
  std::vector<ir::NamedHostTensor> host = {
      {"0.weight", ToHost(nd::zeros({16, 9}))},                     // wrong shape
      {"0.bias", ToHost(nd::zeros({16}, DType::kFloat64))},         // wrong dtype
      {"1.weight", ToHost(m.net.w2)},                               // fine
      {"2.weight", ToHost(nd::zeros({1}))}};                        // extra; 1.bias missing
  ir::SaveParams(m.params, host);
  std::string msg;
  try {
    load(m.symbol, m.params);
  } catch (const FormatError& e) {
    msg = e.what();
  }
  CHECK(msg.find(m.params) != std::string::npos);
  CHECK(msg.find(m.symbol) != std::string::npos);
  CHECK(msg.find("4 difference(s)") != std::string::npos);
  CHECK(msg.find("'0.weight' is float32(16, 9) but the graph expects float32(16, 8)") != std::string::npos);
  CHECK(msg.find("'0.bias' is float64(16,) but the graph expects float32(16,)") != std::string::npos);
  CHECK(msg.find("missing '1.bias' (float32(4,))") != std::string::npos);
  CHECK(msg.find("extra '2.weight'") != std::string::npos);
  CHECK(msg.find("export both again") != std::string::npos);
}

TEST_CASE("load: an exported graph runs at other batch sizes, one plan per input shape, bounded") {
  TempDir dir("kiln_test_load");
  ExportedMlp m(dir);
  Module model = load(m.symbol, m.params);
  for (int64_t batch : {1, 5, 3, 1}) {
    Tensor x = nd::random::normal(0, 1, {batch, 8});
    std::vector<Tensor> y = model({x});
    REQUIRE(y.size() == 1);
    CHECK(y[0].shape() == Shape{batch, 4});
    CheckClose(y[0], m.net(x));
  }
  CHECK(model.num_reshaped_plans() == 2);  // batch 1 and 5; batch 3 is the exported plan
  for (int64_t batch = 10; batch < 10 + static_cast<int64_t>(kMaxReshapedPlans) + 3; ++batch)
    model({nd::ones({batch, 8})});
  CHECK(model.num_reshaped_plans() == kMaxReshapedPlans);
  // Rows are independent: row 0 of a batch of 7 is the batch-1 result of that row.
  Tensor x7 = nd::random::normal(0, 1, {7, 8});
  Tensor row = nd::slice(x7, {0}, {1});
  CheckClose(nd::slice(model({x7})[0], {0}, {1}), model({row})[0]);
}

TEST_CASE("load: a call with wrong inputs names the input and both types") {
  TempDir dir("kiln_test_load");
  ExportedMlp m(dir);
  Module model = load(m.symbol, m.params);
  CHECK_THROWS_WITH_AS(model({nd::ones({3, 8, 1})}),
                       doctest::Contains("input 'data' expects float32(3, 8), found float32(3, 8, 1)"), ShapeError);
  CHECK_THROWS_WITH_AS(model({nd::ones({3, 8}, DType::kFloat64)}),
                       doctest::Contains("input 'data' expects float32(3, 8), found float64(3, 8)"), DTypeError);
  CHECK_THROWS_WITH_AS(model({}), doctest::Contains("expected 1 input(s) (data: float32(3, 8)), found 0"),
                       ValueError);
  CHECK_THROWS_WITH_AS(model({m.x, m.x}), doctest::Contains("found 2"), ValueError);
  CHECK_THROWS_WITH_AS(model({Tensor()}), doctest::Contains("'data' is an undefined tensor"), ValueError);
  CHECK_THROWS_AS(load(m.symbol, m.params, gpu(NumGPUs())), DeviceError);
}

}  // namespace
