// Lanes: the device-neutral interface through which the plan executor (executor.h) runs the steps
// of a plan concurrently (DESIGN.md section 10). A lane is an ordered queue of work: a CPU thread
// today, a GPU stream next. The executor issues, in the plan's step order, for each step on its
// lane: the waits on events other lanes record, the launch of the step, and the record of the
// step's event when another lane waits for it; then Finish runs (CPU) or synchronizes (GPU) what
// was issued. Issuing in step order is what a GPU needs (a stream can only wait on an event whose
// record was issued before); a CPU implementation may queue and run everything in Finish.
//
// An implementation runs one plan at a time per object: Begin returns false while another run is
// in progress (a plan nested inside a step, or another thread), and the executor then runs the
// steps one after another on the calling thread itself.
//
// Not here: choosing lanes (passes/stream_assignment.h), memory (the executor's arenas), or what a
// step does (the launch callback).
#pragma once

#include <functional>

namespace kiln::exec {

class Lanes {
 public:
  virtual ~Lanes() = default;
  /// How many lanes can run at the same time (a CPU: its cores, at least 2).
  virtual int MaxLanes() const = 0;
  /// Starts a run of `num_lanes` lanes over steps 0..num_steps-1; `launch(step)` does a step's
  /// work and must stay valid until Finish. Events are numbered by the step that records them.
  /// False when this object cannot run it now (busy); nothing was started then.
  virtual bool Begin(int num_lanes, int num_steps, const std::function<void(int step)>& launch) = 0;
  /// Work issued to `lane` after this waits until `event` was recorded.
  virtual void Wait(int lane, int event) = 0;
  /// Runs launch(step) on `lane`, after the lane's earlier work. The step learns its lane from
  /// the executor (StepArgs::lane); a GPU implementation makes the lane's stream the one the
  /// step's kernels are issued to, a CPU lane is the thread that calls launch.
  virtual void Launch(int lane, int step) = 0;
  /// Records `event` on `lane`: it happens when the lane's work issued before it is done.
  virtual void Record(int lane, int event) = 0;
  /// Runs or waits for everything issued since Begin and ends the run; rethrows the first error
  /// a launch raised (the steps after it may be skipped).
  virtual void Finish() = 0;
};

/// The CPU implementation: lane 0 is the calling thread, the others helper threads kept for the
/// process; waits spin briefly, then sleep.
Lanes& CpuLanes();

/// The GPU implementation for the calling GPU engine worker: lane 0 is the worker's stream, the
/// others streams of its own; waits and records are CUDA events, so nothing blocks the host, and
/// Finish joins the lanes back into lane 0 (runtime/gpu_facade.cc).
Lanes& GpuLanes();

}  // namespace kiln::exec
