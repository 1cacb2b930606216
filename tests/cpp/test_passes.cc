// The graph passes and the pass manager (passes/pass.h): golden before/after text for each pass,
// each followed by a second run that must report no change and print the same text; the pipeline's
// environment switches (KILN_DISABLE_PASS, KILN_DUMP_IR) and its verifier naming a broken pass.
// freeze_fold runs with an evaluator that logs what it was asked to compute.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "test_util.h"
#include "kiln/ir/text.h"
#include "kiln/ir/verify.h"
#include "kiln/passes/freeze_fold.h"
#include "kiln/passes/pass.h"
#include "kiln/runtime/error.h"

using namespace kiln;

namespace {
using kiln::testing::ErrorOf;
using kiln::testing::Has;
using kiln::testing::Contains;
using kiln::testing::ScopedEnv;

/// Parses `input`, runs `pass`, checks it reports a change and prints `expected`; then runs it
/// again on the result, which must report no change and leave the text identical.
void CheckGolden(passes::PassFn pass, const std::string& input, const std::string& expected) {
  std::unique_ptr<ir::Graph> g = ir::ParseGraph(input);
  CHECK(pass(g) == (ir::PrintGraph(*ir::ParseGraph(input)) != expected));
  ir::Verify(*g);
  std::string text = ir::PrintGraph(*g);
  CHECK(text == expected);
  CHECK_FALSE(pass(g));
  ir::Verify(*g);
  CHECK(ir::PrintGraph(*g) == text);
}

/// The message of the exception of type E that `f` throws ("" when none).

} // namespace

TEST_CASE("pass dce: drops dead nodes and a dead random op, keeps unused graph inputs") {
  CheckGolden(passes::RunDCE,
              "%x = input \"x\" : float32(2, 3)\n"
              "%unused = input \"unused\" : float32(4,)\n"
              "%a = neg(%x) : float32(2, 3)\n"
              "%dead = exp(%x) : float32(2, 3)\n"
              "%r = random_uniform() {shape=[2, 3]} : float32(2, 3)\n"
              "%b = add(%a, %dead) : float32(2, 3)\n"
              "%c = relu(%a) : float32(2, 3)\n"
              "return %c, %x\n",
              "%0 = input \"x\" : float32(2, 3)\n"
              "%1 = input \"unused\" : float32(4,)\n"
              "%2 = neg(%0) : float32(2, 3)\n"
              "%3 = relu(%2) : float32(2, 3)\n"
              "return %3, %0\n");
}

TEST_CASE("pass dce: a graph with nothing dead is unchanged") {
  const std::string text = "%0 = input \"x\" : float32(2,)\n"
                           "%1 = neg(%0) : float32(2,)\n"
                           "return %1\n";
  CheckGolden(passes::RunDCE, text, text);
}

TEST_CASE("pass cse: merges equal nodes and constants, transitively, not random ops") {
  CheckGolden(passes::RunCSE,
              "%x = input \"x\" : float32(2, 3)\n"
              "%a1 = exp(%x) : float32(2, 3)\n"
              "%a2 = exp(%x) : float32(2, 3)\n"
              "%b1 = add(%a1, %x) : float32(2, 3)\n"
              "%b2 = add(%a2, %x) : float32(2, 3)\n"
              "%s1 = sum(%b1) {axes=[1]} : float32(2,)\n"
              "%s2 = sum(%b2) {axes=[0]} : float32(3,)\n"
              "%c1 = full() {shape=[], value=2.0} : float32()\n"
              "%c2 = full() {shape=[], value=2.0} : float32()\n"
              "%c3 = full() {shape=[], value=3.0} : float32()\n"
              "%r1 = random_uniform() {shape=[2, 3]} : float32(2, 3)\n"
              "%r2 = random_uniform() {shape=[2, 3]} : float32(2, 3)\n"
              "%m1 = mul(%b1, %c1) : float32(2, 3)\n"
              "%m2 = mul(%b2, %c2) : float32(2, 3)\n"
              "%m3 = mul(%b2, %c3) : float32(2, 3)\n"
              "return %m1, %m2, %m3, %s1, %s2, %r1, %r2\n",
              "%0 = input \"x\" : float32(2, 3)\n"
              "%1 = exp(%0) : float32(2, 3)\n"
              "%2 = add(%1, %0) : float32(2, 3)\n"
              "%3 = sum(%2) {axes=[1], keepdims=false} : float32(2,)\n"
              "%4 = sum(%2) {axes=[0], keepdims=false} : float32(3,)\n"
              "%5 = full() {shape=[], value=2.0, dtype=float32} : float32()\n"
              "%6 = full() {shape=[], value=3.0, dtype=float32} : float32()\n"
              "%7 = random_uniform() {shape=[2, 3], low=0.0, high=1.0, dtype=float32} : float32(2, 3)\n"
              "%8 = random_uniform() {shape=[2, 3], low=0.0, high=1.0, dtype=float32} : float32(2, 3)\n"
              "%9 = mul(%2, %5) : float32(2, 3)\n"
              "%10 = mul(%2, %6) : float32(2, 3)\n"
              "return %9, %9, %10, %3, %4, %7, %8\n");
}

