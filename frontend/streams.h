// Stream assignment for compiled plans (internal to frontend/): the steps of a plan (its kernels,
// in order) are split into streams, chains of steps that run one after another, so that
// independent branches of a graph can run at the same time (DESIGN.md sections 8 and 10). On CPUs
// a stream is a thread; the GPU executor maps streams to CUDA streams with events for `waits`.
//
// Assign is list scheduling with estimated costs: each step goes to the stream on which it can
// start earliest (a stream that already holds one of its inputs' producers wins ties, which saves a
// cross-stream wait). Memory reuse between steps (a buffer of the arena handed to a later value)
// becomes an ordinary dependency through ReuseDeps, so running streams concurrently never writes a
// buffer another stream still reads.
//
// What it does not do: reorder steps within a stream (the plan's order is kept), or split one
// kernel across streams.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace kiln::streams {

/// One step of a plan: the earlier steps it must wait for, and its estimated cost (any unit).
struct Step {
  std::vector<int> deps;
  double cost = 1;
};

struct Schedule {
  int num_streams = 1;
  std::vector<int> stream;              ///< per step
  std::vector<std::vector<int>> waits;  ///< per step: the latest step of each other stream it needs
  std::vector<std::vector<int>> lists;  ///< per stream: its steps in plan order
  double critical = 0;                  ///< estimated time with the streams concurrent
  double total = 0;                     ///< estimated time one after another
};

/// Splits `steps` (in a valid order: every dep is an earlier step) into at most `max_streams`.
Schedule Assign(std::span<const Step> steps, int max_streams);

/// The schedule of a given stream per step (waits, lists, estimated times): after dependencies
/// were added to steps already assigned (memory reuse, ReuseDeps).
Schedule Finalize(std::span<const Step> steps, std::vector<int> stream);

/// An arena buffer: bytes [begin, end), the step that writes it and the steps that read it.
struct Buffer {
  int64_t begin = 0, end = 0;
  int writer = -1;
  std::vector<int> readers;
};

/// Adds to `steps` the dependencies that memory reuse implies: when a buffer overlaps an earlier
/// one, its writer waits for the earlier one's writer and readers.
void ReuseDeps(std::span<const Buffer> buffers, std::vector<Step>& steps);

/// Runs run(i) for every step: stream 0 on the calling thread, the others on helper threads,
/// each step after the steps it waits for. Falls back to running every step in order on the
/// calling thread when the helpers are busy with another plan. Rethrows the first error (the
/// remaining steps are skipped).
void Execute(const Schedule& s, const std::function<void(int)>& run);

/// Streams Execute can run at once (the cores, at least 2).
int MaxStreams();

/// A plan's streams run concurrently only when the work they take off the critical path is at
/// least this (in the cost unit of plans: bytes moved); 4 MB by default. Tests set it to 0.
double& MinConcurrentWork();

/// Tests: plans whose streams are worth trying always run them concurrently (no timing trial).
bool& AlwaysConcurrent();

}  // namespace kiln::streams
