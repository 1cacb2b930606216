// Tensor: creation, host access (the sync points), device copies.
#include "kiln/frontend/tensor.h"

#include "kiln/frontend/tracer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <vector>

#include "kiln/frontend/autograd.h"
#include "kiln/frontend/dispatch.h"
#include "kiln/runtime/cpu/copy.h"
#include "kiln/runtime/engine.h"
#include "kiln/runtime/cuda.h"

namespace kiln {

namespace {
Tensor MakeEmpty(const Shape& shape, DType dtype, Device device, bool reserve) {
  for (int64_t d : shape)
    if (d < 0)
      KILN_THROW(ShapeError) << "shape " << shape.str() << " has a negative dimension; sizes must be >= 0";
  auto impl = std::make_shared<TensorImpl>();
  // NumBytes refuses a byte count that wraps around 64 bits (ShapeError) before any allocation.
  size_t nbytes = static_cast<size_t>(shape.NumBytes(static_cast<int64_t>(DTypeSize(dtype))));
  impl->storage = reserve ? std::make_shared<Storage>(nbytes, device, Storage::Reserve{})
                          : std::make_shared<Storage>(nbytes, device);
  impl->shape = shape;
  impl->strides = shape.ContiguousStrides();
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}
}  // namespace

Tensor Tensor::Empty(const Shape& shape, DType dtype, Device device) { return MakeEmpty(shape, dtype, device, false); }
Tensor Tensor::Reserved(const Shape& shape, DType dtype, Device device) { return MakeEmpty(shape, dtype, device, true); }

Tensor Tensor::FromHost(const void* data, const Shape& shape, DType dtype, Device device) {
  size_t nbytes = static_cast<size_t>(shape.numel()) * DTypeSize(dtype);
  if (device.is_cpu()) {
    Tensor t = Empty(shape, dtype, device);  // fresh storage: nobody else can see it yet
    if (nbytes) std::memcpy(t.storage()->data(), data, nbytes);
    return t;
  }
  Tensor host = FromHost(data, shape, dtype, cpu());
  return host.To(device);
}

Tensor Tensor::Scalar(double value, DType dtype, Device device) {
  Tensor t = Empty(Shape{}, dtype, device.is_cpu() ? device : cpu());
  host::Fill(t.View(), value);
  return device.is_cpu() ? t : t.To(device);
}

void Tensor::WaitToRead() const {
  if (impl_->symbol) trace::ThrowSymbolicRead("reading an array (asnumpy, item, wait_to_read, print)");
  engine::Engine::Get().WaitForVar(impl_->storage->var());
}

void Tensor::CopyToHost(void* dst) const {
  if (!device().is_cpu()) {
    To(cpu()).CopyToHost(dst);
    return;
  }
  WaitToRead();
  TensorView d = View();
  d.data = dst;
  d.strides = d.shape.ContiguousStrides();
  host::CopyConvert(View(), d);
}

template <class T>
std::vector<T> Tensor::ToVector() const {
  Tensor src = device().is_cpu() ? *this : To(cpu());
  src.WaitToRead();
  std::vector<T> out(static_cast<size_t>(numel()));
  TensorView d;
  d.dtype = DTypeOf<T>::value;
  d.shape = shape();
  d.strides = shape().ContiguousStrides();
  if constexpr (std::is_same_v<T, bool>) {
    std::vector<uint8_t> tmp(out.size());
    d.data = tmp.data();
    host::CopyConvert(src.View(), d);
    for (size_t i = 0; i < out.size(); ++i) out[i] = tmp[i] != 0;
  } else {
    d.data = out.data();
    host::CopyConvert(src.View(), d);
  }
  return out;
}
template std::vector<float> Tensor::ToVector<float>() const;
template std::vector<double> Tensor::ToVector<double>() const;
template std::vector<int32_t> Tensor::ToVector<int32_t>() const;
template std::vector<int64_t> Tensor::ToVector<int64_t>() const;
template std::vector<uint8_t> Tensor::ToVector<uint8_t>() const;
template std::vector<bool> Tensor::ToVector<bool>() const;

double Tensor::Item() const {
  if (numel() != 1)
    KILN_THROW(ShapeError) << "item(): the tensor has " << numel() << " elements " << shape().str()
                           << "; item() needs exactly one";
  return ToVector<double>()[0];
}

std::string Tensor::str() const {
  if (impl_->symbol)
    return "<symbolic " + std::string(DTypeName(dtype())) + shape().str() + " of a hybridized trace>";
  std::vector<double> v = ToVector<double>();
  std::ostringstream os;
  os.precision(IsFloat(dtype()) ? 6 : 19);
  const Shape& s = shape();
  std::vector<int64_t> strides(s.rank());
  int64_t acc = 1;
  for (int i = s.rank() - 1; i >= 0; --i) strides[i] = acc, acc *= s[i];
  std::function<void(int, int64_t)> rec = [&](int dim, int64_t base) {
    if (dim == s.rank()) {
      double x = v[base];
      if (dtype() == DType::kBool) os << (x != 0 ? "True" : "False");
      else if (IsFloat(dtype()) && std::isfinite(x) && x == std::floor(x) && std::fabs(x) < 1e15) os << x << ".";
      else os << x;
      return;
    }
    os << "[";
    int64_t n = s[dim];
    for (int64_t i = 0; i < n; ++i) {
      if (n > 12 && i == 6) {
        os << "..., ";
        i = n - 6;
      }
      rec(dim + 1, base + i * strides[dim]);
      if (i + 1 < n) os << (dim + 1 < s.rank() ? ",\n" + std::string(dim + 1, ' ') : ", ");
    }
    os << "]";
  };
  rec(0, 0);
  os << "\n<Tensor " << s.str() << " " << DTypeName(dtype()) << " @" << device().str() << ">";
  return os.str();
}

// ---- copies between devices ----------------------------------------------------------------------

namespace {
// [lowest, highest) byte offset in its storage that a view can reach; empty for no elements.
std::pair<int64_t, int64_t> ByteRange(const Tensor& t) {
  if (t.numel() == 0) return {0, 0};
  const int64_t es = static_cast<int64_t>(DTypeSize(t.dtype()));
  int64_t lo = t.offset(), hi = t.offset();
  for (int d = 0; d < t.rank(); ++d) {
    int64_t reach = (t.shape()[d] - 1) * t.strides()[d];
    (reach < 0 ? lo : hi) += reach;
  }
  return {lo * es, (hi + 1) * es};
}

bool SameView(const Tensor& a, const Tensor& b) {
  return a.SharesStorage(b) && a.offset() == b.offset() && a.dtype() == b.dtype() && a.shape() == b.shape() &&
         a.strides() == b.strides();
}

void CopyData(const Tensor& self, const Tensor& dst);
}  // namespace

bool MemoryOverlaps(const Tensor& a, const Tensor& b) {
  if (!a.SharesStorage(b)) return false;
  auto [alo, ahi] = ByteRange(a);
  auto [blo, bhi] = ByteRange(b);
  return alo < ahi && blo < bhi && alo < bhi && blo < ahi;
}

void Tensor::CopyTo(const Tensor& dst) const {
  if (!(dst.shape() == shape()))
    KILN_THROW(ShapeError) << "copyto: source shape " << shape().str() << " does not match destination "
                           << dst.shape().str();
  if (dst.dtype() != dtype())
    KILN_THROW(DTypeError) << "copyto: source dtype " << DTypeName(dtype()) << " does not match destination "
                           << DTypeName(dst.dtype()) << "; use astype() first";
  if (trace::Active() || impl_->symbol || dst.impl()->symbol) {
    if (!trace::Active()) trace::ThrowSymbolicRead("copyto");
    trace::RecordAssign(*this, dst);
    return;
  }
  if (autograd::IsRecording()) autograd::RecordWrite(*this, dst);
  // The copy itself is plain data movement (the temporaries below are not part of the record).
  autograd::PauseScope pause(autograd::IsTraining());
  CopyData(*this, dst);
}

namespace {
void CopyData(const Tensor& self, const Tensor& dst) {
  if (SameView(self, dst)) return;  // x[:] = x: nothing moves
  if (MemoryOverlaps(self, dst)) {
    // x[:] = x[::-1], z[:] = z.T: an element-by-element copy would read values it already wrote.
    Tensor tmp = Tensor::Empty(self.shape(), self.dtype(), self.device());
    CopyData(self, tmp);
    CopyData(tmp, dst);
    return;
  }
  Device sd = self.device(), dd = dst.device();
  engine::Var* r[1] = {self.storage()->var()};
  engine::Var* w[1] = {dst.storage()->var()};
  engine::TaskOptions o;
  o.name = "copyto";
  o.bytes = dst.storage()->nbytes();
  Tensor src = self;
  if (sd.is_cpu() && dd.is_cpu()) {
    o.device = dd;
    engine::Engine::Get().Push([src, dst] { host::CopyConvert(src.View(), dst.View()); }, r, w, o);
    return;
  }
  // GPU transfers move contiguous bytes; a strided source goes through a contiguous temporary.
  if (!src.is_contiguous()) src = src.Contiguous();
  if (!dst.is_contiguous() && dd.is_cpu()) {
    Tensor tmp = Tensor::Empty(dst.shape(), dst.dtype(), dd);
    CopyData(src, tmp);
    CopyData(tmp, dst);  // host to host
    return;
  }
  if (!dst.is_contiguous()) {
    // A strided destination on a GPU (a slice being assigned: a[1:, 1:] += b) is written run by
    // run from a contiguous copy on its device, each run a contiguous stretch of its innermost
    // dimension (an overlapping source was copied to a temporary above).
    if (!(src.device() == dd)) src = src.To(dd, /*copy=*/true);
    r[0] = src.storage()->var();
    o.device = dd;
    o.stream = engine::StreamKind::kCopyH2D;
    engine::Engine::Get().Push([src, dst] {
      const int rank = dst.rank();
      const bool inner_dense = dst.strides()[rank - 1] == 1;
      const int outer = inner_dense ? rank - 1 : rank;  // dimensions that select a run
      const int64_t run = inner_dense ? dst.shape()[rank - 1] : 1;
      const size_t es = DTypeSize(dst.dtype());
      char* dbase = static_cast<char*>(dst.View().data);
      const char* sbase = static_cast<const char*>(src.View().data);
      std::vector<int64_t> idx(static_cast<size_t>(outer), 0);
      for (int64_t k = 0, runs = dst.numel() / std::max<int64_t>(run, 1); k < runs; ++k) {
        int64_t off = 0;
        for (int d = 0; d < outer; ++d) off += idx[static_cast<size_t>(d)] * dst.strides()[d];
        cuda::CopyAsync(dbase + off * static_cast<int64_t>(es), sbase + k * run * static_cast<int64_t>(es),
                        static_cast<size_t>(run) * es, cuda::CopyKind::kDeviceToDevice);
        for (int d = outer - 1; d >= 0 && ++idx[static_cast<size_t>(d)] == dst.shape()[d]; --d)
          idx[static_cast<size_t>(d)] = 0;
      }
    }, r, w, o);
    return;
  }
  r[0] = src.storage()->var();
  size_t nbytes = static_cast<size_t>(self.numel()) * DTypeSize(self.dtype());
  if (sd.is_cpu()) {
    o.device = dd;
    o.stream = engine::StreamKind::kCopyH2D;
    engine::Engine::Get().Push([src, dst, nbytes] {
      cuda::CopyAsync(dst.View().data, src.View().data, nbytes, cuda::CopyKind::kHostToDevice);
    }, r, w, o);
  } else if (dd.is_cpu()) {
    o.device = sd;
    o.stream = engine::StreamKind::kCopyD2H;
    engine::Engine::Get().Push([src, dst, nbytes] {
      cuda::CopyAsync(dst.View().data, src.View().data, nbytes, cuda::CopyKind::kDeviceToHost);
    }, r, w, o);
  } else {
    o.device = dd;
    o.stream = engine::StreamKind::kCopyH2D;
    engine::Engine::Get().Push([src, dst, nbytes, sd, dd] {
      if (sd == dd) cuda::CopyAsync(dst.View().data, src.View().data, nbytes, cuda::CopyKind::kDeviceToDevice);
      else cuda::CopyPeerAsync(dst.View().data, dd, src.View().data, sd, nbytes);
    }, r, w, o);
  }
}
}  // namespace

Tensor Tensor::To(Device device, bool copy) const {
  if (device == this->device() && !copy) return *this;
  if (trace::Active() || impl_->symbol) {
    if (device != this->device())
      KILN_THROW(DeviceError) << "hybridize: copying between devices inside a hybridized block is not supported "
                                 "yet; move the inputs before calling the block";
    return Invoke1("copy", {*this});
  }
  CheckDeviceExists(device);
  Tensor out = Empty(shape(), dtype(), device);
  CopyTo(out);
  return out;
}

Tensor Tensor::AsType(DType dtype) const {
  if (dtype == this->dtype()) return *this;
  return Invoke1("cast", {*this}, {{"dtype", dtype}});
}

Tensor Tensor::Contiguous() const {
  if (is_contiguous()) return *this;
  return Invoke1("copy", {*this});
}

}  // namespace kiln
