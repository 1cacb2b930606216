// The kernel emulator on hand-written CUDA C++ (codegen/gpusim_kernels/emulator_test_kernels.cu),
// compiled by clang-19 to NVPTX IR at build time (codegen/CMakeLists.txt): a tiled transpose (2D grid, a
// __shared__ tile,
// __syncthreads, tails) and a block scan (extern __shared__, __syncthreads_count) against plain
// CPU loops. Without clang-19 at build time the test says it skipped.
#ifdef KILN_WITH_CODEGEN
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/codegen/gpu_emulator.h"

TEST_CASE("gpu emulator: CUDA C++ compiled by clang-19 runs as on a GPU") {
  // In the build tree: <build>/tests/cpp/kiln_tests and <build>/codegen/gpusim_kernels/; in
  // scripts/gpu-check's bundle: gpusim_kernels/ beside kiln_tests.
  const std::filesystem::path exe_dir = std::filesystem::canonical("/proc/self/exe").parent_path();
  std::filesystem::path ll = exe_dir / "gpusim_kernels" / "emulator_test_kernels.ll";
  if (!std::filesystem::exists(ll))
    ll = exe_dir.parent_path().parent_path() / "codegen" / "gpusim_kernels" / "emulator_test_kernels.ll";
  if (!std::filesystem::exists(ll)) {
    std::cout
        << "[kiln-skip] " << ll.string()
        << " was not built (clang-19 was not found at configure time): the CUDA C++ kernels did not run\n";
    return;
  }
  std::ifstream f(ll);
  REQUIRE(f.good());
  std::stringstream ir;
  ir << f.rdbuf();
  for (bool checked : {false, true}) {
    CAPTURE(checked);
    kiln::codegen::EmulatorOptions opts;
    opts.checked = checked;
    auto m = kiln::codegen::CompileEmulatedModule(ir.str(), opts);
    kiln::gpusim::EmulatedKernel* transpose = m->Function("transpose");
    kiln::gpusim::EmulatedKernel* scan = m->Function("block_scan");
    REQUIRE(transpose);
    REQUIRE(scan);
    CHECK(transpose->attributes().static_smem_bytes == 32 * 33 * 4);

    int rows = 70, cols = 45; // neither a multiple of the 32 x 32 tile
    std::vector<float> in(static_cast<size_t>(rows * cols)), out(in.size(), -1.0f);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i);
    const float* pi = in.data();
    float* po = out.data();
    void* targs[] = {&pi, &po, &rows, &cols};
    REQUIRE(transpose->Run({2, 3, 1}, {32, 8, 1}, 0, targs) == nullptr);
    int wrong = 0;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c)
        wrong += out[static_cast<size_t>(c * rows + r)] != in[static_cast<size_t>(r * cols + c)];
    CHECK(wrong == 0);

    int n = 1000;
    const uint32_t block = 128, blocks = (n + block - 1) / block;
    std::vector<float> x(static_cast<size_t>(n)), sums(x.size(), 0.0f);
    for (int i = 0; i < n; ++i) x[static_cast<size_t>(i)] = static_cast<float>((i * 7) % 5) - 2.0f;
    std::vector<int> positives(blocks, -1);
    const float* px = x.data();
    float* ps = sums.data();
    int* pp = positives.data();
    void* sargs[] = {&px, &ps, &pp, &n};
    REQUIRE(scan->Run({blocks, 1, 1}, {block, 1, 1}, 2 * block * sizeof(float), sargs) == nullptr);
    int bad = 0;
    for (uint32_t b = 0; b < blocks; ++b) {
      float run = 0;
      int pos = 0;
      for (uint32_t t = 0; t < block && b * block + t < static_cast<uint32_t>(n); ++t) {
        float v = x[b * block + t];
        run += v;
        pos += v > 0;
        bad += sums[b * block + t] != run;
      }
      bad += positives[b] != pos;
    }
    CHECK(bad == 0);
    // Too little dynamic shared memory for the scan's two halves: checked mode says so.
    if (checked) {
      auto fault = scan->Run({blocks, 1, 1}, {block, 1, 1}, block * sizeof(float), sargs);
      REQUIRE(fault != nullptr);
      CHECK(fault->cuda_error == 700);
      CHECK(fault->message.find("shared memory") != std::string::npos);
    }
  }
}

#endif // KILN_WITH_CODEGEN
