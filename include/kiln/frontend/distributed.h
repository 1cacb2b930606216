// kiln.distributed at the level of tensors: data-parallel collectives across processes launched
// by mpirun (DESIGN.md section 10), as engine tasks.
//
// Allreduce and Broadcast return at once: each queues ONE engine task on the kComm stream that
// writes the arrays' variables, so it runs when the arrays' producers have finished and their
// readers wait for it. Every collective task also writes one process-wide "order" variable, so
// the collectives run in the order they were called (the same on every rank, which MPI needs),
// whatever the devices. CPU arrays go through MPI (runtime/mpi.h), GPU arrays through NCCL.
//
// What it does not do: autograd (the arrays are reduced as data), hybridize tracing, arrays that
// are strided views.
#pragma once

#include <string>
#include <vector>

#include "kiln/frontend/tensor.h"
#include "kiln/runtime/mpi.h"

namespace kiln::distributed {

/// One array a rank will reduce: what check_schedule compares across ranks.
struct ScheduleEntry {
  std::string name;
  Shape shape;
  DType dtype = DType::kFloat32;
};

/// Starts the world (idempotent); `timeout_s` > 0 sets the deadline of every collective.
void Init(double timeout_s = 0);
bool IsInitialized();
int Rank();
int Size();
int LocalRank();
/// Waits for queued collectives, then for every rank (DistributedError after the timeout).
void Barrier();
/// In place across processes: every array becomes the sum (mean, max, min) over the ranks.
/// Queued; errors surface at the arrays' next sync point.
void Allreduce(const std::vector<Tensor>& arrays, mpi::ReduceOp op);
/// In place: every rank's arrays become root's. Queued.
void Broadcast(const std::vector<Tensor>& arrays, int root);
/// Compares the reduction schedules of all ranks (a hash, then the lists when hashes differ);
/// throws DistributedError on every rank naming the first entry where they differ.
void CheckSchedule(const std::vector<ScheduleEntry>& entries);
/// The text of one entry, as printed in CheckSchedule's error: "fc1.weight (256, 512) float32".
std::string EntryText(const ScheduleEntry& e);
/// Waits for queued work, then shuts the world down (idempotent; run at exit by kiln.distributed).
void Finalize();

} // namespace kiln::distributed
