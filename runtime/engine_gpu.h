// GPU ordering for the engines (engine.h, DESIGN.md section 4): GPU tasks are ordered by events
// on their streams, never by host waits. Internal to runtime/.
//
// A GPU task on a compute or copy-in stream issues its work and returns; an event recorded on its
// stream right after is left on the variables it wrote (and, for write-after-read order, on the
// ones it read). The next GPU task that uses such a variable makes its own stream wait for that
// event (cudaStreamWaitEvent) before it issues work; a CPU task, a communication task (NCCL and
// the in-process collectives reach memory outside the stream) and the sync points
// (wait_to_read, asnumpy, waitall) wait for it on the host. A copy-out task's result is host
// memory, so it waits for its stream before it completes.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "kiln/runtime/engine.h"

namespace kiln::engine::detail {

struct GpuMark;
/// The GPU work pending on a variable (guarded by the variable's lock).
struct GpuVarState {
  std::shared_ptr<GpuMark> write;              ///< after the last writer's work
  std::vector<std::shared_ptr<GpuMark>> reads;  ///< after the work of the readers since then
};

/// Before a task's body (inside its error handling): waits, on its stream or on the host, for
/// the GPU work pending on `reads` and `writes`. Costs a few loads when no GPU was ever used.
void WaitForGpuWork(std::span<Var* const> reads, std::span<Var* const> writes, const TaskOptions& o);
/// After a GPU task's body: leaves its stream's event on the variables, or (copy-out and
/// communication tasks) waits for the stream.
void MarkGpuWork(std::span<Var* const> reads, std::span<Var* const> writes, const TaskOptions& o);
/// A sync point: waits on the host for the GPU work that writes `v`.
void WaitForGpuWrite(Var* v);
/// waitall: waits for every device that ran GPU tasks.
void WaitForAllGpuWork();
/// Frees a variable's GPU state (its events go back to their pool).
void DeleteGpuState(GpuVarState* s);

}  // namespace kiln::engine::detail
