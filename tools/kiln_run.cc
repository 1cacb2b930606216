// kiln-run: runs an exported model from the command line, with no Python (DESIGN.md section 1).
//
//   kiln-run NAME-symbol.json [--params NAME-0000.params] [--input name=file.npy ...]
//            [--output-dir DIR] [--repeat N] [--device cpu|cpu:N|gpu|gpu:N]
//
// Inputs come from .npy files (see npy.h), outputs go to DIR/output<i>.npy. With --repeat N it
// times N calls after a warm-up and prints one JSON line in the format of bench/ (DESIGN.md
// section 11). Exit status: 0 on success, 2 for a usage error, 1 for a model or input error; the
// message is one line on stderr. Inputs may have other sizes than the exported ones (another batch
// size): the model re-shapes its graph for them (kiln::load). Not here: batching, comparing with
// references.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kiln/frontend/load.h"
#include "kiln/runtime/error.h"
#include "npy.h"

namespace {

using namespace kiln;

constexpr char kUsage[] =
    "usage: kiln-run NAME-symbol.json [--params NAME-0000.params] [--input name=file.npy ...] "
    "[--output-dir DIR] [--repeat N] [--device cpu|cpu:N|gpu|gpu:N]";

struct UsageError {
  std::string what;
};

struct Options {
  std::string symbol, params, output_dir;
  std::map<std::string, std::string> inputs;  // name -> .npy path
  int64_t repeat = 0;
  Device device = cpu();
};

int64_t ParseCount(const std::string& s, const std::string& flag, int64_t min) {
  size_t used = 0;
  int64_t v = -1;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
  }
  if (used != s.size() || s.empty() || v < min)
    throw UsageError{flag + " expects an integer >= " + std::to_string(min) + ", found '" + s + "'"};
  return v;
}

Device ParseDevice(const std::string& s) {
  for (auto [prefix, type] : {std::pair{"cpu", DeviceType::kCPU}, std::pair{"gpu", DeviceType::kGPU}}) {
    std::string p(prefix);
    if (s == p) return {type, 0};
    if (s.rfind(p + ":", 0) == 0) return {type, static_cast<int>(ParseCount(s.substr(p.size() + 1), "--device", 0))};
  }
  throw UsageError{"--device expects cpu, cpu:N, gpu or gpu:N, found '" + s + "'"};
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  std::vector<std::string> args(argv + 1, argv + argc);
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw UsageError{a + " expects a value"};
      return args[++i];
    };
    if (a == "--params") o.params = value();
    else if (a == "--output-dir") o.output_dir = value();
    else if (a == "--repeat") {
      o.repeat = ParseCount(value(), "--repeat", 1);
      // Every call's time is kept (8 bytes each) for the median; beyond this it would not fit.
      constexpr int64_t kMaxRepeat = 100'000'000;
      if (o.repeat > kMaxRepeat)
        throw UsageError{"--repeat expects an integer from 1 to " + std::to_string(kMaxRepeat) +
                         " (each call's time is kept to compute the median), found " + std::to_string(o.repeat)};
    }
    else if (a == "--device") o.device = ParseDevice(value());
    else if (a == "--input") {
      const std::string& v = value();
      size_t eq = v.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == v.size())
        throw UsageError{"--input expects name=file.npy, found '" + v + "'"};
      if (!o.inputs.emplace(v.substr(0, eq), v.substr(eq + 1)).second)
        throw UsageError{"input '" + v.substr(0, eq) + "' is given twice"};
    } else if (a == "-h" || a == "--help") throw UsageError{""};
    else if (a.rfind("-", 0) == 0) throw UsageError{"unknown option '" + a + "'"};
    else if (o.symbol.empty()) o.symbol = a;
    else throw UsageError{"unexpected argument '" + a + "' (one symbol file only)"};
  }
  if (o.symbol.empty()) throw UsageError{"no symbol file given"};
  if (o.params.empty()) o.params = DefaultParamsPath(o.symbol);
  return o;
}

std::string Signature(const Module& m) {
  std::string s;
  for (size_t i = 0; i < m.input_names().size(); ++i)
    s += (i ? ", " : "") + m.input_names()[i] + "=" + DTypeName(m.input_types()[i].dtype) +
         m.input_types()[i].shape.str();
  return s;
}

