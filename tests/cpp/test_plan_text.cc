// Golden text of compiled plans (codegen/plan.h, PlanText): graphs written as IR text are planned
// and printed with each node's decisions: memory planning (arena offsets, in place), fusion
// (elementwise and row groups) and stream assignment (streams, waits, the per-stream layout).
// Planning the printed text again gives the same text (the decisions are a function of the graph);
// KILN_DUMP_IR=<plan step> prints it.
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "kiln/codegen/plan.h"
#include "kiln/ir/text.h"
#include "test_util.h"

using kiln::testing::ScopedEnv;

namespace {
std::string Planned(const std::string& text) {
  std::string out = kiln::PlanText(*kiln::MakePlan(kiln::ir::ParseGraph(text), kiln::cpu(), "test"));
  // The text parses back as the graph, and planning it again decides the same.
  CHECK(kiln::PlanText(*kiln::MakePlan(kiln::ir::ParseGraph(out), kiln::cpu(), "test")) == out);
  return out;
}

const char* kChain = "%x = input \"x\" : float32(16, 16)\n"
                     "%a = exp(%x) : float32(16, 16)\n"
                     "%b = neg(%a) : float32(16, 16)\n"
                     "%c = tanh(%b) : float32(16, 16)\n"
                     "%d = sum(%c) {axes=[0], keepdims=false} : float32(16,)\n"
                     "return %d\n";
}  // namespace

TEST_CASE("plan text: without fusion, elementwise outputs take the blocks of inputs that die there") {
  ScopedEnv env("KILN_DISABLE_PASS", "fusion");
  CHECK(Planned(kChain) ==
          "%0 = input \"x\" : float32(16, 16)\n"
          "%1 = exp(%0) : float32(16, 16)  # step 0; writes %1@0\n"
          "%2 = neg(%1) : float32(16, 16)  # step 1; writes %2@0\n"
          "%3 = tanh(%2) : float32(16, 16)  # step 2; writes %3@0\n"
          "%4 = sum(%3) {axes=[0], keepdims=false} : float32(16,)  # step 3; writes %4@out0\n"
          "return %4\n"
          "# arena 1024 bytes, 1 stream\n");
}

TEST_CASE("plan text: with in place disabled, each intermediate takes a freed block or a new one") {
  ScopedEnv env("KILN_DISABLE_PASS", "fusion, inplace");
  CHECK(Planned(kChain) ==
          "%0 = input \"x\" : float32(16, 16)\n"
          "%1 = exp(%0) : float32(16, 16)  # step 0; writes %1@0\n"
          "%2 = neg(%1) : float32(16, 16)  # step 1; writes %2@1024\n"
          "%3 = tanh(%2) : float32(16, 16)  # step 2; writes %3@0\n"
          "%4 = sum(%3) {axes=[0], keepdims=false} : float32(16,)  # step 3; writes %4@out0\n"
          "return %4\n"
          "# arena 2048 bytes, 1 stream\n");
}

#if KILN_WITH_CODEGEN
TEST_CASE("plan text: an elementwise chain is one group, a reduction with its producers a row group") {
  CHECK(Planned("%x = input \"x\" : float32(16, 16)\n"
                "%a = exp(%x) : float32(16, 16)\n"
                "%b = neg(%a) : float32(16, 16)\n"
                "%c = tanh(%b) : float32(16, 16)\n"
                "return %c\n") ==
                        "%0 = input \"x\" : float32(16, 16)\n"
                        "%1 = exp(%0) : float32(16, 16)  # in group 0\n"
                        "%2 = neg(%1) : float32(16, 16)  # in group 0\n"
                        "%3 = tanh(%2) : float32(16, 16)  # step 0, group 0 elementwise; writes %3@out0\n"
                        "return %3\n"
                        "# arena 0 bytes, 1 stream\n");
  CHECK(Planned("%x = input \"x\" : float32(16, 16)\n"
                "%a = exp(%x) : float32(16, 16)\n"
                "%s = sum(%a) {axes=[1], keepdims=true} : float32(16, 1)\n"
                "%d = div(%a, %s) : float32(16, 16)\n"
                "return %d\n") ==
                        "%0 = input \"x\" : float32(16, 16)\n"
                        "%1 = exp(%0) : float32(16, 16)  # in group 0\n"
                        "%2 = sum(%1) {axes=[1], keepdims=true} : float32(16, 1)  # in group 0\n"
                        "%3 = div(%1, %2) : float32(16, 16)  # step 0, group 0 row; writes %3@out0\n"
                        "return %3\n"
                        "# arena 0 bytes, 1 stream\n");
}
#endif