TEST_CASE("pass simplify: identities with unit constants, only where the type is unchanged") {
  CheckGolden(passes::RunSimplify,
              "%x = input \"x\" : float32(2, 3)\n"
              "%i = input \"i\" : int32(2, 3)\n"
              "%one = full() {shape=[], value=1.0} : float32()\n"
              "%zero = full() {shape=[], value=0.0} : float32()\n"
              "%big1 = full() {shape=[4, 2, 3], value=1.0} : float32(4, 2, 3)\n"
              "%a = mul(%x, %one) : float32(2, 3)\n"
              "%b = mul(%one, %a) : float32(2, 3)\n"
              "%c = add(%b, %zero) : float32(2, 3)\n"
              "%d = add(%zero, %c) : float32(2, 3)\n"
              "%e = sub(%d, %zero) : float32(2, 3)\n"
              "%f = div(%e, %one) : float32(2, 3)\n"
              "%keep_sub = sub(%zero, %f) : float32(2, 3)\n"
              "%keep_bcast = mul(%f, %big1) : float32(4, 2, 3)\n"
              "%ione = full() {shape=[1, 3], value=1.0, dtype=int32} : int32(1, 3)\n"
              "%j = mul(%i, %ione) : int32(2, 3)\n"
              "return %f, %keep_sub, %keep_bcast, %j\n",
              "%0 = input \"x\" : float32(2, 3)\n"
              "%1 = input \"i\" : int32(2, 3)\n"
              "%2 = full() {shape=[], value=1.0, dtype=float32} : float32()\n"
              "%3 = full() {shape=[], value=0.0, dtype=float32} : float32()\n"
              "%4 = full() {shape=[4, 2, 3], value=1.0, dtype=float32} : float32(4, 2, 3)\n"
              "%5 = sub(%3, %0) : float32(2, 3)\n"
              "%6 = mul(%0, %4) : float32(4, 2, 3)\n"
              "%7 = full() {shape=[1, 3], value=1.0, dtype=int32} : int32(1, 3)\n"
              "return %0, %5, %6, %1\n");
}

