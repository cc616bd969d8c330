// The compiler's IR: a traced step as a list of kernel nodes over buffers.
//
// A Buffer is one block of memory the step touches, identified while tracing by its Storage:
//   Input     a call argument (a micro-batch's inputs or targets): rebound on every call;
//   External  memory that outlives the step and is read or updated in place by it (parameters,
//             optimizer and scaler state, BatchNorm running stats, constants the step built on the
//             host): bound to the same Storage on every replay;
//   Internal  memory the step allocated (activations, gradients, temporaries): placed by the memory
//             planner in one arena per device, reused as soon as its last reader has run.
// A TensorRef is a strided view of a buffer (shape, strides and offset in elements of its dtype), so
// view ops (reshape, transpose, slice, expand) need no node at all: their outputs are just other
// TensorRefs of the same buffer. Every Node is a kernel: op, attrs, the refs it reads and the refs it
// writes. Nodes keep the traced order, which also orders in-place updates and reads of the same
// memory; a pass may only reorder or merge nodes whose buffers prove them independent. A fusion pass
// rewrites nodes into a fused op of kernels/ops.def (layer_norm_cast, gemm_epilogue,
// fused_elementwise, ...): every node, fused or not, runs through the kernel table.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/attrs.h"
#include "kernels/op.h"
#include "tensor/rng.h"
#include "tensor/tensor.h"

namespace reel::compile {

enum class BufferKind { Input, External, Internal };
const char* buffer_kind_name(BufferKind k);

struct Buffer {
  int id = -1;
  BufferKind kind = BufferKind::Internal;
  size_t nbytes = 0;
  Device device;
  std::shared_ptr<Storage> storage;  // Input/External: bound memory; Internal: the traced block (dropped once planned)
  int input_index = -1;              // Input: which call argument
  // Internal, from the tracer: the node by whose end the traced program itself had dropped its last
  // reference to the block (eager execution frees it there); -1: still held when the trace finished.
  int released_after = -1;
};

struct TensorRef {
  int buffer = -1;
  Shape shape, strides;
  int64_t offset = 0;  // in elements of dtype
  DType dtype = DType::f32;

  size_t nbytes() const { return size_t(numel_of(shape)) * dtype_size(dtype); }
};

// Node::stream of the third stream, where a micro-batch's first forward kernels run ahead
// (compile/passes/overlap_micro_batches.h); 0 is the main stream, 1 the side stream.
constexpr int kAheadStream = 2;

struct Node {
  OpKind op;
  Attrs attrs;
  std::vector<std::optional<TensorRef>> inputs;  // nullopt: an absent optional input
  std::vector<TensorRef> outputs;
  bool in_place = false;       // outputs existed before the op (dispatch_out)
  std::vector<std::string> fused;  // the traced ops a pass merged into this node (for `reel plan`)
  bool recomputed = false;         // a clone placed in the backward for a memory limit (passes/recompute.cpp)
  // The part of the step it was traced in ("micro-batch 0", "optimizer": kernels/phase.h), for traces
  // of a plan's run; "" outside any. A node a fusion pass builds anew gets it from the nodes it replaced
  // (optimize_graph, before the schedule stage, whose passes read it).
  std::string phase = "";
  // The stream that runs it: 0 the plan's main stream; 1 a second stream beside it, which the main
  // stream waits for only where it must (compile/passes/side_stream.h); 2 a third, for a micro-batch's
  // first forward kernels run under the backward before it (compile/passes/overlap_micro_batches.h).
  int stream = 0;
  // On the side stream: main-stream nodes after its inputs' last reader that it may still run beside
  // (its inputs held that much longer), where the pass found the step's planned peak unchanged by it.
  int hold = 0;
};

// Dropout and the rand ops: their kernels draw Philox numbers (tensor/rng.h).
bool is_random_op(OpKind op);

// A Generator the traced step drew from. Each random node reads the generator's state from one of
// `buffers` (an External (2,) i64 {seed, base offset} per device), its offset attr relative to the
// base. Before each run the plan reserves `span` counters of the generator (what the traced call
// drew from it, from its first draw to the end of its last) and writes the seed and the reserved
// base there: every run draws fresh numbers, exactly the ones an eager call would have drawn.
struct RandomSource {
  Generator* generator = nullptr;
  uint64_t span = 0;
  std::vector<int> buffers;
};

struct Graph {
  std::vector<Buffer> buffers;
  std::vector<Node> nodes;
  std::vector<TensorRef> inputs;   // the call's arguments as traced (one Input buffer each)
  std::vector<TensorRef> outputs;  // what the step function returned
  int num_inputs = 0;
  std::vector<RandomSource> random_sources;

  // Human-readable listing: one line per node with its buffers, as `reel plan` prints it.
  std::string str() const;
};

// The same view: buffer, shape, strides, offset and dtype.
bool same_ref(const TensorRef& a, const TensorRef& b);
// Row-major strides on every dim of size > 1 (as Tensor::is_contiguous).
bool is_contiguous(const TensorRef& r);

// "b12(16, 256, 512) f32 +3" — a ref as plans print it; one that is not contiguous (a transposed
// view, a channels-last tensor, a slice) also shows its strides: "b19(512, 1536) f32 strides (1, 512)".
std::string ref_str(const TensorRef& r);

// The tensor `r` describes, over `storage` with the buffer starting `byte_offset` bytes in.
Tensor view_of(const std::shared_ptr<Storage>& storage, size_t byte_offset, const TensorRef& r);

}  // namespace reel::compile
