// Memory planning (passes/memory_planning.h): offsets of a chain, best-fit reuse of freed blocks,
// in-place outputs over dying inputs (and not when disabled or not elementwise), a value read
// twice freed once, readers that never run keeping their block, per-stream reuse, and freed
// neighbours merging.
#include <doctest/doctest.h>

#include <vector>

#include "kiln/passes/memory_planning.h"

using kiln::DType;
using kiln::passes::MemoryOptions;
using kiln::passes::MemoryPlan;
using kiln::passes::MemoryStep;
using kiln::passes::MemoryValue;
using kiln::passes::PlanMemory;

namespace {
// A float32 value of `numel` elements (blocks of 64 bytes per 16 elements) read last by `last`.
MemoryValue F32(int64_t numel, int last, bool planned = true) { return {planned, DType::kFloat32, numel, last}; }
}  // namespace

TEST_CASE("memory planning: a chain reuses the block of a value two steps back") {
  // v0 (input) -> s0 -> v1 -> s1 -> v2 -> s2 -> v3 -> s3 -> v4 (output); 64 floats (256 bytes) each
  std::vector<MemoryValue> values = {F32(64, 0, false), F32(64, 1), F32(64, 2), F32(64, 3), F32(64, -1, false)};
  std::vector<MemoryStep> steps = {{{0}, {1}, false}, {{1}, {2}, false}, {{2}, {3}, false}, {{3}, {4}, false}};
  MemoryPlan p = PlanMemory(steps, values, {});
  CHECK(p.offset == std::vector<int64_t>{-1, 0, 256, 0, -1});
  CHECK(p.arena_bytes == 512);
  CHECK(p.intermediates == 3);
  CHECK(p.unshared_bytes == 768);
  CHECK(p.in_place == 0);
}

TEST_CASE("memory planning: elementwise outputs take the block of an input that dies there") {
  // v1 = f(v0); v2 = exp(v1) in place; v3 = v2 + v0(input) in place; v4 output
  std::vector<MemoryValue> values = {F32(16, 2, false), F32(16, 1), F32(16, 2), F32(16, 3), F32(16, -1, false)};
  std::vector<MemoryStep> steps = {
      {{0}, {1}, false}, {{1}, {2}, true}, {{2, 0}, {3}, true}, {{3}, {4}, true}};
  MemoryPlan p = PlanMemory(steps, values, {});
  CHECK(p.offset == std::vector<int64_t>{-1, 0, 0, 0, -1});
  CHECK(p.arena_bytes == 64);
  CHECK(p.in_place == 2);
  CHECK(p.intermediates == 3);

  MemoryPlan off = PlanMemory(steps, values, MemoryOptions{.in_place = false});
  CHECK(off.offset == std::vector<int64_t>{-1, 0, 64, 0, -1});  // v3 takes v1's block, freed at step 1
  CHECK(off.in_place == 0);
  CHECK(off.arena_bytes == 128);
}

TEST_CASE("memory planning: no in place over an input of another size, nor for non-elementwise steps") {
  std::vector<MemoryValue> values = {F32(16, 0, false), F32(32, 1), F32(16, 2), F32(16, -1, false)};
  std::vector<MemoryStep> steps = {{{0}, {1}, false}, {{1}, {2}, true}, {{2}, {3}, false}};
  MemoryPlan p = PlanMemory(steps, values, {});
  CHECK(p.in_place == 0);
  CHECK(p.offset[2] == 128);  // v1 (128 bytes) is freed only after v2 is placed
  std::vector<MemoryStep> not_ew = {{{0}, {1}, false}, {{1}, {2}, false}, {{2}, {3}, false}};
  std::vector<MemoryValue> same = {F32(16, 0, false), F32(16, 1), F32(16, 2), F32(16, -1, false)};
  CHECK(PlanMemory(not_ew, same, {}).in_place == 0);
}

TEST_CASE("memory planning: a value read twice is freed once, a reader that never runs keeps the block") {
  // s1 reads v1 twice (a * a); v2's reader never runs as a step; v3 and v6 are read by nobody.
  std::vector<MemoryValue> values = {F32(16, 0, false), F32(16, 1), F32(16, MemoryValue::kNeverFreed),
                                     F32(16, MemoryValue::kNoReader), F32(16, 4), F32(16, -1, false),
                                     F32(16, MemoryValue::kNoReader)};
  std::vector<MemoryStep> steps = {
      {{0}, {1}, false}, {{1, 1}, {2}, false}, {{0}, {3}, false}, {{0}, {4, 6}, false}, {{4}, {5}, false}};
  MemoryPlan p = PlanMemory(steps, values, {});
  // v1 at 0, v2 at 64; v3 takes v1's block and gives it back at once; v4 takes it again and v6 a
  // new block: v1 was freed once, and v2's block stays v2's.
  CHECK(p.offset == std::vector<int64_t>{-1, 0, 64, 0, 0, -1, 128});
  CHECK(p.arena_bytes == 192);
}

