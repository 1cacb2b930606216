// passes/reshape_inputs.h and passes/inline_calls.h: golden before/after text. ReshapeInputs on an
// exported-style graph at another batch size (size-valued attributes rewritten, ambiguous sizes
// settled by the element count or refused), its errors naming the node and the input, and a
// second run at the traced shapes changing nothing; InlineCalls replacing call_graph nodes.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "kiln/ir/call_graph.h"
#include "kiln/ir/text.h"
#include "kiln/ir/verify.h"
#include "kiln/passes/inline_calls.h"
#include "kiln/passes/reshape_inputs.h"
#include "kiln/runtime/error.h"
#include "test_util.h"

using namespace kiln;

namespace {
using kiln::testing::Contains;
using kiln::testing::ErrorOf;

// The canonical text of `text` (attributes completed, values renumbered).
std::string Canon(const std::string& text) { return ir::PrintGraph(*ir::ParseGraph(text)); }

std::string Reshaped(const std::string& text, std::vector<Shape> shapes) {
  auto g = passes::ReshapeInputs(*ir::ParseGraph(text), shapes);
  ir::Verify(*g);
  return ir::PrintGraph(*g);
}

// A LeNet-like tail traced at batch 4: flatten, dense, a broadcast bias, a creation op and a
// slice that takes the whole batch axis.
const char* kTraced = "%x = input \"data\" : float32(4, 2, 3)\n"
                      "%w = input \"0.weight\" : float32(6, 5)\n"
                      "%b = input \"0.bias\" : float32(1, 5)\n"
                      "%f = reshape(%x) {shape=[4, 6]} : float32(4, 6)\n"
                      "%y = matmul(%f, %w) : float32(4, 5)\n"
                      "%bb = broadcast_to(%b) {shape=[4, 5]} : float32(4, 5)\n"
                      "%z = add(%y, %bb) : float32(4, 5)\n"
                      "%o = full() {shape=[4, 5], value=1.0} : float32(4, 5)\n"
                      "%s = slice(%z) {begin=[0, 1], end=[4, 3]} : float32(4, 2)\n"
                      "%t = add(%z, %o) : float32(4, 5)\n"
                      "return %t, %s\n";
} // namespace

TEST_CASE("reshape_inputs: a graph traced at batch 4 re-shaped to batch 3, attributes rewritten") {
  std::string expected = Canon("%x = input \"data\" : float32(3, 2, 3)\n"
                               "%w = input \"0.weight\" : float32(6, 5)\n"
                               "%b = input \"0.bias\" : float32(1, 5)\n"
                               "%f = reshape(%x) {shape=[3, 6]} : float32(3, 6)\n"
                               "%y = matmul(%f, %w) : float32(3, 5)\n"
                               "%bb = broadcast_to(%b) {shape=[3, 5]} : float32(3, 5)\n"
                               "%z = add(%y, %bb) : float32(3, 5)\n"
                               "%o = full() {shape=[3, 5], value=1.0} : float32(3, 5)\n"
                               "%s = slice(%z) {begin=[0, 1], end=[9223372036854775807, 3]} : float32(3, 2)\n"
                               "%t = add(%z, %o) : float32(3, 5)\n"
                               "return %t, %s\n");
  std::string once = Reshaped(kTraced, {Shape{3, 2, 3}});
  CHECK(once == expected);
  // Idempotent: the result re-shaped to its own shapes is unchanged.
  CHECK(Reshaped(once, {Shape{3, 2, 3}}) == once);
  // Another batch from the traced graph.
  std::string seven = Reshaped(kTraced, {Shape{7, 2, 3}});
  CHECK(Contains(seven, "reshape(%0) {shape=[7, 6]}"));
  CHECK(Contains(seven, "broadcast_to(%2) {shape=[7, 5]}"));
  // But not back to 4 from the batch-3 graph: there 3 is also the size of data's last axis, so the
  // broadcast target's 3 could be either; refused, not guessed.
  CHECK(Contains(ErrorOf<ShapeError>([&] {
                   Reshaped(once, {Shape{4, 2, 3}});
                 }),
                 "holds the traced size 3, which is both a resized dimension and one that kept its size"));
}

TEST_CASE("reshape_inputs: the traced shapes leave the graph as it was") {
  CHECK(Reshaped(kTraced, {Shape{4, 2, 3}}) == Canon(kTraced));
}

