// CUDA source generation for fused elementwise kernels (see codegen_cuda.h).
#include "kernels/jit/codegen_cuda.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "kernels/jit/nvrtc_math.h"
#include "tensor/error.h"

namespace reel::jit {

namespace {

// Everything a generated program needs besides the formulas: their math primitives on CUDA's libm
// (the same overloads by type as the host's std:: ones) and 16-bit conversions.
constexpr const char* kPrelude = R"(#define REEL_FM_FN __device__ __forceinline__
REEL_FM_FN float math_exp(float x) { return expf(x); }
REEL_FM_FN double math_exp(double x) { return exp(x); }
REEL_FM_FN float math_log(float x) { return logf(x); }
REEL_FM_FN double math_log(double x) { return log(x); }
REEL_FM_FN float math_sqrt(float x) { return sqrtf(x); }
REEL_FM_FN double math_sqrt(double x) { return sqrt(x); }
REEL_FM_FN float math_tanh(float x) { return tanhf(x); }
REEL_FM_FN double math_tanh(double x) { return tanh(x); }
REEL_FM_FN float math_erf(float x) { return erff(x); }
REEL_FM_FN double math_erf(double x) { return erf(x); }
REEL_FM_FN float math_exp_fast(float x) { return __expf(x); }
REEL_FM_FN double math_exp_fast(double x) { return exp(x); }
REEL_FM_FN float math_recip_fast(float x) { return __fdividef(1.0f, x); }
REEL_FM_FN double math_recip_fast(double x) { return 1.0 / x; }
REEL_FM_FN float math_pow(float x, float y) { return powf(x, y); }
REEL_FM_FN double math_pow(double x, double y) { return pow(x, y); }
// mul, add and sub as single correctly rounded instructions (mul.rn / add.rn / sub.rn), which the
// code generator never contracts into an FMA: a chain of ops rounds after each one, as a chain of
// eager kernels does (a plain a * b + c in the generated code may become one fma). Inside the other
// formulas FMAs form as in their eager kernels, which nvcc compiles with the same contraction.
REEL_FM_FN float math_mul(float a, float b) { return __fmul_rn(a, b); }
REEL_FM_FN double math_mul(double a, double b) { return __dmul_rn(a, b); }
REEL_FM_FN long long math_mul(long long a, long long b) { return a * b; }
REEL_FM_FN float math_add(float a, float b) { return __fadd_rn(a, b); }
REEL_FM_FN double math_add(double a, double b) { return __dadd_rn(a, b); }
REEL_FM_FN long long math_add(long long a, long long b) { return a + b; }
REEL_FM_FN float math_sub(float a, float b) { return __fsub_rn(a, b); }
REEL_FM_FN double math_sub(double a, double b) { return __dsub_rn(a, b); }
REEL_FM_FN long long math_sub(long long a, long long b) { return a - b; }
REEL_FM_FN float reel_load_f16(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
REEL_FM_FN unsigned short reel_store_f16(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
REEL_FM_FN float reel_load_bf16(unsigned short b) { return __uint_as_float(((unsigned int)b) << 16); }
// Round to nearest even, a NaN kept a NaN with its sign and top payload bits (tensor/half.h's
// float_to_bf16_bits): cvt.rn.bf16.f32 rounds every other value the same way in one instruction, but
// makes NaNs canonical, so they take the host's bit arithmetic.
REEL_FM_FN unsigned short reel_store_bf16(float f) {
  unsigned int x = __float_as_uint(f);
  const unsigned short nan = (unsigned short)((x >> 16) | 0x40u);
#if __CUDA_ARCH__ >= 800
  unsigned short b; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));
#else
  x += 0x7fffu + ((x >> 16) & 1u);
  const unsigned short b = (unsigned short)(x >> 16);
#endif
  return (__float_as_uint(f) & 0x7fffffffu) > 0x7f800000u ? nan : b;
}
struct alignas(16) reel_pack_u16 { unsigned short v[8]; };
struct alignas(16) reel_pack_f32 { float v[8]; };
struct alignas(16) reel_pack_f64 { double v[8]; };
struct alignas(16) reel_pack_i64 { long long v[8]; };
)";

const char* storage_type(DType t) {
  switch (t) {
    case DType::f32: return "float";
    case DType::f64: return "double";
    case DType::f16: case DType::bf16: return "unsigned short";
    case DType::i64: return "long long";
  }
  return "?";
}

// The prelude's type of kFusedVectorWidth consecutive elements of dtype t, 16-byte aligned.
const char* pack_type(DType t) {
  switch (t) {
    case DType::f32: return "reel_pack_f32";
    case DType::f64: return "reel_pack_f64";
    case DType::f16: case DType::bf16: return "reel_pack_u16";
    case DType::i64: return "reel_pack_i64";
  }
  return "?";
}

// `text` (of dtype t's storage type) widened to its accumulation type.
std::string widen(DType t, const std::string& text) {
  if (t == DType::f16) return "reel_load_f16(" + text + ")";
  if (t == DType::bf16) return "reel_load_bf16(" + text + ")";
  return text;
}

// `text` (of dtype t's accumulation type) narrowed to its storage type.
std::string narrow(DType t, const std::string& text) {
  if (t == DType::f16) return "reel_store_f16(" + text + ")";
  if (t == DType::bf16) return "reel_store_bf16(" + text + ")";
  return text;
}

// An attr as an exact constant of type `type`: the double's bits, so infinities and every digit
// survive, converted as the CPU converts A(param).
std::string constant(double v, ValueType type) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  char buf[96];
  std::snprintf(buf, sizeof buf, "(%s)__longlong_as_double(0x%016" PRIx64 "LL) /* %.9g */", value_type_name(type), bits, v);
  return buf;
}

