// oneDNN convolutions: the CPU kernels of conv2d, conv2d_backward_input and conv2d_backward_weight
// for f32, f16 and bf16 (conv2d_dnnl.h says when they run; conv2d.cpp holds the im2col reference and
// registers both).
//
// Math (the schema's, kernels/schema/linalg.cpp). G groups, Cg = C/G, Og = O/G, q = o / Og the
// group of output channel o, taps outside the input read zero:
//   forward          y[n, o, oh, ow] = b[o] + sum_{c<Cg, i, j} w[o, c, i, j] x[n, q*Cg + c, oh*sh - ph + i, ow*sw - pw + j]
//   backward input   dx, the adjoint of that sum in x: each (o, c, i, j, oh, ow) tap adds g[n, o, oh, ow] w[o, c, i, j]
//   backward weight  dw[o, c, i, j] = sum_{n, oh, ow} g[n, o, oh, ow] x[n, q*Cg + c, oh*sh - ph + i, ow*sw - pw + j]
// oneDNN's convolution_forward, convolution_backward_data and convolution_backward_weights compute
// exactly these, in f32, the weights described as (G, Og, Cg, kH, kW) when G > 1 (the same bytes as
// reel's (O, Cg, kH, kW)). The right padding passed is the left one: oneDNN checks
// Ho = (H + ph + ph_right - kH) / sh + 1 with floor division, which is the schema's Ho. The bias
// gradient is autograd's sum, so backward weight computes no bias gradient.
//
// Groups run one after another, each as the plain convolution of its Cg channels into Og (make_plan
// says why); depthwise convolutions are then C small convolutions and oneDNN's depthwise kernels
// are not used.
//
// Layouts. An operand goes to oneDNN as it is when it is dense f32, NCHW or NHWC (channels-last;
// weights OIHW or OHWI), else as a contiguous f32 copy: 16-bit operands are widened as the reference
// widens them, and the f32 result is rounded back once. Outputs are contiguous (run_into_contiguous).
// On the dnnl path the primitive picks its own layouts (format_tag::any; with AVX-512 nChw16c
// activations and OIhw16i16o weights, NCHW kept for a 3-channel input): operands are reordered into
// per-thread buffers and the result back into reel's layout. That pays: every convolution of one
// 32-image micro-batch of cnn-small (forward and both backwards, reorders included; 2 threads) takes
// 15.7 ms blocked, 26.2 ms with oneDNN's GEMM convolution on NCHW (the dnnl-plain path, kept for
// such comparisons) and 37.3 ms on im2col; resnet18-cifar's 118, 176 and 265 ms (bench/ops_bench.cpp,
// conv2d_step). The exception is the backward input of fewer than 4 channels per group (make_key).
//
// Caching. Making a primitive (oneDNN tries its implementations in turn and JIT-compiles one; for the
// backward ones the forward's too) takes 0.2 to 0.6 ms, more than a small convolution, so a cache
// keyed by direction, geometry, operand layouts, path and thread count keeps each primitive with its
// reorders and buffer sizes. One mutex guards it. Cached primitives run concurrently from several
// host threads: each execution brings its own scratchpad (scratchpad_mode::user; the library's
// shared one would tie a primitive to the thread that made it) and buffers, on its thread's stream
// (a stream is an in-order queue of one host thread); the engine is one for the process.
//
// Threads. Debian's oneDNN runs on OpenMP with omp_get_max_threads() threads. A convolution whose
// one group is below linalg.cpp's threshold for splitting a GEMM runs on one (GemmThreadScope); the
// thread count is part of the key because a primitive's split of the work is fixed when it is made.
// It is never called inside an OpenMP parallel region (conv2d_uses_dnnl).
#include "kernels/cpu/conv2d_dnnl.h"

#include <dnnl.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/cpu/dense_outputs.h"
#include "kernels/cpu/gemm_threading.h"
#include "tensor/log.h"

