// Convolution algorithms chosen by measurement (see gpu_dnn_autotune.h).
#include "kiln/runtime/gpu_dnn_autotune.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <vector>

#include "kiln/runtime/allocator.h"
#include "kiln/runtime/atomic_file.h"
#include "kiln/runtime/cuda.h"
#include "kiln/runtime/env.h"
#include "kiln/runtime/error.h"

namespace kiln::gpurt {

namespace {

namespace fs = std::filesystem;

constexpr const char* kHeader = "kiln-dnn-algo 2";  // 2: the math type follows the algorithm

// A measured choice: cuDNN's algorithm and the math type it ran with (-1: not reported).
struct Choice {
  int algo = -1, math = -1;
};

struct State {
  std::mutex mu;  // held while a problem is measured: one measurement of a problem at a time
  std::map<std::string, Choice> chosen;  // memory key -> choice (algo -1: the heuristics')
  std::map<int, std::string> library;    // device -> DnnLibraryKey, asked once
  AutotuneStats stats;
};
State& St() {
  static auto* s = new State();  // leaked: kernels may run while statics are destroyed
  return *s;
}

bool Enabled() {
  static const bool on = env::GetInt("KILN_CUDNN_AUTOTUNE") != 0;
  return on;
}

// The disk cache's directory for choices, or empty when it is off; KILN_CACHE_DIR as the
// compiled-kernel cache reads it (codegen/kernel_cache.cc).
fs::path CacheDir() {
  std::string dir = env::Get("KILN_CACHE_DIR");
  if (dir == "off") return {};
  fs::path root;
  if (!dir.empty()) root = dir;
  else if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) root = fs::path(xdg) / "kiln";
  else if (const char* home = std::getenv("HOME"); home && *home) root = fs::path(home) / ".cache" / "kiln";
  else return {};
  return root / "dnn";
}

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

void Put(std::ostringstream& o, const char* name, const DnnTensorDesc& t) { o << ' ' << name << ' ' << t.ToString(); }
void Put(std::ostringstream& o, const char* name, const DnnFilterDesc& f) {
  o << ' ' << name << " [" << f.k << ", " << f.c << ", " << f.h << ", " << f.w << "] format "
    << static_cast<int>(f.format) << " dtype " << static_cast<int>(f.dtype);
}
void Put(std::ostringstream& o, const DnnConvDesc& c) {
  o << " pad " << c.pad_h << ',' << c.pad_w << " stride " << c.stride_h << ',' << c.stride_w << " dilation "
    << c.dilation_h << ',' << c.dilation_w << " mode " << static_cast<int>(c.mode) << " compute "
    << static_cast<int>(c.compute) << " groups " << c.groups << " tf32 " << c.tf32;
}

// The platform's library key of `device`, asked once (with the state's lock held).
const std::string& LibraryKey(Platform& p, int device) {
  auto& known = St().library;
  auto it = known.find(device);
  if (it != known.end()) return it->second;
  static const std::string unknown;
  std::string key = p.DnnLibraryKey(device);
  if (key.empty()) return unknown;  // asked again next time: the disk cache is off until known
  return known.emplace(device, std::move(key)).first->second;
}

// The problem's text: the call, its descriptors, the math mode and the library (no pointers).
std::string ProblemText(Platform& p, int device, const char* call, const std::function<void(std::ostringstream&)>& put) {
  std::ostringstream o;
  o << kHeader << ' ' << call;
  put(o);
  o << " library " << LibraryKey(p, device);
  return o.str();
}
std::string Text(Platform& p, int device, const ConvForwardArgs& a) {
  return ProblemText(p, device, "forward", [&](std::ostringstream& o) {
    Put(o, "x", a.x), Put(o, "w", a.w), Put(o, a.conv), Put(o, "y", a.y);
  });
}
std::string Text(Platform& p, int device, const ConvBackwardDataArgs& a) {
  return ProblemText(p, device, "backward_data", [&](std::ostringstream& o) {
    Put(o, "dx", a.dx), Put(o, "w", a.w), Put(o, a.conv), Put(o, "dy", a.dy);
  });
}
std::string Text(Platform& p, int device, const ConvBackwardFilterArgs& a) {
  return ProblemText(p, device, "backward_filter", [&](std::ostringstream& o) {
    Put(o, "x", a.x), Put(o, "dw", a.dw), Put(o, a.conv), Put(o, "dy", a.dy);
  });
}

// The output a measurement writes, pointed at scratch memory (Find overwrites it; a
// backward-filter chunk after the first accumulates into the real one).
size_t OutputBytes(const ConvForwardArgs& a) { return static_cast<size_t>(a.y.Span()) * sizeof(float); }
size_t OutputBytes(const ConvBackwardDataArgs& a) { return static_cast<size_t>(a.dx.Span()) * sizeof(float); }
size_t OutputBytes(const ConvBackwardFilterArgs& a) {
  return static_cast<size_t>(a.dw.k) * a.dw.c * a.dw.h * a.dw.w * sizeof(float);
}
void SetOutput(ConvForwardArgs& a, void* p) { a.y_data = p; }
void SetOutput(ConvBackwardDataArgs& a, void* p) { a.dx_data = p; }
void SetOutput(ConvBackwardFilterArgs& a, void* p) { a.dw_data = p; }

// A choice read from the disk cache: the file's first line must be the problem's text, the
// second the algorithm and its math type.
std::optional<Choice> ReadChoice(const fs::path& file, const std::string& text) {
  std::ifstream in(file);
  std::string line;
  if (!in || !std::getline(in, line) || line != text) return std::nullopt;
  Choice c;
  if (!(in >> c.algo >> c.math) || c.algo < 0 || c.math < -1 || c.math > 3) return std::nullopt;
  return c;
}

template <class Args> void Apply(Args& a, const Choice& c) { a.algo = c.algo, a.conv.math = c.math; }

template <class Args> void Choose(Platform& p, void* dnn, Stream s, int device, Args& a) {
  State& st = St();
  a.workspace = nullptr, a.workspace_bytes = 0;
  Apply(a, Choice{});  // the heuristics' unless a choice is found (`a` may carry another chunk's)
  if (!Enabled()) {
    std::lock_guard<std::mutex> g(st.mu);
    ++st.stats.heuristic;
    return;
  }
  std::lock_guard<std::mutex> g(st.mu);
  const std::string text = Text(p, device, a);
  const std::string key = text + " device " + std::to_string(device);
  if (auto it = st.chosen.find(key); it != st.chosen.end()) {
    Apply(a, it->second);
    ++st.stats.memory_hits;
    return;
  }
  if (cuda::Capturing()) {  // a measurement would synchronize (and allocate): the heuristics' choice
    ++st.stats.heuristic;
    return;
  }
  const fs::path dir = CacheDir();
  const bool on_disk = !dir.empty() && !LibraryKey(p, device).empty();
  const fs::path file = on_disk ? dir / (std::to_string(Fnv1a(text)) + ".kalgo") : fs::path();
  if (on_disk) {
    if (std::optional<Choice> c = ReadChoice(file, text)) {
      Args probe = a;
      Apply(probe, *c);
      try {
        (void)p.DnnConvolutionWorkspaceSize(dnn, s, probe);  // still an algorithm of this library
        Apply(a, *c);
        st.chosen[key] = *c;
        ++st.stats.disk_hits;
        return;
      } catch (const Error&) {
        // measured again below, and rewritten
      }
    }
  }
  // Measured on scratch memory outside any running plan's region (its peak would keep it).
  StepScratchScope outside(nullptr);
  std::vector<DnnAlgoPerf> perfs;
  const Device dev = gpu(device);
  size_t cap = static_cast<size_t>(std::max<int64_t>(0, env::GetInt("KILN_CUDNN_WORKSPACE_MB"))) << 20;
  for (;;) {
    try {
      KernelScratch out(dev, OutputBytes(a));
      std::unique_ptr<KernelScratch> ws = cap ? std::make_unique<KernelScratch>(dev, cap) : nullptr;
      Args m = a;
      SetOutput(m, out.data());
      m.workspace = ws ? ws->data() : nullptr, m.workspace_bytes = ws ? cap : 0;
      m.beta = 0.0f;
      perfs = p.DnnFindConvolutionAlgorithms(dnn, s, m);
      break;
    } catch (const MemoryError&) {
      if (cap == 0) {  // no memory to measure with: the heuristics (measured again next time)
        ++st.stats.heuristic;
        return;
      }
      cap /= 2;  // a smaller workspace: fewer algorithms can run
    } catch (const Error& e) {  // the library could not measure: its heuristic choice stands
      std::fprintf(stderr, "kiln: warning: measuring convolution algorithms failed, cuDNN's heuristics choose: %s\n",
                   e.what());
      perfs.clear();
      break;
    }
  }
  Choice c;
  for (const DnnAlgoPerf& perf : perfs)
    if (perf.status == 0) {
      c = {perf.algo, perf.math};
      break;
    }
  st.chosen[key] = c;
  if (c.algo < 0) {  // nothing measurable: the heuristics
    ++st.stats.heuristic;
    return;
  }
  Apply(a, c);
  ++st.stats.measured;
  if (!on_disk) return;
  try {
    fs::create_directories(dir);
    WriteFileAtomic(file.string(), text + "\n" + std::to_string(c.algo) + " " + std::to_string(c.math) + "\n");
    ++st.stats.disk_writes;
  } catch (const std::exception& e) {  // a cache that cannot be written: kept in memory only
    std::fprintf(stderr, "kiln: warning: cuDNN algorithm cache: %s\n", e.what());
  }
}

}  // namespace

void ChooseAlgorithm(Platform& p, void* dnn, Stream s, int device, ConvForwardArgs& a) { Choose(p, dnn, s, device, a); }
void ChooseAlgorithm(Platform& p, void* dnn, Stream s, int device, ConvBackwardDataArgs& a) {
  Choose(p, dnn, s, device, a);
}
void ChooseAlgorithm(Platform& p, void* dnn, Stream s, int device, ConvBackwardFilterArgs& a) {
  Choose(p, dnn, s, device, a);
}

AutotuneStats GetAutotuneStats() {
  std::lock_guard<std::mutex> g(St().mu);
  return St().stats;
}

std::string AlgorithmKey(Platform& p, int device, const ConvForwardArgs& a) {
  std::lock_guard<std::mutex> g(St().mu);
  return Text(p, device, a);
}

namespace detail {
void ForgetAlgorithms() {
  std::lock_guard<std::mutex> g(St().mu);
  St().chosen.clear();
  St().library.clear();
  St().stats = {};
}
}  // namespace detail

}  // namespace kiln::gpurt