std::string reg(int r) { return "r" + std::to_string(r); }

// A copy's conversion of register `r` (any type) to dtype `to`, as the CPU's copy: through double.
std::string cast_text(int r, DType to) {
  const std::string d = "(double)" + reg(r);
  switch (to) {
    case DType::f32: return "(float)" + d;
    case DType::f64: return d;
    case DType::i64: return "(long long)" + d;
    case DType::f16: return "reel_load_f16(reel_store_f16((float)" + d + "))";
    case DType::bf16: return "reel_load_bf16(reel_store_bf16((float)" + d + "))";
  }
  return d;
}

// What store instruction i writes: its register narrowed to the storage type; or, where that register
// is a cast to the stored 16-bit dtype, the cast's source rounded once. The cast's value is already a
// 16-bit one widened, which narrows back to itself (a NaN to the same bits: its payload's top bits
// survive the widening), so the bits are those of rounding twice without the second rounding's
// dozen integer instructions an element.
std::string stored_text(const FusedExpr& e, const Instr& i) {
  const Instr& arg = e.code[size_t(i.args[0])];
  if (arg.kind == InstrKind::Cast && arg.dtype == i.dtype && (i.dtype == DType::f16 || i.dtype == DType::bf16))
    return narrow(i.dtype, "(float)(double)" + reg(arg.args[0]));
  return narrow(i.dtype, reg(i.args[0]));
}

std::string op_text(const Instr& i) {
  std::string s = std::string("op_") + op_name(i.op) + "(";
  for (int k = 0; k < 3 && i.args[k] >= 0; ++k) s += (k ? ", " : "") + reg(i.args[k]);
  if (i.op == OpKind::PowScalar || i.op == OpKind::AddScalar || i.op == OpKind::MulScalar || i.op == OpKind::MaskedFill)
    s += ", " + constant(i.p0, i.type);
  if (i.op == OpKind::ClampScalar) s += ", " + constant(i.p0, i.type) + ", " + constant(i.p1, i.type);
  return s + ")";
}

// The element offset of loop operand k (0: the outputs) at element e, from the dim indices i0...
std::string offset_text(const FusedLoop& l, size_t k, const char* suffix) {
  if (l.strides[k] == l.strides[0]) return "e";
  std::string s;
  for (size_t d = 0; d < l.sizes.size(); ++d) {
    if (l.strides[k][d] == 0) continue;
    s += (s.empty() ? "" : " + ") + ("i" + std::to_string(d));
    if (l.strides[k][d] != 1) s += " * " + std::to_string(l.strides[k][d]) + suffix;
  }
  return s.empty() ? "0" : s;
}

