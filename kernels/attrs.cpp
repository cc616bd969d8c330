#include "kernels/attrs.h"

#include <sstream>

#include "tensor/error.h"

namespace reel {

Attrs& Attrs::put(const char* name, Value v) {
  for (auto& kv : items_)
    if (kv.first == name) {
      kv.second = std::move(v);
      return *this;
    }
  items_.emplace_back(name, std::move(v));
  return *this;
}

const Attrs::Value* Attrs::find(const char* name) const {
  for (const auto& kv : items_)
    if (kv.first == name) return &kv.second;
  return nullptr;
}

int64_t Attrs::i(const char* name) const {
  const Value* v = find(name);
  REEL_ASSERT(v && std::holds_alternative<int64_t>(*v), "attr '", name, "' missing or not an integer");
  return std::get<int64_t>(*v);
}

int64_t Attrs::i(const char* name, int64_t fallback) const { return has(name) ? i(name) : fallback; }

double Attrs::f(const char* name) const {
  const Value* v = find(name);
  REEL_ASSERT(v != nullptr, "attr '", name, "' missing");
  if (std::holds_alternative<int64_t>(*v)) return double(std::get<int64_t>(*v));
  REEL_ASSERT(std::holds_alternative<double>(*v), "attr '", name, "' is not a number");
  return std::get<double>(*v);
}

double Attrs::f(const char* name, double fallback) const { return has(name) ? f(name) : fallback; }

const std::vector<int64_t>& Attrs::ints(const char* name) const {
  const Value* v = find(name);
  REEL_ASSERT(v && std::holds_alternative<std::vector<int64_t>>(*v), "attr '", name, "' missing or not a list");
  return std::get<std::vector<int64_t>>(*v);
}

std::string Attrs::str(size_t max_list) const {
  std::ostringstream os;
  bool first = true;
  for (const auto& [name, v] : items_) {
    os << (first ? "" : ", ") << name << "=";
    first = false;
    if (auto p = std::get_if<int64_t>(&v)) os << *p;
    else if (auto d = std::get_if<double>(&v)) os << *d;
    else {
      const auto& l = std::get<std::vector<int64_t>>(v);
      if (l.size() > max_list) {
        os << "[" << l.size() << " values]";
        continue;
      }
      os << "[";
      for (size_t k = 0; k < l.size(); ++k) os << (k ? "," : "") << l[k];
      os << "]";
    }
  }
  return os.str();
}

}  // namespace reel
