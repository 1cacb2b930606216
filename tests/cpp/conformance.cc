// The conformance runner (see conformance.h): runs every registered case on every available
// device, in each of its dtypes, with contiguous and strided inputs, against its double-precision
// reference; checks gradients of differentiable ops against central differences in float64; and
// checks that every op of the op table has a case; and runs every case hybridized (the op traced
// into a graph and compiled as hybridize() compiles it) against its eager result. Failures are
// collected per run and reported one CHECK each, so one failing case never hides another. It
// times nothing.
#include "conformance.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <optional>
#include <set>
#include <sstream>

#include "kiln/frontend/autograd.h"
#include "kiln/frontend/cached_graph.h"
#include "kiln/frontend/dispatch.h"
#include "kiln/ir/op.h"

namespace kiln::testing {

// ---- input helpers -------------------------------------------------------------------------------

HostTensor Arange(const Shape& shape, double start, double step, DType dtype) {
  HostTensor t{shape, std::vector<double>(static_cast<size_t>(shape.numel())), dtype};
  for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = start + step * static_cast<double>(i);
  return t;
}

namespace {
uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
}  // namespace

HostTensor Uniform(const Shape& shape, double lo, double hi, uint64_t seed, DType dtype) {
  HostTensor t{shape, std::vector<double>(static_cast<size_t>(shape.numel())), dtype};
  uint64_t state = seed;
  for (double& v : t.data) v = lo + (hi - lo) * static_cast<double>(SplitMix64(state) >> 11) * 0x1.0p-53;
  return t;
}

HostTensor Ints(const Shape& shape, std::vector<double> values, DType dtype) {
  KILN_CHECK(static_cast<int64_t>(values.size()) == shape.numel())
      << "Ints: " << values.size() << " values do not fill shape " << shape.str();
  return HostTensor{shape, std::move(values), dtype};
}

// ---- registry ------------------------------------------------------------------------------------

namespace {

struct Group {
  std::string name;
  std::vector<OpCase> (*make)();
};

std::vector<Group>& Groups() {
  static std::vector<Group> groups;
  return groups;
}

struct Loaded {
  std::vector<OpCase> cases;
  std::vector<std::string> errors;  // groups whose case builder threw
};

// Cases are built on first use, not at static initialization: building them may touch the op
// table, and the order of static initializers across files is unspecified.
const Loaded& Cases() {
  static const Loaded loaded = [] {
    Loaded l;
    std::vector<Group> groups = Groups();
    std::sort(groups.begin(), groups.end(), [](const Group& a, const Group& b) { return a.name < b.name; });
    for (const Group& g : groups) {
      try {
        for (OpCase& c : g.make()) l.cases.push_back(std::move(c));
      } catch (const std::exception& e) {
        l.errors.push_back("conformance group '" + g.name + "': building its cases threw: " + e.what());
      }
    }
    return l;
  }();
  return loaded;
}

}  // namespace

void RegisterCases(const char* group, std::vector<OpCase> (*make)()) { Groups().push_back({group, make}); }

namespace {

// ---- tensors from host data ----------------------------------------------------------------------

const OpCase kDefaults;

/// `v` as stored in `t` and read back (16-bit floats round, integers truncate).
double RoundTo(double v, DType t) {
  double r = 0;
  KILN_DISPATCH_ALL(t, {
    scalar_t s = static_cast<scalar_t>(static_cast<compute_t<scalar_t>>(v));
    r = static_cast<double>(static_cast<compute_t<scalar_t>>(s));
  });
  return r;
}

void Store(void* base, DType t, int64_t i, double v) {
  KILN_DISPATCH_ALL(
      t, { static_cast<scalar_t*>(base)[i] = static_cast<scalar_t>(static_cast<compute_t<scalar_t>>(v)); });
}

/// The inputs of one run: floating inputs in `dtype` (when given), others in their own dtype,
/// values rounded through the dtype so the reference sees what the kernel sees.
std::vector<HostTensor> RunInputs(const std::vector<HostTensor>& in, std::optional<DType> dtype) {
  std::vector<HostTensor> out = in;
  for (HostTensor& h : out) {
    if (dtype && IsFloat(h.dtype)) h.dtype = *dtype;
    for (double& v : h.data) v = RoundTo(v, h.dtype);
  }
  return out;
}

/// A tensor holding `h` on `device`. Strided: each element at twice its contiguous stride after
/// one leading pad element, the gaps filled with a sentinel, so a kernel that ignores strides or
/// the offset reads visibly wrong values.
Tensor MakeTensor(const HostTensor& h, Device device, bool strided) {
  KILN_CHECK(static_cast<int64_t>(h.data.size()) == h.shape.numel())
      << "host tensor has " << h.data.size() << " values for shape " << h.shape.str();
  const int64_t n = h.shape.numel();
  const size_t es = DTypeSize(h.dtype);
  if (!strided) {
    std::vector<unsigned char> buf(static_cast<size_t>(n) * es);
    for (int64_t i = 0; i < n; ++i) Store(buf.data(), h.dtype, i, h.data[static_cast<size_t>(i)]);
    return Tensor::FromHost(buf.data(), h.shape, h.dtype, device);
  }
  const int64_t total = 2 * n + 1;
  std::vector<unsigned char> buf(static_cast<size_t>(total) * es);
  const double sentinel = IsFloat(h.dtype) ? std::nan("") : h.dtype == DType::kBool ? 1.0 : 77.0;
  for (int64_t i = 0; i < total; ++i) Store(buf.data(), h.dtype, i, sentinel);
  Strides strides = h.shape.ContiguousStrides();
  for (int64_t& s : strides) s *= 2;
  for (int64_t i = 0; i < n; ++i) {
    int64_t rem = i, pos = 1;
    for (int d = h.shape.rank() - 1; d >= 0; --d) {
      pos += (rem % h.shape[d]) * strides[d];
      rem /= h.shape[d];
    }
    Store(buf.data(), h.dtype, pos, h.data[static_cast<size_t>(i)]);
  }
  Tensor base = Tensor::FromHost(buf.data(), Shape{total}, h.dtype, device);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->offset = 1;
  impl->shape = h.shape;
  impl->strides = strides;
  impl->dtype = h.dtype;
  return Tensor(std::move(impl));
}

// ---- comparison ----------------------------------------------------------------------------------

struct Tolerance {
  double rtol = 0, atol = 0;
  bool exact = true;
};

// float64 is held to 1e-9/1e-12 unless the case loosened its tolerances above the defaults (a
// sign that the reference itself is approximate); 16-bit floats to 2e-2 (or the case's, if looser).
Tolerance ToleranceFor(const OpCase& c, DType out) {
  switch (out) {
    case DType::kFloat32: return {c.rtol, c.atol, false};
    case DType::kFloat64:
      return {c.rtol > kDefaults.rtol ? c.rtol : 1e-9, c.atol > kDefaults.atol ? c.atol : 1e-12, false};
    case DType::kFloat16:
    case DType::kBFloat16: return {std::max(2e-2, c.rtol), std::max(2e-2, c.atol), false};
    default: return {0, 0, true};
  }
}

bool Close(double got, double want, const Tolerance& t) {
  if (std::isnan(got) || std::isnan(want)) return std::isnan(got) && std::isnan(want);
  if (got == want) return true;  // also equal infinities
  if (t.exact || std::isinf(got) || std::isinf(want)) return false;
  return std::fabs(got - want) <= t.atol + t.rtol * std::fabs(want);
}

std::string Num(double v) {
  std::ostringstream os;
  os << std::setprecision(17) << v;
  return os.str();
}

std::string IndexStr(const Shape& shape, int64_t flat) {
  std::vector<int64_t> idx(static_cast<size_t>(shape.rank()));
  for (int d = shape.rank() - 1; d >= 0; --d) {
    idx[static_cast<size_t>(d)] = flat % shape[d];
    flat /= shape[d];
  }
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < idx.size(); ++i) os << (i ? ", " : "") << idx[i];
  os << "]";
  return os.str();
}

// ---- one forward run -----------------------------------------------------------------------------

struct Run {
  const OpCase& c;
  std::optional<DType> dtype;  // nullopt: the case has no floating inputs
  Device device;
  bool strided;

