// The graph verifier (ir/verify.h): well-formed graphs pass; each invariant's violation is
// reported with its number, title and node, in exact text. Graphs the public API can build
// wrongly (duplicate input names, values of another graph) are built that way; the rest are
// corrupted through const_cast, as a buggy pass with write access to a Graph would do.
#include <doctest/doctest.h>

#include <string>
#include <utility>

#include "kiln/ir/graph.h"
#include "kiln/ir/text.h"
#include "kiln/ir/verify.h"

using namespace kiln;
using V = std::vector<int64_t>;

namespace {

/// The message of the InternalError Verify throws ("" when it throws none).
std::string VerifyError(const ir::Graph& g, std::string_view pass = {}) {
  try {
    ir::Verify(g, pass);
  } catch (const InternalError& e) {
    return e.what();
  }
  return "";
}

/// The only violation VerifyAll finds ("" for none; all of them joined when there are several).
std::string OneViolation(const ir::Graph& g) {
  std::vector<std::string> v = ir::VerifyAll(g);
  std::string s;
  for (const std::string& m : v) s += (s.empty() ? "" : " | ") + m;
  return s;
}

// Write access a pass would have; the nodes and graph are not const objects, so this is defined.
ir::Attrs& AttrsOf(ir::Node* n) { return const_cast<ir::Attrs&>(n->attrs()); }
std::vector<ir::Value*>& InputsOf(ir::Node* n) { return const_cast<std::vector<ir::Value*>&>(n->inputs()); }
std::vector<ir::Value*>& OutputsOf(ir::Node* n) { return const_cast<std::vector<ir::Value*>&>(n->outputs()); }
std::vector<ir::Value*>& InputsOf(ir::Graph& g) { return const_cast<std::vector<ir::Value*>&>(g.inputs()); }

/// A small graph with the kinds of node the tests corrupt: node #0 exp, #1 sum (attributes),
/// #2 split (two outputs), #3 add (two inputs).
std::unique_ptr<ir::Graph> Sample() {
  return ir::ParseGraph("%0 = input \"x\" : float32(2, 3)\n"
                        "%1 = exp(%0) : float32(2, 3)\n"
                        "%2 = sum(%1) {axes=[1], keepdims=true} : float32(2, 1)\n"
                        "%3, %4 = split(%1) {sections=[1, 2], axis=1} : float32(2, 1), float32(2, 2)\n"
                        "%5 = add(%3, %2) : float32(2, 1)\n"
                        "return %5, %4\n");
}

ir::Node* NodeAt(ir::Graph& g, int k) { return g.nodes()[k].get(); }

} // namespace

TEST_CASE("ir verify: well-formed graphs pass") {
  std::unique_ptr<ir::Graph> g = Sample();
  CHECK(ir::VerifyAll(*g).empty());
  CHECK(VerifyError(*g) == "");
  ir::Graph empty;
  CHECK(ir::VerifyAll(empty).empty());
  // A graph input may be a graph output, twice; an input added after nodes is still an input.
  ir::Graph h;
  ir::Builder b(h);
  ir::Value* x = h.AddInput("x", {Shape{2}, DType::kFloat32});
  ir::Value* one = b.Scalar(1.0, DType::kFloat32);
  ir::Value* y = h.AddInput("y", {Shape{2}, DType::kFloat32});
  h.SetOutputs({x, x, b.Add(b.Add(x, one), y)});
  CHECK(ir::VerifyAll(h).empty());
}

TEST_CASE("ir verify: input names (invariant 2), built through the public API") {
  ir::Graph g;
  ir::Value* a = g.AddInput("x", {Shape{2}, DType::kFloat32});
  g.AddInput("", {Shape{2}, DType::kFloat32});
  g.AddInput("x", {Shape{2}, DType::kFloat32});
  g.SetOutputs({a});
  CHECK(ir::VerifyAll(g) ==
        std::vector<std::string>{
            "invariant 2 (input names are non-empty and unique): graph input 1: has an empty name",
            "invariant 2 (input names are non-empty and unique): graph input 2: is named \"x\", "
            "like graph input 0"});
  CHECK(
      VerifyError(g) ==
      "graph verification failed: invariant 2 (input names are non-empty and unique): graph input 1: has an "
      "empty name");
}

