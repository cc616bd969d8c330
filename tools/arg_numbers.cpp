// The command line's checked numbers (see arg_numbers.h).
#include "tools/arg_numbers.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "compile/runtime/memory_budget.h"
#include "tensor/error.h"

namespace reel::tools {
namespace {

std::string range_str(int64_t lo, int64_t hi) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (hi == kMax) return ">= " + std::to_string(lo);
  return "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

}  // namespace

int64_t int_arg(const char* command, const std::string& option, const std::string& value, int64_t lo, int64_t hi) {
  errno = 0;
  char* end = nullptr;
  const long long x = value.empty() ? 0 : std::strtoll(value.c_str(), &end, 10);
  const bool parsed = !value.empty() && end == value.c_str() + value.size() && errno != ERANGE;
  REEL_CHECK(parsed && x >= lo && x <= hi, command, ": ", option, " expects an integer ", range_str(lo, hi), ", got \"",
             value, "\"");
  return x;
}

double real_arg(const char* command, const std::string& option, const std::string& value, double lo, double hi) {
  errno = 0;
  char* end = nullptr;
  const double x = value.empty() ? 0 : std::strtod(value.c_str(), &end);
  const bool parsed = !value.empty() && end == value.c_str() + value.size() && errno != ERANGE && std::isfinite(x);
  REEL_CHECK(parsed && x >= lo && x <= hi, command, ": ", option, " expects a finite number", 
             lo > -std::numeric_limits<double>::max() ? detail::cat(" >= ", lo) : std::string(),
             hi < std::numeric_limits<double>::max() ? detail::cat(" <= ", hi) : std::string(), ", got \"", value, "\"");
  return x;
}

size_t size_arg(const char* command, const std::string& option, const std::string& value) {
  try {
    return compile::parse_memory_size(value);
  } catch (const Error& e) {
    throw Error(std::string(command) + ": " + option + ": " + e.what());
  }
}

}  // namespace reel::tools