  std::string str() const {
    std::ostringstream os;
    os << "case '" << c.label << "' (op " << c.op;
    if (!c.attrs.empty()) os << " {" << c.attrs.str() << "}";
    os << ", " << (dtype ? DTypeName(*dtype) : "no floating inputs") << ", " << device.str();
    if (!c.inputs.empty()) os << ", " << (strided ? "non-contiguous" : "contiguous") << " inputs";
    os << ")";
    return os.str();
  }
};

bool HasFloatInput(const OpCase& c) {
  return std::any_of(c.inputs.begin(), c.inputs.end(), [](const HostTensor& h) { return IsFloat(h.dtype); });
}

/// Compares output `k` with its reference; returns "" when they agree.
std::string CompareOutput(const Run& run, int k, const Tensor& out, const HostTensor& ref,
                          const ir::TensorType& declared) {
  std::ostringstream err;
  if (out.dtype() != declared.dtype) {
    err << "output " << k << " has dtype " << DTypeName(out.dtype()) << " but the op declares "
        << DTypeName(declared.dtype);
    return err.str();
  }
  if (!(out.shape() == ref.shape) || !(out.shape() == declared.shape)) {
    err << "output " << k << " has shape " << out.shape().str() << "; the reference has " << ref.shape.str()
        << " and the op declares " << declared.shape.str();
    return err.str();
  }
  if (static_cast<int64_t>(ref.data.size()) != ref.shape.numel())
    return "the reference of output " + std::to_string(k) + " has " + std::to_string(ref.data.size()) +
           " values for shape " + ref.shape.str() + " (a bug in the case)";
  std::vector<double> got = out.ToVector<double>();
  Tolerance tol = ToleranceFor(run.c, out.dtype());
  int64_t first = -1, bad = 0;
  double want_first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double want = IsFloat(out.dtype()) ? RoundTo(ref.data[i], out.dtype()) : ref.data[i];
    if (Close(got[i], want, tol)) continue;
    if (bad++ == 0) first = static_cast<int64_t>(i), want_first = want;
  }
  if (bad == 0) return "";
  err << "output " << k << " (" << DTypeName(out.dtype()) << out.shape().str() << ") differs at "
      << IndexStr(out.shape(), first) << " (flat " << first << "): got "
      << Num(got[static_cast<size_t>(first)]) << ", expected " << Num(want_first);
  if (tol.exact)
    err << " (exact)";
  else
    err << " (rtol " << tol.rtol << ", atol " << tol.atol << ")";
  err << "; " << bad << " of " << got.size() << " elements differ";
  return err.str();
}

