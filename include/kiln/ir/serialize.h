// The two export formats of a compiled graph (DESIGN.md section 7): `NAME-symbol.json` (the graph)
// and `NAME-0000.params` (its parameters, in the safetensors layout). Both are written atomically
// and validated completely on load; every problem is a FormatError saying what was expected, what
// was found and what to do. Not here: tensors on devices (see frontend load()), memory mapping.
//
// Graph JSON, version 1. Values are numbered densely in the file: the data inputs first, then the
// params, then each node's outputs in node order; a node refers to its inputs by these numbers.
//
//   {"format": "kiln-graph", "version": 1,
//    "inputs": [{"name": "data", "dtype": "float32", "shape": [1, 512]}],          // values 0..
//    "params": [{"name": "0.weight", "dtype": "float32", "shape": [256, 512]}],    // then these
//    "nodes": [{"op": "matmul", "inputs": [0, 1], "attrs": {"transpose_a": false, ...},
//               "outputs": [{"value": 2, "dtype": "float32", "shape": [1, 256]}]}, ...],
//    "outputs": [{"value": 7, "dtype": "float32", "shape": [1, 2]}],
//    "output_structure": [0, [1, 2]]}
//
// Attribute values by kind: int -> JSON integer, float -> JSON number (or "inf", "-inf", "nan"),
// bool -> true/false, int list -> array of integers, dtype -> its name ("float32"). Every
// attribute of the op is written; on load an omitted one takes the op's default. Recorded output
// dtypes and shapes must equal what the op infers. "output_structure" nests lists of indices into
// "outputs" (a bare index for a model that returns one tensor); every output appears in it.
// Unknown keys are errors. An older version is upgraded to the current one in one place (the
// upgrade table in serialize.cc) before it is checked.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/ir/graph.h"
#include "kiln/runtime/atomic_file.h"

namespace kiln::ir {

/// The graph JSON version this kiln writes; it reads this one and upgrades older ones.
inline constexpr int kGraphFormatVersion = 1;
/// The deepest nesting of arrays and objects the graph JSON and the params header may have;
/// deeper documents are refused with FormatError before they are built.
inline constexpr int kMaxJsonDepth = 128;

/// Where each graph output goes in what a model returns: a leaf is an index into
/// Graph::outputs(), a list is a (Python) tuple or list of structures.
struct OutputStructure {
  int index = -1;                     ///< >= 0: a leaf
  std::vector<OutputStructure> items; ///< the elements of a list (index < 0)

  static OutputStructure Leaf(int i) { return {i, {}}; }
  static OutputStructure List(std::vector<OutputStructure> items) { return {-1, std::move(items)}; }
  /// [0, 1, ..., n-1]
  static OutputStructure Flat(int n);
  bool is_leaf() const { return index >= 0; }
  friend bool operator==(const OutputStructure&, const OutputStructure&) = default;
};

/// What the graph alone does not say: which graph inputs are data and which are parameters (by
/// structural path, e.g. "0.weight"), and how the outputs are grouped.
/// Graph::inputs() must be the data inputs followed by the params, in these orders.
struct GraphManifest {
  std::vector<std::string> inputs;
  std::vector<std::string> params;
  OutputStructure output_structure;
  friend bool operator==(const GraphManifest&, const GraphManifest&) = default;
};

/// A graph read from JSON: its inputs are named by the manifest and added before any node, so
/// value ids equal the file's value numbers.
struct LoadedGraph {
  std::unique_ptr<Graph> graph;
  GraphManifest manifest;
};

/// The JSON document of `g`. Throws ValueError when the manifest does not fit the graph (input
/// counts, duplicate names, output structure out of range or missing an output).
std::string GraphToJson(const Graph& g, const GraphManifest& m);
/// Parses and checks a document (any version this kiln can upgrade) and rebuilds the graph,
/// re-running inference for every node. Throws FormatError naming the JSON path of the problem.
LoadedGraph GraphFromJson(std::string_view text);

/// Atomic file writes live in runtime/ (kiln/runtime/atomic_file.h); ir's writers and their
/// callers use them under this name too.
using ::kiln::WriteFileAtomic;

/// GraphToJson written with WriteFileAtomic.
void SaveGraph(const std::string& path, const Graph& g, const GraphManifest& m);
/// GraphFromJson of a file; messages name the file.
LoadedGraph LoadGraph(const std::string& path);

/// A tensor on the host: dense, row-major, little-endian bytes (bfloat16 and float16 as their
/// 16-bit patterns, bool as 0/1 bytes).
struct HostTensor {
  DType dtype = DType::kFloat32;
  Shape shape;
  std::vector<uint8_t> bytes; ///< shape.numel() * DTypeSize(dtype) of them
  friend bool operator==(const HostTensor&, const HostTensor&) = default;
};
using NamedHostTensor = std::pair<std::string, HostTensor>;

/// Writes `params` in the safetensors layout (what the Python package's save_parameters writes,
/// through this function): 8-byte little-endian header length N, N bytes of compact JSON (keys in insertion order,
/// `"__metadata__": {"format": "kiln"}` first, ASCII-escaped, padded with spaces to a multiple of
/// 8), then the data in the given order. Atomic (kiln::WriteFileAtomic). Throws ValueError for
/// duplicate names or a byte count that does not match shape and dtype.
void SaveParams(const std::string& path, const std::vector<NamedHostTensor>& params);
/// The same with the `__metadata__` entries given (in order; none: no `__metadata__` entry), as
/// the Python package writes them (save_parameters, export).
void SaveParams(const std::string& path, const std::vector<NamedHostTensor>& params,
                const std::vector<std::pair<std::string, std::string>>& metadata);
/// The bytes SaveParams writes (for writing them together with other files: WriteFilesAtomic);
/// `path` only names the file in errors.
std::string ParamsBytes(const std::vector<NamedHostTensor>& params,
                        const std::vector<std::pair<std::string, std::string>>& metadata, const std::string& path);
/// Reads a safetensors file in file order, checking everything (see the header comment of
/// ir/params.cc). The `__metadata__` entries go to `metadata` when given.
std::vector<NamedHostTensor> LoadParams(const std::string& path,
                                        std::map<std::string, std::string>* metadata = nullptr);
/// LoadParams of the bytes of a params file; `source` names it in error messages.
std::vector<NamedHostTensor> ParseParams(std::string_view bytes, const std::string& source,
                                         std::map<std::string, std::string>* metadata = nullptr);
/// Checks loaded parameters against the manifest's params and the types of the matching graph
/// inputs, and returns them in manifest order. Throws one FormatError listing every missing,
/// extra, misshapen or mistyped parameter; `source` (e.g. the params path) names the file.
std::vector<const HostTensor*> CheckParams(const Graph& g, const GraphManifest& m,
                                           const std::vector<NamedHostTensor>& params,
                                           std::string_view source);

namespace detail {
/// For tests of the upgrade path: installs (or, with an empty function, removes) an upgrade of
/// documents of `from_version` to `from_version + 1`, given as JSON text to JSON text so that
/// this header needs no JSON library. Real upgrades live in the table in serialize.cc.
void SetGraphUpgradeForTesting(int from_version, std::function<std::string(const std::string&)> fn);
} // namespace detail

} // namespace kiln::ir
