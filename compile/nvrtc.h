// Fused elementwise kernels on CUDA: generated source (compile/codegen_cuda.h) compiled at run time
// by NVRTC for the device's architecture, cached (compile/kernel_cache.h), loaded with the CUDA
// runtime's library API (cudaLibraryLoadData / cudaLibraryGetKernel) and launched with
// cudaLaunchKernel on reel's current stream of the device, so a captured CUDA graph records it like
// any other kernel. The build links cudart and nvrtc, not libcuda: no driver API here.
//
//   target   sm_XY (CUBIN) when this NVRTC supports the device's compute capability X.Y, else PTX
//            for the newest compute_ZZ below it (the driver compiles it when loading);
//   options  --std=c++17 only: default IEEE division, square root and denormals, as nvcc builds
//            reel's own kernels (FMA contraction on, as there);
//   loading  at plan build time, never while a graph is being captured; the kernel is fetched for
//            the device right away, so lazy module loading cannot happen inside a capture.
// Every NVRTC and CUDA status is checked; a compile error carries NVRTC's log and the source.
// Without the CUDA backend these functions throw a reel::Error saying so (the fusion pass does not
// fuse on CUDA tensors then; there are none).
#pragma once
#include <memory>
#include <string>

#include "compile/fused_expr.h"
#include "compile/graph.h"

namespace reel::compile {

// The kernel computing `expr` over `loop` on `device` (found in the caches or compiled and loaded).
// `label` names it in `reel plan`, logs and errors (the fused op names, say).
std::shared_ptr<FusedKernel> make_cuda_fused_kernel(const FusedExpr& expr, const FusedLoop& loop, Device device,
                                                    const std::string& label);

// NVRTC's version, "13.0".
std::string nvrtc_version();
// The target for `device`: "sm_90", or "compute_ZZ" when NVRTC only supports older ones.
std::string cuda_target_arch(int device);
// Compiled code (CUBIN for sm_*, PTX for compute_*) of `source` for `arch`, through the disk cache:
// a hit reads the file, a miss compiles and stores. Needs NVRTC only (no GPU), so tests can run it
// wherever the CUDA backend is built.
std::string nvrtc_compile_cached(const std::string& source, const std::string& arch, const std::string& label);

}  // namespace reel::compile
