// How a GEMM library can read a (rows, cols) matrix of a strided tensor in place: row-major with a
// leading dimension, column-major (a transposed view) with one, or not at all (copy it first). Shared
// by the Eigen (CPU) and cuBLAS (CUDA) matmul kernels so both take the same no-copy paths.
#pragma once
#include <algorithm>
#include <cstdint>
#include <optional>

#include "tensor/tensor.h"

namespace reel {

struct MatLayout {
  bool row_major = true;
  int64_t outer = 0;  // elements between consecutive rows (row-major) or columns (column-major)
};

// A size-1 dim's stride is meaningless (views may leave anything there), so it is normalised first;
// the result always has outer >= 1, as BLAS leading dimensions must.
inline std::optional<MatLayout> matrix_layout(int64_t rows, int64_t cols, int64_t s_row, int64_t s_col) {
  if (cols == 1) s_col = 1;
  if (rows == 1) s_row = std::max<int64_t>(cols, 1);
  if (s_col == 1 && s_row >= cols) return MatLayout{true, s_row};
  if (rows == 1) s_row = 1;  // also a valid column-major reading of a single row
  if (s_row == 1 && s_col >= rows) return MatLayout{false, s_col};
  return std::nullopt;
}

// The layout of the last two dims of t.
inline std::optional<MatLayout> matrix_layout(const Tensor& t) {
  const int64_t nd = t.dim();
  return matrix_layout(t.shape()[nd - 2], t.shape()[nd - 1], t.strides()[nd - 2], t.strides()[nd - 1]);
}

}  // namespace reel
