// CUDA kernel of matmul on cuBLAS: out[i] = a[i] @ b[i] over the broadcast batch.
//
//   a (..., M, K), b (..., K, N) -> out (..., M, N), out[i](m, n) = sum_k a[i](m, k) b[i](k, n)
//
// Row-major vs cuBLAS. cuBLAS is column-major: a row-major (M, N) matrix with row stride N is, to
// cuBLAS, the column-major (N, M) matrix C^T with leading dimension N. So reel computes
//   C^T (N, M) = B^T (N, K) @ A^T (K, M)
// i.e. it passes b as cuBLAS's first operand and a as its second, with m' = N, n' = M, k' = K.
//
// Operand layouts (as on the CPU, kernels/cpu/matmul.cpp). Every matrix of an operand shares the
// strides of its last two dims. A row-major matrix (stride[-1] == 1) read column-major is its own
// transpose, so cuBLAS takes it with CUBLAS_OP_N and ld = its row stride; a column-major matrix
// (stride[-2] == 1, e.g. the transposed views autograd's backward passes) is taken with CUBLAS_OP_T
// and ld = its column stride. Both are used in place; anything else (expanded or doubly strided
// matrices) is made contiguous on the device first.
//
// Batch. The batch dims of a, b and out (a's and b's broadcast, 0 on broadcast dims) are merged
// wherever one stride per operand covers them (size-1 dims dropped, adjacent dims merged when
// stride[d] == stride[d+1] * size[d+1] for all three). One merged dim is one
// cublasGemmStridedBatchedEx_64 call (a stride of 0 reuses a shared operand); where broadcasting
// leaves several merged dims (a (B, 1, M, K) @ b (1, H, K, N)), the largest is the batched one and
// the host loops over the others. Several merged dims without broadcasting (attention's heads as a
// strided view) are first made one by copying the operands contiguous. When b is a single shared matrix (a linear layer x (B, T, C) @
// W (C, D)) and a's batch merges with its rows, the batch is folded into M: one (B*T, C) @ (C, D)
// GEMM, which cuBLAS tiles far better than B small ones.
//
// Precision (the CPU-parity contract): f32 uses CUBLAS_COMPUTE_32F with the handle in
// CUBLAS_DEFAULT_MATH, so no TF32; f64 uses CUBLAS_COMPUTE_64F; f16 and bf16 use tensor cores with
// f32 accumulation (CUBLAS_COMPUTE_32F, 16-bit inputs and output, rounded once). The shared handle
// (kernels/cuda/register.cu) also sets CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION so that split-K
// partial sums of 16-bit GEMMs are reduced in f32, not in the 16-bit output type. i64 is refused by the schema.
//
// Algorithms: with split-K on (kernels/autotune.h: set_split_k), a single GEMM of 16-bit operands
// into f32 whose output cannot fill the GPU (a weight gradient: few output tiles, a long K) splits K
// on cuBLASLt (gemm_autotune.h: gemm_split_k; the same bits every run), autotuning or not; every
// other GEMM takes cuBLAS's heuristic choice (CUBLAS_GEMM_DEFAULT). With autotuning on (kernels/autotune.h,
// compile's max-autotune) every other GEMM goes through gemm_autotune.h instead: the first eager call of
// each distinct problem times cuBLASLt's heuristic candidates (same precision contract) against
// that default path on its own operands and caches the fastest; later calls, captures included,
// reuse the choice without timing.
//
// Empty cases: an empty output launches nothing; K == 0 writes zeros (an empty sum), as the CPU.
// Outputs from dispatch are contiguous; a strided output from dispatch_out is computed into a
// contiguous temporary and copied into place.
#include <optional>
#include <vector>

#include "kernels/autotune.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/gemm_autotune.h"
#include "kernels/cuda/matmul_into.h"
#include "kernels/matrix_layout.h"
#include "kernels/schema/views.h"

