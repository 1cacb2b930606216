// kiln's dtypes and reduce ops as NCCL's (internal to runtime/cuda; only with KILN_WITH_NCCL).
#pragma once

#include <nccl.h>

#include "kiln/runtime/collectives.h"
#include "kiln/runtime/dtype.h"
#include "kiln/runtime/error.h"

namespace kiln::coll::nccl {

/// Throws DTypeError for dtypes NCCL cannot reduce (bool), naming `what`.
inline ncclDataType_t Type(DType dt, const char* what) {
  switch (dt) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat64: return ncclFloat64;
    case DType::kFloat16: return ncclFloat16;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
    case DType::kUInt8: return ncclUint8;
    case DType::kBool: break;
  }
  KILN_THROW(DTypeError) << what << ": dtype " << DTypeName(dt)
                         << " is not supported by NCCL; cast it to uint8 or int32 first";
}

inline ncclRedOp_t Op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMean: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return ncclSum;
}

}  // namespace kiln::coll::nccl