// The kernel's parameters: the loaded inputs, the Philox states, the outputs; with column sums also
// the sums, the chunks' partial sums (a workspace of (chunks, C) floats) and the rows of a chunk.
std::string signature(const FusedExpr& e, bool column_sums) {
  std::string s = std::string("extern \"C\" __global__ void __launch_bounds__(") + std::to_string(kFusedBlockThreads) +
                  ") " + kFusedKernelName + "(";
  std::string sep;
  for (size_t k = 0; k < e.inputs.size(); ++k, sep = ", ")
    s += sep + std::string("const ") + storage_type(e.inputs[k]) + "* in" + std::to_string(k);
  for (int k = 0; k < e.states; ++k, sep = ", ") s += sep + "const unsigned long long* st" + std::to_string(k);
  for (size_t k = 0; k < e.outputs.size(); ++k, sep = ", ")
    s += sep + std::string(storage_type(e.outputs[k])) + "* out" + std::to_string(k);
  if (column_sums) s += sep + "float* sums, float* partial, long long chunk";
  return s + ")";
}

// The scalar loop's header, from element `first` on, and the dim indices of element e (innermost dim
// last, as in the loop's sizes).
void emit_loop_head(std::ostringstream& os, const FusedLoop& l, const char* suffix) {
  os << "  for (index_t e = first + index_t(blockIdx.x) * " << kFusedBlockThreads << suffix
     << " + threadIdx.x; e < n; e += index_t(gridDim.x) * " << kFusedBlockThreads << suffix << ") {\n";
  const size_t nd = l.sizes.size();
  if (nd == 1) {
    os << "    const index_t i0 = e;\n";
    return;
  }
  os << "    index_t rest = e;\n";
  for (size_t d = nd - 1; d > 0; --d)
    os << "    const index_t i" << d << " = rest % " << l.sizes[d] << suffix << "; rest /= " << l.sizes[d] << suffix << ";\n";
  os << "    const index_t i0 = rest;\n";
}

// The Philox key and first counter of random instruction i: its state's values (read once at the
// kernel's start, key<k> and base<k>) plus its offset, or its own constants.
std::string random_key(const Instr& i) {
  return i.index >= 0 ? "key" + std::to_string(i.index) : std::to_string(i.seed) + "ull";
}
std::string random_start(const Instr& i) {
  const std::string off = std::to_string(i.offset) + "ull";
  return i.index >= 0 ? "(base" + std::to_string(i.index) + " + " + off + ")" : off;
}
std::string random_args(const Instr& i) {
  return constant(double(float(i.p0)), ValueType::F32) + ", " + constant(i.p1, i.type);
}

// Instruction r of the program, `indent` deep. Input k's element is read as load(k) and output k's
// written as store(k) (the scalar loop: in k at its offset, out k at e; the vector loop: element j of
// the packs).
template <typename Load, typename Store, typename Random>
void emit_instr(std::ostringstream& os, const FusedExpr& e, size_t r, const char* indent, Load load, Store store,
                Random random) {
  const Instr& i = e.code[r];
  const char* type = value_type_name(i.type);
  switch (i.kind) {
    case InstrKind::Random: os << indent << "const " << type << " " << reg(int(r)) << " = " << random(int(r)) << ";\n"; break;
    case InstrKind::Load: os << indent << "const " << type << " " << reg(int(r)) << " = " << widen(i.dtype, load(i.index)) << ";\n"; break;
    case InstrKind::Op: os << indent << "const " << type << " " << reg(int(r)) << " = " << op_text(i) << ";\n"; break;
    case InstrKind::Cast: os << indent << "const " << type << " " << reg(int(r)) << " = " << cast_text(i.args[0], i.dtype) << ";\n"; break;
    case InstrKind::Store: os << indent << store(i.index) << " = " << stored_text(e, i) << ";\n"; break;
  }
}