/// RunForward's result for a GPU kernel that declares it does not take the run's dtypes and
/// refused them with a DTypeError, as it should (reported, not failed).
const char* const kRefusedDType = "refused: dtypes the GPU kernel does not take";

/// Runs the case once; returns "" on success, else what went wrong. Checkers report through
/// their own doctest CHECKs (with the run in INFO).
std::string RunForward(const Run& run) {
  const OpCase& c = run.c;
  try {
    const ir::OpDef& def = ir::GetOp(ir::FindOp(c.op));
    ir::Attrs attrs = def.Resolve(c.attrs);
    std::vector<HostTensor> host = RunInputs(c.inputs, run.dtype);
    std::vector<Tensor> in;
    std::vector<ir::TensorType> types;
    for (const HostTensor& h : host) {
      in.push_back(MakeTensor(h, run.device, run.strided));
      types.push_back({h.shape, h.dtype});
    }
    if (run.device.is_gpu()) {  // a kernel that declares its dtypes (KernelBinding::dtypes) refuses others
      const KernelBinding* kb = KernelTable::Get().Find(def.id, DeviceType::kGPU);
      bool takes = !kb->dtypes;
      if (!takes) {
        takes = true;
        for (const ir::TensorType& t : types) takes = takes && (kb->dtypes & DTypeBit(t.dtype));
        for (const ir::TensorType& t : def.Infer(types, attrs)) takes = takes && (kb->dtypes & DTypeBit(t.dtype));
      }
      if (!takes) {
        // The refusal itself is checked: a typed error before anything runs.
        try {
          Invoke(def.id, in, c.attrs, run.device);
        } catch (const DTypeError&) {
          return kRefusedDType;
        }
        return "the GPU kernel declares it does not take these dtypes, yet the op ran";
      }
    }
    std::vector<Tensor> out = Invoke(def.id, in, c.attrs, run.device);
    if (!c.reference) {
      if (!c.check) return "the case has neither a reference nor a checker";
      INFO(run.str());
      c.check(out, attrs);
      return "";
    }
    std::vector<ir::TensorType> declared = def.Infer(types, attrs);
    std::vector<HostTensor> ref = c.reference(host, attrs);
    if (out.size() != ref.size() || out.size() != declared.size())
      return "the op returned " + std::to_string(out.size()) + " outputs; the reference has " +
             std::to_string(ref.size()) + " and the op declares " + std::to_string(declared.size());
    std::string errs;
    for (size_t k = 0; k < out.size(); ++k) {
      std::string e = CompareOutput(run, static_cast<int>(k), out[k], ref[k], declared[k]);
      if (!e.empty()) errs += (errs.empty() ? "" : "; ") + e;
    }
    return errs;
  } catch (const std::exception& e) {
    return std::string("threw: ") + e.what();
  }
}

