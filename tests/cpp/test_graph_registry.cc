// The one registry of compiled graphs (ir/call_graph.h) and what keeps its entries: an entry lives
// while a reference does, a dropped CachedGraph frees its graphs (training variants included)
// once the engine is idle, a graph that calls another keeps it alive. The IR's graph copier
// copies a graph to the same text. A block's signature cache drops its least recently used entry
// beyond its capacity.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "kiln/frontend/autograd.h"
#include "kiln/frontend/cached_graph.h"
#include "kiln/frontend/ops.h"
#include "kiln/frontend/signature_cache.h"
#include "kiln/ir/call_graph.h"
#include "kiln/ir/graph.h"
#include "kiln/ir/text.h"
#include "kiln/runtime/engine.h"
#include "test_util.h"

namespace {

using namespace kiln;
using kiln::testing::Contains;
using kiln::testing::ErrorOf;
using kiln::testing::ScopedEnv;

std::shared_ptr<CachedGraph> TraceTanhMatmul(const Tensor& w, const Shape& x_shape) {
  trace::TraceScope scope;
  Tensor x = scope.Input("data", x_shape, DType::kFloat32, cpu());
  return scope.Finish({nd::tanh(nd::matmul(x, w)) * 2.0});
}

size_t Live() {
  engine::Engine::Get().WaitForAll();
  return NumLiveGraphs();
}

TEST_CASE("graph registry: an entry lives while a reference does, then its id is refused") {
  ir::GraphSignature sig;
  sig.inputs.push_back({Shape{2}, DType::kFloat32});
  sig.outputs.push_back({Shape{2}, DType::kFloat32});
  size_t before = ir::NumRegisteredGraphs();
  ir::GraphRef ref = ir::RegisterGraph(sig, nullptr);
  int64_t id = ref->id();
  CHECK(ir::NumRegisteredGraphs() == before + 1);
  CHECK(ir::FindGraph(id).get() == ref.get());
  CHECK(ir::GetGraphSignature(id).outputs.size() == 1);
  ir::GraphRef again = ir::RegisterGraph(sig, nullptr);
  CHECK(again->id() != id);  // ids are never reused
  ref.reset();
  CHECK(ir::NumRegisteredGraphs() == before + 1);
  std::string err = ErrorOf<ValueError>([&] { ir::FindGraph(id); });
  CHECK(Contains(err, "compiled graph " + std::to_string(id) + " was freed"));
  CHECK(Contains(ErrorOf<ValueError>([&] { ir::FindGraph(1 << 30); }), "no compiled graph has id"));
}

TEST_CASE("graph registry: a dropped compiled graph frees its forward, backward and training variant") {
  Tensor w = nd::random::normal(0, 0.5, {8, 4});
  w.AttachGrad();
  size_t before = Live();
  {
    auto g = TraceTanhMatmul(w, {3, 8});
    CHECK(Live() == before + 1);
    Tensor x = nd::random::normal(0, 1, {3, 8});
    {
      autograd::RecordScope record;
      Tensor y = g->Call({x})[0];
      autograd::Backward({nd::sum(y)});
    }
    // The training variant, owned by the forward's entry, and the compiled backward (the sum's
    // gradient with the variant's backward), owned by the variant's.
    CHECK(Live() == before + 3);
    // A call still queued when the graph goes away runs to the end: the entry waits for it.
    Tensor y = g->Call({x})[0];
    g.reset();
    y.WaitToRead();
    CHECK(y.shape() == Shape{3, 4});
  }
  CHECK(Live() == before);
}

TEST_CASE("graph registry: a recorded call keeps its graph until the backward") {
  // The block that compiled a graph may drop it inside the record scope (its cache cleared or
  // evicted); the tape holds the graph, so the backward still runs through it, and the graph is
  // freed with the tape.
  size_t before = Live();
  {
    Tensor w = nd::random::normal(0, 0.5, {8, 4});
    w.AttachGrad();
    auto g = TraceTanhMatmul(w, {3, 8});
    Tensor x = nd::random::normal(0, 1, {3, 8});
    Tensor loss;
    {
      autograd::RecordScope record;
      loss = nd::sum(g->Call({x})[0]);
    }
    g.reset();
    Live();  // the engine is idle: only the tape keeps the graph now
    autograd::Backward({loss});
    std::vector<float> gw = w.grad().ToVector<float>();
    CHECK(gw.size() == 32);
    double norm = 0;
    for (float v : gw) norm += std::abs(v);
    CHECK(norm > 0);
  }
  CHECK(Live() == before);
}

TEST_CASE("graph registry: a graph that calls another keeps the callee alive") {
  Tensor w = nd::random::normal(0, 0.5, {8, 4});
  size_t before = Live();
  auto inner = TraceTanhMatmul(w, {2, 8});
  int64_t inner_id = inner->graph_id();
  std::shared_ptr<CachedGraph> outer;
  {
    trace::TraceScope scope;
    Tensor x = scope.Input("data", {2, 8}, DType::kFloat32, cpu());
    outer = scope.Finish({inner->Call({x})[0] + 1.0});
  }
  CHECK(Contains(ir::PrintGraph(outer->graph()), "call_graph"));
  inner.reset();
  CHECK(Live() == before + 2);
  CHECK(ir::FindGraph(inner_id)->id() == inner_id);
  Tensor x = nd::random::normal(0, 1, {2, 8});
  std::vector<double> got = outer->Call({x})[0].ToVector<double>();
  std::vector<double> want = (nd::tanh(nd::matmul(x, w)) * 2.0 + 1.0).ToVector<double>();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));
  outer.reset();
  CHECK(Live() == before);
}

