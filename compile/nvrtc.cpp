// NVRTC compilation, loading and launch of fused kernels (see nvrtc.h). CUDA-only code sits under
// REEL_CUDA (the Makefile defines it when nvcc is found); the fallback refuses with a clear error.
#include "compile/nvrtc.h"

#include "compile/codegen_cuda.h"
#include "compile/kernel_cache.h"
#include "compile/log.h"

#ifdef REEL_CUDA
#include <cuda_runtime.h>
#include <nvrtc.h>

#include <algorithm>
#include <vector>

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

namespace reel::compile {

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
    throw Error(detail::cat("compile: NVRTC could not compile the fused kernel (", label, ") for ", arch, ": ",
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
  log("kernels", detail::cat("compiled ", label, " for ", arch, " (", code.size(), " bytes)"));
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

// One launch of a loaded fused kernel per run: pointers of the bound inputs, then of the outputs.
class CudaFusedKernel : public FusedKernel {
 public:
  // width: elements a thread takes at once (fused_vector_width): the grid covers numel / width threads.
  CudaFusedKernel(std::shared_ptr<LoadedKernel> k, int device, int64_t numel, int width, size_t nin, size_t nout,
                  std::string label)
      : k_(std::move(k)), device_(device), nin_(nin), nout_(nout), label_(std::move(label)) {
    const int64_t per_block = int64_t(kFusedBlockThreads) * width;
    const int64_t blocks = (numel + per_block - 1) / per_block;
    grid_ = unsigned(std::clamp<int64_t>(blocks, 1, 65535 * 8));
  }

  void run(const std::vector<Tensor>& in, const std::vector<Tensor>& out) override {
    REEL_ASSERT(in.size() == nin_ && out.size() == nout_, "fused kernel ", label_, ": ", in.size(), " inputs and ",
                out.size(), " outputs bound, expected ", nin_, " and ", nout_);
    std::vector<void*> ptrs(nin_ + nout_), args(nin_ + nout_);
    for (size_t k = 0; k < nin_; ++k) ptrs[k] = in[k].data_ptr();
    for (size_t k = 0; k < nout_; ++k) ptrs[nin_ + k] = out[k].data_ptr();
    for (size_t k = 0; k < ptrs.size(); ++k) args[k] = &ptrs[k];
    DeviceGuard guard(device_);
    auto stream = static_cast<cudaStream_t>(cuda::current_stream(device_));
    REEL_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(k_->kernel), dim3(grid_), dim3(kFusedBlockThreads),
                                     args.data(), 0, stream));
  }

  std::string name() const override { return "fused elementwise (cuda, NVRTC): " + label_; }

 private:
  std::shared_ptr<LoadedKernel> k_;
  int device_;
  unsigned grid_ = 1;
  size_t nin_, nout_;
  std::string label_;
};

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
  REEL_CHECK(best > 0, "compile: NVRTC ", nvrtc_version(), " supports no architecture up to the device's compute capability ",
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

std::shared_ptr<FusedKernel> make_cuda_fused_kernel(const FusedExpr& expr, const FusedLoop& loop, Device device,
                                                    const std::string& label) {
  REEL_CHECK(device.is_cuda(), "compile: a fused CUDA kernel for ", device.str());
  const std::string source = cuda_fused_source(expr, loop, label);
  const std::string arch = cuda_target_arch(device.index);
  const std::string key = std::to_string(device.index) + ":" + identity_of(source, arch);
  std::shared_ptr<LoadedKernel> k = std::static_pointer_cast<LoadedKernel>(kernel_memory_cache_find(key));
  if (!k) {
    k = load_kernel(nvrtc_compile_cached(source, arch, label), device.index);
    kernel_memory_cache_put(key, k);
  }
  return std::make_shared<CudaFusedKernel>(std::move(k), device.index, loop.numel, fused_vector_width(loop), expr.inputs.size(),
                                           expr.outputs.size(), label);
}

#else  // no CUDA backend in this build

namespace {
[[noreturn]] void not_built(const char* what) {
  throw Error(detail::cat("compile: ", what, " needs the CUDA backend, and this reel was built without it (no nvcc "
                          "found at build time)"));
}
}  // namespace

std::string nvrtc_version() { not_built("NVRTC"); }
std::string cuda_target_arch(int) { not_built("a CUDA target architecture"); }
std::string nvrtc_compile_cached(const std::string&, const std::string&, const std::string&) { not_built("NVRTC"); }
std::shared_ptr<FusedKernel> make_cuda_fused_kernel(const FusedExpr&, const FusedLoop&, Device, const std::string&) {
  not_built("a fused CUDA kernel");
}

#endif

}  // namespace reel::compile
