// dispatch — the one door every op passes through, forward or backward, eager or traced.
//
//   outputs = dispatch(op, inputs, attrs[, memory format])
//     1. the op's schema (kernels/schema/) validates inputs and attrs and infers output metas,
//        throwing reel::Error that names the op and shows shapes/dtypes/devices;
//     2. all inputs must share one device (Copy may cross devices);
//     3. outputs are allocated on that device (or, for view ops, built as aliases: no kernel);
//     4. the device's kernel runs (on the current stream, never synchronising with the host);
//     5. an installed observer (the compiler's tracer) sees (op, inputs, outputs, attrs).
//   dispatch_out(op, inputs, outputs, attrs) does the same into caller-given outputs (in-place
//   updates such as grad += g, or a copy into a view); their shapes and dtypes must match.
//
// Meta mode (MetaModeGuard): steps 1, 2 and 5 as usual (a kernel must still exist for the device),
// but no kernel runs and no memory is allocated: fresh outputs get meta Storage (a size and a device,
// no data; tensor/storage.h) and outputs given to dispatch_out are left unwritten. The observer sees
// the same calls, so the compiler's tracer records a step without running it — what the memory-budget
// planner needs to plan a step that would not fit. Inputs may be real or meta. A copy from a GPU to
// the host (how .item() and to_vector() read a device value) throws in meta mode, and reading a meta
// tensor's data on the host throws from Tensor::data_ptr, rather than returning garbage.
//
// Kernels are registered per device type; supports(op, device) tells whether one exists, so that the
// compiler can report a graph break instead of failing, and a fusion pass whether a device can take
// the fused op it would write. A kernel may also register
//   - a SupportsFn: whether it takes one particular call (shapes, layouts, alignment: a cuBLASLt
//     epilogue with no algorithm for the problem, say); supports_call() asks it after the schema;
//   - a PrepareFn: work it can do before its first run (compiling a generated kernel); a Plan calls
//     prepare_kernel() for each of its nodes when it is built, so nothing compiles inside a replay
//     or a CUDA-graph capture. A kernel still works unprepared (eager dispatch): it prepares itself.
//   - a PartsFn, for a kernel that leaves per-block partial sums for another node to add up
//     (layer_norm_backward_partials): how many blocks it runs for a call, its GPU's resident blocks,
//     so that a pass can size the partials' buffer before anything runs (kernel_parts()).
#pragma once
#include <vector>

#include "kernels/attrs.h"
#include "kernels/op.h"
#include "tensor/tensor.h"

