// The graph text form (ir/text.h): golden printed text of graphs built with Builder, the
// print/parse/print identity for every attribute kind and awkward names, and the exact messages
// of parse errors (line, column, what was expected, what was found).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "kiln/ir/graph.h"
#include "kiln/ir/text.h"
#include "kiln/ir/verify.h"

using namespace kiln;
using ir::TensorType;
using V = std::vector<int64_t>;

namespace {

/// Parses `text`, checks it is well formed and prints it again.
std::string Reprint(const std::string& text) {
  std::unique_ptr<ir::Graph> g = ir::ParseGraph(text);
  ir::Verify(*g);
  return ir::PrintGraph(*g);
}

/// The message of the FormatError ParseGraph throws for `text` ("" when it throws none).
std::string ParseError(const std::string& text) {
  try {
    ir::ParseGraph(text);
  } catch (const FormatError& e) {
    return e.what();
  }
  return "";
}

/// Checks the golden text of `g` and that parsing it gives the same text back.
void CheckGolden(const ir::Graph& g, const std::string& expected) {
  std::string text = ir::PrintGraph(g);
  CHECK(text == expected);
  CHECK(Reprint(text) == text);
}

} // namespace

TEST_CASE("ir text: golden MLP built with Builder") {
  ir::Graph g;
  ir::Builder b(g);
  ir::Value* x = g.AddInput("x", {Shape{4, 8}, DType::kFloat32});
  ir::Value* w1 = g.AddInput("w1", {Shape{8, 16}, DType::kFloat32});
  ir::Value* b1 = g.AddInput("b1", {Shape{16}, DType::kFloat32});
  ir::Value* h = b.Op("relu", {b.Add(b.Op("matmul", {x, w1}), b1)});
  ir::Value* loss = b.Op("sum", {h});
  g.SetOutputs({loss, h});
  CheckGolden(g, "%0 = input \"x\" : float32(4, 8)\n"
                 "%1 = input \"w1\" : float32(8, 16)\n"
                 "%2 = input \"b1\" : float32(16,)\n"
                 "%3 = matmul(%0, %1) {transpose_a=false, transpose_b=false} : float32(4, 16)\n"
                 "%4 = add(%3, %2) : float32(4, 16)\n"
                 "%5 = relu(%4) : float32(4, 16)\n"
                 "%6 = sum(%5) {axes=[], keepdims=false} : float32()\n"
                 "return %6, %5\n");
}

TEST_CASE("ir text: golden multi-output split, reduction, conv2d and cast") {
  ir::Graph g;
  ir::Builder b(g);
  ir::Value* x = g.AddInput("x", {Shape{2, 3, 8, 8}, DType::kFloat32});
  ir::Value* w = g.AddInput("w", {Shape{4, 3, 3, 3}, DType::kFloat32});
  ir::Value* y = b.Op("conv2d", {x, w}, {{"stride", V{2, 2}}, {"padding", V{1, 1}}});
  std::vector<ir::Value*> parts = b.OpN("split", {y}, {{"sections", V{1, 3}}, {"axis", int64_t{1}}});
  ir::Value* m = b.Op("mean", {parts[1]}, {{"axes", V{-1, 2}}, {"keepdims", true}});
  ir::Value* c = b.Cast(m, DType::kFloat16);
  ir::Value* i = b.Op("argmax", {parts[0]}, {{"axis", int64_t{-3}}});
  g.SetOutputs({c, i, parts[0]});
  CheckGolden(
      g,
      "%0 = input \"x\" : float32(2, 3, 8, 8)\n"
      "%1 = input \"w\" : float32(4, 3, 3, 3)\n"
      "%2 = conv2d(%0, %1) {stride=[2, 2], padding=[1, 1], dilation=[1, 1], groups=1} : float32(2, 4, 4, 4)\n"
      "%3, %4 = split(%2) {sections=[1, 3], axis=1} : float32(2, 1, 4, 4), float32(2, 3, 4, 4)\n"
      "%5 = mean(%4) {axes=[-1, 2], keepdims=true} : float32(2, 3, 1, 1)\n"
      "%6 = cast(%5) {dtype=float16} : float16(2, 3, 1, 1)\n"
      "%7 = argmax(%3) {axis=-3, keepdims=false} : int64(2, 4, 4)\n"
      "return %6, %7, %3\n");
}