TEST_CASE("pass simplify: neg pairs, transposes, reshapes and casts") {
  CheckGolden(passes::RunSimplify,
              "%x = input \"x\" : float32(2, 3, 4)\n"
              "%n1 = neg(%x) : float32(2, 3, 4)\n"
              "%n2 = neg(%n1) : float32(2, 3, 4)\n"
              "%n3 = neg(%n2) : float32(2, 3, 4)\n"
              "%t1 = transpose(%x) {axes=[1, 2, 0]} : float32(3, 4, 2)\n"
              "%t2 = transpose(%t1) {axes=[-1, 0, 1]} : float32(2, 3, 4)\n"
              "%t3 = transpose(%t1) : float32(2, 4, 3)\n"
              "%r1 = reshape(%x) {shape=[6, 4]} : float32(6, 4)\n"
              "%r2 = reshape(%r1) {shape=[-1]} : float32(24,)\n"
              "%r3 = reshape(%r1) {shape=[2, 3, 4]} : float32(2, 3, 4)\n"
              "%r4 = reshape(%x) {shape=[2, -1, 4]} : float32(2, 3, 4)\n"
              "%c1 = cast(%x) {dtype=float32} : float32(2, 3, 4)\n"
              "%c2 = cast(%x) {dtype=float16} : float16(2, 3, 4)\n"
              "return %n2, %n3, %t2, %t3, %r2, %r3, %r4, %c1, %c2\n",
              "%0 = input \"x\" : float32(2, 3, 4)\n"
              "%1 = neg(%0) : float32(2, 3, 4)\n"
              "%2 = neg(%0) : float32(2, 3, 4)\n"
              "%3 = transpose(%0) {axes=[1, 2, 0]} : float32(3, 4, 2)\n"
              "%4 = transpose(%3) {axes=[]} : float32(2, 4, 3)\n"
              "%5 = reshape(%0) {shape=[6, 4]} : float32(6, 4)\n"
              "%6 = reshape(%0) {shape=[-1]} : float32(24,)\n"
              "%7 = cast(%0) {dtype=float16} : float16(2, 3, 4)\n"
              "return %0, %2, %0, %4, %6, %0, %0, %0, %7\n");
}

TEST_CASE("pass constant_fold: arithmetic on fills through the kernels, data movement of fills") {
  CheckGolden(passes::RunConstantFold,
              "%x = input \"x\" : float32(2, 3)\n"
              "%a = full() {shape=[], value=0.5} : float32()\n"
              "%b = full() {shape=[2, 3], value=3.0} : float32(2, 3)\n"
              "%c = mul(%a, %b) : float32(2, 3)\n"           // 1.5, broadcast to (2, 3)
              "%d = exp(%c) : float32(2, 3)\n"               // expf(1.5f), rounded to float32
              "%e = transpose(%c) : float32(3, 2)\n"
              "%f = reshape(%e) {shape=[6]} : float32(6,)\n"
              "%g = less(%a, %b) : bool(2, 3)\n"
              "%h = cast(%c) {dtype=int32} : int32(2, 3)\n"  // truncation: 1
              "%w = where(%g, %d, %x) : float32(2, 3)\n"    // x is not a constant: stays
              "%y = add(%x, %d) : float32(2, 3)\n"
              "return %w, %y, %f, %h\n",
              "%0 = input \"x\" : float32(2, 3)\n"
              "%1 = full() {shape=[], value=0.5, dtype=float32} : float32()\n"
              "%2 = full() {shape=[2, 3], value=3.0, dtype=float32} : float32(2, 3)\n"
              "%3 = full() {shape=[2, 3], value=1.5, dtype=float32} : float32(2, 3)\n"
              "%4 = full() {shape=[2, 3], value=4.481688976287842, dtype=float32} : float32(2, 3)\n"
              "%5 = full() {shape=[3, 2], value=1.5, dtype=float32} : float32(3, 2)\n"
              "%6 = full() {shape=[6], value=1.5, dtype=float32} : float32(6,)\n"
              "%7 = full() {shape=[2, 3], value=1.0, dtype=bool} : bool(2, 3)\n"
              "%8 = full() {shape=[2, 3], value=1.0, dtype=int32} : int32(2, 3)\n"
              "%9 = where(%7, %4, %0) : float32(2, 3)\n"
              "%10 = add(%0, %4) : float32(2, 3)\n"
              "return %9, %10, %6, %8\n");
}