namespace reel {

struct TensorMeta {
  Shape shape;
  DType dtype;
  Device device;
};

// What a kernel receives. Optional inputs that are absent are undefined Tensors.
struct KernelCall {
  OpKind op;
  const std::vector<Tensor>& in;
  const std::vector<Tensor>& out;
  const Attrs& attrs;
};

using InferFn = std::vector<TensorMeta> (*)(const std::vector<Tensor>& in, const Attrs& attrs);
using ViewFn = Tensor (*)(const Tensor& in, const Attrs& attrs);
using KernelFn = void (*)(const KernelCall& call);
using SupportsFn = bool (*)(const KernelCall& call);
using PrepareFn = void (*)(const KernelCall& call);
// The blocks (partial-sum rows) the device's kernel would run for inputs and attrs (real or meta
// tensors); 0 where it does not take the call.
using PartsFn = int64_t (*)(const std::vector<Tensor>& inputs, const Attrs& attrs);

// Schema registration (kernels/schema/*.cpp) and kernel registration (kernels/<device>/*.cpp).
void register_schema(OpKind op, InferFn infer, ViewFn view = nullptr);
void register_kernel(DeviceType device, OpKind op, KernelFn kernel);
void register_supports(DeviceType device, OpKind op, SupportsFn fn);
void register_prepare(DeviceType device, OpKind op, PrepareFn fn);
void register_parts(DeviceType device, OpKind op, PartsFn fn);
bool supports(OpKind op, DeviceType device);
// Whether op can run on these tensors (real or meta: only shapes, strides, dtypes and devices are
// looked at): the device of the outputs has a kernel, the schema accepts the inputs and attrs and
// predicts the outputs' shapes and dtypes, and the kernel's SupportsFn, if any, takes the call.
// Never throws for a call it refuses: it answers false.
bool supports_call(OpKind op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                   const Attrs& attrs);
// The kernel's PrepareFn on these (bound) tensors, if it registered one; nothing otherwise.
void prepare_kernel(OpKind op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                    const Attrs& attrs);
// The device's PartsFn for op on these inputs (their common device) and attrs; 0 when the device
// registered none or its kernel does not take the call. Never throws for a call it refuses.
int64_t kernel_parts(OpKind op, const std::vector<Tensor>& inputs, const Attrs& attrs);
bool is_view_op(OpKind op);

std::vector<Tensor> dispatch(OpKind op, const std::vector<Tensor>& inputs, const Attrs& attrs = {});
// The same with every fresh 4-D output allocated in `format` (a channels-last convolution's result
// and gradients); other outputs stay contiguous. The observer sees them as fresh outputs as usual.
std::vector<Tensor> dispatch(OpKind op, const std::vector<Tensor>& inputs, const Attrs& attrs, MemoryFormat format);
// Single-output convenience.
Tensor dispatch1(OpKind op, const std::vector<Tensor>& inputs, const Attrs& attrs = {},
                 MemoryFormat format = MemoryFormat::Contiguous);
void dispatch_out(OpKind op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                  const Attrs& attrs = {});
// The output metas dispatch would produce, without running anything (used by planners and tests).
std::vector<TensorMeta> infer_outputs(OpKind op, const std::vector<Tensor>& inputs, const Attrs& attrs = {});

// The compiler's tracer installs one of these; kernels/ never sees compile/. `into_given` is true
// for dispatch_out (the outputs existed before the call: an in-place update or a copy into a view)
// and false for dispatch (the outputs were allocated by it, or are views of an input).
class DispatchObserver {
 public:
  virtual ~DispatchObserver() = default;
  virtual void on_dispatch(OpKind op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                           const Attrs& attrs, bool into_given) = 0;
  // `t`'s values are about to be read by host code (Tensor::item, to_vector), which no op records:
  // a replay could not repeat the read, and whatever the host computes from it would be frozen.
  virtual void on_host_read(const Tensor& t) {}
};
// Installs `observer` for the calling thread (nullptr removes it) and returns the previous one: it
// sees the ops this thread dispatches, not other threads'.
DispatchObserver* set_dispatch_observer(DispatchObserver* observer);
// `observer` installed for the calling thread for the guard's lifetime, the previous one restored
// after (also when an exception leaves the scope).
class ScopedDispatchObserver {
 public:
  explicit ScopedDispatchObserver(DispatchObserver* observer) : previous_(set_dispatch_observer(observer)) {}
  ~ScopedDispatchObserver() { set_dispatch_observer(previous_); }
  ScopedDispatchObserver(const ScopedDispatchObserver&) = delete;
  ScopedDispatchObserver& operator=(const ScopedDispatchObserver&) = delete;

 private:
  DispatchObserver* previous_;
};
// The calling thread's observer (nullptr when none): what is not an op (an MPI collective) checks it
// to refuse being traced, since a replay would skip it.
DispatchObserver* dispatch_observer();

// Runs op's kernel for `device` on tensors that are known to be valid — a recorded op replayed by
// the compiler's plan: no schema check, no allocation, no observer; counted by kernel_count().
void run_kernel(OpKind op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                const Attrs& attrs);
// The registered kernel of op on `device` (nullptr when there is none).
KernelFn find_kernel(OpKind op, DeviceType device);

// While alive, dispatch runs in meta mode (see the top of this file). Nests; per thread.
class MetaModeGuard {
 public:
  MetaModeGuard();
  ~MetaModeGuard();
  MetaModeGuard(const MetaModeGuard&) = delete;
  MetaModeGuard& operator=(const MetaModeGuard&) = delete;

 private:
  bool previous_;
};
bool meta_mode();

// Counts every dispatch since start-up (cheap; used by tests).
uint64_t dispatch_count();
// Counts the device kernels run since start-up: dispatches minus view ops (which run none). A kernel
// function may launch more than one GPU kernel (e.g. a two-pass reduction); this counts ops that ran.
uint64_t kernel_count();

}  // namespace reel