TEST_CASE("ir verify: values of another graph (invariants 4 and 9), with the pass named") {
  ir::Graph other;
  ir::Value* foreign = other.AddInput("z", {Shape{2}, DType::kFloat32});
  ir::Graph g;
  ir::Builder b(g);
  ir::Value* x = g.AddInput("x", {Shape{2}, DType::kFloat32});
  ir::Value* y = b.Add(x, foreign);
  g.SetOutputs({y, foreign});
  CHECK(VerifyError(g, "cse") ==
        "graph verification failed after pass 'cse': invariant 4 (operands are defined before use): node #0 "
        "(add): input 1 (value id 0) is not a value of this graph");
  CHECK(ir::VerifyAll(g).size() == 2);
  CHECK(ir::VerifyAll(g)[1] == "invariant 9 (graph outputs are values of the graph): graph output 1: (value "
                               "id 0) is not a value of this "
                               "graph");
  // The printer does not throw on it; it marks the value.
  CHECK(ir::PrintGraph(g) == "%0 = input \"x\" : float32(2,)\n"
                             "%1 = add(%0, %<foreign 0>) : float32(2,)\n"
                             "return %1, %<foreign 0>\n");
  g.SetOutputs({y, nullptr});
  CHECK(ir::VerifyAll(g)[1] ==
        "invariant 9 (graph outputs are values of the graph): graph output 1: is null");
}

TEST_CASE("ir verify: operands out of order or null (invariant 4)") {
  std::unique_ptr<ir::Graph> g = Sample();
  InputsOf(NodeAt(*g, 0))[0] = NodeAt(*g, 3)->output(); // exp now reads the add after it
  CHECK(OneViolation(*g) ==
        "invariant 4 (operands are defined before use): node #0 (exp): input 0 is output 0 of node #3 (add), "
        "which does not come before it");
  InputsOf(NodeAt(*g, 0))[0] = NodeAt(*g, 0)->output(); // its own output
  CHECK(OneViolation(*g) ==
        "invariant 4 (operands are defined before use): node #0 (exp): input 0 is output 0 of node #0 (exp), "
        "which does not come before it");
  InputsOf(NodeAt(*g, 0))[0] = nullptr;
  CHECK(OneViolation(*g) == "invariant 4 (operands are defined before use): node #0 (exp): input 0 is null");
}

TEST_CASE("ir verify: attributes against the schema (invariant 5)") {
  auto with = [](auto corrupt) {
    std::unique_ptr<ir::Graph> g = Sample();
    corrupt(AttrsOf(NodeAt(*g, 1)).items()); // the sum node
    return OneViolation(*g);
  };
  const std::string pre = "invariant 5 (attributes match the op's schema): node #1 (sum): ";
  CHECK(with([](auto& items) { items[1].second = int64_t{1}; }) ==
        pre + "attribute 'keepdims' holds an int (1); the schema declares a bool");
  CHECK(with([](auto& items) { items.pop_back(); }) == pre + "attribute 'keepdims' is missing");
  CHECK(with([](auto& items) { items.emplace_back("axis", int64_t{0}); }) ==
        pre + "attribute 'axis' is not in the schema (axes, keepdims)");
  CHECK(with([](auto& items) { items.push_back(items[0]); }) == pre + "attribute 'axes' is given twice");
  CHECK(with([](auto& items) { std::swap(items[0], items[1]); }) ==
        pre + "attributes are out of schema order: 'keepdims' where the schema has 'axes'");
}

TEST_CASE("ir verify: arity (invariant 6)") {
  std::unique_ptr<ir::Graph> g = Sample();
  InputsOf(NodeAt(*g, 3)).push_back(NodeAt(*g, 0)->output());
  CHECK(OneViolation(*g) ==
        "invariant 6 (arity matches the op): node #3 (add): expected 2 input(s), found 3");

  g = Sample();
  AttrsOf(NodeAt(*g, 2)).items()[0].second = V{1, 1, 1}; // split now declares three outputs
  CHECK(OneViolation(*g) ==
        "invariant 6 (arity matches the op): node #2 (split): expected 3 output(s), found 2");
}

