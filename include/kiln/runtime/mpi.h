// Collectives across processes launched by mpirun (DESIGN.md section 10), at the level of raw
// buffers: this layer knows dtypes and pointers, never a Tensor or the engine.
//
// MPI runs in MPI_THREAD_SERIALIZED mode: an operation runs on the calling thread (an engine
// worker, the Python thread) under one process-wide lock, so callers may come from anywhere and
// block until their operation is done; MPI_Init_thread and MPI_Finalize run on one dedicated
// thread (the standard wants them on the same thread). Waits are nonblocking collectives
// (or point-to-point messages) polled against a deadline: a rank that died or hangs makes the
// others throw DistributedError after `timeout` seconds instead of hanging, and the world is then
// marked broken (every later call throws at once, and finalize skips MPI_Finalize).
//
// Without a launcher (no mpirun environment) the world is one process and MPI is never started:
// every collective is then the identity.
//
// What it does not do: GPU buffers go through NCCL (NcclAllreduce below, runtime/cuda/), not
// through MPI; no fault tolerance beyond a clear error; no sub-communicators.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/runtime/collectives.h"
#include "kiln/runtime/dtype.h"
#include "kiln/runtime/error.h"

namespace kiln {

/// A collective across processes failed: a peer died or stalled past the timeout, the ranks
/// disagree on what to reduce, or MPI reported an error. A StateError; a queued collective's
/// failure reaches the user as a DistributedError naming the op (the engine keeps error types).
class DistributedError : public StateError {
  using StateError::StateError;
};

namespace mpi {

// The ops of the in-process collectives ("sum", "mean", "max", "min"; ParseReduceOp throws
// ValueError listing them otherwise).
using coll::ReduceOp;
using coll::ParseReduceOp;
using coll::ReduceOpName;

/// Starts MPI (MPI_Init_thread on the communication thread) unless already started; idempotent.
/// `timeout_s` > 0 sets the deadline of every wait; otherwise KILN_DIST_TIMEOUT or 60 s.
/// Throws StateError after Finalize (MPI cannot start twice in one process).
void Init(double timeout_s = 0);
bool IsInitialized();
/// True when running without a launcher: one process, MPI not started.
bool IsLocalWorld();
int Rank();
int Size();
/// The rank among the processes of this machine (for choosing a GPU).
int LocalRank();
double Timeout();
/// Sets the deadline of later waits (seconds, > 0).
void SetTimeout(double timeout_s);

/// Every rank reaches the barrier, or DistributedError after the timeout.
void Barrier();
/// In place: `buf` (count elements of dtype) becomes the reduction over the ranks. float16 and
/// bfloat16 are rejected (DTypeError); kMean needs a float dtype. `what` names the caller's
/// operation in errors.
void Allreduce(void* buf, int64_t count, DType dtype, ReduceOp op, const char* what = "allreduce");
/// In place: every rank's `buf` becomes root's.
void Broadcast(void* buf, size_t nbytes, int root, const char* what = "broadcast");
/// Every rank's value, indexed by rank.
std::vector<uint64_t> AllgatherU64(uint64_t value, const char* what = "allgather");
/// Every rank's bytes, indexed by rank.
std::vector<std::string> AllgatherBytes(const std::string& bytes, const char* what = "allgather");

/// Waits for the other ranks (with the timeout) and shuts MPI down; idempotent. After a failure
/// it skips MPI_Finalize, which would hang on a dead peer.
void Finalize();
bool IsFinalized();
/// Prints "kiln.distributed: rank R <why>" and ends every rank of the job (MPI_Abort), for a rank
/// that cannot go on (an uncaught exception): the others then stop at once instead of waiting
/// out the timeout. Does nothing in a 1-process world or before Init.
void Abort(int code, const std::string& why);

/// The reduction of `n` elements of `src` into `dst` (dst = dst op src), as done by the ring
/// allreduce; exposed for unit tests. kMean reduces as kSum.
void ReduceInto(void* dst, const void* src, int64_t n, DType dtype, ReduceOp op);

/// FNV-1a 64-bit hash, the same on every rank and build.
uint64_t Fnv1a(std::string_view bytes);

// ---- GPU buffers: NCCL bootstrapped through MPI (runtime/cuda/nccl_dist.cc) ----

/// True when kiln was built with CUDA and NCCL and the process's GPUs are real ones: NCCL cannot
/// reach a simulated GPU's memory (KILN_GPU_SIM). Without it, GPU arrays cross processes through
/// MPI via host copies (frontend/distributed.cc).
bool NcclAvailable();
/// In place on gpu(`device_index`), enqueued on `stream` (a cudaStream_t): the reduction over
/// the ranks. The communicator is created on first use (ncclGetUniqueId on rank 0, broadcast over
/// MPI, ncclCommInitRank). Throws DeviceError without NCCL.
void NcclAllreduce(void* buf, int64_t count, DType dtype, ReduceOp op, int device_index, void* stream);
/// Destroys the NCCL communicators (called by Finalize).
void NcclShutdown();

} // namespace mpi
} // namespace kiln
