// GEMM + epilogue on cuBLASLt (see gemm_epilogue.h).
//
// Row-major vs column-major as in matmul.cu: reel computes y^T (N, M) = b^T (N, K) @ a^T (K, M), so b is
// cuBLASLt's A operand and a its B. CUBLASLT_EPILOGUE_BIAS adds bias[i] to row i of the column-major
// result, i.e. to column i of reel's row-major y: exactly a Linear layer's bias. The GELU epilogue's
// auxiliary matrix (the pre-activation) is laid out as y: column-major (N, M) with leading dimension N,
// which cuBLASLt wants divisible by 8.
// The matmul descriptor, layouts and the heuristic's algorithm are made once per problem and cached;
// the workspace is the one cuBLAS uses (blas_workspace: allocated once, so a capture never allocates).
#include <map>
#include <optional>
#include <memory>
#include <mutex>
#include <tuple>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/gemm_epilogue.h"
#include "kernels/matrix_layout.h"
#include "kernels/schema/views.h"

namespace reel::cuda {

namespace {

enum class Epilogue { Bias, BiasGeluAux };

// The alignment the GELU epilogue's pre-activation must have: what the caching allocator and the
// compiled plan's arena give every block.
constexpr uintptr_t kAuxAlignment = 256;

// (A meta tensor, as a plan traced without memory holds, stands for an allocation: aligned.)
bool aux_aligned(const Tensor& aux) {
  return aux.storage()->is_meta() || reinterpret_cast<uintptr_t>(aux.data_ptr()) % kAuxAlignment == 0;
}

const char* epilogue_name(Epilogue e) {
  switch (e) {
    case Epilogue::Bias: return "gemm_bias";
    case Epilogue::BiasGeluAux: return "gemm_bias_gelu";
  }
  return "gemm_epilogue";
}

cudaDataType lt_type(Epilogue e, DType dt) {
  switch (dt) {
    case DType::f32: return CUDA_R_32F;
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    default:
      throw Error(detail::cat(epilogue_name(e), ": dtype ", dtype_name(dt), " is not supported (f32, f16, bf16)"));
  }
}

struct LtPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ly = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;  // what the algorithm needs of the kBlasGemmWorkspaceBytes it was chosen with
  bool found = false;
  ~LtPlan() {
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (ly) cublasLtMatrixLayoutDestroy(ly);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

// Operands of one call; aux only for BiasGeluAux (the pre-activation it writes, of y's shape and dtype).
struct Operands {
  const Tensor& a;
  const Tensor& b;
  const Tensor& bias;
  const Tensor* aux;
  const Tensor& y;
};

// epilogue, M, N, K, a's layout, b's layout, a/y/bias dtypes, device.
using Key = std::tuple<int, int64_t, int64_t, int64_t, bool, int64_t, bool, int64_t, int, int, int, int>;

// cuBLASLt's view of reel's row-major operand t (rows x cols): see matmul.cu.
void describe(const MatLayout& l, int64_t rows, int64_t cols, cudaDataType type, cublasOperation_t* op,
              cublasLtMatrixLayout_t* layout) {
  *op = l.row_major ? CUBLAS_OP_N : CUBLAS_OP_T;
  // Stored as column-major: a row-major (rows, cols) matrix is the column-major (cols, rows) one.
  if (l.row_major) REEL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(layout, type, uint64_t(cols), uint64_t(rows), l.outer));
  else REEL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(layout, type, uint64_t(rows), uint64_t(cols), l.outer));
}

template <typename T>
void set_attr(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  REEL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof value));
}

void check_shapes(Epilogue e, const Operands& o) {
  const Tensor &a = o.a, &b = o.b, &y = o.y;
  const bool dims = a.dim() == 2 && b.dim() == 2 && y.dim() == 2;
  const int64_t M = dims ? a.shape()[0] : -1, K = dims ? a.shape()[1] : -1, N = dims ? b.shape()[1] : -1;
  bool ok = dims && matrix_layout(a) && matrix_layout(b) && y.is_contiguous() && b.shape()[0] == K &&
            y.shape()[0] == M && y.shape()[1] == N;
  ok = ok && o.bias.is_contiguous() && o.bias.numel() == N;
  if (o.aux) ok = ok && o.aux->is_contiguous() && o.aux->shape() == y.shape() && o.aux->dtype() == y.dtype();
  REEL_CHECK(ok, epilogue_name(e), ": shapes ", shape_str(a.shape()), " @ ", shape_str(b.shape()),
             " + ", shape_str(o.bias.shape()), " -> ", shape_str(y.shape()),
             o.aux ? " (pre-activation " + shape_str(o.aux->shape()) + " " + dtype_name(o.aux->dtype()) + ")"
                   : std::string(),
             " do not form (M, K) @ (K, N) -> (M, N) with readable layouts",
             o.aux ? " and a contiguous pre-activation of the result's shape and dtype" : "");
}

