// CPU kernel of matmul: out[i] = a[i] @ b[i] over the broadcast batch, on oneDNN's sgemm (f32) or
// Eigen's GEMM (f64, and f32 under REEL_CPU_GEMM=eigen; kernels/cpu/sgemm.h).
//
//   a (..., M, K), b (..., K, N) -> out (..., M, N), out[i](m, n) = sum_k a[i](m, k) b[i](k, n)
//
// Layouts. Every matrix of an operand shares the strides of its last two dims, so "can the GEMM read
// it in place" is one question per operand: a matrix is mapped directly when it is row-major
// (stride[-1] == 1) or column-major (stride[-2] == 1) with an outer stride that keeps rows/columns
// apart. A transposed view (what backward's a^T and b^T are) is column-major and is never copied
// (sgemm's 'T', Eigen's ColMajor map); anything else (expanded or doubly strided matrices) is copied
// to contiguous first. Batch dims may have any strides, including 0 for broadcast ones.
//
// Threading (policy in linalg.cpp). One GEMM (batch 1) is left to the library, which splits it over
// the OpenMP threads itself when it is large enough. A batch of >= 2 GEMMs is split over OpenMP
// threads by batch entry; inside a parallel region Eigen sees omp_get_num_threads() > 1 and runs
// single-threaded, and sgemm is narrowed to one thread, so the two levels never oversubscribe.
// When b has no batch (x (B, T, C) @ W (C, D), the common linear layer) and a's batch dims merge with
// its rows, the batch is folded into one (B*T, C) @ (C, D) GEMM, which the library threads and blocks
// better.
//
// Dtypes. f32 and f64 multiply in their own type; f16 and bf16 are widened to f32, multiplied, and
// rounded back once (f32 accumulation, as GPUs do). i64 is refused by the schema.
//
// The fused GEMMs (matmul_into, gemm_epilogue) take that unrounded product and run their epilogue
// (transpose, add, bias, GELU, the one rounding) as the kernels of those ops, so in f32 they give the
// bits of matmul followed by the unfused ops. matmul_into's add is therefore not sgemm's beta = 1:
// that sums c into the blocked partial products (different bits from product-then-add once K spans
// several blocks), and eager's params += would no longer equal the compiled plan's.
#include <Eigen/Dense>
#include <optional>
#include <type_traits>

#include "kernels/cpu/compose.h"
#include "kernels/cpu/gemm_threading.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/sgemm.h"
#include "kernels/dispatch.h"
#include "kernels/matrix_layout.h"
#include "kernels/schema/views.h"

namespace reel::cpu {

namespace {

// `t` in dtype `dt` with a layout a GEMM reads in place: `t` itself when possible, else a contiguous copy.
Tensor mappable(const Tensor& t, DType dt) {
  if (t.dtype() == dt && matrix_layout(t)) return t;
  Tensor c = Tensor::empty(t.shape(), dt, t.device());
  copy_strided(c, t);
  return c;
}

// Folds a's batch into its rows when b is one shared matrix: a (..., M, K) viewed as (B*M, K).
// Returns false when b is batched or a's batch dims do not merge with its rows.
template <typename T>
bool matmul_folded(const Tensor& a, const Tensor& b, const Tensor& out);

// out (..., M, N) contiguous = a @ b, all of dtype T (f32 or f64).
template <typename T>
void matmul_same_dtype(const Tensor& a_in, const Tensor& b_in, const Tensor& out) {
  const int64_t nd = out.dim();
  const int64_t M = out.shape()[nd - 2], N = out.shape()[nd - 1], K = a_in.shape().back();
  if (out.numel() == 0) return;
  T* pc = out.data<T>();
  if (K == 0) {  // an empty sum
    std::fill(pc, pc + out.numel(), T(0));
    return;
  }
  if (matmul_folded<T>(a_in, b_in, out)) return;
  const DType dt = DTypeOf<T>::value;
  Tensor a = mappable(a_in, dt), b = mappable(b_in, dt);
  const MatLayout la = *matrix_layout(a), lb = *matrix_layout(b);

  // Batch: out's leading dims; a's and b's batch strides broadcast to them (0 on broadcast dims).
  Shape batch(out.shape().begin(), out.shape().end() - 2);
  auto batch_strides = [&](const Tensor& t) {
    Shape shape(t.shape().begin(), t.shape().end() - 2), strides(t.strides().begin(), t.strides().end() - 2);
    return broadcast_strides(shape, strides, batch);
  };
  const std::vector<int64_t> sa = batch_strides(a), sb = batch_strides(b);
  const int64_t nbatch = numel_of(batch);
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  auto one = [&](int64_t i) {  // out[i] = a[i] @ b[i], i a flat index into the broadcast batch
    int64_t oa = 0, ob = 0, rem = i;
    for (int64_t d = int64_t(batch.size()) - 1; d >= 0; --d) {
      int64_t idx = rem % batch[d];
      rem /= batch[d];
      oa += idx * sa[d];
      ob += idx * sb[d];
    }
    gemm(pa + oa, la, pb + ob, lb, pc + i * M * N, M, K, N);
  };
  const double flops_each = 2.0 * double(M) * double(N) * double(K);
  if (split_gemm_batch(nbatch, flops_each)) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < nbatch; ++i) one(i);
  } else {
    GemmThreadScope scope(flops_each);
    for (int64_t i = 0; i < nbatch; ++i) one(i);
  }
}