TEST_CASE("pass constant_fold: leaves what would fail, lose precision or draw random numbers") {
  const std::string text = "%0 = full() {shape=[2], value=7.0, dtype=int32} : int32(2,)\n"
                           "%1 = full() {shape=[], value=0.0, dtype=int32} : int32()\n"
                           "%2 = div(%0, %1) : int32(2,)\n"  // fails when run: not folded
                           "%3 = full() {shape=[], value=9007199254740992.0, dtype=int64} : int64()\n"
                           "%4 = full() {shape=[], value=1.0, dtype=int64} : int64()\n"
                           "%5 = add(%3, %4) : int64()\n"     // 2^53 + 1: a double cannot hold it
                           "%6 = full() {shape=[2], value=1.0, dtype=float16} : float16(2,)\n"
                           "%7 = exp(%6) : float16(2,)\n"    // 16-bit floats are left to the kernels
                           "%8 = random_uniform() {shape=[2], low=0.0, high=1.0, dtype=float32} : float32(2,)\n"
                           "%9 = full() {shape=[2], value=2.0, dtype=float32} : float32(2,)\n"
                           "%10 = mul(%8, %9) : float32(2,)\n"
                           "return %2, %5, %7, %10\n";
  CheckGolden(passes::RunConstantFold, text, text);
}

TEST_CASE("pass pipeline: default pipeline cleans up what simplify leaves, with a report") {
  // 0.5 * 2 folds to 1, which simplify then removes.
  std::unique_ptr<ir::Graph> g = ir::ParseGraph("%x = input \"x\" : float32(2, 3)\n"
                                                "%half = full() {shape=[], value=0.5} : float32()\n"
                                                "%two = full() {shape=[], value=2.0} : float32()\n"
                                                "%one = mul(%half, %two) : float32()\n"
                                                "%a = mul(%x, %one) : float32(2, 3)\n"
                                                "%b = exp(%a) : float32(2, 3)\n"
                                                "%c = exp(%x) : float32(2, 3)\n"
                                                "%d = add(%b, %c) : float32(2, 3)\n"
                                                "return %d\n");
  passes::PipelineReport report;
  g = passes::RunPipeline(std::move(g), passes::DefaultPipeline(), {.verify = true}, &report);
  CHECK(ir::PrintGraph(*g) == "%0 = input \"x\" : float32(2, 3)\n"
                              "%1 = exp(%0) : float32(2, 3)\n"
                              "%2 = add(%1, %1) : float32(2, 3)\n"
                              "return %2\n");
  CHECK(report.str() == "constant_fold: changed, 7 -> 7 nodes\n"
                        "simplify: changed, 7 -> 6 nodes\n"
                        "cse: changed, 6 -> 5 nodes\n"
                        "dce: changed, 5 -> 2 nodes\n");
}

TEST_CASE("pass pipeline: KILN_DISABLE_PASS skips a pass, unknown names suggest the closest") {
  const std::string input = "%x = input \"x\" : float32(2,)\n"
                            "%a = exp(%x) : float32(2,)\n"
                            "%b = exp(%x) : float32(2,)\n"
                            "%c = add(%a, %b) : float32(2,)\n"
                            "return %c\n";
  {
    ScopedEnv env("KILN_DISABLE_PASS", " cse ,");
    passes::PipelineReport report;
    std::unique_ptr<ir::Graph> g =
        passes::RunPipeline(ir::ParseGraph(input), passes::DefaultPipeline(), {.verify = true}, &report);
    CHECK(ir::PrintGraph(*g) == ir::PrintGraph(*ir::ParseGraph(input)));
    CHECK(report.str() == "constant_fold: unchanged, 3 -> 3 nodes\n"
                          "simplify: unchanged, 3 -> 3 nodes\n"
                          "cse: disabled\n"
                          "dce: unchanged, 3 -> 3 nodes\n");
  }
  {
    ScopedEnv env("KILN_DISABLE_PASS", "dce,csee");
    CHECK(
        ErrorOf<ValueError>([&] { passes::RunPipeline(ir::ParseGraph(input), passes::DefaultPipeline()); }) ==
        "KILN_DISABLE_PASS: unknown pass 'csee'; did you mean 'cse'? The passes are: "
        "constant_fold, simplify, cse, dce, freeze_fold, fusion, epilogue, inplace, streams");
  }
  {
    ScopedEnv env("KILN_DUMP_IR", "simplfy");
    CHECK(
        ErrorOf<ValueError>([&] { passes::RunPipeline(ir::ParseGraph(input), passes::DefaultPipeline()); }) ==
        "KILN_DUMP_IR: unknown pass 'simplfy'; did you mean 'simplify'? The passes are: "
        "constant_fold, simplify, cse, dce, freeze_fold, fusion, epilogue, inplace, streams");
  }
  // Once restored, the full pipeline runs again.
  std::unique_ptr<ir::Graph> g = passes::RunPipeline(ir::ParseGraph(input), passes::DefaultPipeline());
  CHECK(g->nodes().size() == 2);
}

