// CPU kernels of the movement ops (reshape, transpose, slice, concat, stack, split, take,
// one_hot, ...). The slice arithmetic they share with inference is NormalizeSlice in shape.h.
// Copies move raw bytes (dtype-agnostic): strided copies coalesce dimensions first, then take a
// row-memcpy path, a cache-tiled path for transposes, or a plain strided loop. Kernels write
// into the views they are given and never allocate tensors; they do not convert dtypes (that is
// host::CopyConvert in copy.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kiln/runtime/tensor_view.h"

namespace kiln::host {

/// dst = src: equal shapes and dtypes, any strides on either side (0 and negative included on
/// src). Multithreaded for large tensors.
void CopyStrided(const TensorView& src, const TensorView& dst);

/// Concatenates `in` along `axis` into `out` (equal dtypes; all other dims equal). Inputs may be
/// strided; a contiguous `out` with contiguous inputs takes one parallel pass of block copies.
void Concat(std::span<const TensorView> in, const TensorView& out, int axis);
/// The inverse of Concat: `in` cut along `axis` into consecutive pieces `out`.
void Split(const TensorView& in, std::span<const TensorView> out, int axis);

/// out = x.take(indices, axis) (NumPy): contiguous x, indices (int32/int64) and out; negative
/// indices wrap once. Throws ValueError naming the first bad index and the valid range, before
/// writing anything.
void Take(const TensorView& x, const TensorView& indices, const TensorView& out, int axis);
/// The gradient of Take: dx = zeros, then dx[..., indices[j], ...] += dy[..., j, ...] along
/// `axis`, repeated indices accumulating. Contiguous floating operands. No atomics: threads own
/// disjoint rows or column ranges of dx.
void TakeGrad(const TensorView& dy, const TensorView& indices, const TensorView& dx, int axis);

/// out[..., k] = (indices[...] == k) ? on : off for k < depth = out.shape.back(); an index
/// outside [0, depth) gives a row of `off`. Contiguous operands; any output dtype.
/// `labels`: the indices are class labels; one outside [0, depth) is a ValueError (RaiseBadLabel)
/// instead of an all-off row.
void OneHot(const TensorView& indices, const TensorView& out, double on, double off, bool labels = false);
/// Throws the ValueError of a class label outside [0, classes) (CPU and GPU kernels alike);
/// `found_by` is appended (where a GPU's check found it).
[[noreturn]] void RaiseBadLabel(int64_t label, int64_t position, int64_t classes, const char* found_by = "");
/// Throws the ValueError of take's (or take_grad's: `op`) index outside [-dim, dim) at `position`
/// of the indices, for axis `axis` (CPU and GPU kernels alike); `found_by` is appended.
[[noreturn]] void RaiseBadIndex(const char* op, int64_t index, int64_t position, int axis, int64_t dim,
                                const char* found_by = "");

}  // namespace kiln::host