template <typename T>
bool matmul_folded(const Tensor& a, const Tensor& b, const Tensor& out) {
  if (a.dim() <= 2 || numel_of(Shape(b.shape().begin(), b.shape().end() - 2)) != 1) return false;
  const int64_t K = a.shape().back(), N = b.shape().back();
  const int64_t rows = a.numel() / K;
  std::optional<Shape> strides = view_strides(a.shape(), a.strides(), {rows, K});
  if (!strides) return false;
  const int64_t nb = b.dim();
  Tensor a2 = Tensor::make_view(a, {rows, K}, *strides, a.offset());
  Tensor b2 = Tensor::make_view(b, {K, N}, {b.strides()[nb - 2], b.strides()[nb - 1]}, b.offset());
  Tensor out2 = Tensor::make_view(out, {rows, N}, {N, 1}, out.offset());
  matmul_same_dtype<T>(a2, b2, out2);
  return true;
}

void matmul_kernel(const KernelCall& c) {
  const Tensor& out = c.out[0];
  visit_float_dtype(out.dtype(), "matmul", [&]<typename T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      matmul_same_dtype<T>(c.in[0], c.in[1], out);
    } else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      // Widen both operands once (the copy is needed anyway), multiply in f32, round back once.
      Tensor a = mappable(c.in[0], DType::f32), b = mappable(c.in[1], DType::f32);
      Tensor acc = Tensor::empty(out.shape(), DType::f32, out.device());
      matmul_same_dtype<float>(a, b, acc);
      copy_strided(out, acc);
    } else {
      REEL_ASSERT(false, "matmul kernel reached with dtype ", dtype_name(out.dtype()));
    }
  });
}

// ---- fused GEMMs (kernels/ops.def): the f32 product, then the epilogue's ops as their own kernels ----

// a @ b before any rounding: in f32 for f32, f16 and bf16 operands (widened, as matmul_kernel does),
// in f64 for f64. Written into `into` when that is a contiguous tensor of the accumulation dtype (the
// fused op's own output: no temporary), else into a contiguous temporary.
Tensor accumulated_product(const Tensor& a, const Tensor& b, const Tensor& into = Tensor()) {
  const DType acc = a.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Tensor a_acc = cpu::converted(a, acc), b_acc = cpu::converted(b, acc);
  const Shape shape = infer_outputs(OpKind::Matmul, {a_acc, b_acc})[0].shape;
  const bool direct = into.defined() && into.dtype() == acc && into.shape() == shape && into.is_contiguous();
  Tensor out = direct ? into : cpu::scratch(shape, acc);
  cpu::run_op(OpKind::Matmul, {a_acc, b_acc}, {out});
  return out;
}

// out (=|+=) a @ b or its transpose. in: a, b[, c]; attrs transpose, accumulate.
void matmul_into_kernel(const KernelCall& c) {
  const bool transpose = c.attrs.b("transpose", false), accumulate = c.attrs.b("accumulate", false);
  Tensor p = accumulated_product(c.in[0], c.in[1], transpose || accumulate ? Tensor() : c.out[0]);
  if (p.is_same(c.out[0])) return;
  if (transpose) p = Tensor::make_view(p, {p.shape()[1], p.shape()[0]}, {p.strides()[1], p.strides()[0]}, p.offset());
  if (!accumulate) {
    cpu::run_op(OpKind::Copy, {p}, {c.out[0]});
    return;
  }
  if (c.out[0].dtype() == p.dtype()) {
    cpu::run_op(OpKind::Add, {c.in[2], p}, {c.out[0]});
    return;
  }
  // A 16-bit result: the sum in f32, rounded once (as beta = 1 in the GEMM's epilogue).
  Tensor sum = cpu::scratch(p.shape(), p.dtype());
  cpu::run_op(OpKind::Add, {cpu::converted(c.in[2], p.dtype()), p}, {sum});
  cpu::run_op(OpKind::Copy, {sum}, {c.out[0]});
}

// y = a @ b + bias [pre = that, y = gelu(pre)], the bias added to the unrounded product.
void gemm_epilogue_kernel(const KernelCall& c) {
  const bool gelu = c.attrs.b("gelu", false);
  Tensor p = accumulated_product(c.in[0], c.in[1], gelu ? Tensor() : c.out[0]);
  cpu::run_op(OpKind::Add, {p, cpu::converted(c.in[2], p.dtype())}, {p});
  if (gelu) {
    cpu::run_op(OpKind::Copy, {p}, {c.out[1]});
    cpu::run_op(OpKind::Gelu, {p}, {p});
  }
  if (!p.is_same(c.out[0])) cpu::run_op(OpKind::Copy, {p}, {c.out[0]});
}

}  // namespace

void register_matmul_cpu_kernel() {
  register_kernel(DeviceType::CPU, OpKind::Matmul, [](const KernelCall& c) { run_into_contiguous(c, matmul_kernel); });
  register_kernel(DeviceType::CPU, OpKind::MatmulInto, matmul_into_kernel);
  register_kernel(DeviceType::CPU, OpKind::GemmEpilogue, gemm_epilogue_kernel);
}

}  // namespace reel::cpu