TEST_CASE("ir verify: each value produced once (invariants 1 and 7)") {
  std::unique_ptr<ir::Graph> g = Sample();
  std::swap(OutputsOf(NodeAt(*g, 2))[0], OutputsOf(NodeAt(*g, 2))[1]);
  CHECK(
      ir::VerifyAll(*g) ==
      std::vector<std::string>{
          "invariant 7 (each value is produced once): node #2 (split): output 0 (value id 4) has index 1",
          "invariant 7 (each value is produced once): node #2 (split): output 1 (value id 3) has index 0",
          "invariant 8 (output types match inference): node #2 (split): output 0 has type float32(2, 2), but "
          "split infers float32(2, 1)",
          "invariant 8 (output types match inference): node #2 (split): output 1 has type float32(2, 1), but "
          "split infers float32(2, 2)"});

  g = Sample();
  OutputsOf(NodeAt(*g, 1))[0] = NodeAt(*g, 0)->output(); // sum claims exp's output
  CHECK(ir::VerifyAll(*g).at(0) == "invariant 7 (each value is produced once): node #1 (sum): output 0 "
                                   "(value id 1) is also output 0 of node "
                                   "#0 (exp)");

  g = Sample();
  InputsOf(*g).push_back(NodeAt(*g, 0)->output()); // a node output listed as a graph input
  CHECK(ir::VerifyAll(*g) ==
        std::vector<std::string>{
            "invariant 1 (graph inputs are distinct values with no producer): graph input 1: (value id 1) is "
            "produced by a node (exp)",
            "invariant 2 (input names are non-empty and unique): graph input 1: has an empty name",
            "invariant 7 (each value is produced once): node #0 (exp): output 0 (value id 1) is also a graph "
            "input"});

  g = Sample();
  InputsOf(*g).push_back(g->inputs()[0]);
  CHECK(
      ir::VerifyAll(*g).at(0) ==
      "invariant 1 (graph inputs are distinct values with no producer): graph input 1: is the same value as "
      "graph input 0");
}

TEST_CASE("ir verify: output types against inference (invariant 8)") {
  std::unique_ptr<ir::Graph> g = Sample();
  AttrsOf(NodeAt(*g, 1)).items()[1].second = false; // sum without keepdims infers (2,)
  // The add after it was built for (2, 1); its recorded type still matches its recorded inputs.
  CHECK(OneViolation(*g) ==
        "invariant 8 (output types match inference): node #1 (sum): output 0 has type float32(2, 1), but sum "
        "infers float32(2,)");

  g = Sample();
  AttrsOf(NodeAt(*g, 1)).items()[0].second = V{5};
  CHECK(OneViolation(*g) == "invariant 8 (output types match inference): node #1 (sum): inference fails: "
                            "sum: axis 5 is out of range "
                            "for a tensor of rank 2; expected an axis in [-2, 1]");
}

TEST_CASE("ir verify: value ids (invariant 10)") {
  std::unique_ptr<ir::Graph> g = Sample();
  ir::Graph other;
  ir::Value* stray = other.AddInput("y", {Shape{2}, DType::kFloat32});
  InputsOf(*g).push_back(stray); // a second value with id 0, and one value too many
  CHECK(ir::VerifyAll(*g) ==
        std::vector<std::string>{
            "invariant 10 (value ids are unique and dense): graph input 1: has id 0, like "
            "another value",
            "invariant 10 (value ids are unique and dense): graph: has 6 values, but its inputs "
            "and node outputs are 7"});
}

TEST_CASE("ir verify: the first violation is the one Verify reports, as InternalError") {
  std::unique_ptr<ir::Graph> g = Sample();
  AttrsOf(NodeAt(*g, 1)).items()[1].second = false;           // invariant 8 at node #1
  InputsOf(NodeAt(*g, 3)).push_back(NodeAt(*g, 0)->output()); // invariant 6 at node #3
  CHECK(ir::VerifyAll(*g).size() == 2);
  CHECK_THROWS_AS(ir::Verify(*g), InternalError);
  CHECK(
      VerifyError(*g, "simplify") ==
      "graph verification failed after pass 'simplify': invariant 8 (output types match inference): node #1 "
      "(sum): output 0 has type float32(2, 1), but sum infers float32(2,)");
}