// The loads first, then the other instructions in program order (codegen_cuda.h: why, and why the
// values are the same).
void emit_scalar_body(std::ostringstream& os, const FusedExpr& e, const FusedLoop& l, const char* suffix) {
  auto load = [&](int k) { return "in" + std::to_string(k) + "[" + offset_text(l, size_t(k) + 1, suffix) + "]"; };
  auto store = [&](int k) { return "out" + std::to_string(k) + "[e]"; };
  auto random = [&](int r) {
    const Instr& i = e.code[size_t(r)];
    return std::string("op_dropout_mask(") + random_key(i) + ", " + random_start(i) + ", (unsigned long long)e, " +
           random_args(i) + ")";
  };
  for (const bool loads : {true, false})
    for (size_t r = 0; r < e.code.size(); ++r)
      if ((e.code[r].kind == InstrKind::Load) == loads) emit_instr(os, e, r, "    ", load, store, random);
}

// One pack of a contiguous program, `indent` deep, in two parts: the loads of kFusedVectorWidth
// elements of every input from element pack * width on, with 16-byte loads into l<k><tag>; then the
// elements computed one by one exactly as the scalar loop would, and stored from s<k><tag> as packs.
// Every pointer must be 16-byte aligned. Several packs' loads may come before the first's compute
// (the column-sums kernel's rows in flight): a program reads a buffer it writes only at the element
// it writes (compile/passes/fuse_elementwise.cpp), so no load can see another pack's store.
// `pack` as a factor: an expression in parentheses, a plain name as it is.
std::string factor(const std::string& pack) { return pack.find(' ') == std::string::npos ? pack : "(" + pack + ")"; }

void emit_pack_loads(std::ostringstream& os, const FusedExpr& e, const std::string& indent, const char* suffix,
                     const std::string& tag, const std::string& pack) {
  for (size_t k = 0; k < e.inputs.size(); ++k)
    os << indent << "const " << pack_type(e.inputs[k]) << " l" << k << tag << " = *reinterpret_cast<const "
       << pack_type(e.inputs[k]) << "*>(in" << k << " + " << factor(pack) << " * " << kFusedVectorWidth << suffix
       << ");\n";
}

void emit_pack_compute(std::ostringstream& os, const FusedExpr& e, const std::string& indent, const char* suffix,
                       const std::string& tag, const std::string& pack) {
  const int w = kFusedVectorWidth;
  for (size_t k = 0; k < e.outputs.size(); ++k) os << indent << pack_type(e.outputs[k]) << " s" << k << tag << ";\n";
  // A random instruction's Philox blocks for the pack's elements p w .. p w + w - 1, drawn once each
  // (a block gives four consecutive elements their words) rather than once per element.
  static_assert(kFusedVectorWidth % 4 == 0, "a pack holds whole Philox blocks");
  for (size_t r = 0; r < e.code.size(); ++r) {
    const Instr& i = e.code[r];
    if (i.kind != InstrKind::Random) continue;
    for (int b = 0; b < w / 4; ++b)
      os << indent << "const philox_words ph" << r << "_" << b << tag << " = philox4x32_10_words(" << random_key(i)
         << ", " << random_start(i) << " + (unsigned long long)" << factor(pack) << " * " << w / 4 << "ull + " << b
         << "ull);\n";
  }
  os << "#pragma unroll\n" << indent << "for (int j = 0; j < " << w << "; ++j) {\n";
  auto random = [&](int r) {
    const std::string ph = "ph" + std::to_string(r) + "_";
    std::string blocks = ph + std::to_string(w / 4 - 1) + tag;
    for (int b = w / 4 - 2; b >= 0; --b)
      blocks = "(j < " + std::to_string(4 * (b + 1)) + " ? " + ph + std::to_string(b) + tag + " : " + blocks + ")";
    return "dropout_mask_of(philox_word(" + blocks + ", (unsigned int)(j % 4)), " + random_args(e.code[size_t(r)]) + ")";
  };
  const std::string inner = indent + "  ";
  for (size_t r = 0; r < e.code.size(); ++r)
    emit_instr(
        os, e, r, inner.c_str(), [&](int k) { return "l" + std::to_string(k) + tag + ".v[j]"; },
        [&](int k) { return "s" + std::to_string(k) + tag + ".v[j]"; }, random);
  os << indent << "}\n";
  for (size_t k = 0; k < e.outputs.size(); ++k)
    os << indent << "*reinterpret_cast<" << pack_type(e.outputs[k]) << "*>(out" << k << " + " << factor(pack) << " * "
       << w << suffix << ") = s" << k << tag << ";\n";
}

