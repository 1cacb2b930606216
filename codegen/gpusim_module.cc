// CompileEmulatedModule: NVPTX IR text -> (registers from `ptxas -v` of the same IR's PTX) ->
// RewriteForHost -> O3 for the host -> object code linked into the process-wide LLJIT ->
// EmulatedModule whose kernels run through RunLaunch. Also InstallGpuEmulator.
#include "kiln/codegen/gpu_emulator.h"

#include <llvm/AsmParser/Parser.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Module.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Support/SourceMgr.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/Transforms/Utils/Cloning.h>

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <sstream>

#include "gpusim_internal.h"
#include "kiln/codegen/llvm_jit.h"
#include "kiln/codegen/ptx.h"
#include "kiln/runtime/env.h"
#include "kiln/runtime/error.h"
#include "lower.h"

namespace kiln::codegen {
namespace {

using gpusim_detail::EntryFn;

/// Registers per kernel from `ptxas -v` of the module's PTX; empty when ptxas is missing or fails.
std::map<std::string, int> PtxasRegisters(const llvm::Module& nvptx) {
  std::map<std::string, int> regs;
  std::string ptxas = FindPtxas();
  if (ptxas.empty()) return regs;
  static std::once_flag once;
  std::call_once(once, [] {
    LLVMInitializeNVPTXTargetInfo();
    LLVMInitializeNVPTXTarget();
    LLVMInitializeNVPTXTargetMC();
    LLVMInitializeNVPTXAsmPrinter();
  });
  std::string arch = "sm_80", err;
  for (const llvm::Function& f : nvptx)
    if (f.hasFnAttribute("target-cpu")) arch = f.getFnAttribute("target-cpu").getValueAsString().str();
  const llvm::Target* target = llvm::TargetRegistry::lookupTarget("nvptx64-nvidia-cuda", err);
  if (!target) return regs;
  std::unique_ptr<llvm::TargetMachine> tm(
      target->createTargetMachine("nvptx64-nvidia-cuda", arch, "", {}, std::nullopt));
  if (!tm) return regs;
  std::unique_ptr<llvm::Module> m = llvm::CloneModule(nvptx);
  m->setDataLayout(tm->createDataLayout());
  llvm::SmallString<0> ptx;
  llvm::raw_svector_ostream os(ptx);
  llvm::legacy::PassManager pm;
  if (tm->addPassesToEmitFile(pm, os, nullptr, llvm::CodeGenFileType::AssemblyFile)) return regs;
  pm.run(*m);
  static std::atomic<int> counter{0};
  namespace fs = std::filesystem;
  fs::path base = fs::temp_directory_path() /
                  ("kiln-gpusim-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  std::ofstream(base.string() + ".ptx") << ptx.str().str();
  std::string cmd = ptxas + " -arch=" + arch + " -v " + base.string() + ".ptx -o " + base.string() +
                    ".cubin > " + base.string() + ".log 2>&1";
  int rc = std::system(cmd.c_str());
  std::ifstream log(base.string() + ".log");
  std::string line, current;
  static const std::regex entry(R"(Compiling entry function '([^']+)')"), used(R"(Used (\d+) registers)");
  while (rc == 0 && std::getline(log, line)) {
    std::smatch s;
    if (std::regex_search(line, s, entry))
      current = s[1];
    else if (std::regex_search(line, s, used) && !current.empty())
      regs[current] = std::stoi(s[1]);
  }
  for (const char* ext : {".ptx", ".cubin", ".log"}) fs::remove(base.string() + ext);
  return regs;
}

/// A crude estimate when ptxas is not available: a few registers per ten instructions.
int EstimateRegisters(const llvm::Function& f) {
  size_t n = 0;
  for (const llvm::BasicBlock& bb : f) n += bb.size();
  return static_cast<int>(std::clamp<size_t>(16 + n / 10, 16, 255));
}

class Kernel final : public gpusim::EmulatedKernel {
public:
  Kernel(std::string name, EntryFn entry, gpusim::KernelAttributes attrs, bool has_barrier, uint64_t seed)
      : name_(std::move(name)), entry_(entry), attrs_(attrs), has_barrier_(has_barrier), seed_(seed) {}

  gpusim::KernelAttributes& attributes() override { return attrs_; }

  std::unique_ptr<gpusim::KernelFault> Run(gpusim::Dim3 grid, gpusim::Dim3 block, size_t dynamic_smem_bytes,
                                           void** args) override {
    return gpusim_detail::RunLaunch(entry_, name_, has_barrier_, attrs_.static_smem_bytes, grid, block,
                                    dynamic_smem_bytes, args, seed_);
  }

private:
  std::string name_;
  EntryFn entry_;
  gpusim::KernelAttributes attrs_;
  bool has_barrier_;
  uint64_t seed_;
};

class Module final : public gpusim::EmulatedModule {
public:
  gpusim::EmulatedKernel* Function(const std::string& name) override {
    auto it = kernels_.find(name);
    return it == kernels_.end() ? nullptr : it->second.get();
  }
  std::map<std::string, std::unique_ptr<Kernel>> kernels_;
};

/// The host target machine used for the emulator's code (the JIT's own settings; one per process,
/// used under the compile lock).
llvm::TargetMachine& HostMachine() {
  static llvm::TargetMachine* tm = [] {
    detail::Host(); // initializes the native target
    auto jtmb = llvm::orc::JITTargetMachineBuilder::detectHost();
    KILN_CHECK(static_cast<bool>(jtmb))
        << "gpusim: detecting the host CPU: " << llvm::toString(jtmb.takeError());
    jtmb->setCodeGenOptLevel(llvm::CodeGenOptLevel::Aggressive);
    auto made = jtmb->createTargetMachine();
    KILN_CHECK(static_cast<bool>(made))
        << "gpusim: creating the target machine: " << llvm::toString(made.takeError());
    return made->release();
  }();
  return *tm;
}

std::unique_ptr<gpusim::EmulatedModule> CompileForSeam(std::string_view ir) {
  return CompileEmulatedModule(ir);
}

} // namespace

std::unique_ptr<gpusim::EmulatedModule> CompileEmulatedModule(std::string_view nvptx_ir,
                                                              const EmulatorOptions& options) {
  static std::mutex mu;
  static int modules = 0;
  std::lock_guard<std::mutex> lock(mu);
  bool checked = options.checked ? *options.checked : env::GetInt("KILN_GPU_SIM_ASAN") != 0;
  uint64_t seed = options.seed ? *options.seed : static_cast<uint64_t>(env::GetInt("KILN_GPU_SIM_SEED"));
  llvm::LLVMContext ctx;
  llvm::SMDiagnostic diag;
  std::unique_ptr<llvm::Module> m =
      llvm::parseAssemblyString(llvm::StringRef(nvptx_ir.data(), nvptx_ir.size()), diag, ctx);
  if (!m) {
    std::string msg;
    llvm::raw_string_ostream os(msg);
    diag.print("nvptx-ir", os);
    KILN_THROW(DeviceError) << "gpusim: the kernel module is not valid LLVM IR: " << os.str();
  }
  std::map<std::string, int> regs = PtxasRegisters(*m);
  std::map<std::string, int> estimates;
  // Each kernel parameter's size as the GPU's ABI lays it out (the NVPTX data layout), so that a
  // launch can copy its arguments before it returns, as cuLaunchKernel does.
  std::map<std::string, std::vector<size_t>> param_sizes;
  const llvm::DataLayout& layout = m->getDataLayout();
  for (const llvm::Function& f : *m) {
    if (f.isDeclaration()) continue;
    estimates[f.getName().str()] = EstimateRegisters(f);
    std::vector<size_t>& sizes = param_sizes[f.getName().str()];
    for (const llvm::Argument& a : f.args())
      sizes.push_back(static_cast<size_t>(layout.getTypeAllocSize(a.getType()).getFixedValue()));
  }

  std::string unique = "kiln_gpusim_module_" + std::to_string(modules++);
  gpusim_detail::RewriteResult rw = gpusim_detail::RewriteForHost(*m, checked, unique);
  detail::CheckModule(*m, "the emulated GPU module " + unique);
  llvm::TargetMachine& tm = HostMachine();
  detail::OptimizeO3(*m, &tm, /*libmvec=*/false);
  llvm::SmallString<0> object;
  {
    llvm::raw_svector_ostream os(object);
    llvm::legacy::PassManager pm;
    KILN_CHECK(!tm.addPassesToEmitFile(pm, os, nullptr, llvm::CodeGenFileType::ObjectFile))
        << "gpusim: the host target cannot emit object code";
    pm.run(*m);
  }
  auto table = reinterpret_cast<void (*)(void**)>(
      detail::LoadObject(std::string_view(object.data(), object.size()), unique));
  std::vector<void*> entries(rw.kernels.size());
  table(entries.data());

  auto module = std::make_unique<Module>();
  for (size_t k = 0; k < rw.kernels.size(); ++k) {
    const auto& rk = rw.kernels[k];
    gpusim::KernelAttributes attrs;
    auto it = regs.find(rk.name);
    attrs.num_regs = it != regs.end() ? it->second : estimates[rk.name];
    attrs.static_smem_bytes = rw.static_smem_bytes;
    attrs.max_threads_per_block = rk.max_threads;
    attrs.param_sizes = param_sizes[rk.name];
    module->kernels_[rk.name] =
        std::make_unique<Kernel>(rk.name, reinterpret_cast<EntryFn>(entries[k]), attrs, rw.has_barrier, seed);
  }
  return module;
}

void InstallGpuEmulator() { gpusim::SetModuleCompiler(&CompileForSeam); }

} // namespace kiln::codegen
