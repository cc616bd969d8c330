// The CUDA kernel of the fused_elementwise op: its program (kernels/fused_expr.h) turned into CUDA C
// (kernels/jit/codegen_cuda.h), compiled at run time by NVRTC for the device's architecture, cached
// (kernels/jit/kernel_cache.h), loaded with the CUDA runtime's library API (cudaLibraryLoadData /
// cudaLibraryGetKernel) and launched with cudaLaunchKernelExC on reel's current stream of the device
// (with programmatic dependent launch, as reel's other kernels: kernels/cuda/launch.cuh),
// so a captured CUDA graph records it like any other kernel. The build links cudart and nvrtc, not
// libcuda: no driver API here. This is the op's kernel as cuBLAS is matmul's: it belongs with the
// kernels, and eager dispatch of a fused_elementwise op on a GPU works like any other op.
//
//   target   sm_XY (CUBIN) when this NVRTC supports the device's compute capability X.Y, else PTX
//            for the newest compute_ZZ below it (the driver compiles it when loading);
//   options  --std=c++17 only: default IEEE division, square root and denormals, as nvcc builds
//            reel's own kernels (FMA contraction on, as there, inside each op's formula; mul, add
//            and sub are correctly rounded single instructions, codegen_cuda.cpp's math_mul etc.,
//            so no FMA forms across two ops of a program, as none forms across two eager kernels);
//   loading  in the op's PrepareFn, which a plan runs when it is built (kernels/dispatch.h), so never
//            while a graph is being captured; the kernel is fetched for the device right away, so
//            lazy module loading cannot happen inside a capture. An unprepared call (eager dispatch)
//            compiles and loads on its first run.
//   finding  a call finds its loaded kernel by its program, loop geometry and device: first in a
//            table keyed by the address of its attrs (a plan's node keeps its attrs in one place, so
//            a replay compares, not hashes), then by the generated source.
// Every NVRTC and CUDA status is checked; a compile error carries NVRTC's log and the source.
// Without the CUDA backend these functions throw a reel::Error saying so (and no fused_elementwise
// kernel is registered for CUDA; there are no CUDA tensors then).
#pragma once
#include <memory>
#include <string>

#include "kernels/fused_expr.h"

namespace reel::jit {

// Registers fused_elementwise's CUDA kernel and PrepareFn (called by register_cuda_backend).
void register_fused_elementwise_cuda_kernel();

// NVRTC's version, "13.0".
std::string nvrtc_version();
// The target for `device`: "sm_90", or "compute_ZZ" when NVRTC only supports older ones.
std::string cuda_target_arch(int device);
// Compiled code (CUBIN for sm_*, PTX for compute_*) of `source` for `arch`, through the disk cache:
// a hit reads the file, a miss compiles and stores. Needs NVRTC only (no GPU), so tests can run it
// wherever the CUDA backend is built.
std::string nvrtc_compile_cached(const std::string& source, const std::string& arch, const std::string& label);

}  // namespace reel::jit