/// Runs the case eagerly and hybridized: the op traced on symbolic inputs into a graph, compiled
/// through the hybridize pipeline (passes, fusion, codegen, plan) and called on the same inputs.
/// Returns "" when every output agrees with the eager one within the case's tolerance (twice it:
/// both sides carry their own rounding; integer and bool outputs exactly). Random ops draw other
/// numbers in a graph, so their checker judges the hybridized outputs instead. With `chained`,
/// an elementwise op's outputs are negated (logical_not for bool) on both sides, so that the op
/// fuses into a generated kernel: a lone elementwise op runs its library kernel.
std::string RunHybridized(const Run& run, bool chained) {
  const OpCase& c = run.c;
  try {
    const ir::OpDef& def = ir::GetOp(ir::FindOp(c.op));
    std::vector<HostTensor> host = RunInputs(c.inputs, run.dtype);
    std::vector<Tensor> in;
    for (const HostTensor& h : host) in.push_back(MakeTensor(h, run.device, run.strided));
    auto f = [&](const std::vector<Tensor>& x) {
      std::vector<Tensor> y = Invoke(def.id, x, c.attrs, run.device);
      if (chained)
        for (Tensor& t : y) t = Invoke(t.dtype() == DType::kBool ? op::kLogicalNot : op::kNeg, std::vector<Tensor>{t})[0];
      return y;
    };
    std::shared_ptr<CachedGraph> graph;
    {
      trace::TraceScope scope;
      std::vector<Tensor> sym;
      for (size_t i = 0; i < host.size(); ++i)
        sym.push_back(scope.Input("data" + std::to_string(i), host[i].shape, host[i].dtype, run.device));
      // A compiled graph takes at least one input (as a block's forward does); creation ops get
      // one they do not read.
      if (host.empty()) scope.Input("unused", Shape{}, DType::kFloat32, run.device);
      graph = scope.Finish(f(sym));
    }
    std::vector<Tensor> hybrid =
        graph->Call(in.empty() ? std::vector<Tensor>{Tensor::Scalar(0, DType::kFloat32, run.device)} : in);
    if (!c.reference) {
      INFO(run.str() << ", hybridized");
      c.check(hybrid, def.Resolve(c.attrs));
      return "";
    }
    std::vector<Tensor> eager = f(in);
    if (hybrid.size() != eager.size())
      return "hybridized: " + std::to_string(hybrid.size()) + " outputs, eager " + std::to_string(eager.size());
    OpCase loose = c;
    loose.rtol *= 2, loose.atol *= 2;
    std::string errs;
    for (size_t k = 0; k < eager.size(); ++k) {
      HostTensor want{eager[k].shape(), eager[k].ToVector<double>(), eager[k].dtype()};
      std::string e = CompareOutput(Run{loose, run.dtype, run.device, run.strided}, static_cast<int>(k), hybrid[k],
                                    want, {eager[k].shape(), eager[k].dtype()});
      if (!e.empty()) errs += (errs.empty() ? "hybridized against eager: " : "; ") + e;
    }
    return errs;
  } catch (const DTypeError& e) {
    if (run.device.is_gpu()) return kRefusedDType;  // conformance: forward checks the refusals
    return std::string("hybridized: threw: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("hybridized: threw: ") + e.what();
  }
}

bool AnyStrided(const std::vector<HostTensor>& in) {
  for (const HostTensor& h : in) {
    // A strided tensor is non-contiguous when some dimension other than a size-1 one exists.
    if (std::any_of(h.shape.begin(), h.shape.end(), [](int64_t d) { return d > 1; })) return true;
  }
  return false;
}

// ---- gradients -----------------------------------------------------------------------------------

/// Up to `max` indices spread over [0, n).
std::vector<int64_t> Sample(int64_t n, int64_t max) {
  std::vector<int64_t> idx;
  if (n <= max) {
    for (int64_t i = 0; i < n; ++i) idx.push_back(i);
  } else {
    for (int64_t k = 0; k < max; ++k) idx.push_back(k * n / max);
  }
  return idx;
}

std::string CheckGradient(const OpCase& c) {
  const ir::OpDef& def = ir::GetOp(ir::FindOp(c.op));
  std::vector<HostTensor> host = RunInputs(c.inputs, DType::kFloat64);
  std::vector<int> which;
  if (c.grad_inputs.empty()) {
    for (size_t j = 0; j < host.size(); ++j)
      if (IsFloat(host[j].dtype)) which.push_back(static_cast<int>(j));
  } else {
    for (int j : c.grad_inputs) {
      if (j < 0 || j >= static_cast<int>(host.size()) || !IsFloat(host[static_cast<size_t>(j)].dtype))
        return "grad_inputs names input " + std::to_string(j) + ", which is not a floating input";
      which.push_back(j);
    }
  }
  if (which.empty()) return "";

  std::vector<Tensor> xs;
  for (const HostTensor& h : host) xs.push_back(MakeTensor(h, cpu(), false));
  for (int j : which) xs[static_cast<size_t>(j)].AttachGrad();
  std::vector<Tensor> out;
  {
    autograd::RecordScope record;
    out = Invoke(def.id, xs, c.attrs, cpu());
  }
  // L = sum_k <w_k, y_k> over the floating outputs.
  std::vector<Tensor> heads, head_grads;
  std::vector<std::vector<double>> weights(out.size());
  for (size_t k = 0; k < out.size(); ++k) {
    if (!IsFloat(out[k].dtype())) continue;
    HostTensor w = Uniform(out[k].shape(), -1, 1, 1234 + k, DType::kFloat64);
    weights[k] = w.data;
    heads.push_back(out[k]);
    head_grads.push_back(MakeTensor(w, cpu(), false));
  }
  if (heads.empty()) return "";
  std::vector<Tensor> vars;
  for (int j : which) vars.push_back(xs[static_cast<size_t>(j)]);
  std::vector<Tensor> grads = autograd::Grad(heads, vars, head_grads);

  auto loss = [&](const std::vector<HostTensor>& in) {
    std::vector<Tensor> t;
    for (const HostTensor& h : in) t.push_back(MakeTensor(h, cpu(), false));
    std::vector<Tensor> y = Invoke(def.id, t, c.attrs, cpu());
    double l = 0;
    for (size_t k = 0; k < y.size(); ++k) {
      if (!IsFloat(y[k].dtype())) continue;
      std::vector<double> v = y[k].ToVector<double>();
      for (size_t i = 0; i < v.size(); ++i) l += weights[k][i] * v[i];
    }
    return l;
  };

  std::string errs;
  for (size_t q = 0; q < which.size(); ++q) {
    const size_t j = static_cast<size_t>(which[q]);
    if (!(grads[q].shape() == host[j].shape)) {
      errs += std::string(errs.empty() ? "" : "; ") + "gradient of input " + std::to_string(j) +
              " has shape " + grads[q].shape().str() + ", the input " + host[j].shape.str();
      continue;
    }
    std::vector<double> analytic = grads[q].ToVector<double>();
    int bad = 0;
    std::string first;
    std::vector<HostTensor> probe = host;
    for (int64_t i : Sample(host[j].shape.numel(), 20)) {
      double& x = probe[j].data[static_cast<size_t>(i)];
      const double x0 = x, eps = 1e-6 * std::max(1.0, std::fabs(x0));
      x = x0 + eps;
      double lp = loss(probe);
      x = x0 - eps;
      double lm = loss(probe);
      x = x0;
      double numeric = (lp - lm) / (2 * eps), a = analytic[static_cast<size_t>(i)];
      double scale = std::max({1.0, std::fabs(a), std::fabs(numeric)});
      if (std::fabs(a - numeric) <= c.grad_tol * scale) continue;
      if (bad++ == 0)
        first = IndexStr(host[j].shape, i) + ": analytic " + Num(a) + ", numeric " + Num(numeric);
    }
    if (bad)
      errs += std::string(errs.empty() ? "" : "; ") + "gradient of input " + std::to_string(j) + " " +
              host[j].shape.str() + " differs at " + first + " (grad_tol " + Num(c.grad_tol) + "; " +
              std::to_string(bad) + " checked elements differ)";
  }
  return errs;
}

/// The gradients of the case's floating inputs, float32, on `dev`: L = sum_k <w_k, y_k> over the
/// floating outputs with fixed weights, as CheckGradient; one gradient per differentiated input.
std::vector<std::vector<double>> Gradients(const OpCase& c, Device dev) {
  const ir::OpDef& def = ir::GetOp(ir::FindOp(c.op));
  std::vector<HostTensor> host = RunInputs(c.inputs, DType::kFloat32);
  std::vector<Tensor> xs;
  std::vector<Tensor> vars;
  for (const HostTensor& h : host) xs.push_back(MakeTensor(h, dev, false));
  for (size_t j = 0; j < host.size(); ++j) {
    bool want = c.grad_inputs.empty() ? IsFloat(host[j].dtype)
                                      : std::count(c.grad_inputs.begin(), c.grad_inputs.end(), static_cast<int>(j)) > 0;
    if (want && IsFloat(host[j].dtype)) xs[j].AttachGrad(), vars.push_back(xs[j]);
  }
  if (vars.empty()) return {};
  std::vector<Tensor> out;
  {
    autograd::RecordScope record;
    out = Invoke(def.id, xs, c.attrs, dev);
  }
  std::vector<Tensor> heads, head_grads;
  for (size_t k = 0; k < out.size(); ++k) {
    if (!IsFloat(out[k].dtype())) continue;
    heads.push_back(out[k]);
    head_grads.push_back(MakeTensor(Uniform(out[k].shape(), -1, 1, 1234 + k, out[k].dtype()), dev, false));
  }
  if (heads.empty()) return {};
  std::vector<std::vector<double>> g;
  for (const Tensor& t : autograd::Grad(heads, vars, head_grads)) g.push_back(t.ToVector<double>());
  return g;
}

}  // namespace