namespace reel::cuda {

namespace {

// `t` itself when cuBLAS can read its matrices in place, else a contiguous copy on the device.
Tensor gemm_readable(const Tensor& t) {
  if (matrix_layout(t)) return t;
  Tensor c = Tensor::empty(t.shape(), t.dtype(), t.device());
  copy_on_device(c, t);
  return c;
}

// cuBLAS's view of one row-major-semantics operand: see the file comment.
struct GemmOperand {
  cublasOperation_t op;
  int64_t ld;
};

GemmOperand gemm_operand(MatLayout l) { return {l.row_major ? CUBLAS_OP_N : CUBLAS_OP_T, l.outer}; }

struct GemmTypes {
  cudaDataType data;
  cublasComputeType_t compute;
};

GemmTypes gemm_types(DType dt) {
  switch (dt) {
    case DType::f32: return {CUDA_R_32F, CUBLAS_COMPUTE_32F};  // exact f32: the handle allows no TF32
    case DType::f64: return {CUDA_R_64F, CUBLAS_COMPUTE_64F};
    case DType::f16: return {CUDA_R_16F, CUBLAS_COMPUTE_32F};
    case DType::bf16: return {CUDA_R_16BF, CUBLAS_COMPUTE_32F};
    default: throw Error(detail::cat("matmul: dtype ", dtype_name(dt), " is not supported on CUDA"));
  }
}

// One strided-batched GEMM in row-major terms: for i in [0, batch)
//   c[i * stride_c] (M, N, row stride N) = a[i * stride_a] (M, K) @ b[i * stride_b] (K, N)
struct GemmShape {
  int64_t M, N, K;
  GemmOperand a, b;
};

void gemm_strided_batched(const Tensor& out, DType in_dtype, const GemmShape& g, const void* a, int64_t stride_a,
                          const void* b, int64_t stride_b, void* c, int64_t stride_c, int64_t batch,
                          bool accumulate = false) {
  // Operands in in_dtype; the result in out's dtype: the same, or f32 from 16-bit operands (the
  // compiler's fusion of autocast's cast into the GEMM: one rounding fewer).
  const GemmTypes t = gemm_types(in_dtype);
  const cudaDataType c_type = gemm_types(out.dtype()).data;
  cublasHandle_t h = cublas_handle(out.device());  // created with TF32 off and f32 split-K reductions
  const float one_f = 1.0f, zero_f = 0.0f;
  const double one_d = 1.0, zero_d = 0.0;
  const bool f64 = t.compute == CUBLAS_COMPUTE_64F;
  const void* alpha = f64 ? static_cast<const void*>(&one_d) : static_cast<const void*>(&one_f);
  const void* beta = f64 ? static_cast<const void*>(accumulate ? &one_d : &zero_d)
                         : static_cast<const void*>(accumulate ? &one_f : &zero_f);  // out += a @ b
  // C^T (N, M) = B^T (N, K) @ A^T (K, M): b is cuBLAS's first operand.
  auto run_default = [&](void* dst) {
    REEL_CUBLAS_CHECK(cublasGemmStridedBatchedEx_64(h, g.b.op, g.a.op, g.N, g.M, g.K, alpha, b, t.data, g.b.ld,
                                                    stride_b, a, t.data, g.a.ld, stride_a, beta, dst, c_type, g.N,
                                                    stride_c, batch, t.compute, CUBLAS_GEMM_DEFAULT));
  };
  const GemmProblem p{.m = g.N, .n = g.M, .k = g.K,  // the same GEMM in the same cuBLAS terms: b first
                      .trans_a = g.b.op == CUBLAS_OP_T, .trans_b = g.a.op == CUBLAS_OP_T,
                      .lda = g.b.ld, .ldb = g.a.ld, .ldc = g.N,
                      .stride_a = stride_b, .stride_b = stride_a, .stride_c = stride_c, .batch = batch,
                      .in = in_dtype, .out = out.dtype(), .accumulate = accumulate, .device = out.device()};
  if (split_k_enabled() && gemm_split_k(p, b, a, c)) return;  // a weight gradient too small to fill the GPU
  if (!autotune_enabled()) return run_default(c);
  gemm_autotuned(p, b, a, c, run_default);
}

// Element `elems` of an untyped device pointer whose elements are `esize` bytes.
void* at(void* p, int64_t elems, size_t esize) { return static_cast<char*>(p) + elems * int64_t(esize); }

// a (..., M, K) with a shared b (K, N): one GEMM (rows, K) @ (K, N) with rows = a's batch times M.
// Returns false (having done nothing) when b is batched or a's batch does not merge with its rows.
bool matmul_folded(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate = false) {
  if (a.dim() <= 2 || numel_of(Shape(b.shape().begin(), b.shape().end() - 2)) != 1) return false;
  const int64_t K = a.shape().back(), N = b.shape().back(), nb = b.dim();
  const int64_t rows = a.numel() / K;
  std::optional<Shape> strides = view_strides(a.shape(), a.strides(), {rows, K});
  if (!strides) return false;
  std::optional<MatLayout> la = matrix_layout(rows, K, (*strides)[0], (*strides)[1]);
  std::optional<MatLayout> lb = matrix_layout(K, N, b.strides()[nb - 2], b.strides()[nb - 1]);
  if (!la || !lb) return false;
  const GemmShape g{rows, N, K, gemm_operand(*la), gemm_operand(*lb)};
  gemm_strided_batched(out, a.dtype(), g, a.data_ptr(), 0, b.data_ptr(), 0, out.data_ptr(), 0, 1, accumulate);
  return true;
}

// One merged batch dim: its size and each operand's stride over it (elements).
struct BatchDim {
  int64_t size, sa, sb, sc;
};

// Drops size-1 dims and merges adjacent dims whose strides nest for all three operands.
std::vector<BatchDim> merged_batch(const Shape& batch, const std::vector<int64_t>& sa,
                                   const std::vector<int64_t>& sb, const std::vector<int64_t>& sc) {
  std::vector<BatchDim> dims;  // outermost first
  for (size_t d = 0; d < batch.size(); ++d) {
    if (batch[d] == 1) continue;
    BatchDim cur{batch[d], sa[d], sb[d], sc[d]};
    if (!dims.empty()) {
      BatchDim& outer = dims.back();
      if (outer.sa == cur.sa * cur.size && outer.sb == cur.sb * cur.size && outer.sc == cur.sc * cur.size) {
        outer = {outer.size * cur.size, cur.sa, cur.sb, cur.sc};
        continue;
      }
    }
    dims.push_back(cur);
  }
  return dims;
}

// out (..., M, N) contiguous = a @ b, all of out's dtype, K >= 1 and out non-empty.
void matmul_dense(const Tensor& a_in, const Tensor& b_in, const Tensor& out, bool accumulate = false) {
  if (matmul_folded(a_in, b_in, out, accumulate)) return;
  const int64_t nd = out.dim();
  const int64_t M = out.shape()[nd - 2], N = out.shape()[nd - 1], K = a_in.shape().back();
  Tensor a = gemm_readable(a_in), b = gemm_readable(b_in);

  // Batch strides broadcast to out's batch (0 on broadcast dims); out's own are contiguous.
  const Shape batch(out.shape().begin(), out.shape().end() - 2);
  auto batch_strides = [&](const Tensor& t) {
    Shape shape(t.shape().begin(), t.shape().end() - 2), strides(t.strides().begin(), t.strides().end() - 2);
    return broadcast_strides(shape, strides, batch);
  };
  const std::vector<int64_t> sc(out.strides().begin(), out.strides().end() - 2);
  std::vector<BatchDim> dims = merged_batch(batch, batch_strides(a), batch_strides(b), sc);
  if (dims.size() > 1) {
    // The batch does not fold into one stride: typically attention's heads, q (B, H, T, hd) as a view
    // of (B, T, 3d). Rather than one small batched GEMM per outer index (H launches that each fill a
    // fraction of the GPU), copy each operand that is not itself broadcast into a contiguous buffer
    // (a memory-bound pass, far cheaper than the GEMM it unlocks) and merge again.
    auto unbroadcast = [&](const Tensor& t) { return t.dim() == out.dim() && t.numel() > 0 &&
                                                     Shape(t.shape().begin(), t.shape().end() - 2) == batch; };
    if (unbroadcast(a)) a = contiguous_on_device(a);
    if (unbroadcast(b)) b = contiguous_on_device(b);
    dims = merged_batch(batch, batch_strides(a), batch_strides(b), sc);
  }

  const GemmShape g{M, N, K, gemm_operand(*matrix_layout(a)), gemm_operand(*matrix_layout(b))};

  // The largest merged dim is the strided batch; the host loops over the others (usually none).
  BatchDim inner{1, 0, 0, 0};
  if (!dims.empty()) {
    auto largest = std::max_element(dims.begin(), dims.end(),
                                    [](const BatchDim& x, const BatchDim& y) { return x.size < y.size; });
    inner = *largest;
    dims.erase(largest);
  }
  const size_t es = out.element_size(), es_in = a.element_size();
  std::vector<int64_t> idx(dims.size(), 0);
  for (;;) {
    int64_t oa = 0, ob = 0, oc = 0;
    for (size_t d = 0; d < dims.size(); ++d) {
      oa += idx[d] * dims[d].sa;
      ob += idx[d] * dims[d].sb;
      oc += idx[d] * dims[d].sc;
    }
    gemm_strided_batched(out, a.dtype(), g, at(a.data_ptr(), oa, es_in), inner.sa, at(b.data_ptr(), ob, es_in),
                         inner.sb, at(out.data_ptr(), oc, es), inner.sc, inner.size, accumulate);
    // Odometer over the outer dims, innermost fastest.
    int64_t d = int64_t(dims.size()) - 1;
    while (d >= 0 && ++idx[d] == dims[d].size) idx[d--] = 0;
    if (d < 0) break;
  }
}

void matmul_kernel(const KernelCall& c) {
  const Tensor& out = c.out[0];
  if (out.numel() == 0) return;
  Tensor dense = out.is_contiguous() ? out : Tensor::empty(out.shape(), out.dtype(), out.device());
  if (c.in[0].shape().back() == 0) {  // K == 0: an empty sum; all-zero bits are 0.0 in every float dtype
    REEL_CUDA_CHECK(cudaMemsetAsync(dense.data_ptr(), 0, dense.nbytes(), stream_of(dense)));
  } else {
    matmul_dense(c.in[0], c.in[1], dense);
  }
  if (!dense.is_same(out)) copy_on_device(out, dense);
}

}  // namespace

void matmul_into(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate) {
  REEL_CHECK(a.dtype() == b.dtype() && (out.dtype() == a.dtype() || out.dtype() == DType::f32) && out.is_contiguous(),
             "matmul_into: operands ", dtype_name(a.dtype()), " and ", dtype_name(b.dtype()), ", result ",
             dtype_name(out.dtype()), (out.is_contiguous() ? "" : " (not contiguous)"),
             ": expected equal operand dtypes and a contiguous result in theirs or f32");
  if (out.numel() == 0) return;
  if (a.shape().back() == 0) {
    if (!accumulate) REEL_CUDA_CHECK(cudaMemsetAsync(out.data_ptr(), 0, out.nbytes(), stream_of(out)));
    return;
  }
  matmul_dense(a, b, out, accumulate);
}

namespace {

// The matmul_into op (schema in kernels/schema/linalg.cpp); its transpose (a b)^T is b^T a^T.
Tensor transposed(const Tensor& m) {
  return Tensor::make_view(m, {m.shape()[1], m.shape()[0]}, {m.strides()[1], m.strides()[0]}, m.offset());
}

void matmul_into_kernel(const KernelCall& c) {
  const bool accumulate = c.attrs.b("accumulate", false);
  if (c.attrs.b("transpose", false)) matmul_into(transposed(c.in[1]), transposed(c.in[0]), c.out[0], accumulate);
  else matmul_into(c.in[0], c.in[1], c.out[0], accumulate);
}

}  // namespace

void register_matmul_cuda_kernel() {
  register_kernel(DeviceType::CUDA, OpKind::Matmul, matmul_kernel);
  register_kernel(DeviceType::CUDA, OpKind::MatmulInto, matmul_into_kernel);
}

}  // namespace reel::cuda