TEST_CASE("graph copier: a copy prints as the original, nodes copy onto mapped inputs") {
  Tensor w = nd::random::normal(0, 0.5, {8, 4});
  auto g = TraceTanhMatmul(w, {3, 8});
  ir::ValueMap map;
  std::unique_ptr<ir::Graph> copy = ir::CopyGraph(g->graph(), &map);
  CHECK(ir::PrintGraph(*copy) == ir::PrintGraph(g->graph()));
  for (const ir::Value* v : g->graph().inputs()) CHECK(map.at(v)->name() == v->name());
  // Copying the nodes again onto the copy's own inputs appends a second, identical body.
  ir::ValueMap onto;
  for (size_t i = 0; i < g->graph().inputs().size(); ++i) onto[g->graph().inputs()[i]] = copy->inputs()[i];
  size_t n = copy->nodes().size();
  ir::CopyNodes(g->graph(), *copy, onto);
  CHECK(copy->nodes().size() == 2 * n);
  // A node reading a value that was not mapped is an internal error, not a wrong graph.
  ir::Graph empty;
  ir::ValueMap none;
  CHECK(Contains(ErrorOf<InternalError>([&] { ir::CopyNodes(g->graph(), empty, none); }), "not mapped"));
}

CallSignature Sig(int64_t rows, bool training = false) {
  CallSignature s;
  s.training = training;
  s.args.push_back({true, Shape{rows, 4}, DType::kFloat32, cpu(), ""});
  s.args.push_back({false, Shape{}, DType::kFloat32, cpu(), "'relu'"});
  return s;
}

TEST_CASE("signature cache: least recently used dropped beyond the capacity") {
  Tensor w = nd::random::normal(0, 0.5, {4, 4});
  SignatureCache cache(2);
  CHECK(cache.capacity() == 2);
  for (int64_t r = 1; r <= 3; ++r) cache.Insert(Sig(r), {TraceTanhMatmul(w, {r, 4}), nullptr});
  CHECK(cache.size() == 2);
  CHECK(cache.evictions() == 1);
  CHECK(cache.Find(Sig(1)) == nullptr);
  REQUIRE(cache.Find(Sig(2)) != nullptr);  // now the most recently used: 3 goes next
  CHECK(cache.Find(Sig(2, /*training=*/true)) == nullptr);
  cache.Insert(Sig(4), {TraceTanhMatmul(w, {4, 4}), nullptr});
  CHECK(cache.Find(Sig(3)) == nullptr);
  CHECK(cache.Find(Sig(2)) != nullptr);
  CHECK(cache.keys().size() == 2);
  CHECK(*cache.keys()[0] == Sig(2));
  cache.set_capacity(1);
  CHECK(cache.size() == 1);
  CHECK(Contains(ErrorOf<ValueError>([&] { cache.set_capacity(0); }), "at least 1"));
}

TEST_CASE("signature cache: KILN_GRAPH_CACHE_SIZE sets the default capacity and is checked") {
  {
    ScopedEnv env("KILN_GRAPH_CACHE_SIZE", "3");
    CHECK(SignatureCache().capacity() == 3);
  }
  ScopedEnv env("KILN_GRAPH_CACHE_SIZE", "0");
  CHECK(Contains(ErrorOf<ValueError>([] { SignatureCache c; }), "KILN_GRAPH_CACHE_SIZE=0"));
}

}  // namespace