void emit_pack_body(std::ostringstream& os, const FusedExpr& e, const std::string& indent, const char* suffix) {
  emit_pack_loads(os, e, indent, suffix, "", "p");
  emit_pack_compute(os, e, indent, suffix, "", "p");
}

// The OR of every operand's address, whose low four bits are zero when all are 16-byte aligned.
void emit_addresses(std::ostringstream& os, const FusedExpr& e) {
  os << "  const unsigned long long addresses = 0ull";
  for (size_t k = 0; k < e.inputs.size(); ++k) os << " | (unsigned long long)in" << k;
  for (size_t k = 0; k < e.outputs.size(); ++k) os << " | (unsigned long long)out" << k;
  os << ";\n";
}

// The vector loop of a contiguous program: each thread takes packs of kFusedVectorWidth elements
// (emit_pack_body); then the scalar loop takes the last numel % width elements. Only when every
// pointer is 16-byte aligned (views may start anywhere): otherwise the scalar loop takes everything.
void emit_vector_loop(std::ostringstream& os, const FusedExpr& e, const char* suffix) {
  emit_addresses(os, e);
  os << "  if ((addresses & 15ull) == 0) {\n";
  os << "    const index_t packs = n / " << kFusedVectorWidth << suffix << ";\n";
  os << "    for (index_t p = index_t(blockIdx.x) * " << kFusedBlockThreads << suffix
     << " + threadIdx.x; p < packs; p += index_t(gridDim.x) * " << kFusedBlockThreads << suffix << ") {\n";
  emit_pack_body(os, e, "      ", suffix);
  os << "    }\n    first = packs * " << kFusedVectorWidth << suffix << ";\n  }\n";
}

// Rows whose packs a thread of the column-sums kernel loads before it computes the first: a block
// there walks its rows in a loop, so one pack at a time would leave each thread a single load in
// flight (the vector loop's threads have their one pack each, all at once).
constexpr int kColumnRowsInFlight = 4;

