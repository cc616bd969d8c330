#include "kernels/dispatch.h"

#include <atomic>
#include <mutex>

#include "kernels/registry.h"
#include "tensor/cuda.h"
#include "tensor/error.h"

namespace reel {
namespace {

struct OpEntry {
  InferFn infer = nullptr;
  ViewFn view = nullptr;
  KernelFn kernels[2] = {nullptr, nullptr};  // indexed by DeviceType
  SupportsFn supports[2] = {nullptr, nullptr};
  PrepareFn prepare[2] = {nullptr, nullptr};
  PartsFn parts[2] = {nullptr, nullptr};
};

OpEntry& entry(OpKind op) {
  static OpEntry table[kNumOps];
  return table[static_cast<int>(op)];
}

// Registration happens once, on first use, so that static libraries need no static initialisers.
void ensure_registered() {
  static std::once_flag once;
  std::call_once(once, [] { register_builtin_ops(); });
}

// Per thread, as grad mode and meta mode are: a trace on one thread records that thread's ops alone
// (another thread's eager ops, say a data loader's copies, must not land on its tape).
thread_local DispatchObserver* observer = nullptr;
std::atomic<uint64_t> n_dispatch{0};
std::atomic<uint64_t> n_kernels{0};
// Per thread: a planner tracing on one thread must not turn another thread's dispatches into no-ops.
thread_local bool meta_active = false;

// An output of a meta-mode dispatch: the right size and device, no memory.
Tensor meta_output(const TensorMeta& m, MemoryFormat format) {
  auto storage = std::make_shared<Storage>(Storage::Meta{}, size_t(numel_of(m.shape)) * dtype_size(m.dtype), m.device);
  Tensor t = Tensor::from_storage(std::move(storage), m.shape, m.dtype);
  return format == MemoryFormat::Contiguous ? t : Tensor::make_view(t, m.shape, strides_for(m.shape, format), 0);
}

// The format a fresh output of `shape` gets: `format` where it applies (ChannelsLast needs 4 dims).
MemoryFormat output_format(const Shape& shape, MemoryFormat format) {
  return shape.size() == 4 ? format : MemoryFormat::Contiguous;
}

// A host read of a device value has nothing to read in meta mode; say so where it starts.
void check_meta_host_read(OpKind op, Device in_device, Device out_device) {
  REEL_CHECK(!(op == OpKind::Copy && in_device.is_cuda() && out_device.is_cpu()), "copy from ", in_device.str(),
             " to the host in meta mode: a traced-without-running step has no values to read (.item(), "
             "to_vector() and printing are not available while planning)");
}

Device common_device(OpKind op, const std::vector<Tensor>& inputs) {
  const Tensor* first = nullptr;
  for (const Tensor& t : inputs) {
    if (!t.defined()) continue;
    if (!first) {
      first = &t;
      continue;
    }
    REEL_CHECK(op == OpKind::Copy || t.device() == first->device(), op_name(op), ": inputs are on different devices (",
               first->device().str(), " and ", t.device().str(), "); move them with .to(device) first");
  }
  return first ? first->device() : Device::cpu();
}

const OpEntry& checked_entry(OpKind op) {
  ensure_registered();
  const OpEntry& e = entry(op);
  REEL_ASSERT(e.infer != nullptr, "op ", op_name(op), " has no schema");
  return e;
}

KernelFn kernel_for(OpKind op, const OpEntry& e, Device device) {
  KernelFn k = e.kernels[static_cast<int>(device.type)];
  // Without a usable GPU no op has a CUDA kernel: say why, not that this one op lacks it.
  if (k == nullptr && device.is_cuda() && !cuda::is_available())
    throw Error(detail::cat(op_name(op), ": cannot run on ", device.str(), ": ", cuda::unavailable_reason()));
  REEL_CHECK(k != nullptr, op_name(op), ": not implemented on ", device.str());
  return k;
}

// The device whose kernel runs an op: the outputs' — except that a copy between the host and a GPU
// is always the GPU backend's job, whichever side the output is on.
Device kernel_device(OpKind op, Device input_device, Device output_device) {
  if (op == OpKind::Copy && input_device.is_cuda()) return input_device;
  return output_device;
}

void notify(OpKind op, const std::vector<Tensor>& in, const std::vector<Tensor>& out, const Attrs& attrs,
            bool into_given) {
  n_dispatch.fetch_add(1, std::memory_order_relaxed);
  if (observer) observer->on_dispatch(op, in, out, attrs, into_given);
}

}  // namespace

const char* op_name(OpKind op) {
  static const char* names[] = {
#define REEL_OP(name, str, family) str,
#include "kernels/ops.def"
#undef REEL_OP
  };
  int i = static_cast<int>(op);
  return i >= 0 && i < kNumOps ? names[i] : "?";
}

void register_schema(OpKind op, InferFn infer, ViewFn view) {
  entry(op).infer = infer;
  entry(op).view = view;
}

void register_kernel(DeviceType device, OpKind op, KernelFn kernel) {
  entry(op).kernels[static_cast<int>(device)] = kernel;
}

void register_supports(DeviceType device, OpKind op, SupportsFn fn) {
  entry(op).supports[static_cast<int>(device)] = fn;
}

void register_prepare(DeviceType device, OpKind op, PrepareFn fn) { entry(op).prepare[static_cast<int>(device)] = fn; }
void register_parts(DeviceType device, OpKind op, PartsFn fn) { entry(op).parts[static_cast<int>(device)] = fn; }

bool supports(OpKind op, DeviceType device) {
  ensure_registered();
  const OpEntry& e = entry(op);
  return e.view != nullptr || e.kernels[static_cast<int>(device)] != nullptr;
}

bool supports_call(OpKind op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                   const Attrs& attrs) {
  const OpEntry& e = checked_entry(op);
  std::vector<TensorMeta> metas;
  Device in_device;
  try {
    in_device = common_device(op, inputs);
    metas = e.infer(inputs, attrs);
  } catch (const Error&) {
    return false;
  }
  if (metas.size() != outputs.size()) return false;
  for (size_t i = 0; i < metas.size(); ++i) {
    const Tensor& o = outputs[i];
    if (!o.defined() || o.shape() != metas[i].shape || o.dtype() != metas[i].dtype || o.device() != metas[i].device)
      return false;
  }
  const Device device = kernel_device(op, in_device, outputs.empty() ? in_device : outputs[0].device());
  const int d = static_cast<int>(device.type);
  if (e.kernels[d] == nullptr) return false;
  return e.supports[d] == nullptr || e.supports[d](KernelCall{op, inputs, outputs, attrs});
}

void prepare_kernel(OpKind op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                    const Attrs& attrs) {
  const OpEntry& e = checked_entry(op);
  if (e.view) return;
  const Device in_device = common_device(op, inputs);
  const Device device = kernel_device(op, in_device, outputs.empty() ? in_device : outputs[0].device());
  if (PrepareFn p = e.prepare[static_cast<int>(device.type)]) p(KernelCall{op, inputs, outputs, attrs});
}

int64_t kernel_parts(OpKind op, const std::vector<Tensor>& inputs, const Attrs& attrs) {
  const OpEntry& e = checked_entry(op);
  Device device;
  try {
    device = common_device(op, inputs);
  } catch (const Error&) {
    return 0;
  }
  const PartsFn fn = e.parts[static_cast<int>(device.type)];
  if (!fn) return 0;
  try {
    return fn(inputs, attrs);
  } catch (const Error&) {
    return 0;
  }
}

bool is_view_op(OpKind op) { return checked_entry(op).view != nullptr; }

std::vector<TensorMeta> infer_outputs(OpKind op, const std::vector<Tensor>& inputs, const Attrs& attrs) {
  const OpEntry& e = checked_entry(op);
  common_device(op, inputs);
  return e.infer(inputs, attrs);
}

namespace {
// An op's output; an allocator that runs out of memory is named with the buffer it was asked for.
Tensor allocate_output(OpKind op, size_t index, const TensorMeta& m, MemoryFormat format) {
  try {
    return Tensor::empty(m.shape, m.dtype, m.device, format);
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.find("out of memory") == std::string::npos && what.find("out of host memory") == std::string::npos) throw;
    throw Error(detail::cat(op_name(op), ": output ", index, " ", shape_str(m.shape), " ", m.dtype, " (",
                            numel_of(m.shape) * int64_t(dtype_size(m.dtype)), " bytes) on ", m.device.str(),
                            ": ", what));
  }
}
}  // namespace

