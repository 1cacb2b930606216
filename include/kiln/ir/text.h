// The text form of a Graph (DESIGN.md section 7): PrintGraph writes it, ParseGraph reads it back,
// and ParseGraph(PrintGraph(g)) prints byte for byte as g does. Tests and KILN_DUMP_IR use it.
// It is not the exchange format (that is NAME-symbol.json) and carries no parameters.
//
// Grammar (one statement per line; blank lines and `#` comments to the end of a line are skipped;
// spaces and tabs separate tokens anywhere within a line; `#group=`, `#stream=` and `#wait=` are
// planning notes, not comments):
//
//   graph     := { input | node } return
//   input     := VALUE '=' 'input' STRING ':' type
//   node      := VALUE { ',' VALUE } '=' OP '(' [ VALUE { ',' VALUE } ] ')' [ attrs ] ':' type { ',' type }
//                { note } [ place { place } ]
//   note      := '#group=' INT | '#stream=' INT | '#wait=' VALUE { ',' VALUE }
//   place     := '@arena+' INT | '@-'        one per result, in order
//   return    := 'return' [ VALUE { ',' VALUE } ]
//   attrs     := '{' [ NAME '=' attr { ',' NAME '=' attr } ] '}'
//   attr      := INT | FLOAT | 'true' | 'false' | DTYPE | '[' [ INT { ',' INT } ] ']'
//   type      := DTYPE '(' [ INT { ',' INT } [ ',' ] ] ')'          e.g. float32()  int64(5,)
//   VALUE     := '%' [A-Za-z0-9_.]+          defined once, before any use
//   INT       := -?[0-9]+                     (64-bit)
//   FLOAT     := a number with '.', an exponent, 'inf', '-inf' or 'nan'   e.g. 1.0  -2.5e-07
//   STRING    := '"' with \" \\ \n \r \t \xHH escapes '"'
//
// Notes and places are the typed planning annotations of ir/graph.h (NodeNote, ValueNote): a node's
// fusion group, stream and the nodes of other streams it waits for (named by their first result),
// and where each result lives in the plan's arena. The printer writes them only when set.
//
// The printer writes the canonical form: graph inputs first, then nodes in order, values renumbered
// %0, %1, ... in that order; every attribute of the op's schema in schema order (defaults
// included); floats in the shortest form that reads back to the same double, always with a '.' or
// exponent so they never read as ints; names escaped. The parser also accepts omitted attributes
// (their defaults apply), any value names, and inputs after nodes.
//
// The parser builds the graph through Graph::AddInput/AddNode, so it runs the op table's
// attribute resolution and type inference; every written type must equal the inferred one.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "kiln/ir/graph.h"

namespace kiln::ir {

/// The canonical text form of `g`. Never throws on a malformed graph: a value that does not
/// belong to `g` prints as `%<foreign N>` (N its id), a null one as `%<null>`; Verify says why.
std::string PrintGraph(const Graph& g);

/// Parses the text form. Throws FormatError "line L, column C: ..." at the first problem: what
/// was expected and what was found; an unknown op with the closest op name; a type annotation
/// that disagrees with inference, naming the node; attribute and inference errors of the op table,
/// with their position. The result satisfies every invariant of Verify.
std::unique_ptr<Graph> ParseGraph(std::string_view text);

}  // namespace kiln::ir