// The column-sums build (codegen_cuda.h): a (column tile, row chunk) block's walk over its rows, the
// packs of its 8 warps' rows computed and summed per column in f32, then the block's, the chunk's
// and the tile's sums in a fixed order.
void emit_column_sums_kernel(std::ostringstream& os, const FusedExpr& e, const FusedLoop& l, FusedColumnSums sums,
                             const char* suffix) {
  const int w = kFusedVectorWidth, lanes = kFusedColumnTile / w, warps = kFusedBlockThreads / lanes;
  const int64_t cols = l.shape.back(), rows = l.numel / cols;
  const DType summed = e.outputs[size_t(sums.output)];
  os << "  const index_t rows = " << rows << suffix << ", cols = " << cols << suffix << ";\n";
  os << "  const int lane = threadIdx.x % " << lanes << ", row_in_step = threadIdx.x / " << lanes << ";\n";
  os << "  const index_t c0 = index_t(blockIdx.x) * " << kFusedColumnTile << suffix << " + lane * " << w << suffix
     << ";\n";
  os << "  const index_t lo = index_t(blockIdx.y) * index_t(chunk);\n";
  os << "  const index_t hi = lo + index_t(chunk) < rows ? lo + index_t(chunk) : rows;\n";
  os << "  float acc[" << w << "];\n#pragma unroll\n  for (int j = 0; j < " << w << "; ++j) acc[j] = 0.0f;\n";
  emit_addresses(os, e);
  const std::string summed_out = std::to_string(sums.output);
  // Aligned: kColumnRowsInFlight rows' packs loaded before the first is computed, then the rows left
  // one at a time; misaligned: element by element through the scalar body.
  os << "  if (c0 < cols && (addresses & 15ull) == 0) {\n";
  os << "    index_t r = lo + row_in_step;\n";
  os << "    for (; r + " << (kColumnRowsInFlight - 1) * warps << suffix
     << " < hi; r += " << kColumnRowsInFlight * warps << suffix << ") {\n";
  os << "      const index_t p = (r * cols + c0) / " << w << suffix << ";\n";
  // Row r + warps u starts u * warps * cols / w packs after row r.
  auto pack_of = [&](int u) {
    return u == 0 ? std::string("p")
                  : "p + " + std::to_string(u * warps) + suffix + " * (cols / " + std::to_string(w) + suffix + ")";
  };
  for (int u = 0; u < kColumnRowsInFlight; ++u)
    emit_pack_loads(os, e, "      ", suffix, "_" + std::to_string(u), pack_of(u));
  for (int u = 0; u < kColumnRowsInFlight; ++u) {
    const std::string tag = "_" + std::to_string(u);
    emit_pack_compute(os, e, "      ", suffix, tag, pack_of(u));
    os << "#pragma unroll\n      for (int j = 0; j < " << w
       << "; ++j) acc[j] += " << widen(summed, "s" + summed_out + tag + ".v[j]") << ";\n";
  }
  os << "    }\n";
  os << "    for (; r < hi; r += " << warps << suffix << ") {\n";
  os << "      const index_t p = (r * cols + c0) / " << w << suffix << ";\n";
  emit_pack_body(os, e, "      ", suffix);
  os << "#pragma unroll\n      for (int j = 0; j < " << w
     << "; ++j) acc[j] += " << widen(summed, "s" + summed_out + ".v[j]") << ";\n";
  os << "    }\n";
  os << "  } else if (c0 < cols) {\n";
  os << "    for (index_t r = lo + row_in_step; r < hi; r += " << warps << suffix << ") {\n";
  os << "      for (int j = 0; j < " << w << "; ++j) {\n";
  os << "        const index_t e = r * cols + c0 + index_t(j);\n";
  {
    std::ostringstream body;
    emit_scalar_body(body, e, l, suffix);
    // emit_scalar_body indents by four; this loop sits four deeper.
    std::string line;
    std::istringstream in(body.str());
    while (std::getline(in, line)) os << "    " << line << "\n";
  }
  os << "        acc[j] += " << widen(summed, "out" + summed_out + "[e]") << ";\n";
  os << "      }\n    }\n  }\n";
  // The block's sums: its warps' per column, added in warp order through shared memory.
  os << "  __shared__ float part[" << warps << "][" << kFusedColumnTile + 1 << "];\n";
  os << "#pragma unroll\n  for (int j = 0; j < " << w << "; ++j) part[row_in_step][lane * " << w << " + j] = acc[j];\n";
  os << "  __syncthreads();\n";
  os << "  const index_t col = index_t(blockIdx.x) * " << kFusedColumnTile << suffix << " + threadIdx.x;\n";
  os << "  const bool mine = threadIdx.x < " << kFusedColumnTile << " && col < cols;\n";
  os << "  if (mine) {\n    float v = part[0][threadIdx.x];\n    for (int y = 1; y < " << warps
     << "; ++y) v += part[y][threadIdx.x];\n    partial[index_t(blockIdx.y) * cols + col] = v;\n  }\n";
  // The tile's last block to finish adds the chunks' sums in order (kernels/cuda/last_block.cuh's
  // scheme: fence, count in, reset the counter for the next launch), 32 partials' loads in flight at
  // once: they come from L2, and one at a time would put a chunk count of L2 round trips at the end.
  os << "  __shared__ bool is_last;\n  __threadfence();\n  __syncthreads();\n";
  os << "  if (threadIdx.x == 0) {\n    is_last = atomicAdd(&reel_column_counters[blockIdx.x], 1u) + 1u == gridDim.y;\n"
     << "    if (is_last) atomicExch(&reel_column_counters[blockIdx.x], 0u);\n  }\n";
  os << "  __syncthreads();\n  if (!is_last) return;\n  __threadfence();\n";
  os << "  if (mine) {\n    float v = __ldcg(partial + col);\n"
     << "#pragma unroll 32\n    for (unsigned s = 1; s < gridDim.y; ++s) v += __ldcg(partial + index_t(s) * cols + "
        "col);\n"
     << "    sums[col] = " << (sums.accumulate ? "sums[col] + v" : "v") << ";\n  }\n";
}

}  // namespace