std::vector<Tensor> dispatch(OpKind op, const std::vector<Tensor>& inputs, const Attrs& attrs) {
  return dispatch(op, inputs, attrs, MemoryFormat::Contiguous);
}

std::vector<Tensor> dispatch(OpKind op, const std::vector<Tensor>& inputs, const Attrs& attrs, MemoryFormat format) {
  const OpEntry& e = checked_entry(op);
  Device device = common_device(op, inputs);
  std::vector<TensorMeta> metas = e.infer(inputs, attrs);
  std::vector<Tensor> outputs;
  outputs.reserve(metas.size());
  if (e.view) {
    REEL_ASSERT(metas.size() == 1, "view op ", op_name(op), " must have one output");
    outputs.push_back(e.view(inputs[0], attrs));
  } else {
    const Device out_device = metas.empty() ? device : metas[0].device;
    KernelFn k = kernel_for(op, e, kernel_device(op, device, out_device));
    if (meta_active) {
      check_meta_host_read(op, device, out_device);
      for (const TensorMeta& m : metas) outputs.push_back(meta_output(m, output_format(m.shape, format)));
    } else {
      for (const TensorMeta& m : metas)
        outputs.push_back(allocate_output(op, outputs.size(), m, output_format(m.shape, format)));
      k(KernelCall{op, inputs, outputs, attrs});
      n_kernels.fetch_add(1, std::memory_order_relaxed);
    }
  }
  notify(op, inputs, outputs, attrs, false);
  return outputs;
}

