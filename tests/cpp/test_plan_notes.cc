// Planning notes in the IR text (ir/graph.h NodeNote and ValueNote, ir/text.cc): `#group=`,
// `#stream=`, `#wait=` and `@arena+N` print after a node's types and parse back; and the memory
// planning pass over a graph (passes/memory_planning.h, RunMemoryPlanning) as golden
// before/after text, where a second run changes nothing; and a compiled plan's decisions as notes
// on its own copy of the graph (codegen/plan.h, AnnotatedGraph), which the memory planning pass
// over that copy leaves unchanged (the pass and the plan agree).
#include <doctest/doctest.h>

#include <string>

#include "kiln/codegen/plan.h"
#include "kiln/ir/text.h"
#include "kiln/passes/memory_planning.h"
#include "kiln/passes/stream_assignment.h"
#include "kiln/runtime/error.h"
#include "test_util.h"

using kiln::ir::ParseGraph;
using kiln::ir::PrintGraph;

namespace {
// Parses `text`, runs memory planning, returns the printed result; checks that a second run
// changes nothing and that the result parses back to the same text.
std::string Planned(const std::string& text, bool* changed = nullptr) {
  auto g = ParseGraph(text);
  const bool c = kiln::passes::RunMemoryPlanning(*g, {});
  if (changed) *changed = c;
  const std::string out = PrintGraph(*g);
  CHECK(!kiln::passes::RunMemoryPlanning(*g, {}));
  CHECK(PrintGraph(*g) == out);
  CHECK(PrintGraph(*ParseGraph(out)) == out);
  return out;
}
} // namespace

TEST_CASE("plan notes: groups, streams, waits and placements print and parse back") {
  const std::string text =
      "%0 = input \"x\" : float32(16,)\n"
      "%1 = exp(%0) : float32(16,) #group=0 #stream=1\n"
      "%2 = neg(%1) : float32(16,) #group=0 #stream=1 @arena+64\n"
      "%3 = relu(%0) : float32(16,) #stream=0 @arena+0\n"
      "%4 = add(%2, %3) : float32(16,) #stream=0 #wait=%2,%1\n"
      "%5, %6 = split(%4) {sections=[2], axis=0} : float32(8,), float32(8,) @- @arena+128\n"
      "return %5, %6\n";
  auto g = ParseGraph(text);
  CHECK(PrintGraph(*g) == text);
  const auto& n = g->nodes();
  CHECK(n[0]->note().group == 0);
  CHECK(n[0]->note().stream == 1);
  CHECK(n[0]->output()->note().offset == -1);
  CHECK(n[1]->output()->note().offset == 64);
  CHECK(n[2]->note().group == -1);
  CHECK(n[3]->note().waits == std::vector<const kiln::ir::Node*>{n[1].get(), n[0].get()});
  CHECK(n[4]->output(1)->note().offset == 128);
  // A plain comment is still a comment; a note written with a space is one too.
  CHECK(PrintGraph(*ParseGraph("%0 = input \"x\" : float32(4,)\n"
                               "%1 = exp(%0) : float32(4,)  # group=3, in a comment\n"
                               "return %1\n")) ==
        "%0 = input \"x\" : float32(4,)\n%1 = exp(%0) : float32(4,)\nreturn %1\n");
}

TEST_CASE("plan notes: malformed notes are format errors that say what was expected") {
  auto fails_with = [](const std::string& text, const std::string& what) {
    try {
      ParseGraph(text);
      FAIL("parsed: " << text);
    } catch (const kiln::FormatError& e) {
      CHECK_MESSAGE(std::string(e.what()).find(what) != std::string::npos, std::string(e.what()));
    }
  };
  fails_with("%0 = input \"x\" : float32(16,)\n"
             "%1, %2 = split(%0) {sections=[2], axis=0} : float32(8,), float32(8,) @arena+0\n"
             "return %1, %2\n",
             "one placement ('@arena+N' or '@-') per result, 2, found 1");
  fails_with("%0 = input \"x\" : float32(4,)\n%1 = exp(%0) : float32(4,) #stream=x\nreturn %1\n",
             "a number after '#stream='");
  fails_with("%0 = input \"x\" : float32(4,)\n%1 = exp(%0) : float32(4,) #wait=%0\nreturn %1\n",
             "#wait= names a graph input");
  fails_with("%0 = input \"x\" : float32(4,)\n%1 = exp(%0) : float32(4,) @arena+\nreturn %1\n",
             "a byte offset after '@arena+'");
}