TEST_CASE("plan text: independent matmuls go to two streams, the join waits, each stream keeps its blocks") {
  ScopedEnv env("KILN_DISABLE_PASS", "epilogue");
  CHECK(Planned("%x = input \"x\" : float32(512, 512)\n"
                "%y = input \"y\" : float32(512, 512)\n"
                "%a = matmul(%x, %x) : float32(512, 512)\n"
                "%b = matmul(%y, %y) : float32(512, 512)\n"
                "%c = add(%a, %b) : float32(512, 512)\n"
                "%e = exp(%c) : float32(512, 512)\n"
                "return %e\n") ==
                        "%0 = input \"x\" : float32(512, 512)\n"
                        "%1 = input \"y\" : float32(512, 512)\n"
                        "%2 = matmul(%0, %0) {transpose_a=false, transpose_b=false} : float32(512, 512)  # step 0, stream 0; writes %2@0/0\n"
                        "%3 = matmul(%1, %1) {transpose_a=false, transpose_b=false} : float32(512, 512)  # step 1, stream 1; writes %3@1048576/1048576\n"
                        "%4 = add(%2, %3) : float32(512, 512)  # in group 0\n"
                        "%5 = exp(%4) : float32(512, 512)  # step 2, group 0 elementwise, stream 0, waits for step 1; writes %5@out0/out0\n"
                        "return %5\n"
                        "# arena 2097152 bytes, 2 streams run concurrently (arena 2097152 bytes)\n");
  CHECK(Planned("%x = input \"x\" : float32(8, 8)\n"
                "%y = input \"y\" : float32(8, 8)\n"
                "%a = matmul(%x, %x) : float32(8, 8)\n"
                "%b = matmul(%y, %y) : float32(8, 8)\n"
                "%c = add(%a, %b) : float32(8, 8)\n"
                "return %c\n") ==
                        "%0 = input \"x\" : float32(8, 8)\n"
                        "%1 = input \"y\" : float32(8, 8)\n"
                        "%2 = matmul(%0, %0) {transpose_a=false, transpose_b=false} : float32(8, 8)  # step 0, stream 0; writes %2@0\n"
                        "%3 = matmul(%1, %1) {transpose_a=false, transpose_b=false} : float32(8, 8)  # step 1, stream 1; writes %3@256\n"
                        "%4 = add(%2, %3) : float32(8, 8)  # step 2, stream 0, waits for step 1; writes %4@out0\n"
                        "return %4\n"
                        "# arena 512 bytes, 2 streams\n");
}

TEST_CASE("plan text: KILN_DUMP_IR names a plan step and prints the planned graph") {
  ScopedEnv disable("KILN_DISABLE_PASS", "fusion");
  ScopedEnv dump("KILN_DUMP_IR", "streams");
  std::unique_ptr<kiln::Plan> plan;
  std::string dumped = kiln::testing::CapturedStderr(
      [&] { plan = kiln::MakePlan(kiln::ir::ParseGraph(kChain), kiln::cpu(), "dumped"); });
  CHECK(dumped == "# after the plan steps (dumped)\n" + kiln::PlanText(*plan));
}

namespace {
kiln::TensorView View(std::vector<float>& v) {
  kiln::Shape s{static_cast<int64_t>(v.size())};
  return {v.data(), kiln::DType::kFloat32, s, s.ContiguousStrides()};
}
}  // namespace

TEST_CASE("plan: a late output is written after every step, so its buffer may be an input the steps read") {
  // %s (out 0) reads %m after %n (out 1, late) replaces it: batch norm's statistics written in place.
  const char* text = "%m = input \"m\" : float32(4,)\n"
                     "%b = input \"b\" : float32(4,)\n"
                     "%n = add(%m, %b) : float32(4,)\n"
                     "%t = sum(%n) {axes=[0], keepdims=false} : float32()\n"
                     "%u = sum(%m) {axes=[0], keepdims=false} : float32()\n"
                     "%s = add(%t, %u) : float32()\n"
                     "return %s, %n\n";
  const int late[] = {1};
  auto plan = kiln::MakePlan(kiln::ir::ParseGraph(text), kiln::cpu(), "test", late);
  CHECK(plan->out_of_place == std::vector<int>{1});
  std::vector<float> m = {1, 2, 3, 4}, b = {10, 10, 10, 10}, s = {0};
  kiln::TensorView s_view{s.data(), kiln::DType::kFloat32, kiln::Shape{}, kiln::Strides{}};
  const kiln::TensorView in[] = {View(m), View(b)}, out[] = {s_view, View(m)};  // out 1 is input 0
  kiln::exec::Run(plan->exec, in, out, kiln::exec::CallInfo{kiln::cpu()});
  CHECK(s[0] == doctest::Approx(50 + 10));  // sum(m + b) + sum(m), with m as it was
  CHECK(m == std::vector<float>{11, 12, 13, 14});
  // Without it the output is written where its step runs, before %u reads %m.
  auto plain = kiln::MakePlan(kiln::ir::ParseGraph(text), kiln::cpu(), "test");
  CHECK(plain->out_of_place.empty());
  m = {1, 2, 3, 4};
  kiln::exec::Run(plain->exec, in, out, kiln::exec::CallInfo{kiln::cpu()});
  CHECK(s[0] != doctest::Approx(60));  // %u read the new values
}

TEST_CASE("plan: an output that is an input's value is copied before a late output replaces that input") {
  const char* text = "%m = input \"m\" : float32(4,)\n"
                     "%b = input \"b\" : float32(4,)\n"
                     "%n = add(%m, %b) : float32(4,)\n"
                     "return %n, %m\n";
  // Out 0 (late) is written into m's buffer; out 1 is m as it was, copied first. Listed in the
  // other order too: the copies do not follow the outputs' order.
  for (bool late_first : {true, false}) {
    CAPTURE(late_first);
    const std::string t = late_first ? text : std::string(text).replace(std::string(text).find("return %n, %m"), 13, "return %m, %n");
    const int late[] = {late_first ? 0 : 1};
    auto plan = kiln::MakePlan(kiln::ir::ParseGraph(t), kiln::cpu(), "test", late);
    std::vector<float> m = {1, 2, 3, 4}, b = {10, 10, 10, 10}, old(4, 0.f);
    const kiln::TensorView in[] = {View(m), View(b)};
    const kiln::TensorView out0[] = {View(m), View(old)}, out1[] = {View(old), View(m)};
    kiln::exec::Run(plan->exec, in, late_first ? out0 : out1, kiln::exec::CallInfo{kiln::cpu()});
    CHECK(old == std::vector<float>{1, 2, 3, 4});
    CHECK(m == std::vector<float>{11, 12, 13, 14});
  }
}
