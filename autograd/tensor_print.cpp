// Printing in PyTorch's manner: nested brackets, aligned columns, "..." past 1000 elements.
#include <cmath>
#include <cstdio>
#include <sstream>

#include "tensor/tensor.h"

namespace reel {
namespace {

constexpr int64_t kSummaryThreshold = 1000;
constexpr int64_t kEdgeItems = 3;

std::string format_value(double v, bool integer) {
  char buf[64];
  if (integer) std::snprintf(buf, sizeof buf, "%lld", (long long)v);
  else if (std::isnan(v)) std::snprintf(buf, sizeof buf, "nan");
  else if (std::isinf(v)) std::snprintf(buf, sizeof buf, v > 0 ? "inf" : "-inf");
  else if (v != 0 && (std::fabs(v) >= 1e6 || std::fabs(v) < 1e-4)) std::snprintf(buf, sizeof buf, "%.4e", v);
  else std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}

struct Printer {
  const std::vector<double>& values;
  const Shape& shape;
  bool integer, summarize;
  size_t width = 0;
  std::ostringstream os;

  void print(size_t dim, int64_t base, int indent) {
    if (dim == shape.size()) {
      std::string s = format_value(values[base], integer);
      os << std::string(width > s.size() ? width - s.size() : 0, ' ') << s;
      return;
    }
    int64_t n = shape[dim], stride = 1;
    for (size_t d = dim + 1; d < shape.size(); ++d) stride *= shape[d];
    os << "[";
    for (int64_t i = 0; i < n; ++i) {
      if (summarize && n > 2 * kEdgeItems && i == kEdgeItems) {
        os << "...";
        i = n - kEdgeItems - 1;
        os << (dim + 1 == shape.size() ? ", " : ",\n" + std::string(indent + 1, ' '));
        continue;
      }
      print(dim + 1, base + i * stride, indent + 1);
      if (i + 1 < n) os << (dim + 1 == shape.size() ? ", " : "," + std::string(shape.size() - dim - 1, '\n') +
                                                                std::string(indent + 1, ' '));
    }
    os << "]";
  }
};

}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  std::vector<double> values = dtype() == DType::i64 ? std::vector<double>() : to_vector<double>();
  if (dtype() == DType::i64)
    for (int64_t v : to_vector<int64_t>()) values.push_back(double(v));
  Printer p{values, shape(), dtype() == DType::i64, numel() > kSummaryThreshold, 0, {}};
  for (double v : values) p.width = std::max(p.width, format_value(v, p.integer).size());
  p.os << "tensor(";
  p.print(0, 0, 7);
  p.os << ", dtype=" << dtype_name(dtype());
  if (device().is_cuda()) p.os << ", device=" << device().str();
  if (requires_grad()) p.os << ", requires_grad=true";
  p.os << ")";
  return p.os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

}  // namespace reel
