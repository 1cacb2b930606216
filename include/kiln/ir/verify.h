// The graph verifier (STYLE.md convention 5): checks that a Graph is well formed. It runs before
// and after every pass in debug builds and tests, and at the end of ParseGraph. It checks
// structure and types only; it does not run kernels, look at devices or judge performance.
//
// Invariants, in the order they are checked (graph inputs, then node by node, then the graph's
// outputs and its value ids):
//   1  Graph inputs are distinct, non-null values with no producer.
//   2  Graph input names are non-empty and unique.
//   3  A node's id is its position in nodes().
//   4  Operands are defined before use: every input of a node is non-null and is a graph input or
//      an output of an earlier node (topological order; no dangling or foreign values).
//   5  Attributes match the op's schema: exactly the declared names, in schema order, each of
//      its declared kind (what OpDef::Resolve produces).
//   6  Arity matches the op: the number of inputs it declares (at least one if variadic) and the
//      number of outputs it declares for these attributes.
//   7  Each value is produced once: output i of node n has producer n and index i, and is neither
//      a graph input nor an output of another node (or another output of n).
//   8  Output types equal what the op infers from its input types and attributes.
//   9  Graph outputs are non-null values of this graph (graph inputs or node outputs).
//  10  Value ids are unique and dense: the graph inputs and node outputs are num_values() values
//      with ids 0 .. num_values()-1.
// A node whose operands, attributes or arity are wrong is not type-checked (8).
//
// Errors: a violation means whatever built or rewrote the graph is wrong (a pass, a gradient
// rule, a builder), so Verify throws InternalError. Code reading graphs from files (ParseGraph,
// the JSON loader) checks its input itself and reports FormatError; it may use VerifyAll as a
// last line of defence and rethrow its findings as FormatError.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kiln/ir/graph.h"

namespace kiln::ir {

/// Throws InternalError naming the first violated invariant (number and title), the node
/// (`node #id (op)`) or graph input/output involved, and, when given, the pass it ran after:
/// "graph verification failed after pass 'cse': invariant 4 (operands are defined before use):
/// node #2 (add): input 1 (value id 0) is not a value of this graph".
void Verify(const Graph& g, std::string_view after_pass = {});

/// Every violation, in check order, each as "invariant N (title): where: what"; empty if `g`
/// is well formed.
std::vector<std::string> VerifyAll(const Graph& g);

}  // namespace kiln::ir
