// Every op kiln has, one line each (DESIGN.md section 3). The line is the op's declaration as far
// as names and identity go; the layers expand these X-macro lists into what they need:
//   runtime/  the op ids (kiln::op::kAdd, ...; op_id.h), the scalar functions of elementwise ops
//             (kiln::UnaryFn / kiln::BinaryFn; scalar_fn.h) and the CPU kernels that run them;
//   ir/       the op table, which attaches schema, inference, fusion kind and gradient to each id
//             and checks at start-up that every op listed here was declared exactly once;
//   codegen/  the LLVM lowering of each scalar function;
//   frontend/ the C++ wrappers kiln::nd::<nd_name>;  python/  kiln.nd.<nd_name>.
// Not here: attributes, shapes, gradients (ir/ops_*.cc) and kernels of non-elementwise ops.
//
// Adding a unary elementwise op (softplus and mish show it: four files):
//   1. one line in KILN_UNARY_OPS below: id, name, C++/Python name, dtypes, doc;
//   2. its scalar body: in scalar_fn.h (ExpandUnary) when it composes other scalar functions,
//      which the CPU kernels and codegen both expand; for a new primitive, a case in
//      runtime/cpu/elementwise.cc (and one in codegen/lower.cc to fuse it: without, its groups
//      run unfused);
//   3. its gradient in ir/ops_elementwise.cc (UnaryGrad), or none: not differentiable;
//   4. its conformance cases in tests/cpp/conformance_elementwise.cc (eager, hybridized, gradient).
// kiln::nd::<nd_name>, kiln.nd.<nd_name>, the op table entry, the CPU kernel binding and the
// codegen name follow from the line.
// Ids are positions in these lists: the order is not a file format (graphs name ops by name).
#pragma once

// Unary elementwise ops: X(Id, name, nd_name, domain, doc)
//   Id       the op id (kiln::op::Id) and its scalar function (kiln::UnaryFn::Id)
//   name     the op's name in graphs, IR text and symbol files
//   nd_name  the function kiln::nd::nd_name (C++) and kiln.nd.nd_name (Python)
//   domain   FloatOnly (floating dtypes), Numeric (every dtype but bool) or Any
#define KILN_UNARY_OPS(X)                                                                          \
  X(kNeg, neg, negative, Numeric, "-x")                                                            \
  X(kAbs, abs, abs, Numeric, "|x|")                                                                \
  X(kSign, sign, sign, Numeric, "-1, 0 or 1")                                                      \
  X(kSquare, square, square, Numeric, "x * x")                                                     \
  X(kSqrt, sqrt, sqrt, FloatOnly, "square root")                                                   \
  X(kRsqrt, rsqrt, rsqrt, FloatOnly, "1 / sqrt(x)")                                                \
  X(kReciprocal, reciprocal, reciprocal, FloatOnly, "1 / x")                                       \
  X(kExp, exp, exp, FloatOnly, "e^x")                                                              \
  X(kLog, log, log, FloatOnly, "natural logarithm")                                                \
  X(kLog1p, log1p, log1p, FloatOnly, "log(1 + x)")                                                 \
  X(kExpm1, expm1, expm1, FloatOnly, "e^x - 1")                                                    \
  X(kSin, sin, sin, FloatOnly, "sine")                                                             \
  X(kCos, cos, cos, FloatOnly, "cosine")                                                           \
  X(kTanh, tanh, tanh, FloatOnly, "hyperbolic tangent")                                            \
  X(kErf, erf, erf, FloatOnly, "error function")                                                   \
  X(kRelu, relu, relu, Numeric, "max(x, 0)")                                                       \
  X(kFloor, floor, floor, Numeric, "round down")                                                   \
  X(kCeil, ceil, ceil, Numeric, "round up")                                                        \
  X(kRound, round, round, Numeric, "round half away from zero")                                    \
  X(kLogicalNot, logical_not, logical_not, Any, "x == 0, as bool")                                \
  X(kSoftplus, softplus, softplus, FloatOnly, "log(1 + e^x), MXNet's softrelu")                  \
  X(kMish, mish, mish, FloatOnly, "x * tanh(softplus(x))")