namespace reel::cpu {

// ---------------------------------------------------------------------------------------------
// the path switch

namespace {
// The path when REEL_CPU_CONV is unset: oneDNN's, 2.4x im2col's speed over cnn-small's convolutions
// on two cores. Its sums run in another order than im2col's; tests hold both to the rounding bound
// of the sum of |terms| (tests/test_conv2d_groups.cpp, tests/test_conv2d_dnnl.cpp).
constexpr CpuConvPath kDefaultPath = CpuConvPath::Dnnl;
std::atomic<int> g_path{-1};  // a CpuConvPath, or -1 before REEL_CPU_CONV has been read
}  // namespace

CpuConvPath parse_cpu_conv_path(const std::string& text) {
  if (text == "dnnl") return CpuConvPath::Dnnl;
  if (text == "dnnl-plain") return CpuConvPath::DnnlPlain;
  if (text == "im2col") return CpuConvPath::Im2col;
  throw Error(detail::cat("REEL_CPU_CONV: unknown CPU convolution path \"", text,
                          "\" (expected dnnl, dnnl-plain or im2col)"));
}

const char* cpu_conv_path_name(CpuConvPath path) {
  switch (path) {
    case CpuConvPath::Dnnl: return "dnnl";
    case CpuConvPath::DnnlPlain: return "dnnl-plain";
    case CpuConvPath::Im2col: return "im2col";
  }
  return "?";
}

CpuConvPath cpu_conv_path() {
  int p = g_path.load(std::memory_order_acquire);
  if (p < 0) {
    const char* env = std::getenv("REEL_CPU_CONV");
    const CpuConvPath parsed = env && *env ? parse_cpu_conv_path(env) : kDefaultPath;
    int unread = -1;  // a set_cpu_conv_path that came first wins
    g_path.compare_exchange_strong(unread, int(parsed), std::memory_order_acq_rel);
    p = g_path.load(std::memory_order_acquire);
  }
  return CpuConvPath(p);
}

void set_cpu_conv_path(CpuConvPath path) { g_path.store(int(path), std::memory_order_release); }

bool conv2d_uses_dnnl(DType dtype) {
  if (dtype == DType::f64 || cpu_conv_path() == CpuConvPath::Im2col) return false;
#ifdef _OPENMP
  if (omp_in_parallel()) return false;
#endif
  return true;
}

namespace {

using dnnl::memory;
using Tag = memory::format_tag;

// ---------------------------------------------------------------------------------------------
// keys and plans

enum class ConvDir { Forward, BackwardInput, BackwardWeight };
// How a dense operand is stored: NCHW / OIHW, or channels-last NHWC / OHWI.
enum class Layout { Nchw, Nhwc };

// One primitive's identity. Operand a and b are (x, w) forward, (g, w) backward input and (g, x)
// backward weight; the output is always contiguous.
struct ConvKey {
  ConvDir dir;
  int64_t N, C, H, W, O, kH, kW, Ho, Wo, sh, sw, ph, pw, G;
  bool bias, blocked;
  Layout a, b;
  int threads;
  auto operator<=>(const ConvKey&) const = default;
  // One group's: the thread count is chosen by it, so that a group's primitive is the one a plain
  // convolution of its channels gets.
  double group_flops() const { return 2.0 * double(N * (O / G) * (C / G) * kH * kW) * double(Ho * Wo); }
};

// An operand as reel holds it (`user`) and as the primitive reads or writes it (`want`); `reorder`
// converts user -> want for an input, want -> user for the output, and is absent when they agree.
struct Operand {
  memory::desc user, want;
  std::optional<dnnl::reorder> reorder;
  bool reorder_scratch = false;  // whether the reorder asks for a scratchpad
};

// One group's convolution (the whole one for G == 1) and how to run it on each group in turn: the
// operands' pointers advance by the steps (in elements) from group to group.
struct ConvPlan {
  dnnl::primitive conv;
  int arg_a = 0, arg_b = 0, arg_out = 0;
  Operand a, b, out;
  memory::desc bias;      // zero (no bias) unless forward with a bias
  int64_t groups = 1, a_step = 0, b_step = 0, out_step = 0, bias_step = 0;
  size_t scratch = 0;     // bytes: the largest scratchpad of the convolution and its reorders
  bool conv_scratch = false;
  std::string impl;       // oneDNN's name for the implementation it chose (REEL_LOG=kernels)
};

const dnnl::engine& cpu_engine() {
  static const dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);  // lives to the exit
  return *engine;
}

dnnl::stream& thread_stream() {
  thread_local dnnl::stream stream(cpu_engine());
  return stream;
}

dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// One group's operands as reel holds them (for G == 1 the whole tensors). Channels [q*Cg, (q+1)*Cg)
// of an activation keep the whole tensor's strides, so for G > 1 they are a strided view of it; the
// weight rows [q*Og, (q+1)*Og) of one group are a dense block.
memory::desc activation_md(int64_t n, int64_t c, int64_t h, int64_t w, int64_t channels, Layout l) {
  const memory::dims strides = l == Layout::Nchw ? memory::dims{channels * h * w, h * w, w, 1}
                                                 : memory::dims{h * w * channels, 1, w * channels, channels};
  return {{n, c, h, w}, memory::data_type::f32, strides};
}
memory::desc x_md(const ConvKey& k, Layout l) { return activation_md(k.N, k.C / k.G, k.H, k.W, k.C, l); }
memory::desc y_md(const ConvKey& k, Layout l) { return activation_md(k.N, k.O / k.G, k.Ho, k.Wo, k.O, l); }
memory::desc w_md(const ConvKey& k, Layout l) {
  return {{k.O / k.G, k.C / k.G, k.kH, k.kW}, memory::data_type::f32, l == Layout::Nchw ? Tag::oihw : Tag::ohwi};
}
// What the primitive is asked to read or write: its own choice on the blocked path, dense NCHW / OIHW
// (abcd) on the plain one.
memory::desc compute_md(const ConvKey& k, const memory::desc& user) {
  return {user.dims(), memory::data_type::f32, k.blocked ? Tag::any : Tag::abcd};
}

// Elements from one group's block of an activation to the next's: `c` channels on.
int64_t channel_step(int64_t c, int64_t h, int64_t w, Layout l) { return l == Layout::Nchw ? c * h * w : c; }

Operand make_operand(const memory::desc& user, const memory::desc& want, bool input, size_t& scratch) {
  Operand o{user, want, std::nullopt, false};
  if (user == want) return o;
  const dnnl::engine& e = cpu_engine();
  dnnl::reorder::primitive_desc pd = input ? dnnl::reorder::primitive_desc(e, user, e, want, user_scratchpad())
                                           : dnnl::reorder::primitive_desc(e, want, e, user, user_scratchpad());
  const size_t bytes = pd.scratchpad_desc().get_size();
  o.reorder_scratch = bytes > 0;
  scratch = std::max(scratch, bytes);
  o.reorder.emplace(pd);
  return o;
}

// Records the convolution primitive made from `pd` and which execution arguments a, b and out are.
void set_conv(ConvPlan& p, dnnl::primitive conv, const dnnl::primitive_desc& pd, int arg_a, int arg_b, int arg_out) {
  p.conv = std::move(conv);
  p.arg_a = arg_a;
  p.arg_b = arg_b;
  p.arg_out = arg_out;
  const size_t bytes = pd.scratchpad_desc().get_size();
  p.conv_scratch = bytes > 0;
  p.scratch = std::max(p.scratch, bytes);
  p.impl = pd.impl_info_str();
}

// The primitive of direction k.dir for one group with its reorders; null where oneDNN has no
// implementation. Groups run one after another as plain convolutions of Cg channels into Og, so a
// grouped convolution equals, to the bit, its groups run one by one (the reference's property,
// tests/test_conv2d_groups.cpp and tests/test_conv2d_dnnl.cpp); oneDNN's own grouped and depthwise
// kernels would sum in another order. The backward primitives are made with the forward one as their hint, as
// oneDNN asks (it then picks layouts that agree with the forward's).
std::shared_ptr<const ConvPlan> make_plan(const ConvKey& k) {
  namespace d = dnnl;
  const d::engine& e = cpu_engine();
  const memory::dims strides{k.sh, k.sw}, pad{k.ph, k.pw};
  const memory::desc x = compute_md(k, x_md(k, Layout::Nchw)), w = compute_md(k, w_md(k, Layout::Nchw)),
                     y = compute_md(k, y_md(k, Layout::Nchw));
  const int64_t Cg = k.C / k.G, Og = k.O / k.G;
  const memory::desc bias = k.bias ? memory::desc({Og}, memory::data_type::f32, Tag::x) : memory::desc();
  const d::algorithm direct = d::algorithm::convolution_direct;
  const d::primitive_attr attr = user_scratchpad();
  d::convolution_forward::primitive_desc fwd(
      d::convolution_forward::desc(d::prop_kind::forward_training, direct, x, w, bias, y, strides, pad, pad), attr, e,
      true);
  if (!fwd) return nullptr;
  auto p = std::make_shared<ConvPlan>();
  p->groups = k.G;
  const int64_t x_step = channel_step(Cg, k.H, k.W, Layout::Nchw), y_step = channel_step(Og, k.Ho, k.Wo, Layout::Nchw),
                w_step = Og * Cg * k.kH * k.kW;
  switch (k.dir) {
    case ConvDir::Forward:
      set_conv(*p, d::convolution_forward(fwd), fwd, DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST);
      p->a = make_operand(x_md(k, k.a), fwd.src_desc(), true, p->scratch);
      p->b = make_operand(w_md(k, k.b), fwd.weights_desc(), true, p->scratch);
      p->out = make_operand(y_md(k, Layout::Nchw), fwd.dst_desc(), false, p->scratch);
      p->bias = bias;
      p->a_step = channel_step(Cg, k.H, k.W, k.a), p->b_step = w_step, p->out_step = y_step, p->bias_step = Og;
      break;
    case ConvDir::BackwardInput: {
      d::convolution_backward_data::primitive_desc bwd(
          d::convolution_backward_data::desc(direct, x, w, y, strides, pad, pad), attr, e, fwd, true);
      if (!bwd) return nullptr;
      set_conv(*p, d::convolution_backward_data(bwd), bwd, DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC);
      p->a = make_operand(y_md(k, k.a), bwd.diff_dst_desc(), true, p->scratch);
      p->b = make_operand(w_md(k, k.b), bwd.weights_desc(), true, p->scratch);
      p->out = make_operand(x_md(k, Layout::Nchw), bwd.diff_src_desc(), false, p->scratch);
      p->a_step = channel_step(Og, k.Ho, k.Wo, k.a), p->b_step = w_step, p->out_step = x_step;
      break;
    }
    case ConvDir::BackwardWeight: {
      d::convolution_backward_weights::primitive_desc bwd(
          d::convolution_backward_weights::desc(direct, x, w, y, strides, pad, pad), attr, e, fwd, true);
      if (!bwd) return nullptr;
      set_conv(*p, d::convolution_backward_weights(bwd), bwd, DNNL_ARG_DIFF_DST, DNNL_ARG_SRC, DNNL_ARG_DIFF_WEIGHTS);
      p->a = make_operand(y_md(k, k.a), bwd.diff_dst_desc(), true, p->scratch);
      p->b = make_operand(x_md(k, k.b), bwd.src_desc(), true, p->scratch);
      p->out = make_operand(w_md(k, Layout::Nchw), bwd.diff_weights_desc(), false, p->scratch);
      p->a_step = channel_step(Og, k.Ho, k.Wo, k.a), p->b_step = channel_step(Cg, k.H, k.W, k.b), p->out_step = w_step;
      break;
    }
  }
  return p;
}

const char* dir_name(ConvDir dir) {
  switch (dir) {
    case ConvDir::Forward: return "conv2d";
    case ConvDir::BackwardInput: return "conv2d_backward_input";
    case ConvDir::BackwardWeight: return "conv2d_backward_weight";
  }
  return "?";
}

struct PlanCache {
  std::mutex mu;
  std::map<ConvKey, std::shared_ptr<const ConvPlan>> plans;  // null: oneDNN has no implementation
};

PlanCache& plan_cache() {
  static PlanCache* cache = new PlanCache;  // lives to the exit, as the engine its primitives use
  return *cache;
}

// Past this many entries the cache starts again: a process sees a handful of geometries, and a
// program that keeps changing them (every image size of a sweep) should not hold them all.
constexpr size_t kMaxCachedPlans = 512;

std::shared_ptr<const ConvPlan> find_plan(const ConvKey& k) {
  PlanCache& cache = plan_cache();
  std::lock_guard<std::mutex> lock(cache.mu);
  auto it = cache.plans.find(k);
  if (it != cache.plans.end()) return it->second;
  if (cache.plans.size() >= kMaxCachedPlans) cache.plans.clear();
  std::shared_ptr<const ConvPlan> plan;
  try {
    plan = make_plan(k);
  } catch (const dnnl::error& e) {  // a geometry the descriptors refuse: the reference takes it
    plan = nullptr;
  }
  if (log_enabled("kernels"))
    log_line("kernels", detail::cat("oneDNN ", dir_name(k.dir), " x (", k.N, ", ", k.C, ", ", k.H, ", ", k.W, ") O ",
                                    k.O, " kernel ", k.kH, "x", k.kW, " stride ", k.sh, "x", k.sw, " padding ", k.ph,
                                    "x", k.pw, " groups ", k.G, ", ", k.threads, " threads, ",
                                    k.blocked ? "blocked" : "plain", ": ",
                                    plan ? plan->impl : std::string("no implementation, im2col runs it")));
  cache.plans.emplace(k, plan);
  return plan;
}

// ---------------------------------------------------------------------------------------------
// execution

// A 64-byte aligned block that grows to the largest size asked of it and is then reused.
class Buffer {
 public:
  void* get(size_t bytes) {
    if (bytes > size_) {
      const size_t rounded = (bytes + 63) / 64 * 64;
      data_.reset(static_cast<char*>(std::aligned_alloc(64, rounded)));
      REEL_CHECK(data_ != nullptr, "conv2d: out of host memory for a ", rounded, "-byte oneDNN buffer");
      size_ = rounded;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> data_;
  size_t size_ = 0;
};

// Each host thread's buffers for the reordered operands and the scratchpad.
struct Workspace {
  Buffer a, b, out, scratch;
};

Workspace& thread_workspace() {
  thread_local Workspace ws;
  return ws;
}

void run_primitive(const dnnl::primitive& prim, std::unordered_map<int, memory> args, bool with_scratch,
                   const memory& scratch) {
  if (with_scratch) args.emplace(DNNL_ARG_SCRATCHPAD, scratch);
  prim.execute(thread_stream(), args);
}

// The operand the primitive reads: reel's memory itself, or its reorder into `buf`.
memory input_memory(const Operand& o, const float* data, Buffer& buf, const memory& scratch) {
  const dnnl::engine& e = cpu_engine();
  memory user(o.user, e, const_cast<float*>(data));  // read only: oneDNN takes a void*
  if (!o.reorder) return user;
  memory want(o.want, e, buf.get(o.want.get_size()));
  run_primitive(*o.reorder, {{DNNL_ARG_FROM, user}, {DNNL_ARG_TO, want}}, o.reorder_scratch, scratch);
  return want;
}

// Runs plan p's convolution on one group's operands; `out` (f32) receives the result.
void execute_group(const ConvPlan& p, const float* a, const float* b, const float* bias, float* out,
                   const memory& scratch) {
  const dnnl::engine& e = cpu_engine();
  Workspace& ws = thread_workspace();
  std::unordered_map<int, memory> args{{p.arg_a, input_memory(p.a, a, ws.a, scratch)},
                                       {p.arg_b, input_memory(p.b, b, ws.b, scratch)}};
  if (bias) args.emplace(DNNL_ARG_BIAS, memory(p.bias, e, const_cast<float*>(bias)));
  const memory user_out(p.out.user, e, out);
  const memory result = p.out.reorder ? memory(p.out.want, e, ws.out.get(p.out.want.get_size())) : user_out;
  args.emplace(p.arg_out, result);
  run_primitive(p.conv, std::move(args), p.conv_scratch, scratch);
  if (p.out.reorder)
    run_primitive(*p.out.reorder, {{DNNL_ARG_FROM, result}, {DNNL_ARG_TO, user_out}}, p.out.reorder_scratch, scratch);
}

// Runs plan p on reel's operands, group after group; `out` (f32, contiguous) receives the result.
void execute(const ConvPlan& p, const float* a, const float* b, const float* bias, float* out) {
  const memory scratch =
      p.scratch > 0 ? memory(memory::desc({memory::dim(p.scratch)}, memory::data_type::u8, Tag::x), cpu_engine(),
                             thread_workspace().scratch.get(p.scratch))
                    : memory();
  for (int64_t q = 0; q < p.groups; ++q)
    execute_group(p, a + q * p.a_step, b + q * p.b_step, bias ? bias + q * p.bias_step : nullptr,
                  out + q * p.out_step, scratch);
  thread_stream().wait();
}

// ---------------------------------------------------------------------------------------------
// the kernels

// `t` as contiguous f32: itself, or a copy (16-bit widened, strided gathered).
Tensor contiguous_f32(const Tensor& t) {
  if (t.dtype() == DType::f32 && t.is_contiguous()) return t;
  Tensor c = Tensor::empty(t.shape(), DType::f32, t.device());
  copy_strided(c, t);
  return c;
}

// `t` as f32 in a layout oneDNN can be told of: itself when it is dense f32 (NCHW or NHWC), else a
// contiguous f32 copy (16-bit widened, strided gathered).
Tensor dense_f32(const Tensor& t, Layout& layout) {
  layout = Layout::Nchw;
  if (t.dtype() == DType::f32 && !t.is_contiguous() && t.is_contiguous(MemoryFormat::ChannelsLast)) {
    layout = Layout::Nhwc;
    return t;
  }
  return contiguous_f32(t);
}

// Below this many input channels per group the blocked backward-input kernel, which pads the
// channels of dx to a block of 16, loses to oneDNN's GEMM on NCHW (measured at 1 thread, (32, Cg, 32,
// 32) from 16 and 64 channels: Cg 1: 1.0 / 5.5 ms against 0.45 / 0.84; Cg 3: 1.0 / 5.2 against 1.2 /
// 2.1; from Cg 4 on blocked is even or ahead). The choice rests on one group's geometry alone, so a
// grouped call and a plain call on one group's channels still get the same primitive.
constexpr int64_t kMinBlockedInputChannels = 4;

ConvKey make_key(ConvDir dir, const Shape& x, const Shape& w, const Shape& y, const Attrs& attrs, bool bias,
                 Layout a, Layout b) {
  const auto& s = attrs.ints("stride");
  const auto& p = attrs.ints("padding");
  const int64_t G = attrs.i("groups", 1);
  const bool narrow_dx = dir == ConvDir::BackwardInput && x[1] / G < kMinBlockedInputChannels;
  const bool blocked = cpu_conv_path() == CpuConvPath::Dnnl && !narrow_dx;
  return {dir, x[0], x[1], x[2], x[3], w[0], w[2], w[3], y[2], y[3], s[0], s[1], p[0], p[1], G, bias, blocked, a, b, 1};
}

int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// Runs the convolution of key k (threads still to fill in) on dense f32 operands into `out`, through
// an f32 temporary when out is 16-bit. False where oneDNN has no implementation.
bool run_conv(ConvKey k, const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& out) {
  REEL_ASSERT(out.is_contiguous(), "conv2d: oneDNN kernels write contiguous outputs");
  if (k.N == 0 || out.numel() == 0) return false;  // empty batches: the reference writes the zeros
  const GemmThreadScope threads(k.group_flops());
  k.threads = max_threads();
  const std::shared_ptr<const ConvPlan> plan = find_plan(k);
  if (!plan) return false;
  const Tensor result = out.dtype() == DType::f32 ? out : Tensor::empty(out.shape(), DType::f32, out.device());
  try {
    execute(*plan, a.data<float>(), b.data<float>(), bias.defined() ? bias.data<float>() : nullptr, result.data<float>());
  } catch (const dnnl::error& e) {
    throw InternalError(detail::cat(dir_name(k.dir), ": oneDNN failed (", e.what(), ", status ", int(e.status),
                                    ") at ", __FILE__, ":", __LINE__));
  }
  if (!result.is_same(out)) copy_strided(out, result);  // rounded once, to the 16-bit dtype
  return true;
}

}  // namespace

bool conv2d_fwd_dnnl_kernel(const KernelCall& c) {
  Layout la, lb;
  const Tensor x = dense_f32(c.in[0], la), w = dense_f32(c.in[1], lb);
  const Tensor bias = c.in[2].defined() ? contiguous_f32(c.in[2]) : Tensor();
  const Tensor& y = c.out[0];
  return run_conv(make_key(ConvDir::Forward, x.shape(), w.shape(), y.shape(), c.attrs, bias.defined(), la, lb), x, w,
                  bias, y);
}

bool conv2d_bwd_input_dnnl_kernel(const KernelCall& c) {
  Layout la, lb;
  const Tensor g = dense_f32(c.in[0], la), w = dense_f32(c.in[1], lb);
  const Tensor& dx = c.out[0];
  return run_conv(make_key(ConvDir::BackwardInput, dx.shape(), w.shape(), g.shape(), c.attrs, false, la, lb), g, w,
                  Tensor(), dx);
}

bool conv2d_bwd_weight_dnnl_kernel(const KernelCall& c) {
  Layout la, lb;
  const Tensor g = dense_f32(c.in[0], la), x = dense_f32(c.in[1], lb);
  const Tensor& dw = c.out[0];
  return run_conv(make_key(ConvDir::BackwardWeight, x.shape(), dw.shape(), g.shape(), c.attrs, false, la, lb), g, x,
                  Tensor(), dw);
}

size_t conv2d_dnnl_cached_primitives() {
  PlanCache& cache = plan_cache();
  std::lock_guard<std::mutex> lock(cache.mu);
  return cache.plans.size();
}

}  // namespace reel::cpu
