// Eager autograd. Under a RecordScope every op whose inputs need gradients is appended to a tape
// that is an ir::Graph (DESIGN.md section 5); Backward runs the autodiff pass of passes/ over it
// and executes the gradient nodes eagerly. Eager autograd and graph autodiff share one
// differentiation implementation: the op table's gradient rules.
#pragma once

#include <memory>
#include <vector>

#include "kiln/frontend/tensor.h"
#include "kiln/ir/graph.h"

namespace kiln::autograd {

/// `with autograd.record(train_mode)`: records ops for differentiation.
class RecordScope {
 public:
  explicit RecordScope(bool train_mode = true);
  ~RecordScope();
  RecordScope(const RecordScope&) = delete;
  RecordScope& operator=(const RecordScope&) = delete;

 private:
  bool prev_recording_, prev_training_;
};

/// `with autograd.pause(train_mode)`: stops recording inside a record scope.
class PauseScope {
 public:
  explicit PauseScope(bool train_mode = false);
  ~PauseScope();
  PauseScope(const PauseScope&) = delete;
  PauseScope& operator=(const PauseScope&) = delete;

 private:
  bool prev_recording_, prev_training_;
};

bool IsRecording();
bool IsTraining();
/// Sets the training flag (returns the previous value); dropout and batch norm read it.
bool SetTraining(bool training);

/// Backpropagates from `heads` (with `head_grads`, ones where undefined) into every leaf that has
/// a gradient buffer. Without `retain_graph` the tape's saved values are released and a second
/// backward through them raises StateError.
void Backward(const std::vector<Tensor>& heads, const std::vector<Tensor>& head_grads = {},
              bool retain_graph = false);

/// True once a backward has written a gradient into `t`'s gradient buffer (a path led from the
/// heads to `t`), until cleared with SetGradFresh(t, false); the Trainer uses it to name parameters
/// that got no gradient. False for tensors without a gradient buffer (SetGradFresh then throws).
bool GradFresh(const Tensor& t);
void SetGradFresh(const Tensor& t, bool fresh);

/// Gradients of `heads` with respect to `variables`, returned instead of written to .grad.
std::vector<Tensor> Grad(const std::vector<Tensor>& heads, const std::vector<Tensor>& variables,
                         const std::vector<Tensor>& head_grads = {}, bool retain_graph = false);

// ---- used by dispatch ----

/// True when `t` was recorded on the active record scope's tape as an output of a compiled call
/// (a hybridized block's call_graph): kiln.loss compiles a loss over such a prediction.
bool FromCompiledCall(const Tensor& t);
/// True when recording and some input takes part in differentiation.
bool NeedsRecord(std::span<const Tensor> inputs);
/// Appends the op to the tape and links the outputs to it.
void Record(ir::OpId op, const ir::Attrs& attrs, std::span<const Tensor> inputs,
            std::span<const Tensor> outputs);

/// Called by Tensor::CopyTo while recording, before `src` is written into `dst` (y[0] = 10,
/// y[:] = x * 5, h += 1): the tape then sees the storage of `dst` as a new value, its old value
/// with the written elements replaced by `src`, and every tensor viewing that storage is read from
/// the new value when it is next used. Values that recorded ops saved from that storage keep
/// their old contents (copied before the write). A write into a leaf (a tensor with attach_grad(),
/// or a view of one) is not differentiated, as an optimizer step taken inside the scope: earlier
/// uses keep the old value, later ones read the new one, and backward adds both gradients.
void RecordWrite(const Tensor& src, const Tensor& dst);

}  // namespace kiln::autograd