TEST_CASE("memory planning pass: golden text, in place where an elementwise input dies") {
  bool changed = false;
  // %1 is read again by %3: %2 takes a new block; %3 takes %1's block (both operands die there,
  // elementwise: in place); %4 (a transpose) is not elementwise and takes a free block; the
  // graph's input and output are not planned.
  CHECK(Planned("%0 = input \"x\" : float32(4, 4)\n"
                "%1 = exp(%0) : float32(4, 4)\n"
                "%2 = neg(%1) : float32(4, 4)\n"
                "%3 = add(%1, %2) : float32(4, 4)\n"
                "%4 = transpose(%3) {axes=[1, 0]} : float32(4, 4)\n"
                "%5 = tanh(%4) : float32(4, 4)\n"
                "return %5\n",
                &changed) == "%0 = input \"x\" : float32(4, 4)\n"
                             "%1 = exp(%0) : float32(4, 4) @arena+0\n"
                             "%2 = neg(%1) : float32(4, 4) @arena+64\n"
                             "%3 = add(%1, %2) : float32(4, 4) @arena+0\n"
                             "%4 = transpose(%3) {axes=[1, 0]} : float32(4, 4) @arena+64\n"
                             "%5 = tanh(%4) : float32(4, 4)\n"
                             "return %5\n");
  CHECK(changed);
  // Planned text in, the same text out: nothing changes.
  Planned("%0 = input \"x\" : float32(4, 4)\n"
          "%1 = exp(%0) : float32(4, 4) @arena+0\n"
          "%2 = tanh(%1) : float32(4, 4)\n"
          "return %2\n",
          &changed);
  CHECK(!changed);
}

TEST_CASE("memory planning pass: a group's inner values take no memory") {
  CHECK(Planned("%0 = input \"x\" : float32(16,)\n"
                "%1 = exp(%0) : float32(16,) #group=0\n"
                "%2 = neg(%1) : float32(16,) #group=0\n"
                "%3 = sum(%2) {axes=[0], keepdims=true} : float32(1,)\n"
                "%4 = mul(%2, %3) : float32(16,)\n"
                "return %4\n") == "%0 = input \"x\" : float32(16,)\n"
                                  "%1 = exp(%0) : float32(16,) #group=0\n"
                                  "%2 = neg(%1) : float32(16,) #group=0 @arena+0\n"
                                  "%3 = sum(%2) {axes=[0], keepdims=true} : float32(1,) @arena+64\n"
                                  "%4 = mul(%2, %3) : float32(16,)\n"
                                  "return %4\n");
}

namespace {
// The annotated copy of the plan of `text`, as text; the plan's own graph stays plain, the text
// parses back, and memory planning over the copy changes nothing.
std::string PlanNotes(const std::string& text) {
  auto plan = kiln::MakePlan(ParseGraph(text), kiln::cpu(), "test");
  auto annotated = kiln::AnnotatedGraph(*plan);
  const std::string out = PrintGraph(*annotated);
  CHECK(PrintGraph(*plan->graph).find_first_of("#@") == std::string::npos);
  CHECK(PrintGraph(*ParseGraph(out)) == out);
  CHECK(!kiln::passes::RunMemoryPlanning(*annotated, {}));
  if (plan->schedule.num_streams > 1)
    CHECK(!kiln::passes::RunStreamAssignment(*annotated, plan->schedule.num_streams));
  return out;
}
} // namespace

