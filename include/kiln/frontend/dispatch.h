// Eager dispatch: the one path by which every op runs. Invoke checks the arguments and infers
// output types on the calling thread (errors name the op, shapes, dtypes, devices), allocates
// the outputs, records the op on the autograd tape when recording, and queues the kernel.
// Kernels are bound to op ids per device type in runtime's KernelTable (runtime/cpu/kernels_*.cc).
#pragma once

#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "kiln/frontend/tensor.h"
#include "kiln/ir/op.h"
#include "kiln/runtime/kernel.h"
#include "kiln/runtime/tensor_view.h"

namespace kiln {

/// The call_graph kernels (cached_graph.cc), added to the runtime's kernel table by dispatch.cc.
void BindGraphKernels(KernelTable& t);

/// Runs op `op` eagerly. `device` places ops without inputs (creation); for other ops it must be
/// empty or equal to the inputs' device.
std::vector<Tensor> Invoke(ir::OpId op, std::span<const Tensor> inputs, const ir::Attrs& attrs = {},
                           std::optional<Device> device = std::nullopt);
std::vector<Tensor> Invoke(std::string_view op, std::span<const Tensor> inputs,
                           const ir::Attrs& attrs = {}, std::optional<Device> device = std::nullopt);
/// Invoke for single-output ops.
Tensor Invoke1(std::string_view op, std::initializer_list<Tensor> inputs, const ir::Attrs& attrs = {},
               std::optional<Device> device = std::nullopt);
/// Invoke for single-output ops, taking the inputs by pointer (no Tensor copies). Elementwise ops
/// without attributes on inputs of one shape, dtype and device take the small-op path (see
/// dispatch.cc); every other call goes through Invoke, with the same results and errors.
Tensor Invoke1(ir::OpId op, std::span<const Tensor* const> inputs, const ir::Attrs& attrs = {});
/// Runs `op` writing into existing `outputs` (shapes and dtypes must match what `op` infers).
void InvokeInto(ir::OpId op, std::span<const Tensor> inputs, const ir::Attrs& attrs,
                std::span<const Tensor> outputs);

/// CPU ops whose inputs and outputs total at most `bytes` run on the calling thread when nothing
/// they depend on is pending (KILN_ENGINE_INLINE_BYTES; 0 queues every op). Returns the old value.
size_t SetInlineLimit(size_t bytes);

/// Seeds the generator behind random ops (kiln.random.seed): the process-wide one, which every
/// thread without a generator of its own draws from; with `this_thread`, the calling thread's
/// own, from then on used by its random ops alone (the same seed gives the same numbers as the
/// process-wide generator given it, whatever other threads draw meanwhile).
void ManualSeed(uint64_t seed, bool this_thread = false);

/// Where a random op's numbers come from: the generator's seed and its counter's offset.
struct RandomReservation {
  uint64_t seed = 0, offset = 0;
};

/// Reserves `draws` numbers (rounded up to a multiple of 4, as every random op's are) of the
/// generator a random op queued now by this thread would draw from.
RandomReservation ReserveRandom(uint64_t draws);

/// While alive, the next random op this thread queues draws from `r` (reserved earlier, by
/// ReserveRandom) rather than reserving anew: a call held back (deferred.h) keeps the numbers
/// of the place it was made at.
class RandomReservationScope {
 public:
  explicit RandomReservationScope(const RandomReservation* r);
  ~RandomReservationScope();
  RandomReservationScope(const RandomReservationScope&) = delete;
  RandomReservationScope& operator=(const RandomReservationScope&) = delete;

 private:
  const RandomReservation* old_;
};

/// The call site the Python layer reports for the ops it is about to queue ("file.py:12").
/// Engine errors name it. Thread-local; nullptr when unknown.
void SetCallSite(const char* site);

}  // namespace kiln