// ---- the tests -----------------------------------------------------------------------------------

TEST_CASE("conformance: forward") {
  const Loaded& loaded = Cases();
  for (const std::string& e : loaded.errors) CHECK_MESSAGE(false, e);
  std::vector<Device> devices = {cpu()};
  if (NumGPUs() > 0)
    devices.push_back(gpu(0));
  else
    MESSAGE("conformance: GPU pass skipped: no GPU (NumGPUs() == 0)");

  std::set<std::string> no_gpu_kernel, refused_dtype;
  int64_t runs = 0;
  for (const OpCase& c : loaded.cases) {
    std::vector<std::optional<DType>> dtypes;
    if (HasFloatInput(c)) dtypes.assign(c.dtypes.begin(), c.dtypes.end());
    if (dtypes.empty()) dtypes.push_back(std::nullopt);
    for (Device dev : devices) {
      if (dev.is_gpu()) {
        auto id = ir::OpTable::Get().TryFind(c.op);
        if (id && !KernelTable::Get().Find(*id, DeviceType::kGPU)) {
          no_gpu_kernel.insert(c.op);
          continue;
        }
      }
      for (std::optional<DType> dt : dtypes) {
        for (bool strided : {false, true}) {
          if (strided && (!c.noncontiguous || !AnyStrided(c.inputs))) continue;
          Run run{c, dt, dev, strided};
          std::string err = RunForward(run);
          if (err == kRefusedDType) {
            refused_dtype.insert(c.op + "(" + (dt ? DTypeName(*dt) : "default") + ")");
            continue;
          }
          CHECK_MESSAGE(err.empty(), run.str() << ": " << err);
          ++runs;
        }
      }
    }
  }
  MESSAGE("conformance: " << loaded.cases.size() << " cases, " << runs << " runs");
  if (!no_gpu_kernel.empty()) {
    std::string names;
    for (const std::string& n : no_gpu_kernel) names += " " + n;
    MESSAGE("conformance: GPU pass skipped for ops without a GPU kernel:" << names);
  }
  if (!refused_dtype.empty()) {
    std::string names;
    for (const std::string& n : refused_dtype) names += " " + n;
    MESSAGE("conformance: GPU kernels refused (DTypeError) the dtypes they do not take:" << names);
  }
}