const LtPlan& lt_plan(Epilogue e, const Operands& o) {
  check_shapes(e, o);
  const Tensor &a = o.a, &b = o.b, &y = o.y;
  const int64_t M = a.shape()[0], K = a.shape()[1], N = b.shape()[1];
  const MatLayout la = *matrix_layout(a), lb = *matrix_layout(b);
  const Key key{int(e), M, N, K, la.row_major, la.outer, lb.row_major, lb.outer, int(a.dtype()), int(y.dtype()),
                int(o.bias.dtype()), y.device().index};
  static std::mutex mutex;
  static std::map<Key, std::unique_ptr<LtPlan>> plans;
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<LtPlan>& slot = plans[key];
  if (slot) return *slot;
  auto p = std::make_unique<LtPlan>();
  REEL_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t op_b, op_a;
  describe(lb, K, N, lt_type(e, b.dtype()), &op_b, &p->la);  // cuBLASLt's A is reel's b
  describe(la, M, K, lt_type(e, a.dtype()), &op_a, &p->lb);  // and its B is reel's a
  REEL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->ly, lt_type(e, y.dtype()), uint64_t(N), uint64_t(M), N));
  set_attr(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, op_b);
  set_attr(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, op_a);
  const cublasLtEpilogue_t epi = e == Epilogue::Bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  set_attr(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epi);
  set_attr(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, lt_type(e, o.bias.dtype()));
  if (o.aux) {
    // The heuristic reads the aux pointer's alignment (not its memory): a stand-in aligned to
    // kAuxAlignment, which supported() and run() ask of every real one.
    set_attr(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, N);
    set_attr(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, reinterpret_cast<void*>(kAuxAlignment));
  }
  cublasLtMatmulPreference_t pref;
  REEL_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = kBlasGemmWorkspaceBytes;
  REEL_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  cublasLtMatmulHeuristicResult_t result{};
  int n = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(cublaslt_handle(y.device()), p->desc, p->la, p->lb, p->ly, p->ly,
                                                     pref, 1, &result, &n);
  cublasLtMatmulPreferenceDestroy(pref);
  p->found = st == CUBLAS_STATUS_SUCCESS && n > 0;
  if (p->found) p->algo = result.algo, p->workspace = result.workspaceSize;
  slot = std::move(p);
  return *slot;
}

// The structural conditions every epilogue shares (no device work); then cuBLASLt's heuristic.
bool supported(Epilogue e, const Operands& o) {
  const Tensor &a = o.a, &b = o.b, &y = o.y;
  if (a.dim() != 2 || b.dim() != 2 || y.dim() != 2) return false;
  if (a.dtype() != b.dtype() || !(y.dtype() == a.dtype() || y.dtype() == DType::f32)) return false;
  if (a.dtype() != DType::f32 && a.dtype() != DType::f16 && a.dtype() != DType::bf16) return false;
  if (!matrix_layout(a) || !matrix_layout(b) || !y.is_contiguous()) return false;
  if (a.numel() == 0 || b.numel() == 0 || b.shape()[0] != a.shape()[1] || y.shape() != Shape{a.shape()[0], b.shape()[1]})
    return false;
  if (o.bias.dim() != 1 || !(o.bias.dtype() == y.dtype() || o.bias.dtype() == DType::f32) || !o.bias.is_contiguous() ||
      o.bias.numel() != b.shape()[1])
    return false;
  if (o.aux && (o.aux->shape() != y.shape() || o.aux->dtype() != y.dtype() || !o.aux->is_contiguous() ||
                y.shape()[1] % 8 != 0 || !aux_aligned(*o.aux)))
    return false;
  return lt_plan(e, o).found;
}

