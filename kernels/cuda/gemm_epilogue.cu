// GEMM + bias epilogue on cuBLASLt (see gemm_epilogue.h).
//
// Row-major vs column-major as in matmul.cu: reel computes y^T (N, M) = b^T (N, K) @ a^T (K, M), so b is
// cuBLASLt's A operand and a its B. CUBLASLT_EPILOGUE_BIAS adds bias[i] to row i of the column-major
// result, i.e. to column i of reel's row-major y: exactly a Linear layer's bias.
// The matmul descriptor, layouts and the heuristic's algorithm are made once per problem and cached;
// the workspace is the one cuBLAS uses (blas_workspace: allocated once, so a capture never allocates).
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/gemm_epilogue.h"
#include "kernels/matrix_layout.h"

namespace reel::cuda {

namespace {

cudaDataType lt_type(DType dt) {
  switch (dt) {
    case DType::f32: return CUDA_R_32F;
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    default: throw Error(detail::cat("gemm_bias: dtype ", dtype_name(dt), " is not supported (f32, f16, bf16)"));
  }
}

struct LtPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ly = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool found = false;
  ~LtPlan() {
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (ly) cublasLtMatrixLayoutDestroy(ly);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

using Key = std::tuple<int64_t, int64_t, int64_t, bool, int64_t, bool, int64_t, int, int, int, int>;

// cuBLASLt's view of reel's row-major operand t (rows x cols): see matmul.cu.
void describe(const MatLayout& l, int64_t rows, int64_t cols, cudaDataType type, cublasOperation_t* op,
              cublasLtMatrixLayout_t* layout) {
  *op = l.row_major ? CUBLAS_OP_N : CUBLAS_OP_T;
  // Stored as column-major: a row-major (rows, cols) matrix is the column-major (cols, rows) one.
  if (l.row_major) REEL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(layout, type, uint64_t(cols), uint64_t(rows), l.outer));
  else REEL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(layout, type, uint64_t(rows), uint64_t(cols), l.outer));
}

const LtPlan& lt_plan(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& y) {
  const int64_t M = a.shape()[0], K = a.shape()[1], N = b.shape()[1];
  std::optional<MatLayout> la = matrix_layout(a), lb = matrix_layout(b);
  REEL_CHECK(la && lb && y.is_contiguous() && bias.is_contiguous() && bias.numel() == N && b.shape()[0] == K &&
                 y.shape()[0] == M && y.shape()[1] == N,
             "gemm_bias: shapes ", shape_str(a.shape()), " @ ", shape_str(b.shape()), " + ", shape_str(bias.shape()),
             " -> ", shape_str(y.shape()), " do not form (M, K) @ (K, N) + (N) -> (M, N) with readable layouts");
  const Key key{M, N, K, la->row_major, la->outer, lb->row_major, lb->outer, int(a.dtype()), int(y.dtype()),
                int(bias.dtype()), y.device().index};
  static std::mutex mutex;
  static std::map<Key, std::unique_ptr<LtPlan>> plans;
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<LtPlan>& slot = plans[key];
  if (slot) return *slot;
  auto p = std::make_unique<LtPlan>();
  REEL_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t op_b, op_a;
  describe(*lb, K, N, lt_type(b.dtype()), &op_b, &p->la);  // cuBLASLt's A is reel's b
  describe(*la, M, K, lt_type(a.dtype()), &op_a, &p->lb);  // and its B is reel's a
  REEL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->ly, lt_type(y.dtype()), uint64_t(N), uint64_t(M), N));
  REEL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof op_b));
  REEL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof op_a));
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
  REEL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  cudaDataType bias_type = lt_type(bias.dtype());
  REEL_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type));
  cublasLtMatmulPreference_t pref;
  REEL_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = kBlasWorkspaceBytes;
  REEL_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  cublasLtMatmulHeuristicResult_t result{};
  int n = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(cublaslt_handle(y.device()), p->desc, p->la, p->lb, p->ly, p->ly,
                                                     pref, 1, &result, &n);
  cublasLtMatmulPreferenceDestroy(pref);
  p->found = st == CUBLAS_STATUS_SUCCESS && n > 0;
  if (p->found) p->algo = result.algo;
  slot = std::move(p);
  return *slot;
}

}  // namespace

bool gemm_bias_supported(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& y) {
  if (a.dim() != 2 || b.dim() != 2 || bias.dim() != 1 || y.dim() != 2) return false;
  if (a.dtype() != b.dtype() || !(bias.dtype() == y.dtype() || bias.dtype() == DType::f32)) return false;
  if (!(y.dtype() == a.dtype() || y.dtype() == DType::f32)) return false;
  if (a.dtype() != DType::f32 && a.dtype() != DType::f16 && a.dtype() != DType::bf16) return false;
  if (!matrix_layout(a) || !matrix_layout(b) || !y.is_contiguous() || !bias.is_contiguous()) return false;
  if (a.numel() == 0 || b.numel() == 0) return false;
  return lt_plan(a, b, bias, y).found;
}

void gemm_bias(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& y) {
  const LtPlan& p = lt_plan(a, b, bias, y);
  REEL_CHECK(p.found, "gemm_bias: cuBLASLt has no algorithm for ", shape_str(a.shape()), " @ ", shape_str(b.shape()));
  const void* bias_ptr = bias.data_ptr();
  REEL_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr, sizeof bias_ptr));
  const float one = 1.0f, zero = 0.0f;
  const Tensor& ws = blas_workspace(y.device());
  REEL_CUBLAS_CHECK(cublasLtMatmul(cublaslt_handle(y.device()), p.desc, &one, b.data_ptr(), p.la, a.data_ptr(), p.lb,
                                   &zero, y.data_ptr(), p.ly, y.data_ptr(), p.ly, &p.algo, ws.data_ptr(),
                                   kBlasWorkspaceBytes, stream_of(y)));
}

}  // namespace reel::cuda