TEST_CASE("conformance: eager against hybridized") {
  int64_t runs = 0;
  for (const OpCase& c : Cases().cases) {
    std::vector<std::optional<DType>> dtypes;
    if (HasFloatInput(c)) dtypes.assign(c.dtypes.begin(), c.dtypes.end());
    if (dtypes.empty()) dtypes.push_back(std::nullopt);
    for (std::optional<DType> dt : dtypes) {
      for (bool strided : {false, true}) {
        if (strided && (!c.noncontiguous || !AnyStrided(c.inputs))) continue;
        Run run{c, dt, cpu(), strided};
        const ir::OpDef& def = ir::GetOp(ir::FindOp(c.op));
        for (bool chained : {false, true}) {
          if (chained && !def.unary_fn && !def.binary_fn) continue;
          std::string err = RunHybridized(run, chained);
          const std::string what = run.str() + (chained ? ", negated in the graph" : "");
          CHECK_MESSAGE(err.empty(), what << ": " << err);
          ++runs;
        }
      }
    }
  }
  MESSAGE("conformance: " << runs << " hybridized runs");
}

TEST_CASE("conformance: gradients") {
  for (const OpCase& c : Cases().cases) {
    if (!c.grad) continue;
    auto id = ir::OpTable::Get().TryFind(c.op);
    if (!id || !ir::GetOp(*id).differentiable) continue;  // unknown ops fail the forward test
    std::string err;
    try {
      err = CheckGradient(c);
    } catch (const std::exception& e) {
      err = std::string("threw: ") + e.what();
    }
    CHECK_MESSAGE(err.empty(), "case '" << c.label << "' (op " << c.op << ", float64, gradient): " << err);
  }
}