TEST_CASE("plan notes: a plan's placements and streams as notes on its own copy of the graph") {
  kiln::testing::ScopedEnv env("KILN_DISABLE_PASS", "fusion, epilogue");
  CHECK(PlanNotes("%x = input \"x\" : float32(16, 16)\n"
                  "%a = exp(%x) : float32(16, 16)\n"
                  "%b = neg(%a) : float32(16, 16)\n"
                  "%c = sum(%b) {axes=[0], keepdims=false} : float32(16,)\n"
                  "return %c\n") == "%0 = input \"x\" : float32(16, 16)\n"
                                    "%1 = exp(%0) : float32(16, 16) @arena+0\n"
                                    "%2 = neg(%1) : float32(16, 16) @arena+0\n"
                                    "%3 = sum(%2) {axes=[0], keepdims=false} : float32(16,)\n"
                                    "return %3\n");
  CHECK(PlanNotes("%x = input \"x\" : float32(8, 8)\n"
                  "%y = input \"y\" : float32(8, 8)\n"
                  "%a = matmul(%x, %x) : float32(8, 8)\n"
                  "%b = matmul(%y, %y) : float32(8, 8)\n"
                  "%c = add(%a, %b) : float32(8, 8)\n"
                  "return %c\n") ==
        "%0 = input \"x\" : float32(8, 8)\n"
        "%1 = input \"y\" : float32(8, 8)\n"
        "%2 = matmul(%0, %0) {transpose_a=false, transpose_b=false} : float32(8, 8) #stream=0 @arena+0\n"
        "%3 = matmul(%1, %1) {transpose_a=false, transpose_b=false} : float32(8, 8) #stream=1 @arena+256\n"
        "%4 = add(%2, %3) : float32(8, 8) #stream=0 #wait=%3\n"
        "return %4\n");
}

#if KILN_WITH_CODEGEN
TEST_CASE("plan notes: a plan's fused groups as notes, and their inner values take no memory") {
  CHECK(PlanNotes("%x = input \"x\" : float32(16, 16)\n"
                  "%a = exp(%x) : float32(16, 16)\n"
                  "%b = neg(%a) : float32(16, 16)\n"
                  "%c = tanh(%b) : float32(16, 16)\n"
                  "%d = transpose(%c) {axes=[1, 0]} : float32(16, 16)\n"
                  "%e = relu(%d) : float32(16, 16)\n"
                  "return %e\n") == "%0 = input \"x\" : float32(16, 16)\n"
                                    "%1 = exp(%0) : float32(16, 16) #group=0\n"
                                    "%2 = neg(%1) : float32(16, 16) #group=0\n"
                                    "%3 = tanh(%2) : float32(16, 16) #group=0 @arena+0\n"
                                    "%4 = transpose(%3) {axes=[1, 0]} : float32(16, 16) @arena+1024\n"
                                    "%5 = relu(%4) : float32(16, 16)\n"
                                    "return %5\n");
}
#endif

TEST_CASE("stream assignment pass: golden text, independent matmuls on two streams, the join waits") {
  auto g = ParseGraph("%x = input \"x\" : float32(8, 8)\n"
                      "%y = input \"y\" : float32(8, 8)\n"
                      "%a = matmul(%x, %x) : float32(8, 8)\n"
                      "%b = matmul(%y, %y) : float32(8, 8)\n"
                      "%c = add(%a, %b) : float32(8, 8)\n"
                      "%d = exp(%c) : float32(8, 8)\n"
                      "return %d\n");
  CHECK(kiln::passes::RunStreamAssignment(*g, 2));
  const std::string out = PrintGraph(*g);
  CHECK(out == "%0 = input \"x\" : float32(8, 8)\n"
               "%1 = input \"y\" : float32(8, 8)\n"
               "%2 = matmul(%0, %0) {transpose_a=false, transpose_b=false} : float32(8, 8) #stream=0\n"
               "%3 = matmul(%1, %1) {transpose_a=false, transpose_b=false} : float32(8, 8) #stream=1\n"
               "%4 = add(%2, %3) : float32(8, 8) #stream=0 #wait=%3\n"
               "%5 = exp(%4) : float32(8, 8) #stream=0\n"
               "return %5\n");
  CHECK(!kiln::passes::RunStreamAssignment(*g, 2));
  auto back = ParseGraph(out);
  CHECK(!kiln::passes::RunStreamAssignment(*back, 2));
  CHECK(PrintGraph(*back) == out);
  // One stream: nothing to record, and the notes are cleared.
  CHECK(kiln::passes::RunStreamAssignment(*back, 1));
  CHECK(PrintGraph(*back).find('#') == std::string::npos);
}
