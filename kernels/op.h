// OpKind — the enum of every op, generated from kernels/ops.def.
#pragma once
#include <cstdint>

namespace reel {

enum class OpKind : uint16_t {
#define REEL_OP(name, str, family) name,
#include "kernels/ops.def"
#undef REEL_OP
  Count_
};

constexpr int kNumOps = static_cast<int>(OpKind::Count_);

const char* op_name(OpKind op);

}  // namespace reel