// On a simulated or real GPU: every case with a GPU kernel, hybridized against eager on the GPU,
// and the float32 gradients of the GPU (its backward ops on the GPU) against the CPU's.
TEST_CASE("conformance: GPU eager against hybridized") {
  if (NumGPUs() == 0) {
    MESSAGE("conformance: skipped: no GPU (NumGPUs() == 0)");
    return;
  }
  int64_t runs = 0;
  std::set<std::string> refused;
  for (const OpCase& c : Cases().cases) {
    auto id = ir::OpTable::Get().TryFind(c.op);
    if (!id || !KernelTable::Get().Find(*id, DeviceType::kGPU)) continue;  // listed by conformance: forward
    std::vector<std::optional<DType>> dtypes;
    if (HasFloatInput(c)) dtypes.assign(c.dtypes.begin(), c.dtypes.end());
    if (dtypes.empty()) dtypes.push_back(std::nullopt);
    for (std::optional<DType> dt : dtypes) {
      Run run{c, dt, gpu(0), false};
      const ir::OpDef& def = ir::GetOp(*id);
      for (bool chained : {false, true}) {
        if (chained && !def.unary_fn && !def.binary_fn) continue;
        std::string err = RunHybridized(run, chained);
        if (err == kRefusedDType) {
          refused.insert(c.op);
          continue;
        }
        CHECK_MESSAGE(err.empty(), run.str() << (chained ? ", negated in the graph" : "") << ": " << err);
        ++runs;
      }
    }
  }
  MESSAGE("conformance: " << runs << " hybridized runs on " << gpu(0).str() << "; " << refused.size()
                          << " ops refused some dtypes (checked by conformance: forward)");
}

