// Collectives among the devices of one process (DESIGN.md section 10): allreduce, broadcast,
// reduce-scatter and all-gather of Tensors held on several CPU devices (a threaded pass over
// host memory) or several GPUs (NCCL).
//
// Each call checks its arguments on the calling thread (typed errors that name the device index
// and what differs), then queues ONE engine task, on the comm queue of the first device, that
// reads every input's and writes every output's engine variable on all devices: it starts once
// the producers of every input finished, later readers wait for it, and there is no rendezvous
// between per-device tasks that could deadlock. Calls return at once; errors inside the task are
// stored on the outputs and raised at the next sync point.
//
// Results are bit-identical on every device; on CPU devices each element is reduced in device
// order (0, 1, ...), independent of threads and chunking. Integer mean truncates toward zero.
// What it does not do: autograd recording, hybridize tracing, non-contiguous tensors, mixing
// CPU and GPU devices in one call.
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "kiln/frontend/tensor.h"

namespace kiln {

enum class ReduceOp { kSum, kMean, kMax, kMin };

/// groups[d] = the tensors of device d (same count, shapes and dtypes for every d; each group on
/// one device, groups on distinct devices). Every tensor is replaced, in place, by the reduction
/// over devices of the matching tensors. Returns at once (one engine task; none for one device,
/// where every op is the identity).
void AllReduce(std::span<const std::vector<Tensor>> groups, ReduceOp op = ReduceOp::kSum);
/// Copies the tensors of groups[root] into the matching tensors of every other group, in place.
void Broadcast(std::span<const std::vector<Tensor>> groups, int root = 0);
/// inputs[d]: N elements each (same dtype, any shapes); outputs[d]: part d of
/// np.array_split(flat, D) (the first N % D parts one element longer), contiguous, on the device
/// of inputs[d], reduced over devices. outputs[d] may be exactly that part of inputs[d] (in place).
void ReduceScatter(std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                   ReduceOp op = ReduceOp::kSum);
/// inputs[d]: part d; outputs[d]: the concatenation of all parts in device order (flat sizes must
/// add up), on the device of inputs[d]. inputs[d] may be exactly part d of outputs[d] (in place).
void AllGather(std::span<const Tensor> inputs, std::span<const Tensor> outputs);

/// "sum", "mean", "max", "min".
const char* ReduceOpName(ReduceOp op);
/// Parses an op name; throws ValueError listing the valid names otherwise.
ReduceOp ParseReduceOp(std::string_view name);

} // namespace kiln