TEST_CASE("ir text: values are renumbered densely, inputs first") {
  // Builder::Scalar adds a node before the second input exists: value ids 0, 1, 2, 3 are x, the
  // constant, y and the product; the text numbers inputs first.
  ir::Graph g;
  ir::Builder b(g);
  ir::Value* x = g.AddInput("x", {Shape{3}, DType::kFloat64});
  ir::Value* k = b.Scalar(0.1, DType::kFloat64);
  ir::Value* y = g.AddInput("y", {Shape{3}, DType::kFloat64});
  g.SetOutputs({b.Mul(b.Mul(x, k), y)});
  CHECK(y->id() == 2);
  CheckGolden(g, "%0 = input \"x\" : float64(3,)\n"
                 "%1 = input \"y\" : float64(3,)\n"
                 "%2 = full() {shape=[], value=0.1, dtype=float64} : float64()\n"
                 "%3 = mul(%0, %2) : float64(3,)\n"
                 "%4 = mul(%3, %1) : float64(3,)\n"
                 "return %4\n");
}

TEST_CASE("ir text: every attribute kind round-trips exactly") {
  const double tricky[] = {0.1,
                           -0.0,
                           1.0,
                           1e300,
                           -2.5e-7,
                           1.0 / 3.0,
                           5e-324,
                           std::numeric_limits<double>::max(),
                           std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity()};
  for (double v : tricky) {
    INFO("value " << v);
    ir::Graph g;
    ir::Builder b(g);
    g.SetOutputs({b.Op("full", {}, {{"shape", V{2}}, {"value", v}, {"dtype", DType::kFloat64}})});
    std::string text = ir::PrintGraph(g);
    std::unique_ptr<ir::Graph> back = ir::ParseGraph(text);
    double got = back->nodes()[0]->attrs().Float("value");
    CHECK(std::memcmp(&got, &v, sizeof v) == 0); // bit for bit, the sign of zero included
    CHECK(ir::PrintGraph(*back) == text);
  }
  ir::Graph g;
  ir::Builder b(g);
  ir::Value* nan = b.Op("full", {}, {{"shape", V{}}, {"value", std::nan("")}});
  ir::Value* x = g.AddInput("x", {Shape{5, 4}, DType::kInt32});
  // INT64_MIN / INT64_MAX are slice's "from the start" / "to the end".
  ir::Value* s = b.Op("slice", {x},
                      {{"begin", V{-3}}, {"end", V{std::numeric_limits<int64_t>::min()}}, {"step", V{-1}}});
  ir::Value* s2 =
      b.Op("slice", {x}, {{"begin", V{1}}, {"end", V{std::numeric_limits<int64_t>::max()}}, {"step", V{2}}});
  ir::Value* t = b.Op("transpose", {x}, {{"axes", V{}}});
  ir::Value* mm = b.Op("matmul", {b.Cast(t, DType::kFloat32), b.Cast(x, DType::kFloat32)},
                       {{"transpose_a", true}, {"transpose_b", true}});
  ir::Value* oh =
      b.Op("one_hot", {x},
           {{"depth", int64_t{3}}, {"on_value", 2.0}, {"off_value", -1.5}, {"dtype", DType::kBFloat16}});
  g.SetOutputs({nan, s, s2, mm, oh});
  std::string expected =
      "%0 = input \"x\" : int32(5, 4)\n"
      "%1 = full() {shape=[], value=nan, dtype=float32} : float32()\n"
      "%2 = slice(%0) {begin=[-3], end=[-9223372036854775808], step=[-1]} : int32(3, 4)\n"
      "%3 = slice(%0) {begin=[1], end=[9223372036854775807], step=[2]} : int32(2, 4)\n"
      "%4 = transpose(%0) {axes=[]} : int32(4, 5)\n"
      "%5 = cast(%4) {dtype=float32} : float32(4, 5)\n"
      "%6 = cast(%0) {dtype=float32} : float32(5, 4)\n"
      "%7 = matmul(%5, %6) {transpose_a=true, transpose_b=true} : float32(5, 5)\n"
      "%8 = one_hot(%0) {depth=3, on_value=2.0, off_value=-1.5, dtype=bfloat16, labels=false} : bfloat16(5, 4, 3)\n"
      "return %1, %2, %3, %7, %8\n";
  CheckGolden(g, expected);
}

