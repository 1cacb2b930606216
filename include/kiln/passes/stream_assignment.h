// Stream assignment (DESIGN.md sections 8 and 10): the steps of a plan (the kernels it launches,
// in order) are split into streams, chains of steps that run one after another, so that
// independent branches of a graph can run at the same time. A stream becomes a lane of the
// executor (kiln/runtime/lanes.h): a thread on CPUs, a device stream on GPUs; `waits` become
// events between lanes.
//
// AssignStreams is list scheduling with estimated costs: each step goes to the stream on which it
// can start earliest (a stream that already holds one of its inputs' producers wins ties, which
// saves a cross-stream wait). Memory reuse between steps (a block of the arena handed to a later
// value) becomes an ordinary dependency through AddReuseDeps, so running streams concurrently never
// writes a block another stream still reads.
//
// What it does not do: reorder steps within a stream (the plan's order is kept), or split one
// kernel across streams.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kiln/ir/graph.h"

namespace kiln::passes {

/// One step of a plan: the earlier steps it must wait for, and its estimated cost (any unit).
struct StreamStep {
  std::vector<int> deps;
  double cost = 1;
};

struct StreamSchedule {
  int num_streams = 1;
  std::vector<int> stream;             ///< per step
  std::vector<std::vector<int>> waits; ///< per step: the latest step of each other stream it needs
  std::vector<std::vector<int>> lists; ///< per stream: its steps in plan order
  double critical = 0;                 ///< estimated time with the streams concurrent
  double total = 0;                    ///< estimated time one after another
};

/// Splits `steps` (in a valid order: every dep is an earlier step) into at most `max_streams`.
StreamSchedule AssignStreams(std::span<const StreamStep> steps, int max_streams);

/// The schedule of a given stream per step (waits, lists, estimated times): after dependencies
/// were added to steps already assigned (memory reuse, AddReuseDeps).
StreamSchedule FinalizeStreams(std::span<const StreamStep> steps, std::vector<int> stream);

/// An arena block: bytes [begin, end), the step that writes it and the steps that read it.
struct ArenaBlock {
  int64_t begin = 0, end = 0;
  int writer = -1;
  std::vector<int> readers;
};

/// Adds to `steps` the dependencies that memory reuse implies: when a block overlaps an earlier
/// one, its writer waits for the earlier one's writer and readers.
void AddReuseDeps(std::span<const ArenaBlock> blocks, std::vector<StreamStep>& steps);

/// Whether running a schedule's streams concurrently is worth trying: the work they take off the
/// critical path is at least `min_work` (in the cost unit) and at least a tenth of the total.
bool WorthConcurrent(const StreamSchedule& s, double min_work);

/// The default `min_work` of plans (cost unit: bytes moved): 4 MB. Tests set it to 0.
double& MinConcurrentWork();

/// The pass over a graph: assigns its steps (passes/graph_steps.h: a node, or a `#group=` group at
/// its last member) to at most `max_streams` streams by AssignStreams, with the plan's estimate
/// of cost (bytes read and written; four times that for a matmul or convolution), and records
/// each step's stream and the steps of other streams it waits for as `#stream=` and `#wait=`
/// notes. With one stream there is nothing to record (the notes are cleared). True when a note
/// changed.
bool RunStreamAssignment(ir::Graph& graph, int max_streams);

} // namespace kiln::passes
