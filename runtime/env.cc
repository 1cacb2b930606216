// The table of environment switches and their lookup.
#include "kiln/runtime/env.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <string_view>
#include <vector>

#include "kiln/runtime/error.h"

extern char** environ;

namespace kiln::env {

namespace {
constexpr Switch kSwitches[] = {
    {"KILN_ENGINE", "threaded", "threaded (default) or naive: run every task synchronously on the calling thread"},
    {"KILN_ENGINE_MAX_PENDING", "1024", "tasks that may wait in the engine before Push blocks (backpressure)"},
    {"KILN_ENGINE_MAX_PENDING_MB", "32", "megabytes of task outputs that may wait before Push blocks (small keeps them in cache)"},
    {"KILN_ENGINE_INLINE_BYTES", "16384", "a CPU op touching at most this many bytes, with nothing to wait for, runs on the calling thread (0: always queue)"},
    {"KILN_CPU_WORKERS", "1", "engine worker threads per CPU device (kernels are multithreaded inside)"},
    {"KILN_NUM_THREADS", "0", "threads a CPU kernel may use; 0 means one per core"},
    {"KILN_SEED", "0", "initial seed of the random number generator"},
    {"KILN_DUMP_IR", "", "print the graph after a pass: a pass name or all"},
    {"KILN_DISABLE_PASS", "", "comma-separated passes to switch off"},
    {"KILN_CACHE_DIR", "", "directory of the compiled-kernel disk cache (default ~/.cache/kiln; off: no disk cache)"},
    {"KILN_CACHE_MAX_MB", "256", "size bound of the kernel disk cache; least recently used kernels are deleted beyond it"},
    {"KILN_KERNEL_CACHE_SIZE", "1024", "generated kernels kept in memory; beyond it the least recently used is dropped and its code freed once no compiled graph uses it"},
    {"KILN_VERIFY", "0", "1: run the graph verifier around every pass"},
    {"KILN_PROFILE", "", "a file name: profile the whole run and write a Chrome trace (Perfetto, chrome://tracing) there at exit"},
    {"KILN_PROFILE_MAX_EVENTS", "4000000", "events the profiler keeps in memory (about 100 bytes each); later ones are dropped and counted"},
    {"KILN_CPU_POOL_MB", "1024", "megabytes of freed host memory each CPU pool keeps for reuse; beyond it the least recently used sizes go back to the system (0: keep none)"},
    {"KILN_GRAPH_CACHE_SIZE", "64", "compiled graphs a hybridized block keeps, one per input signature; the least recently used is dropped beyond it"},
    {"KILN_REPORT", "0", "1: print a compile report for each hybridized block"},
    {"KILN_BUCKET_MB", "25", "megabytes of gradients the Trainer sums across devices in one collective"},
    {"KILN_GPU_SIM_ASAN", "0", "1: simulated GPUs check every device access of a kernel (out of bounds: error 700, misaligned: 716)"},
    {"KILN_GPU_SIM_SEED", "0", "seed of the random order in which simulated GPUs run the blocks of a kernel launch"},
    {"KILN_GPU_SIM", "0", "N > 0: N simulated GPUs on the CPU instead of CUDA (tests without a GPU)"},
    {"KILN_GPU_SIM_MEM", "4G", "memory of each simulated GPU: e.g. 4G, 512M, or a number of MiB"},
    {"KILN_CUDA_GRAPHS", "1", "0: compiled graphs on GPUs launch their kernels one by one instead of replaying a captured CUDA graph"},
    {"KILN_COMPILED_BACKWARD", "1", "0: a backward through a hybridized block runs the loss's gradient ops one by one instead of in one compiled plan with the block's backward"},
    {"KILN_JOIN_CALLS", "1", "0: a hybridized call under autograd.record() runs at once instead of waiting for the loss, the backward and the SGD or Adam update to join it in one plan"},
    {"KILN_CUDNN_AUTOTUNE", "1", "0: convolutions on GPUs take cuDNN's heuristic algorithm instead of the one measured fastest (once per problem, kept in KILN_CACHE_DIR/dnn)"},
    {"KILN_CUDNN_WORKSPACE_MB", "256", "the most workspace a measured convolution algorithm may use, in MiB"},
    {"KILN_CONV_TF32", "1", "0: float32 convolutions on GPUs in full float32 (cuDNN's FMA math); 1 (default, as PyTorch's cudnn.allow_tf32): they may use TF32 tensor cores (inputs rounded to 10 mantissa bits, relative error ~1e-3); kiln.set_math_mode overrides it"},
    {"KILN_MATMUL_TF32", "0", "1: float32 matmuls on GPUs use TF32 tensor cores (cuBLASLt CUBLAS_COMPUTE_32F_FAST_TF32, relative error ~1e-3); 0 (default, as PyTorch's matmul.allow_tf32): full float32; kiln.set_math_mode overrides it"},
    {"KILN_GPU_LOG", "0", "1: print the GPU platform, driver version and devices on first contact"},
    {"KILN_DIST_TIMEOUT", "60", "seconds a collective across processes may wait for the others before failing"},
};

}  // namespace

const Switch* Table(int* count) {
  *count = static_cast<int>(sizeof(kSwitches) / sizeof(kSwitches[0]));
  return kSwitches;
}

std::string Get(const char* name) {
  for (const Switch& s : kSwitches) {
    if (std::strcmp(s.name, name) == 0) {
      const char* v = std::getenv(name);
      return v ? v : s.default_value;
    }
  }
  KILN_CHECK(false) << "environment switch " << name << " is not declared in runtime/env.cc";
  return {};
}

int64_t GetInt(const char* name) {
  std::string v = Get(name);
  if (v.empty()) return 0;
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (*end != '\0')
    KILN_THROW(ValueError) << name << "=" << v << " is not an integer; set it to a whole number";
  return x;
}

void CheckEnvironment() {
  // Other programs may own names that start with KILN_, so an unknown name is only a warning
  // (once per process: the engine calls this once), never an error.
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv(*e);
    if (kv.substr(0, 5) != "KILN_") continue;
    std::string_view name = kv.substr(0, kv.find('='));
    bool known = false;
    const char* best = kSwitches[0].name;
    size_t best_d = SIZE_MAX;
    for (const Switch& s : kSwitches) {
      if (name == s.name) known = true;
      size_t d = EditDistance(name, s.name);
      if (d < best_d) best_d = d, best = s.name;
    }
    if (!known)
      std::fprintf(stderr,
                   "kiln: warning: environment variable %.*s is not a kiln switch and is ignored; "
                   "did you mean %s? The switches are listed in kiln's README\n",
                   static_cast<int>(name.size()), name.data(), best);
  }
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1), last(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) last[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      row[j] = std::min({last[j] + 1, row[j - 1] + 1, last[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(row, last);
  }
  return last[b.size()];
}

}  // namespace kiln::env