TEST_CASE("ir text: names with quotes, backslashes, spaces and control characters") {
  ir::Graph g;
  ir::Builder b(g);
  std::string name = "a \"quoted\" name\\with\ttab\nnewline\x01 and UTF-8 \xc3\xa9";
  ir::Value* x = g.AddInput(name, {Shape{}, DType::kBool});
  g.AddInput("#not a comment", {Shape{0, 2}, DType::kUInt8});
  g.SetOutputs({b.Op("logical_not", {x}), x});
  std::string text = ir::PrintGraph(g);
  CHECK(text ==
        "%0 = input \"a \\\"quoted\\\" name\\\\with\\ttab\\nnewline\\x01 and UTF-8 \xc3\xa9\" : bool()\n"
        "%1 = input \"#not a comment\" : uint8(0, 2)\n"
        "%2 = logical_not(%0) : bool()\n"
        "return %2, %0\n");
  std::unique_ptr<ir::Graph> back = ir::ParseGraph(text);
  CHECK(back->inputs()[0]->name() == name);
  CHECK(back->inputs()[1]->name() == "#not a comment");
  CHECK(ir::PrintGraph(*back) == text);
}

TEST_CASE("ir text: the parser takes hand-written forms and prints them canonically") {
  // Comments, blank lines, named values, omitted default attributes, a type list with a
  // trailing comma, an input after a node, an empty return.
  std::string text = "# a hand-written graph\n"
                     "\n"
                     "%x = input \"x\" : float32(6,)   # six numbers\n"
                     "%a, %b = split(%x) {sections=[2]} : float32(3,), float32(3,)\n"
                     "%y = input \"y\" : float32(3,)\n"
                     "%s = sum(%a) {keepdims=true} : float32(1,)\n"
                     "%c = concat(%a, %b, %y) : float32(9,)\n"
                     "%m = maximum(%c, %s) : float32(9,)\n"
                     "\n"
                     "return\n"
                     "\n";
  CHECK(Reprint(text) == "%0 = input \"x\" : float32(6,)\n"
                         "%1 = input \"y\" : float32(3,)\n"
                         "%2, %3 = split(%0) {sections=[2], axis=0} : float32(3,), float32(3,)\n"
                         "%4 = sum(%2) {axes=[], keepdims=true} : float32(1,)\n"
                         "%5 = concat(%2, %3, %1) {axis=0} : float32(9,)\n"
                         "%6 = maximum(%5, %4) : float32(9,)\n"
                         "return\n");
  // An int where a float is declared, a bool where an int is, and an int for a one-element list
  // are the coercions of OpDef::Resolve.
  CHECK(Reprint("%0 = full() {shape=3, value=2, dtype=int64} : int64(3,)\n"
                "%1 = argmin(%0) {axis=false} : int64()\nreturn %1") ==
        "%0 = full() {shape=[3], value=2.0, dtype=int64} : int64(3,)\n"
        "%1 = argmin(%0) {axis=0, keepdims=false} : int64()\n"
        "return %1\n");
}

TEST_CASE("ir text: the autodiff-shaped gradient of an MLP round-trips") {
  // Gradient rules build through Builder too; their graphs (broadcast sums, full nodes, reshape)
  // must print and parse back identically.
  ir::Graph g;
  ir::Builder b(g);
  ir::Value* x = g.AddInput("x", {Shape{4, 3}, DType::kFloat32});
  ir::Value* bias = g.AddInput("bias", {Shape{3}, DType::kFloat32});
  ir::Value* y = b.Op("tanh", {b.Add(x, bias)});
  ir::Value* gy = b.OnesLike(y);
  ir::Value* gb = b.SumTo(b.Mul(gy, b.Sub(b.OnesLike(y), b.Mul(y, y))), bias->shape());
  g.SetOutputs({y, gb});
  std::string text = ir::PrintGraph(g);
  CHECK(Reprint(text) == text);
  CHECK(text.find("sum(%8) {axes=[0], keepdims=true} : float32(1, 3)\n") != std::string::npos);
  CHECK(text.find("reshape(%9) {shape=[3]} : float32(3,)\n") != std::string::npos);
}