namespace {
/// A deliberately broken pass: makes the graph output a value of another graph.
bool BreakGraph(std::unique_ptr<ir::Graph>& g) {
  static ir::Graph other;
  static ir::Value* foreign = other.AddInput("foreign", {Shape{2}, DType::kFloat32});
  g->SetOutputs({foreign});
  return true;
}
/// Changes the graph but says it did not.
bool LyingPass(std::unique_ptr<ir::Graph>& g) {
  passes::RunDCE(g);
  return false;
}
} // namespace

TEST_CASE("pass pipeline: the verifier names the pass that broke the graph") {
  const std::string input = "%x = input \"x\" : float32(2,)\n"
                            "%a = exp(%x) : float32(2,)\n"
                            "%b = neg(%x) : float32(2,)\n"
                            "return %a\n";
  const passes::Pass broken[] = {{"dce", passes::RunDCE}, {"break_graph", BreakGraph}};
  std::string msg =
      ErrorOf<InternalError>([&] { passes::RunPipeline(ir::ParseGraph(input), broken, {.verify = true}); });
  CHECK(msg.find("after pass 'break_graph'") != std::string::npos);
  CHECK(msg.find("invariant 9") != std::string::npos);

  const passes::Pass lying[] = {{"lying", LyingPass}};
  msg = ErrorOf<InternalError>([&] { passes::RunPipeline(ir::ParseGraph(input), lying, {.verify = true}); });
  CHECK(msg.find("pass 'lying' reported no change but changed the graph") != std::string::npos);

  // A pipeline's own pass names are valid in the switches.
  ScopedEnv env("KILN_DISABLE_PASS", "break_graph");
  std::unique_ptr<ir::Graph> g = passes::RunPipeline(ir::ParseGraph(input), broken, {.verify = true});
  CHECK(g->nodes().size() == 1);
}

TEST_CASE("pass pipeline: KILN_DUMP_IR prints the graph after the named pass") {
  const std::string input = "%x = input \"x\" : float32(2,)\n"
                            "%a = exp(%x) : float32(2,)\n"
                            "%b = exp(%x) : float32(2,)\n"
                            "%c = add(%a, %b) : float32(2,)\n"
                            "return %c\n";
  ScopedEnv env("KILN_DUMP_IR", "cse");
  std::string dumped =
      kiln::testing::CapturedStderr([&] { passes::RunPipeline(ir::ParseGraph(input), passes::DefaultPipeline()); });
  CHECK(dumped == "# after pass cse (changed, 3 -> 2 nodes)\n"
                  "%0 = input \"x\" : float32(2,)\n"
                  "%1 = exp(%0) : float32(2,)\n"
                  "%2 = add(%1, %1) : float32(2,)\n"
                  "return %2\n");
}

