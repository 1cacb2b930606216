// Loading an exported model (DESIGN.md section 1 and 7) for deployment from C++, with no Python:
// `NAME-symbol.json` (the graph) and `NAME-0000.params` (its weights) are read and checked
// against each other, the weights are uploaded to a device and the graph is compiled once.
//
//   kiln::Module model = kiln::load("mlp-symbol.json", "mlp-0000.params", kiln::cpu());
//   kiln::Tensor y = model({x})[0];
//
// A Module checks every call's inputs (count, dtype, rank, device) against the exported ones and
// names the offending input. Inputs of other sizes than the exported ones (another batch size)
// run too, as MXNet rebinds its executor: the graph is re-shaped for them (shapes inferred again,
// size-valued attributes rewritten: passes/reshape_inputs.h) and compiled once per input shapes,
// the plans of the last kMaxReshapedPlans such shapes kept. A graph that cannot be re-shaped
// soundly is a ShapeError naming the node and the input. Not here: training an imported model
// (parameters are frozen), Python's SymbolBlock.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/frontend/tensor.h"
#include "kiln/ir/op.h"
#include "kiln/ir/serialize.h"

namespace kiln {

class CachedGraph;

/// Plans a Module keeps for input shapes other than the exported ones (least recently used dropped).
inline constexpr size_t kMaxReshapedPlans = 8;

/// A loaded, compiled model. A cheap, copyable handle: copies share the compiled graph and the
/// parameters.
class Module {
 public:
  /// Runs the model on `inputs` (one per input_names(), in that order, on device()): one engine
  /// task; returns the outputs flattened in order (see output_structure()). Inputs of other sizes
  /// than input_types() re-shape the graph (compiled on their first call). Throws ValueError for
  /// a wrong number of inputs, DTypeError / ShapeError / DeviceError naming the input otherwise,
  /// and ShapeError naming the node when the graph cannot be re-shaped for these sizes.
  std::vector<Tensor> operator()(const std::vector<Tensor>& inputs) const;

  /// Names of the data inputs, in call order (e.g. {"data"}).
  const std::vector<std::string>& input_names() const;
  /// Exported dtype and shape of each data input.
  const std::vector<ir::TensorType>& input_types() const;
  /// Parameter names by structural path (e.g. "0.weight"), in graph order.
  const std::vector<std::string>& param_names() const;
  /// The parameters as uploaded to device(), in param_names() order.
  const std::vector<Tensor>& params() const;
  /// Number of tensors a call returns.
  int num_outputs() const;
  /// How the flat outputs nest (a bare leaf for a model returning one tensor).
  const ir::OutputStructure& output_structure() const;
  /// Where the parameters live and the model runs.
  Device device() const;
  /// Plans kept for other input shapes than the exported ones (at most kMaxReshapedPlans).
  size_t num_reshaped_plans() const;
  /// The compiled graph underneath, for the exported input shapes.
  const CachedGraph& compiled() const;

  struct State;

 private:
  friend Module load(const std::string&, const std::string&, Device);
  explicit Module(std::shared_ptr<const State> s) : s_(std::move(s)) {}
  std::shared_ptr<const State> s_;
};

/// Reads and validates `symbol_file` and `param_file`, uploads the parameters to `device` and
/// compiles the graph. Throws FormatError naming the file and exactly what differs (unreadable,
/// malformed, truncated or unknown-version files; missing, extra, misshapen or mistyped
/// parameters) and what to do; DeviceError when `device` does not exist.
Module load(const std::string& symbol_file, const std::string& param_file, Device device = cpu());

/// The params file exported next to a symbol file: "NAME-symbol.json" -> "NAME-0000.params"
/// (any other name: its extension, if any, replaced by "-0000.params").
std::string DefaultParamsPath(const std::string& symbol_file);

}  // namespace kiln