TEST_CASE("ir text: syntax errors name line, column, expected and found") {
  auto err = [](const std::string& text) { return ParseError(text); };
  CHECK(err("%0 = input \"x\" : float32(2, 3)\n"
            "%1 = add(%0 %0) : float32(2, 3)\n"
            "return %1\n") == "line 2, column 13: expected ',' or ')', found '%0'");
  CHECK(err("%0 = input \"x\" : float32(2, 3)\n") ==
        "line 2, column 1: expected a definition ('%name = ...') or 'return', found end of input");
  CHECK(err("%0 = input \"x\" : float32(2, 3)\nreturn %0\n%1 = relu(%0) : float32(2, 3)\n") ==
        "line 3, column 1: expected end of input after 'return', found '%1'");
  CHECK(err("%0 = input \"x : float32(2, 3)\nreturn %0") ==
        "line 1, column 30: expected '\"' to close the string, found end of line");
  CHECK(err("%0 = input \"a\\qb\" : float32()\nreturn %0") ==
        "line 1, column 14: expected an escape (\\\" \\\\ \\n \\r \\t \\xHH), found '\\q'");
  CHECK(err("%0 = input x : float32()\nreturn %0") ==
        "line 1, column 12: expected the input's name as a string, found 'x'");
  CHECK(
      err("%0 = input \"x\" : float23(2)\nreturn %0") ==
      "line 1, column 18: expected a dtype (float32, float64, float16, bfloat16, int32, int64, uint8, bool), "
      "found 'float23'");
  CHECK(err("%0 = input \"x\" : float32(2, -3)\nreturn %0") ==
        "line 1, column 29: expected a dimension (an integer >= 0), found '-3'");
  CHECK(err("%0 = input \"x\" : float32(2; 3)\nreturn %0") ==
        "line 1, column 27: expected ',' or ')', found character ';'");
  CHECK(err("%0 = input \"x\" : float32(2.5)\nreturn %0") ==
        "line 1, column 26: expected a dimension or ')', found '2.5'");
  CHECK(err("%0 = input \"x\" : int64(3)\n"
            "%1 = sum(%0) {axes=[0, 1.5]} : int64()\nreturn %1") ==
        "line 2, column 24: expected an integer, found '1.5'");
  CHECK(
      err("%0 = full() {shape=[], value=99999999999999999999} : float32()\nreturn %0") ==
      "line 1, column 30: expected an integer, found '99999999999999999999', which does not fit in 64 bits");
  CHECK(err("%0 = full() {shape=[], value=1e999} : float32()\nreturn %0") ==
        "line 1, column 30: expected a float, found '1e999', which is out of the range of a double");
  CHECK(err("%0 = input \"x\" : float32(2)\n%1 = relu(%0) float32(2)\nreturn %1") ==
        "line 2, column 15: expected ':', found 'float32'");
  CHECK(err("%0 = input \"x\" : float32(2)\n%1 = relu(%0) : float32(2) junk\nreturn %1") ==
        "line 2, column 28: expected end of line, found 'junk'");
  CHECK(err("%0 = input \"x\" : float32(2)\n%1 = relu(%9) : float32(2)\nreturn %1") ==
        "line 2, column 11: %9 is not defined; a value must be defined before its use");
  CHECK(err("%0 = input \"x\" : float32(2)\n%0 = relu(%0) : float32(2)\nreturn %0") ==
        "line 2, column 1: %0 is already defined on line 1");
  CHECK(err("%0 = input \"x\" : float32(2)\n%1 = input \"x\" : float32(2)\nreturn %0") ==
        "line 2, column 12: input name \"x\" is already used on line 1");
  CHECK(err("%0 = input \"\" : float32(2)\nreturn %0") ==
        "line 1, column 12: expected a non-empty input name, found \"\"");
  CHECK(err("%0 = input \"x\" : float32(2)\n%1 = relu(%0) : float32(2)\nreturn %1,") ==
        "line 3, column 11: expected a value ('%name'), found end of input");
}