Tensor dispatch1(OpKind op, const std::vector<Tensor>& inputs, const Attrs& attrs, MemoryFormat format) {
  std::vector<Tensor> out = dispatch(op, inputs, attrs, format);
  REEL_ASSERT(out.size() >= 1, op_name(op), " returned no output");
  return out[0];
}

void dispatch_out(OpKind op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                  const Attrs& attrs) {
  const OpEntry& e = checked_entry(op);
  REEL_ASSERT(e.view == nullptr, "dispatch_out on view op ", op_name(op));
  Device in_device = common_device(op, inputs);
  std::vector<TensorMeta> metas = e.infer(inputs, attrs);
  REEL_CHECK(metas.size() == outputs.size(), op_name(op), ": expected ", metas.size(), " outputs, got ",
             outputs.size());
  for (size_t i = 0; i < metas.size(); ++i) {
    const Tensor& o = outputs[i];
    REEL_CHECK(o.defined(), op_name(op), ": output ", i, " is undefined");
    REEL_CHECK(o.shape() == metas[i].shape, op_name(op), ": output ", i, " has shape ", shape_str(o.shape()),
               " but the result has shape ", shape_str(metas[i].shape));
    REEL_CHECK(o.dtype() == metas[i].dtype || op == OpKind::Copy, op_name(op), ": output ", i, " has dtype ",
               o.dtype(), " but the result has dtype ", metas[i].dtype);
    REEL_CHECK(o.device() == metas[i].device || op == OpKind::Copy, op_name(op), ": output ", i, " is on ",
               o.device().str(), " but the inputs are on ", metas[i].device.str());
  }
  Device out_device = outputs.empty() ? Device::cpu() : outputs[0].device();
  KernelFn k = kernel_for(op, e, kernel_device(op, in_device, out_device));
  if (meta_active) {
    check_meta_host_read(op, in_device, out_device);  // the outputs keep their old contents
  } else {
    k(KernelCall{op, inputs, outputs, attrs});
    n_kernels.fetch_add(1, std::memory_order_relaxed);
  }
  notify(op, inputs, outputs, attrs, true);
}

void run_kernel(OpKind op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                const Attrs& attrs) {
  REEL_CHECK(!meta_active, op_name(op), ": a plan's kernel cannot run in meta mode (nothing is allocated to run on)");
  const OpEntry& e = checked_entry(op);
  Device in_device = common_device(op, inputs);
  Device out_device = outputs.empty() ? in_device : outputs[0].device();
  kernel_for(op, e, kernel_device(op, in_device, out_device))(KernelCall{op, inputs, outputs, attrs});
  n_kernels.fetch_add(1, std::memory_order_relaxed);
}

KernelFn find_kernel(OpKind op, DeviceType device) {
  ensure_registered();
  return entry(op).kernels[static_cast<int>(device)];
}

DispatchObserver* set_dispatch_observer(DispatchObserver* o) {
  DispatchObserver* prev = observer;
  observer = o;
  return prev;
}

DispatchObserver* dispatch_observer() { return observer; }

MetaModeGuard::MetaModeGuard() : previous_(meta_active) { meta_active = true; }
MetaModeGuard::~MetaModeGuard() { meta_active = previous_; }
bool meta_mode() { return meta_active; }

uint64_t dispatch_count() { return n_dispatch.load(std::memory_order_relaxed); }
uint64_t kernel_count() { return n_kernels.load(std::memory_order_relaxed); }

}  // namespace reel