TEST_CASE(
    "reshape_inputs: a size that is both the batch and a kept dimension is settled by the element count") {
  // (4, 4) with only the batch axis resized: in [4, 2, 2] only the first 4 can be the batch.
  const char* g = "%x = input \"data\" : float32(4, 4)\n"
                  "%r = reshape(%x) {shape=[4, 2, 2]} : float32(4, 2, 2)\n"
                  "return %r\n";
  CHECK(Reshaped(g, {Shape{3, 4}}) == Canon("%x = input \"data\" : float32(3, 4)\n"
                                            "%r = reshape(%x) {shape=[3, 2, 2]} : float32(3, 2, 2)\n"
                                            "return %r\n"));
}

TEST_CASE("reshape_inputs: a reshape keeping its input's leading sizes keeps the new ones (flatten)") {
  // Traced at batch 3 with 3x3 feature maps: the leading 3 of [3, -1] is the input's axis 0.
  const char* g = "%x = input \"data\" : float32(3, 4, 3, 3)\n"
                  "%r = reshape(%x) {shape=[3, -1]} : float32(3, 36)\n"
                  "return %r\n";
  CHECK(Reshaped(g, {Shape{1, 4, 3, 3}}) == Canon("%x = input \"data\" : float32(1, 4, 3, 3)\n"
                                                  "%r = reshape(%x) {shape=[1, -1]} : float32(1, 36)\n"
                                                  "return %r\n"));
}

TEST_CASE("reshape_inputs: an ambiguous node is a ShapeError naming the node and the input") {
  // [-1, 4] of a (4, 4) batch-3 input: (4, 3) and (3, 4) both fit, so which 4 is the batch is unknown.
  const char* g = "%x = input \"data\" : float32(4, 4)\n"
                  "%r = reshape(%x) {shape=[-1, 4]} : float32(4, 4)\n"
                  "return %r\n";
  std::string msg = ErrorOf<ShapeError>([&] { Reshaped(g, {Shape{3, 4}}); });
  CHECK(Contains(msg, "cannot re-shape node 0 (reshape, value %1) for input 'data' (4, 4) -> (3, 4)"));
  CHECK(Contains(msg, "more than one choice"));
  CHECK(Contains(msg, "export the graph again"));

  const char* bc = "%x = input \"data\" : float32(4, 4)\n"
                   "%b = input \"b\" : float32(1, 4)\n"
                   "%r = broadcast_to(%b) {shape=[4, 4]} : float32(4, 4)\n"
                   "%s = add(%x, %r) : float32(4, 4)\n"
                   "return %s\n";
  msg = ErrorOf<ShapeError>([&] { Reshaped(bc, {Shape{3, 4}}); });
  CHECK(Contains(msg, "node 0 (broadcast_to"));
  CHECK(Contains(msg, "ambiguous"));
}

TEST_CASE("reshape_inputs: constant slice bounds on a resized axis are refused") {
  const char* g = "%x = input \"data\" : float32(4, 5)\n"
                  "%s = slice(%x) {begin=[3], end=[4]} : float32(1, 5)\n"
                  "return %s\n";
  std::string msg = ErrorOf<ShapeError>([&] { Reshaped(g, {Shape{2, 5}}); });
  CHECK(Contains(msg, "node 0 (slice"));
  CHECK(Contains(msg, "slices axis 0, resized from 4 to 2, with constant bounds"));
  // The same slice on an axis that keeps its size carries over.
  CHECK(Contains(Reshaped(g, {Shape{4, 5}}), "slice(%0) {begin=[3], end=[4]"));
}

TEST_CASE("reshape_inputs: errors of the inputs and of inference name what to do") {
  const char* two = "%a = input \"a\" : float32(4, 3)\n"
                    "%b = input \"b\" : float32(4, 5)\n"
                    "return %a, %b\n";
  std::string msg = ErrorOf<ShapeError>([&] { Reshaped(two, {Shape{2, 3}, Shape{5, 5}}); });
  CHECK(Contains(msg, "input sizes disagree: input 'a' axis 0 and input 'b' axis 0 were both 4"));
  msg = ErrorOf<ShapeError>([&] { Reshaped(two, {Shape{2, 3, 1}}); });
  CHECK(Contains(msg, "input 'a' has shape (2, 3, 1) of rank 3, but the graph was traced with (4, 3)"));
  // A target written as a product of the batch (24 = 4 * 6) cannot be rewritten: inference fails,
  // and the message names the node.
  const char* flat = "%x = input \"data\" : float32(4, 6)\n"
                     "%r = reshape(%x) {shape=[24]} : float32(24,)\n"
                     "return %r\n";
  msg = ErrorOf<ShapeError>([&] { Reshaped(flat, {Shape{3, 6}}); });
  CHECK(Contains(msg, "cannot re-shape node 0 (reshape, value %1) for input 'data' (4, 6) -> (3, 6)"));
  CHECK(Contains(msg, "cannot reshape (3, 6)"));
}