TEST_CASE("ir text: op, attribute and type errors name the op and the node") {
  auto err = [](const std::string& text) { return ParseError(text); };
  const std::string x = "%0 = input \"x\" : float32(2, 3)\n";
  CHECK(err(x + "%1 = ad(%0, %0) : float32(2, 3)\nreturn %1") ==
        "line 2, column 6: unknown op 'ad'; did you mean 'add'?");
  CHECK(err(x + "%1 = transpsoe(%0) : float32(3, 2)\nreturn %1") ==
        "line 2, column 6: unknown op 'transpsoe'; did you mean 'transpose'?");
  CHECK(err(x + "%1 = sum(%0) {axis=[1]} : float32(2,)\nreturn %1") ==
        "line 2, column 15: sum has no attribute 'axis'; expected one of: axes, keepdims");
  CHECK(err(x + "%1 = relu(%0) {alpha=0.1} : float32(2, 3)\nreturn %1") ==
        "line 2, column 16: relu has no attribute 'alpha'; expected one of: (none)");
  CHECK(err(x + "%1 = sum(%0) {keepdims=[1]} : float32(2,)\nreturn %1") ==
        "line 2, column 24: sum: attribute 'keepdims' expects a bool, found an int list ([1])");
  CHECK(err(x + "%1 = cast(%0) {dtype=1.5} : float32(2, 3)\nreturn %1") ==
        "line 2, column 22: cast: attribute 'dtype' expects a dtype, found a float (1.5)");
  CHECK(err(x + "%1 = sum(%0) {axes=[1], axes=[0]} : float32(2,)\nreturn %1") ==
        "line 2, column 25: attribute 'axes' is given twice");
  CHECK(err(x + "%1 = sum(%0) {axes=@} : float32(2,)\nreturn %1") ==
        "line 2, column 20: expected an attribute value (integer, float, true, false, dtype or [integers]), "
        "found character '@'");
  // Errors of the op table's resolution and inference keep their text and gain a position.
  CHECK(err(x + "%1 = cast(%0) : float32(2, 3)\nreturn %1") ==
        "line 2, column 6: cast: attribute 'dtype' (dtype) is required");
  CHECK(err(x + "%1 = add(%0) : float32(2, 3)\nreturn %1") ==
        "line 2, column 6: add: expected 2 input(s), found 1");
  // The annotation must be what the op infers, and there is one per result.
  CHECK(err(x + "%1 = sum(%0) {axes=[1]} : float32(3,)\nreturn %1") ==
        "line 2, column 27: node %1 (sum): %1 is annotated float32(3,), but sum infers float32(2,)");
  CHECK(err(x + "%1 = cast(%0) {dtype=int32} : float32(2, 3)\nreturn %1") ==
        "line 2, column 31: node %1 (cast): %1 is annotated float32(2, 3), but cast infers int32(2, 3)");
  CHECK(err(x + "%1, %2 = split(%0) {sections=[2]} : float32(1, 3), float32(2, 3)\nreturn %1") ==
        "line 2, column 52: node %1, %2 (split): %2 is annotated float32(2, 3), but split infers float32(1, "
        "3)");
  CHECK(err(x + "%1 = split(%0) {sections=[2]} : float32(1, 3)\nreturn %1") ==
        "line 2, column 1: node %1 (split): expected 2 result value(s), one per output of split, found 1");
  CHECK(err(x + "%1, %2 = split(%0) {sections=[2]} : float32(1, 3)\nreturn %1") ==
        "line 2, column 50: expected ',' and a type for %2, found end of line");
  CHECK(err(x + "%1 = relu(%0) : float32(2, 3), float32(2, 3)\nreturn %1") ==
        "line 2, column 30: expected end of line after 1 type(s), one per result, found ','");
  CHECK(err(x + "%1, %1 = split(%0) {sections=[2]} : float32(1, 3), float32(1, 3)\nreturn %1") ==
        "line 2, column 5: %1 is named twice");
}