TEST_CASE("memory planning: per stream, a freed block is taken again only on its own stream") {
  // Stream 0: s0 writes v1, s1 reads it (freed there) and writes v3; stream 1: s2 writes v2; s3 joins.
  std::vector<MemoryValue> values = {F32(16, 2, false), F32(16, 1), F32(16, 3), F32(16, 3), F32(16, -1, false)};
  std::vector<MemoryStep> steps = {
      {{0}, {1}, false, 0}, {{1}, {3}, false, 0}, {{0}, {2}, false, 1}, {{2, 3}, {4}, false, 0}};
  MemoryPlan serial = PlanMemory(steps, values, {});
  CHECK(serial.offset == std::vector<int64_t>{-1, 0, 0, 64, -1});  // serially, v2 takes v1's block
  CHECK(serial.arena_bytes == 128);
  MemoryPlan per_stream = PlanMemory(steps, values, MemoryOptions{.per_stream = true});
  CHECK(per_stream.offset == std::vector<int64_t>{-1, 0, 128, 64, -1});
  CHECK(per_stream.arena_bytes == 192);
}

TEST_CASE("memory planning: freed neighbours merge into one block, and a free block at the end grows") {
  // v1 and v2 (64 bytes each) sit side by side and die at step 2, which puts v3 after them; v4
  // (128 bytes) then takes the two merged.
  std::vector<MemoryValue> values = {F32(16, 1, false), F32(16, 2), F32(16, 2), F32(16, 4), F32(32, 4),
                                     F32(16, -1, false)};
  std::vector<MemoryStep> steps = {
      {{0}, {1}, false}, {{0}, {2}, false}, {{1, 2}, {3}, false}, {{3}, {4}, false}, {{3, 4}, {5}, false}};
  MemoryPlan p = PlanMemory(steps, values, {});
  CHECK(p.offset == std::vector<int64_t>{-1, 0, 64, 128, 0, -1});
  CHECK(p.arena_bytes == 192);

  // v2 (64 bytes, at 64) is read by nobody and freed at once: the free block [64, 128) ends the
  // arena, so v3 (256 bytes) grows it to [64, 320) rather than starting a block at 128.
  std::vector<MemoryValue> grow = {F32(16, 2, false), F32(16, 3), F32(16, MemoryValue::kNoReader), F32(64, 3),
                                   F32(16, -1, false)};
  std::vector<MemoryStep> gsteps = {{{0}, {1}, false}, {{0}, {2}, false}, {{0}, {3}, false}, {{1, 3}, {4}, false}};
  MemoryPlan q = PlanMemory(gsteps, grow, {});
  CHECK(q.offset == std::vector<int64_t>{-1, 0, 64, 64, -1});
  CHECK(q.arena_bytes == 320);
}

TEST_CASE("memory planning: a zero-element value takes no block and frees none") {
  // v1 has no elements and dies at step 1, where v2 starts at offset 0; v2 dies at step 2 (after
  // v3 is placed); v4 and v5 then take v2's block and a new one. Freeing v1 once put an empty
  // block at offset 0 beside v2's, and the free lists went out of step.
  std::vector<MemoryValue> values = {F32(16, 5, false), F32(0, 1), F32(16, 2), F32(16, 5), F32(16, 5),
                                     F32(16, 5), F32(16, -1, false)};
  std::vector<MemoryStep> steps = {{{0}, {1}, false}, {{0, 1}, {2}, false}, {{2}, {3}, false},
                                   {{0}, {4}, false}, {{0}, {5}, false}, {{0, 3, 4, 5}, {6}, false}};
  MemoryPlan p = PlanMemory(steps, values, {});
  CHECK(p.offset[2] == 0);
  CHECK(p.offset[3] == 64);
  CHECK(p.offset[4] == 0);
  CHECK(p.offset[5] == 128);
  CHECK(p.arena_bytes == 192);
}