bool fused_loop_fits_32bit(const FusedLoop& loop) {
  constexpr int64_t kLimit = int64_t(1) << 31;
  if (loop.numel >= kLimit) return false;
  for (const auto& strides : loop.strides) {
    int64_t reach = 0;
    for (size_t d = 0; d < loop.sizes.size(); ++d) {
      if (strides[d] < 0) return false;
      reach += (loop.sizes[d] - 1) * strides[d];
    }
    if (reach >= kLimit) return false;
  }
  return true;
}

std::string cuda_fused_source(const FusedExpr& expr, const FusedLoop& loop, const std::string& label,
                              FusedColumnSums sums) {
  REEL_ASSERT(!sums.on() || fused_column_sums_fit(loop),
              "fused_elementwise: the column-sums kernel needs a contiguous loop of rows of a multiple of ",
              kFusedVectorWidth, " columns (loop ", shape_str(loop.shape), ")");
  const bool idx32 = fused_loop_fits_32bit(loop);
  std::ostringstream os;
  os << "// reel fused elementwise kernel: " << label << "\n// loop " << shape_str(loop.shape) << " merged to "
     << shape_str(loop.sizes) << ", " << (idx32 ? "32" : "64") << "-bit indices";
  if (sums.on()) os << "; column sums of output " << sums.output << (sums.accumulate ? ", added to" : "");
  os << "\n" << kPrelude << kNvrtcMathSource << "\n";
  const char* suffix = idx32 ? "u" : "LL";
  if (sums.on()) os << "__device__ unsigned reel_column_counters[" << kFusedColumnCounters << "];\n";
  os << signature(expr, sums.on()) << " {\n";
  // Programmatic dependent launch (kernels/cuda/launch.cuh): wait for the kernels before this one
  // before touching memory.
  os << "#if __CUDA_ARCH__ >= 900\n  asm volatile(\"griddepcontrol.wait;\" ::: \"memory\");\n#endif\n";
  os << "  typedef " << (idx32 ? "unsigned int" : "long long") << " index_t;\n";
  os << "  const index_t n = " << loop.numel << suffix << ";\n";
  os << "  index_t first = 0;\n";
  for (int k = 0; k < expr.states; ++k)
    os << "  const unsigned long long key" << k << " = st" << k << "[0], base" << k << " = st" << k << "[1];\n";
  if (sums.on()) {
    emit_column_sums_kernel(os, expr, loop, sums, suffix);
    os << "}\n";
    return os.str();
  }
  if (fused_vector_width(loop) > 1) emit_vector_loop(os, expr, suffix);
  emit_loop_head(os, loop, suffix);
  emit_scalar_body(os, expr, loop, suffix);
  os << "  }\n}\n";
  return os.str();
}

bool fused_column_sums_fit(const FusedLoop& loop) {
  if (fused_vector_width(loop) != kFusedVectorWidth || loop.shape.empty()) return false;
  const int64_t cols = loop.shape.back();
  return cols > 0 && cols % kFusedVectorWidth == 0 &&
         (cols + kFusedColumnTile - 1) / kFusedColumnTile <= kFusedColumnCounters;
}

int fused_vector_width(const FusedLoop& loop) {
  if (loop.sizes.size() != 1 || loop.numel < kFusedVectorWidth || loop.strides.size() > 1 + kFusedVectorMaxInputs)
    return 1;
  for (const auto& strides : loop.strides)
    if (strides.size() != 1 || strides[0] != 1) return 1;
  return kFusedVectorWidth;
}

}  // namespace reel::jit
