// How two values combine in a reduction: sum, max and min, in one place for every reduction of
// the runtime (the reduction kernels of cpu/reduce.cc; the host collectives of collectives.cc,
// whose loop the ring allreduce of mpi.cc reuses), so that they agree on every element. Max and
// min propagate NaN as NumPy's maximum/minimum do: a NaN operand wins, and a NaN held stays.
// Values combine in the type given (callers pass compute_t<T>, so float16 combines as float).
#pragma once

namespace kiln::host {

struct SumOp {
  template <class C> static C Apply(C a, C b) { return a + b; }
};
struct MaxOp {
  template <class C> static C Apply(C a, C b) { return (b > a || b != b) ? b : a; }  // b != b: NaN
};
struct MinOp {
  template <class C> static C Apply(C a, C b) { return (b < a || b != b) ? b : a; }
};

}  // namespace kiln::host