TEST_CASE("inline_calls: call_graph nodes become the called graph's nodes, recursively") {
  auto inner = ir::ParseGraph("%a = input \"a\" : float32(2, 3)\n"
                              "%w = input \"w\" : float32(3,)\n"
                              "%s = add(%a, %w) : float32(2, 3)\n"
                              "%r = relu(%s) : float32(2, 3)\n"
                              "return %r, %s\n");
  ir::GraphSignature sig;
  for (const ir::Value* v : inner->inputs()) sig.inputs.push_back(v->type());
  for (const ir::Value* v : inner->outputs()) sig.outputs.push_back(v->type());
  ir::GraphRef ref = ir::RegisterGraph(sig, nullptr);
  std::string id = std::to_string(ref->id());
  auto outer = ir::ParseGraph("%x = input \"x\" : float32(2, 3)\n"
                              "%p = input \"p\" : float32(3,)\n"
                              "%n = neg(%x) : float32(2, 3)\n"
                              "%c, %d = call_graph(%n, %p) {graph_id=" +
                              id +
                              ", num_outputs=2} : float32(2, 3), float32(2, 3)\n"
                              "%e = mul(%c, %d) : float32(2, 3)\n"
                              "return %e, %c\n");
  int asked = 0;
  auto body = [&](int64_t gid) -> const ir::Graph& {
    ++asked;
    CHECK(gid == ref->id());
    return *inner;
  };
  CHECK(passes::HasCalls(*outer));
  auto g = passes::InlineCalls(*outer, body);
  ir::Verify(*g);
  CHECK(asked == 1);
  CHECK_FALSE(passes::HasCalls(*g));
  CHECK(ir::PrintGraph(*g) == Canon("%x = input \"x\" : float32(2, 3)\n"
                                    "%p = input \"p\" : float32(3,)\n"
                                    "%n = neg(%x) : float32(2, 3)\n"
                                    "%s = add(%n, %p) : float32(2, 3)\n"
                                    "%r = relu(%s) : float32(2, 3)\n"
                                    "%e = mul(%r, %s) : float32(2, 3)\n"
                                    "return %e, %r\n"));
  // Nothing left to inline: a second run copies the graph unchanged.
  auto again = passes::InlineCalls(*g, body);
  CHECK(asked == 1);
  CHECK(ir::PrintGraph(*again) == ir::PrintGraph(*g));

  // A call whose graph calls another graph is inlined through both.
  ir::GraphSignature sig2 = sig;
  ir::GraphRef ref2 = ir::RegisterGraph(sig2, nullptr);
  auto middle = ir::ParseGraph("%a = input \"a\" : float32(2, 3)\n"
                               "%w = input \"w\" : float32(3,)\n"
                               "%c, %d = call_graph(%a, %w) {graph_id=" +
                               id +
                               ", num_outputs=2} : float32(2, 3), float32(2, 3)\n"
                               "return %d, %c\n");
  auto top = ir::ParseGraph("%x = input \"x\" : float32(2, 3)\n"
                            "%p = input \"p\" : float32(3,)\n"
                            "%c, %d = call_graph(%x, %p) {graph_id=" +
                            std::to_string(ref2->id()) +
                            ", num_outputs=2} : float32(2, 3), float32(2, 3)\n"
                            "return %c\n");
  auto nested = passes::InlineCalls(
      *top, [&](int64_t gid) -> const ir::Graph& { return gid == ref2->id() ? *middle : *inner; });
  CHECK(ir::PrintGraph(*nested) == Canon("%x = input \"x\" : float32(2, 3)\n"
                                         "%p = input \"p\" : float32(3,)\n"
                                         "%s = add(%x, %p) : float32(2, 3)\n"
                                         "%r = relu(%s) : float32(2, 3)\n"
                                         "return %s\n"));
}