// Binary elementwise ops with NumPy broadcasting: X(Id, name, nd_name, doc); Id names the op and
// its kiln::BinaryFn. Comparisons come last (ReturnsBool relies on it).
#define KILN_BINARY_OPS(X)                                                                         \
  X(kAdd, add, add, "a + b")                                                                       \
  X(kSub, sub, subtract, "a - b")                                                                  \
  X(kMul, mul, multiply, "a * b")                                                                  \
  X(kDiv, div, divide, "a / b (integer division truncates toward zero)")                           \
  X(kPow, pow, power, "a ** b")                                                                    \
  X(kMaximum, maximum, maximum, "elementwise max (ties send the gradient to a)")                   \
  X(kMinimum, minimum, minimum, "elementwise min (ties send the gradient to a)")                   \
  X(kEqual, equal, equal, "a == b")                                                                \
  X(kNotEqual, not_equal, not_equal, "a != b")                                                     \
  X(kLess, less, less, "a < b")                                                                    \
  X(kLessEqual, less_equal, less_equal, "a <= b")                                                  \
  X(kGreater, greater, greater, "a > b")                                                           \
  X(kGreaterEqual, greater_equal, greater_equal, "a >= b")

// Every other op: X(Id, name). Their C++ and Python wrappers take attributes and are written by
// hand (frontend/ops.cc, python/src/ndarray.cc).
#define KILN_OTHER_OPS(X)                                                                          \
  X(kWhere, where)                                                                                 \
  X(kCast, cast)                                                                                   \
  X(kCopy, copy)                                                                                   \
  X(kStopGradient, stop_gradient)                                                                  \
  X(kSum, sum)                                                                                     \
  X(kMean, mean)                                                                                   \
  X(kMax, max)                                                                                     \
  X(kMin, min)                                                                                     \
  X(kArgmax, argmax)                                                                               \
  X(kArgmin, argmin)                                                                               \
  X(kReshape, reshape)                                                                             \
  X(kTranspose, transpose)                                                                         \
  X(kSlice, slice)                                                                                 \
  X(kSliceGrad, slice_grad)                                                                        \
  X(kBroadcastTo, broadcast_to)                                                                    \
  X(kExpandDims, expand_dims)                                                                      \
  X(kSqueeze, squeeze)                                                                             \
  X(kConcat, concat)                                                                               \
  X(kStack, stack)                                                                                 \
  X(kSplit, split)                                                                                 \
  X(kTake, take)                                                                                   \
  X(kTakeGrad, take_grad)                                                                          \
  X(kOneHot, one_hot)                                                                              \
  X(kMatmul, matmul)                                                                               \
  X(kConv2d, conv2d)                                                                               \
  X(kConv2dGradData, conv2d_grad_data)                                                             \
  X(kConv2dGradWeight, conv2d_grad_weight)                                                         \
  X(kMaxPool2d, max_pool2d)                                                                        \
  X(kMaxPool2dGrad, max_pool2d_grad)                                                               \
  X(kAvgPool2d, avg_pool2d)                                                                        \
  X(kAvgPool2dGrad, avg_pool2d_grad)                                                               \
  X(kBatchNormTrain, batch_norm_train)                                                             \
  X(kBatchNormTrainGrad, batch_norm_train_grad)                                                    \
  X(kFull, full)                                                                                   \
  X(kRandomUniform, random_uniform)                                                                \
  X(kRandomNormal, random_normal)                                                                  \
  X(kRandomBernoulli, random_bernoulli)                                                            \
  X(kArange, arange)                                                                               \
  X(kCallGraph, call_graph)                                                                        \
  X(kCallGraphBackward, call_graph_backward)