std::vector<Tensor> ReadInputs(const Options& o, const Module& m) {
  std::vector<std::string> missing;
  for (const std::string& name : m.input_names())
    if (!o.inputs.count(name)) missing.push_back(name);
  std::string unknown;
  for (const auto& [name, path] : o.inputs)
    if (std::find(m.input_names().begin(), m.input_names().end(), name) == m.input_names().end())
      unknown += (unknown.empty() ? "" : ", ") + name;
  if (!unknown.empty())
    KILN_THROW(ValueError) << "the model has no input(s) " << unknown << "; it expects " << Signature(m);
  if (!missing.empty()) {
    std::string list;
    for (const std::string& n : missing) list += (list.empty() ? "" : ", ") + n;
    KILN_THROW(ValueError) << "missing input(s) " << list << ": the model expects " << Signature(m)
                           << "; pass each as --input name=file.npy";
  }
  std::vector<Tensor> out;
  for (size_t i = 0; i < m.input_names().size(); ++i) {
    const std::string& path = o.inputs.at(m.input_names()[i]);
    ir::HostTensor h = tools::ReadNpy(path);
    const ir::TensorType& want = m.input_types()[i];
    if (h.dtype != want.dtype || h.shape.rank() != want.shape.rank()) {
      std::string msg = "input '" + m.input_names()[i] + "' expects " + DTypeName(want.dtype) + want.shape.str() +
                        ", found " + DTypeName(h.dtype) + h.shape.str() + " in '" + path + "'";
      if (h.dtype != want.dtype) KILN_THROW(DTypeError) << msg << "; save it with a.astype('" << DTypeName(want.dtype) << "')";
      KILN_THROW(ShapeError) << msg << "; only the sizes of an input can differ from the exported ones, save a rank-"
                             << want.shape.rank() << " array";
    }
    out.push_back(Tensor::FromHost(h.bytes.data(), h.shape, h.dtype, m.device()));
  }
  return out;
}

void WriteOutputs(const std::string& dir, const std::vector<Tensor>& outs) {
  std::filesystem::create_directories(dir);
  for (size_t i = 0; i < outs.size(); ++i) {
    Tensor t = outs[i].dtype() == DType::kBFloat16 ? outs[i].AsType(DType::kFloat32) : outs[i];
    ir::HostTensor h{t.dtype(), t.shape(), std::vector<uint8_t>(t.numel() * DTypeSize(t.dtype()))};
    t.CopyToHost(h.bytes.data());
    tools::WriteNpy((std::filesystem::path(dir) / ("output" + std::to_string(i) + ".npy")).string(), h);
  }
}

std::string CaseName(const std::string& symbol) {
  std::string stem = std::filesystem::path(symbol).filename().string();
  for (const char* suffix : {"-symbol.json", ".json"}) {
    std::string s(suffix);
    if (stem.size() > s.size() && stem.compare(stem.size() - s.size(), s.size(), s) == 0)
      return stem.substr(0, stem.size() - s.size());
  }
  return stem;
}

void Bench(const Module& m, const std::vector<Tensor>& inputs, int64_t repeat, const std::string& name) {
  using Clock = std::chrono::steady_clock;
  auto call = [&] {
    for (const Tensor& t : m(inputs)) t.WaitToRead();
  };
  for (int i = 0; i < 3; ++i) call();  // warm-up: allocator pools, caches, lazy initialization
  std::vector<double> us;
  us.reserve(static_cast<size_t>(repeat));
  Clock::time_point start = Clock::now();
  for (int64_t i = 0; i < repeat; ++i) {
    Clock::time_point t0 = Clock::now();
    call();
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  double total_s = std::chrono::duration<double>(Clock::now() - start).count();
  std::sort(us.begin(), us.end());
  auto pct = [&](double p) { return us[std::min(us.size() - 1, static_cast<size_t>(p * static_cast<double>(us.size())))]; };
  double median = us.size() % 2 ? us[us.size() / 2] : 0.5 * (us[us.size() / 2 - 1] + us[us.size() / 2]);
  std::printf("{\"bench\": \"kiln_run\", \"case\": \"%s\", \"metric\": \"us_per_call\", \"value\": %.3f, "
              "\"unit\": \"us\", \"p90\": %.3f, \"calls_per_s\": %.1f, \"repeat\": %lld, \"device\": \"%s\"}\n",
              name.c_str(), median, pct(0.9), static_cast<double>(repeat) / total_s,
              static_cast<long long>(repeat), m.device().str().c_str());
}

// Multi-line kiln messages (lists of differences) joined with "; ".
std::string OneLine(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\n') {
      out += s[i];
      continue;
    }
    out += "; ";
    while (i + 1 < s.size() && s[i + 1] == ' ') ++i;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = ParseArgs(argc, argv);
  } catch (const UsageError& e) {
    if (e.what.empty()) {
      std::printf("%s\n", kUsage);
      return 0;
    }
    std::fprintf(stderr, "kiln-run: %s; %s\n", e.what.c_str(), kUsage);
    return 2;
  }
  try {
    Module model = load(o.symbol, o.params, o.device);
    std::vector<Tensor> inputs = ReadInputs(o, model);
    std::vector<Tensor> outputs = model(inputs);
    for (size_t i = 0; i < outputs.size(); ++i) {
      outputs[i].WaitToRead();
      std::fprintf(stderr, "output%zu: %s%s\n", i, DTypeName(outputs[i].dtype()), outputs[i].shape().str().c_str());
    }
    if (!o.output_dir.empty()) WriteOutputs(o.output_dir, outputs);
    if (o.repeat > 0) Bench(model, inputs, o.repeat, CaseName(o.symbol));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln-run: error: %s\n", OneLine(e.what()).c_str());
    return 1;
  }
}
