// Attrs — the non-tensor arguments of an op (dims, eps, stride, seed, ...), as named values.
//
// Attrs travel with every dispatch so that the tracer can record them, the plan printer can show
// them and the plan cache can hash them. Values are int64, double or a list of int64; bools and
// dtypes are stored as int64.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "tensor/dtype.h"

namespace reel {

class Attrs {
 public:
  using Value = std::variant<int64_t, double, std::vector<int64_t>>;

  Attrs() = default;
  Attrs& set(const char* name, int64_t v) { return put(name, v); }
  Attrs& set(const char* name, int v) { return put(name, int64_t(v)); }
  Attrs& set(const char* name, bool v) { return put(name, int64_t(v)); }
  Attrs& set(const char* name, double v) { return put(name, v); }
  Attrs& set(const char* name, DType v) { return put(name, int64_t(v)); }
  Attrs& set(const char* name, std::vector<int64_t> v) { return put(name, std::move(v)); }

  bool has(const char* name) const { return find(name) != nullptr; }
  int64_t i(const char* name) const;
  int64_t i(const char* name, int64_t fallback) const;
  double f(const char* name) const;
  double f(const char* name, double fallback) const;
  bool b(const char* name) const { return i(name) != 0; }
  bool b(const char* name, bool fallback) const { return i(name, fallback) != 0; }
  DType dtype(const char* name) const { return static_cast<DType>(i(name)); }
  const std::vector<int64_t>& ints(const char* name) const;

  const std::vector<std::pair<std::string, Value>>& items() const { return items_; }
  // "dim=1, keepdim=1". Lists longer than max_list show their size only ("program=[120 values]"): a
  // fused elementwise op's program would drown a plan listing. The default prints everything.
  std::string str(size_t max_list = SIZE_MAX) const;

 private:
  Attrs& put(const char* name, Value v);
  const Value* find(const char* name) const;
  std::vector<std::pair<std::string, Value>> items_;
};

}  // namespace reel
