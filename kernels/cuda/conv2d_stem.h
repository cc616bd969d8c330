// reel's own kernels for a stem convolution (few input channels, as an RGB image has), which cuDNN's
// kernels serve badly: the forward and the weight gradient, in 16 bits and channels-last
// (kernels/cuda/conv2d_stem.cu). kernels/cuda/conv2d.cu takes them where stem_convolution says so.
// Declared without CUDA types.
#pragma once
#include "tensor/tensor.h"

namespace reel::cuda {

// A convolution's geometry. C and O count all channels; the weight has C/G input channels per output
// channel.
struct ConvGeom {
  int64_t N, C, H, W, O, kH, kW, Ho, Wo, sh, sw, ph, pw, G;
  MemoryFormat format;  // of x, y and (as KRSC) w
};

// Whether the stem kernels take the convolution: 16-bit NHWC, one group, C < 8, K = C kH kW <= 64 and
// O in {16, 32, 48, 64}.
bool stem_convolution(const ConvGeom& g, DType dt);
// dy NHWC dense, x NHWC dense, dw KRSC dense.
void stem_weight_gradient_into(const Tensor& dy, const Tensor& x, const Tensor& dw, const ConvGeom& geo);
// x NHWC dense, w KRSC dense, y NHWC dense and 16-byte aligned.
void stem_forward_into(const Tensor& x, const Tensor& w, const Tensor& y, const ConvGeom& geo);

}  // namespace reel::cuda