TEST_CASE("conformance: GPU gradients against the CPU's") {
  if (NumGPUs() == 0) {
    MESSAGE("conformance: skipped: no GPU (NumGPUs() == 0)");
    return;
  }
  int64_t checked = 0;
  std::set<std::string> no_kernel;
  for (const OpCase& c : Cases().cases) {
    if (!c.grad) continue;
    auto id = ir::OpTable::Get().TryFind(c.op);
    if (!id || !ir::GetOp(*id).differentiable) continue;
    if (!KernelTable::Get().Find(*id, DeviceType::kGPU)) {
      no_kernel.insert(c.op);
      continue;
    }
    std::string err;
    try {
      auto want = Gradients(c, cpu());
      auto got = Gradients(c, gpu(0));
      if (want.size() != got.size()) err = "gradient counts differ";
      for (size_t j = 0; err.empty() && j < want.size(); ++j) {
        if (want[j].size() != got[j].size()) {
          err = "gradient " + std::to_string(j) + " has " + std::to_string(got[j].size()) + " elements on the GPU";
          break;
        }
        const double tol = std::max(c.grad_tol, 1e-4);
        for (size_t i = 0; i < want[j].size(); ++i)
          if (!(std::fabs(got[j][i] - want[j][i]) <= tol * (1 + std::fabs(want[j][i])))) {
            err = "gradient " + std::to_string(j) + " element " + std::to_string(i) + ": GPU " + Num(got[j][i]) +
                  ", CPU " + Num(want[j][i]);
            break;
          }
      }
    } catch (const std::exception& e) {
      err = std::string("threw: ") + e.what();
    }
    CHECK_MESSAGE(err.empty(), "case '" << c.label << "' (op " << c.op << ", float32 gradient on " << gpu(0).str()
                                        << " against the CPU): " << err);
    ++checked;
  }
  std::string names;
  for (const std::string& n : no_kernel) names += " " + n;
  MESSAGE("conformance: " << checked << " GPU gradients checked against the CPU's"
                          << (names.empty() ? "" : "; ops without a GPU kernel:" + names));
}

TEST_CASE("conformance: every op has a case") {
  std::set<std::string> covered;
  for (const OpCase& c : Cases().cases) covered.insert(c.op);
  // These run a traced graph: test_cached_graph.cc checks them against eager execution,
  // forward and gradients, for graphs of many ops.
  covered.insert("call_graph"), covered.insert("call_graph_backward");
  const ir::OpTable& table = ir::OpTable::Get();
  std::string missing;
  for (size_t i = 0; i < table.size(); ++i) {
    const std::string& name = table[static_cast<ir::OpId>(i)].name;
    if (!covered.count(name)) missing += " " + name;
  }
  CHECK_MESSAGE(missing.empty(), "ops without a conformance case:" << missing);
}

}  // namespace kiln::testing
