// Joined calls: the compiled calls of one training step run as one plan.
//
// In the d2l loop (`with autograd.record(): l = loss(net(X), y)`, then `l.backward()`) the
// network, the loss and the backward are three compiled graphs. Under autograd.record() a
// compiled call is held back instead of pushed: its outputs exist (allocated, on the tape) but
// nothing computes them yet. The next compiled call on the device joins it, and the compiled
// backward that reads what they saved joins them into one plan, compiled once per combination
// (cached with the first call's graph). That plan is held in turn, as the device's step, until
// the optimizer's update (optim.h) joins it: on a GPU one CUDA graph replays the whole step,
// update included. Anything else that comes first pushes the step alone.
//
// Held calls behave as if pushed when they were made: their variables are held in the engine
// (engine::HoldVars), and anything that touches one (an op reading an output or writing an
// input, a wait, asnumpy, waitall) pushes the held calls first, one plan for all of them. What
// is held: training calls (autograd recording, a training variant) whose inputs and outputs are
// contiguous and write no tensor another held call reads or writes; at most four calls per
// device. A held call that draws random numbers (dropout) reserves them when it is made
// (ReserveRandom): calls join when their reservations follow one another, and run one by one
// when something drew in between. KILN_JOIN_CALLS=0 pushes every call at once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/frontend/tensor.h"
#include "kiln/ir/graph.h"

namespace kiln::deferred {

/// Holds the training call of registered graph `graph_id` on `inputs` writing `outputs`, of
/// which `late` are written after the call read its inputs (batch norm's running statistics,
/// written into captured inputs); false when the call must be pushed now (nothing was held).
bool Hold(int64_t graph_id, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
          std::vector<int> late);

/// Runs a graph now, joined with the calls held on `device` when it reads one of their outputs:
/// `make` builds the graph (inputs and outputs as `inputs` and `outputs`); `key` names it, for the
/// cache. `spent[j]`: the caller drops input j right after, and nothing else reads it (a saved
/// value a backward spends): when it is a held call's saved value, the joined plan keeps it in
/// its arena and never writes (nor allocates) it. False when nothing held is read: nothing ran,
/// and the caller runs it alone.
bool RunJoined(const std::string& key, Device device, std::span<const Tensor> inputs, const std::vector<bool>& spent,
               std::span<const Tensor> outputs, const std::function<std::unique_ptr<ir::Graph>()>& make);

/// Runs a parameter update joined with the device's held step (the plan RunJoined made of a
/// training step, held until its update comes) when it reads the step's outputs (the gradients):
/// one plan for the step and its update. `make` builds the update's graph (inputs and outputs as
/// `inputs` and `outputs`); every output is written after everything read its old value (the
/// weights the step read). `key` names the graph, for the cache. False when nothing ran: the
/// caller runs the update alone.
bool RunUpdate(const std::string& key, Device device, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
               const std::function<std::unique_ptr<ir::Graph>()>& make);

/// Whether a step is held on `device` (RunUpdate may join it).
bool HoldsStep(Device device);

/// Pushes every held call (the engine's flush hook calls it).
void Flush();

/// Drops every held call without running it (at exit, after a flush that failed): their
/// outputs keep whatever they held.
void Drop();

}  // namespace kiln::deferred