namespace {

/// A freeze_fold evaluator that computes nothing: it names each new constant c<handle> and logs
/// "c4 = transpose(c1)"; it refuses the ops in `refuse`, as a kernel that fails would.
struct LogEvaluator final : passes::ConstantEvaluator {
  int next = 0;
  std::vector<std::string> refuse, log;
  std::optional<std::vector<int>> Evaluate(const ir::Node& n, std::span<const int> in) override {
    for (const std::string& op : refuse)
      if (n.def().name == op) return std::nullopt;
    std::string args;
    for (int h : in) args += (args.empty() ? "c" : ", c") + std::to_string(h);
    std::vector<int> out;
    for (size_t k = 0; k < n.outputs().size(); ++k) out.push_back(next++);
    log.push_back("c" + std::to_string(out[0]) + " = " + n.def().name + "(" + args + ")");
    return out;
  }
};

using Strings = std::vector<std::string>;

/// Parses `input`, declares the inputs named in `constants` constant (handles 0, 1... in input
/// order), runs freeze_fold and checks the text and the evaluator's log; then runs it again on
/// the result with its constants declared, which must change nothing.
passes::FreezeResult CheckFreezeGolden(const std::string& input, const Strings& constants,
                                       const std::string& expected, const Strings& expected_log,
                                       const Strings& refuse = {}) {
  std::unique_ptr<ir::Graph> g = ir::ParseGraph(input);
  LogEvaluator ev;
  ev.refuse = refuse;
  passes::FreezeOptions options{{}, &ev};
  for (const ir::Value* v : g->inputs()) {
    bool constant = std::find(constants.begin(), constants.end(), v->name()) != constants.end();
    options.constants.push_back(constant ? ev.next++ : -1);
  }
  passes::FreezeResult result;
  CHECK(passes::RunFreezeFold(g, options, &result) == (ir::PrintGraph(*ir::ParseGraph(input)) != expected));
  ir::Verify(*g);
  const std::string text = ir::PrintGraph(*g);
  CHECK(text == expected);
  CHECK(ev.log == expected_log);
  // Again: the constants are the trailing inputs now.
  passes::FreezeOptions again{std::vector<int>(g->inputs().size() - result.constants.size(), -1), &ev};
  again.constants.insert(again.constants.end(), result.constants.begin(), result.constants.end());
  passes::FreezeResult second;
  CHECK_FALSE(passes::RunFreezeFold(g, again, &second));
  CHECK(ir::PrintGraph(*g) == text);
  CHECK(second.nodes_folded == 0);  // a refused node is asked again (and refused again)
  CHECK(second.constants == result.constants);
  return result;
}

}  // namespace

TEST_CASE("pass freeze_fold: folds what depends on constants alone, keeps broadcasts, drops the unused") {
  passes::FreezeResult r = CheckFreezeGolden(
      "%x = input \"x\" : float32(2, 4)\n"
      "%w = input \"w\" : float32(3, 4)\n"
      "%stat = input \"stat\" : float32(3,)\n"           // not constant (a running statistic)
      "%b = input \"b\" : float32(3,)\n"
      "%two = full() {shape=[], value=2.0} : float32()\n"
      "%w2 = mul(%w, %two) : float32(3, 4)\n"            // folds, reading the fill
      "%wt = transpose(%w2) : float32(4, 3)\n"           // folds: only %wt is left to read
      "%y = matmul(%x, %wt) : float32(2, 3)\n"           // reads data: stays
      "%bb = broadcast_to(%b) {shape=[2, 3]} : float32(2, 3)\n"  // larger than %b: stays
      "%z = add(%y, %bb) : float32(2, 3)\n"
      "%nb = neg(%b) : float32(3,)\n"                    // folds; an output
      "%r = random_uniform() {shape=[3]} : float32(3,)\n"
      "%rb = add(%b, %r) : float32(3,)\n"               // random: stays
      "%dead = exp(%w) : float32(3, 4)\n"                // dead: neither folded nor kept
      "%s = add(%stat, %nb) : float32(3,)\n"
      "return %z, %nb, %rb, %s\n",
      {"w", "b"},
      "%0 = input \"x\" : float32(2, 4)\n"
      "%1 = input \"stat\" : float32(3,)\n"
      "%2 = input \"b\" : float32(3,)\n"
      "%3 = input \"folded0\" : float32(4, 3)\n"
      "%4 = input \"folded1\" : float32(3,)\n"
      "%5 = matmul(%0, %3) {transpose_a=false, transpose_b=false} : float32(2, 3)\n"
      "%6 = broadcast_to(%2) {shape=[2, 3]} : float32(2, 3)\n"
      "%7 = add(%5, %6) : float32(2, 3)\n"
      "%8 = random_uniform() {shape=[3], low=0.0, high=1.0, dtype=float32} : float32(3,)\n"
      "%9 = add(%2, %8) : float32(3,)\n"
      "%10 = add(%1, %4) : float32(3,)\n"
      "return %7, %4, %9, %10\n",
      {"c2 = full()", "c3 = mul(c0, c2)", "c4 = transpose(c3)", "c5 = neg(c1)"});
  CHECK(r.constants == std::vector<int>{1, 4, 5});  // b, then the folded values in node order
  CHECK(r.inputs_frozen == 2);
  CHECK(r.nodes_folded == 3);
  CHECK(r.constant_bytes == (3 + 12 + 3) * 4);
}

