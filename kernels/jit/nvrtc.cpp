// NVRTC compilation, loading and launch of fused_elementwise's kernels (see nvrtc.h). CUDA-only code sits under
// REEL_CUDA (the Makefile defines it when nvcc is found); the fallback refuses with a clear error.
#include "kernels/jit/nvrtc.h"

#include "kernels/jit/codegen_cuda.h"
#include "kernels/jit/kernel_cache.h"
#include "tensor/log.h"

#ifdef REEL_CUDA
#include <cuda_runtime.h>
#include <nvrtc.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/column_sums.h"
#include "kernels/cuda/launch_programmatic.h"
#include "kernels/dispatch.h"
#include "tensor/cuda.h"
#include "tensor/cuda_check.h"

#define REEL_NVRTC_CHECK(expr)                                                                            \
  do {                                                                                                    \
    nvrtcResult reel_status_ = (expr);                                                                    \
    if (reel_status_ != NVRTC_SUCCESS)                                                                    \
      throw ::reel::Error(::reel::detail::cat("NVRTC error ", nvrtcGetErrorString(reel_status_), " at ", \
                                              __FILE__, ":", __LINE__, ": ", #expr));                     \
  } while (0)
#endif

namespace reel::jit {

#ifdef REEL_CUDA
namespace {

// The kernel's identity in the caches: everything that decides the code.
std::string identity_of(const std::string& source, const std::string& arch) {
  return "reel fused kernel v1; nvrtc " + nvrtc_version() + "; --gpu-architecture=" + arch + " --std=c++17\n" + source;
}

// Destroys an nvrtcProgram on every path out.
struct ProgramGuard {
  nvrtcProgram p = nullptr;
  ~ProgramGuard() {
    if (p) nvrtcDestroyProgram(&p);
  }
};

std::string compile_with_nvrtc(const std::string& source, const std::string& arch, const std::string& label) {
  ProgramGuard prog;
  REEL_NVRTC_CHECK(nvrtcCreateProgram(&prog.p, source.c_str(), "reel_fused.cu", 0, nullptr, nullptr));
  const std::string arch_opt = "--gpu-architecture=" + arch;
  const char* opts[] = {arch_opt.c_str(), "--std=c++17"};
  const nvrtcResult status = nvrtcCompileProgram(prog.p, 2, opts);
  count_kernel_compilation();
  if (status != NVRTC_SUCCESS) {
    size_t n = 0;
    REEL_NVRTC_CHECK(nvrtcGetProgramLogSize(prog.p, &n));
    std::string log_text(n, '\0');
    REEL_NVRTC_CHECK(nvrtcGetProgramLog(prog.p, log_text.data()));
    throw Error(detail::cat("fused_elementwise: NVRTC could not compile the kernel (", label, ") for ", arch, ": ",
                            nvrtcGetErrorString(status), " at ", __FILE__, ":", __LINE__, "\n", log_text,
                            "\nsource:\n", source));
  }
  std::string code;
  size_t n = 0;
  if (arch.rfind("sm_", 0) == 0) {
    REEL_NVRTC_CHECK(nvrtcGetCUBINSize(prog.p, &n));
    code.resize(n);
    REEL_NVRTC_CHECK(nvrtcGetCUBIN(prog.p, code.data()));
  } else {
    REEL_NVRTC_CHECK(nvrtcGetPTXSize(prog.p, &n));  // includes the terminating NUL
    code.resize(n);
    REEL_NVRTC_CHECK(nvrtcGetPTX(prog.p, code.data()));
  }
  log_line("kernels", detail::cat("compiled ", label, " for ", arch, " (", code.size(), " bytes)"));
  return code;
}

// Makes `device` current for the guard's lifetime (kernels launch and load on the current device).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    REEL_CUDA_CHECK(cudaGetDevice(&previous_));
    changed_ = previous_ != device;
    if (changed_) REEL_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() {
    if (changed_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

// A loaded program and its one kernel; unloaded when the last plan and the cache let go of it.
struct LoadedKernel {
  cudaLibrary_t library = nullptr;
  cudaKernel_t kernel = nullptr;
  ~LoadedKernel() {
    if (library) cudaLibraryUnload(library);  // at exit the runtime may be gone: nothing to report then
  }
};

std::shared_ptr<LoadedKernel> load_kernel(const std::string& code, int device) {
  DeviceGuard guard(device);
  auto k = std::make_shared<LoadedKernel>();
  REEL_CUDA_CHECK(cudaLibraryLoadData(&k->library, code.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
  REEL_CUDA_CHECK(cudaLibraryGetKernel(&k->kernel, k->library, kFusedKernelName));
  // Fetching the attributes loads the kernel into this device's context now, not at its first
  // launch, which may be inside a CUDA graph capture.
  cudaFuncAttributes attrs;
  REEL_CUDA_CHECK(cudaFuncGetAttributes(&attrs, reinterpret_cast<const void*>(k->kernel)));
  return k;
}

// A loaded kernel and its launch geometry for one (program, loop, column sums, device).
struct FusedLaunch {
  std::shared_ptr<LoadedKernel> kernel;
  int device = 0;
  dim3 grid{1, 1, 1};
  size_t inputs = 0, outputs = 0;  // the kernel's pointers: loaded inputs and states, program outputs
  FusedColumnSums sums;
  bool sums_in_kernel = false;  // the column-sums kernel; else column_sums_into after the kernel
  int64_t cols = 0, chunk = 0;  // the column-sums kernel: columns (C), and rows of a chunk
};

// Column-sums blocks per SM the grid aims for, and the fewest rows of a chunk (a thread then takes
// at least its four rows' packs at once: codegen_cuda.cpp's rows in flight). Every chunk is one more
// partial for the tile's last block to add: at 8 blocks an SM (gpt-small's fc: 128 chunks) Nsight
// Compute timed the kernel 8.5 us above the elementwise kernel alone, about the last block's 16
// batches of partial loads; two an SM gives gpt-small 33 chunks and gpt-tiny 64.
constexpr int64_t kColumnBlocksPerSM = 2, kColumnMinRows = 32;

// The column-sums grid of `launch` on `device`: ceil(C / tile) tiles, and chunks of rows enough for
// about kColumnBlocksPerSM blocks per SM, each of at least kColumnMinRows rows. It depends on the
// shape and the SM count only: the same bits on every run of a GPU.
void size_column_grid(FusedLaunch& launch, const FusedLoop& loop, int device) {
  int sms = 0;
  REEL_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  launch.cols = loop.shape.back();
  const int64_t rows = loop.numel / launch.cols;
  const int64_t tiles = (launch.cols + kFusedColumnTile - 1) / kFusedColumnTile;
  const int64_t want = (kColumnBlocksPerSM * sms + tiles - 1) / tiles;
  const int64_t chunks = std::max<int64_t>(1, std::min({want, (rows + kColumnMinRows - 1) / kColumnMinRows, int64_t(65535)}));
  launch.chunk = (rows + chunks - 1) / chunks;
  launch.grid = dim3(unsigned(tiles), unsigned((rows + launch.chunk - 1) / launch.chunk));
}

std::shared_ptr<FusedLaunch> build_launch(const FusedExpr& expr, const FusedLoop& loop, FusedColumnSums sums,
                                          int device) {
  const std::string label = fused_label(expr);
  const bool sums_in_kernel = sums.on() && loop.numel > 0 && fused_column_sums_fit(loop);
  const std::string source = cuda_fused_source(expr, loop, label, sums_in_kernel ? sums : FusedColumnSums{});
  const std::string arch = cuda_target_arch(device);
  const std::string key = std::to_string(device) + ":" + identity_of(source, arch);
  std::shared_ptr<LoadedKernel> k = std::static_pointer_cast<LoadedKernel>(kernel_memory_cache_find(key));
  if (!k) {
    k = load_kernel(nvrtc_compile_cached(source, arch, label), device);
    kernel_memory_cache_put(key, k);
  }
  auto launch = std::make_shared<FusedLaunch>();
  launch->kernel = std::move(k);
  launch->device = device;
  launch->inputs = expr.inputs.size() + size_t(expr.states);  // the loaded inputs, then the Philox states
  launch->outputs = expr.outputs.size();
  launch->sums = sums;
  launch->sums_in_kernel = sums_in_kernel;
  if (sums_in_kernel) {
    size_column_grid(*launch, loop, device);
  } else {
    // A thread of the vector loop takes fused_vector_width elements: the grid covers numel / width threads.
    const int64_t per_block = int64_t(kFusedBlockThreads) * fused_vector_width(loop);
    launch->grid = dim3(unsigned(std::clamp<int64_t>((loop.numel + per_block - 1) / per_block, 1, 65535 * 8)));
  }
  return launch;
}

// What decides a call's code: its program, its loop (sizes and every operand's strides), its column
// sums and device.
struct LaunchKey {
  std::vector<int64_t> program, sizes, strides;
  int sums_output = -1;
  bool sums_accumulate = false;
  int device = 0;
  bool operator==(const LaunchKey&) const = default;
};

LaunchKey key_of(const KernelCall& c, const FusedLoop& loop) {
  const FusedColumnSums sums = fused_column_sums_of(c.attrs);
  LaunchKey k{c.attrs.ints("program"),
              loop.sizes,
              {},
              sums.output,
              sums.accumulate,
              c.out.empty() ? 0 : c.out[0].device().index};
  for (const auto& s : loop.strides) k.strides.insert(k.strides.end(), s.begin(), s.end());
  k.strides.push_back(int64_t(c.in.size()));
  return k;
}

// Calls by the address of their attrs: a plan's node calls with the same attrs object every replay.
// The key is compared in full, so a reused address (another plan's node) is a miss, not a wrong kernel.
struct CallSite {
  LaunchKey key;
  std::shared_ptr<FusedLaunch> launch;
};
std::mutex sites_mu;
std::unordered_map<const Attrs*, CallSite>& call_sites() {
  static std::unordered_map<const Attrs*, CallSite> sites;
  return sites;
}

// `fresh`: look the kernel up in the process's caches even when the call site knows it (a plan being
// built counts its kernels as found in memory, not as a call site's repeat).
std::shared_ptr<FusedLaunch> launch_for(const KernelCall& c, bool fresh = false) {
  // The loop is the loaded inputs' (the Philox states and the sums after them are read whole, not iterated).
  const size_t loads = c.attrs.ints("inputs").size();
  REEL_ASSERT(loads <= c.in.size(), "fused_elementwise: ", loads, " loaded inputs among ", c.in.size(), " inputs");
  const std::vector<Tensor> loaded(c.in.begin(), c.in.begin() + int64_t(loads));
  const FusedLoop loop = fused_loop_of(fused_shape_of(c.attrs), loaded);
  LaunchKey key = key_of(c, loop);
  if (!fresh) {
    std::lock_guard<std::mutex> lock(sites_mu);
    auto it = call_sites().find(&c.attrs);
    if (it != call_sites().end() && it->second.key == key) return it->second.launch;
  }
  std::shared_ptr<FusedLaunch> launch =
      build_launch(fused_expr_of(c.attrs), loop, fused_column_sums_of(c.attrs), key.device);
  std::lock_guard<std::mutex> lock(sites_mu);
  call_sites()[&c.attrs] = CallSite{std::move(key), launch};
  return launch;
}

// Pointers of the call's loaded inputs and states, then of its program's outputs, as the generated
// kernel's parameters; with the column sums in the kernel also the sums, a workspace for the chunks'
// partials and the chunk's rows. Column sums the kernel cannot take (a strided or broadcast operand,
// rows not a multiple of 8 columns) are the column_sums op's kernel run after it.
void fused_elementwise_kernel(const KernelCall& c) {
  const std::shared_ptr<FusedLaunch> l = launch_for(c);
  const size_t sums_out = l->sums.on() ? 1 : 0, sums_in = l->sums.accumulate ? 1 : 0;
  REEL_ASSERT(c.in.size() == l->inputs + sums_in && c.out.size() == l->outputs + sums_out,
              "fused_elementwise: ", c.in.size(), " inputs and ", c.out.size(), " outputs for a program of ", l->inputs,
              " and ", l->outputs, l->sums.on() ? " and its column sums" : "");
  std::vector<void*> ptrs(l->inputs + l->outputs);
  for (size_t k = 0; k < l->inputs; ++k) ptrs[k] = c.in[k].data_ptr();
  for (size_t k = 0; k < l->outputs; ++k) ptrs[l->inputs + k] = c.out[k].data_ptr();
  DeviceGuard guard(l->device);
  Tensor partial;
  long long chunk = l->chunk;
  if (l->sums_in_kernel) {
    partial = Tensor::empty({int64_t(l->grid.y) * l->cols}, DType::f32, Device::cuda(l->device));
    ptrs.push_back(c.out.back().data_ptr());
    ptrs.push_back(partial.data_ptr());
  }
  std::vector<void*> args(ptrs.size());
  for (size_t k = 0; k < ptrs.size(); ++k) args[k] = &ptrs[k];
  if (l->sums_in_kernel) args.push_back(&chunk);  // the last parameter, by value
  auto stream = static_cast<cudaStream_t>(cuda::current_stream(l->device));
  REEL_CUDA_CHECK(cuda::launch_programmatic(reinterpret_cast<const void*>(l->kernel->kernel), l->grid,
                                            dim3(kFusedBlockThreads), 0, stream, args.data()));
  if (!l->sums.on() || l->sums_in_kernel) return;
  if (c.out.back().numel() == 0) return;  // no columns: nothing to sum
  cuda::column_sums_into(c.out[size_t(l->sums.output)], c.out.back(), l->sums.accumulate);
}

void fused_elementwise_prepare(const KernelCall& c) { launch_for(c, /*fresh=*/true); }

}  // namespace

std::string nvrtc_version() {
  int major = 0, minor = 0;
  REEL_NVRTC_CHECK(nvrtcVersion(&major, &minor));
  return std::to_string(major) + "." + std::to_string(minor);
}

std::string cuda_target_arch(int device) {
  int major = 0, minor = 0;
  REEL_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  REEL_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  const int want = major * 10 + minor;
  int n = 0;
  REEL_NVRTC_CHECK(nvrtcGetNumSupportedArchs(&n));
  std::vector<int> archs(size_t(std::max(n, 0)));
  if (n > 0) REEL_NVRTC_CHECK(nvrtcGetSupportedArchs(archs.data()));
  if (std::find(archs.begin(), archs.end(), want) != archs.end()) return "sm_" + std::to_string(want);
  int best = -1;
  for (int a : archs)
    if (a < want) best = std::max(best, a);
  REEL_CHECK(best > 0, "fused_elementwise: NVRTC ", nvrtc_version(), " supports no architecture up to the device's compute capability ",
             major, ".", minor);
  return "compute_" + std::to_string(best);
}

std::string nvrtc_compile_cached(const std::string& source, const std::string& arch, const std::string& label) {
  const std::string identity = identity_of(source, arch);
  if (std::optional<std::string> code = kernel_cache_load(identity)) return *code;
  std::string code = compile_with_nvrtc(source, arch, label);
  kernel_cache_store(identity, code);
  return code;
}

void register_fused_elementwise_cuda_kernel() {
  register_kernel(DeviceType::CUDA, OpKind::FusedElementwise, fused_elementwise_kernel);
  register_prepare(DeviceType::CUDA, OpKind::FusedElementwise, fused_elementwise_prepare);
}

#else  // no CUDA backend in this build

namespace {
[[noreturn]] void not_built(const char* what) {
  throw Error(detail::cat("fused_elementwise: ", what, " needs the CUDA backend, and this reel was built without it (no nvcc "
                          "found at build time)"));
}
}  // namespace

std::string nvrtc_version() { not_built("NVRTC"); }
std::string cuda_target_arch(int) { not_built("a CUDA target architecture"); }
std::string nvrtc_compile_cached(const std::string&, const std::string&, const std::string&) { not_built("NVRTC"); }
void register_fused_elementwise_cuda_kernel() {}

#endif

}  // namespace reel::jit
