// The CPU's two convolution paths and the switch between them: oneDNN's primitives
// (kernels/cpu/conv2d_dnnl.cpp) and the im2col + Eigen GEMM kernels (kernels/cpu/conv2d.cpp), which
// stay as the reference. The kernels registered for conv2d, conv2d_backward_input and
// conv2d_backward_weight (conv2d.cpp) ask conv2d_uses_dnnl() on every call.
//
// REEL_CPU_CONV picks the path, read once, at the first convolution (set_cpu_conv_path changes it):
//   dnnl        (the default) oneDNN in the layouts it prefers (format_tag::any: on AVX-512, nChw16c activations
//               and OIhw16i16o weights), reel's NCHW / OIHW operands reordered in and the result
//               reordered back
//   dnnl-plain  oneDNN on reel's own NCHW / OIHW layouts, no reorders (oneDNN then runs its
//               im2col + GEMM convolution); kept to measure what the blocked layouts buy
//   im2col      the reference (and the path of f64 and of calls inside a parallel region)
// f64 always takes im2col: oneDNN has no f64 convolution (and gradcheck runs in f64). So does a call
// made inside an OpenMP parallel region, where oneDNN's threads would nest.
#pragma once
#include <cstddef>
#include <string>

#include "kernels/dispatch.h"

namespace reel::cpu {

enum class CpuConvPath { Dnnl, DnnlPlain, Im2col };

// "dnnl", "dnnl-plain" or "im2col"; anything else is a reel::Error that lists the three.
CpuConvPath parse_cpu_conv_path(const std::string& text);
const char* cpu_conv_path_name(CpuConvPath path);
// REEL_CPU_CONV as read at the first call, or what set_cpu_conv_path set since.
CpuConvPath cpu_conv_path();
// For tests and benchmarks that run both paths in one process; affects every thread's next call.
void set_cpu_conv_path(CpuConvPath path);

// Whether a convolution of `dtype` called now goes to oneDNN.
bool conv2d_uses_dnnl(DType dtype);

// The oneDNN kernels, on the KernelCall of the op (contiguous outputs: run_into_contiguous). Each
// returns false, having written nothing, where oneDNN has no implementation for the geometry; the
// caller then runs the reference.
bool conv2d_fwd_dnnl_kernel(const KernelCall& c);
bool conv2d_bwd_input_dnnl_kernel(const KernelCall& c);
bool conv2d_bwd_weight_dnnl_kernel(const KernelCall& c);

// Primitives held by the cache (one per direction, geometry, layout and thread count seen).
size_t conv2d_dnnl_cached_primitives();

}  // namespace reel::cpu