TEST_CASE("pass freeze_fold: a node the evaluator cannot run stays, fills alone are constant_fold's") {
  CheckFreezeGolden("%x = input \"x\" : int32(2,)\n"
                    "%k = input \"k\" : int32(2,)\n"
                    "%z = full() {shape=[2], value=0.0, dtype=int32} : int32(2,)\n"
                    "%a = abs(%k) : int32(2,)\n"          // folds
                    "%q = div(%a, %z) : int32(2,)\n"      // refused (would fail): stays, reads the folded %a
                    "%u = neg(%q) : int32(2,)\n"          // not constant any more: stays
                    "%f = full() {shape=[2], value=3.0, dtype=int32} : int32(2,)\n"
                    "%g = neg(%f) : int32(2,)\n"          // fills only: left as it is
                    "%y = add(%x, %u) : int32(2,)\n"
                    "return %y, %g\n",
                    {"k"},
                    "%0 = input \"x\" : int32(2,)\n"
                    "%1 = input \"folded0\" : int32(2,)\n"
                    "%2 = full() {shape=[2], value=0.0, dtype=int32} : int32(2,)\n"
                    "%3 = div(%1, %2) : int32(2,)\n"
                    "%4 = neg(%3) : int32(2,)\n"
                    "%5 = full() {shape=[2], value=3.0, dtype=int32} : int32(2,)\n"
                    "%6 = neg(%5) : int32(2,)\n"
                    "%7 = add(%0, %4) : int32(2,)\n"
                    "return %7, %6\n",
                    {"c1 = abs(c0)", "c2 = full()"}, {"div"});
}

TEST_CASE("pass freeze_fold: with nothing to fold the graph is unchanged, unused constants go") {
  const std::string text = "%0 = input \"x\" : float32(2, 3)\n"
                           "%1 = input \"w\" : float32(3, 3)\n"
                           "%2 = matmul(%0, %1) {transpose_a=false, transpose_b=false} : float32(2, 3)\n"
                           "return %2\n";
  CheckFreezeGolden(text, {"w"}, text, {});
  // Without an evaluator, constants only move behind the other inputs; one nothing reads goes.
  std::unique_ptr<ir::Graph> g = ir::ParseGraph("%w = input \"w\" : float32(3, 3)\n"
                                                "%unused = input \"unused\" : float32(3,)\n"
                                                "%x = input \"x\" : float32(2, 3)\n"
                                                "%t = transpose(%w) : float32(3, 3)\n"
                                                "%y = matmul(%x, %t) : float32(2, 3)\n"
                                                "return %y\n");
  passes::FreezeResult r;
  CHECK(passes::RunFreezeFold(g, {{7, 8, -1}, nullptr}, &r));
  CHECK(ir::PrintGraph(*g) == "%0 = input \"x\" : float32(2, 3)\n"
                              "%1 = input \"w\" : float32(3, 3)\n"
                              "%2 = transpose(%1) {axes=[]} : float32(3, 3)\n"
                              "%3 = matmul(%0, %2) {transpose_a=false, transpose_b=false} : float32(2, 3)\n"
                              "return %3\n");
  CHECK(r.constants == std::vector<int>{7});
  CHECK(r.nodes_folded == 0);
}