void run(Epilogue e, const Operands& o) {
  const LtPlan& p = lt_plan(e, o);
  REEL_CHECK(p.found, epilogue_name(e), ": cuBLASLt has no algorithm for ", shape_str(o.a.shape()), " @ ",
             shape_str(o.b.shape()));
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, o.bias.data_ptr());
  if (o.aux) {
    REEL_CHECK(aux_aligned(*o.aux), epilogue_name(e), ": the pre-activation ", shape_str(o.aux->shape()),
               " must start ", kAuxAlignment, "-byte aligned");
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, o.aux->data_ptr());
  }
  const float one = 1.0f, zero = 0.0f;
  // On side lane 2 (a micro-batch's first forward kernels run ahead: tensor/cuda.h), which has no
  // cuBLAS workspace of its own, the same algorithm gets the bytes it needs from the caching allocator
  // for the call (the lane's own blocks), so the lane adds no 16 MiB to the step's memory.
  const Device dev = o.y.device();
  Tensor call_ws;
  void* ws = nullptr;
  size_t ws_bytes = kBlasGemmWorkspaceBytes;
  if (side_lane(stream_of(o.y), dev.index) == 2) {
    ws_bytes = p.workspace;
    if (ws_bytes > 0) call_ws = workspace(ws_bytes, dev), ws = call_ws.data_ptr();
  } else {
    ws = blas_workspace(dev);
  }
  REEL_CUBLAS_CHECK(cublasLtMatmul(cublaslt_handle(dev), p.desc, &one, o.b.data_ptr(), p.la, o.a.data_ptr(), p.lb,
                                   &zero, o.y.data_ptr(), p.ly, o.y.data_ptr(), p.ly, &p.algo, ws, ws_bytes,
                                   stream_of(o.y)));
}

}  // namespace

bool gemm_bias_supported(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& y) {
  return supported(Epilogue::Bias, {a, b, bias, nullptr, y});
}
void gemm_bias(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& y) {
  run(Epilogue::Bias, {a, b, bias, nullptr, y});
}

bool gemm_bias_gelu_supported(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& y, const Tensor& pre) {
  return supported(Epilogue::BiasGeluAux, {a, b, bias, &pre, y});
}
void gemm_bias_gelu(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& y, const Tensor& pre) {
  run(Epilogue::BiasGeluAux, {a, b, bias, &pre, y});
}

namespace {

// The gemm_epilogue op (schema in kernels/schema/linalg.cpp): a (..., K) and its results (..., N) are
// handed to cuBLASLt as (rows, K) and (rows, N) matrices, when their strides fold the leading dims.
std::optional<Tensor> rows_of(const Tensor& t) {
  if (t.dim() == 2) return t;
  const int64_t cols = t.dim() ? t.shape().back() : 1, rows = cols ? t.numel() / cols : 0;
  const std::optional<Shape> s = view_strides(t.shape(), t.strides(), {rows, cols});
  if (!s) return std::nullopt;
  return Tensor::make_view(t, {rows, cols}, *s, t.offset());
}

std::optional<Tensor> gelu_pre(const KernelCall& c) {
  if (!c.attrs.b("gelu", false)) return Tensor();
  return rows_of(c.out[1]);
}

bool gemm_epilogue_supported(const KernelCall& c) {
  const std::optional<Tensor> a = rows_of(c.in[0]), y = rows_of(c.out[0]), pre = gelu_pre(c);
  if (!a || !y || !pre) return false;
  if (pre->defined()) return gemm_bias_gelu_supported(*a, c.in[1], c.in[2], *y, *pre);
  return gemm_bias_supported(*a, c.in[1], c.in[2], *y);
}

void gemm_epilogue_kernel(const KernelCall& c) {
  const std::optional<Tensor> a = rows_of(c.in[0]), y = rows_of(c.out[0]), pre = gelu_pre(c);
  REEL_CHECK(a && y && pre, "gemm_epilogue: a ", shape_str(c.in[0].shape()), " strides ", shape_str(c.in[0].strides()),
             " or its result ", shape_str(c.out[0].shape()), " does not fold into a (rows, cols) matrix on ",
             c.out[0].device().str());
  if (pre->defined()) gemm_bias_gelu(*a, c.in[1], c.in[2], *y, *pre);
  else gemm_bias(*a, c.in[1], c.in[2], *y);
}

}  // namespace

void register_gemm_epilogue_cuda_kernel() {
  register_kernel(DeviceType::CUDA, OpKind::GemmEpilogue, gemm_epilogue_kernel);
  register_supports(DeviceType::CUDA, OpKind::GemmEpilogue, gemm_epilogue_supported);
}

}  // namespace reel::cuda
