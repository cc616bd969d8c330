// What the passes match with: who reads and writes each buffer (BufferUses), the shapes of nodes
// every fusion looks for (a plain cast, a sole reader, a gradient write), whether a device takes
// the fused op a pass would write (call_supported), and why_not(), which says under REEL_LOG=fusion
// why a pass declined a candidate, in the manner of Inductor's WhyNoFuse. Patterns are stated by
// op, dtype and reader counts, never by model.
#pragma once
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "compile/ir/graph.h"

namespace reel::compile {


// Who touches each buffer, in graph order (node indices), for the fusion passes' safety checks. A
// graph output counts as a reader at index nodes.size().
struct BufferUses {
  std::vector<std::vector<int>> readers, writers, touches;
  int producer(int buffer) const { return writers[buffer].empty() ? -1 : writers[buffer].back(); }
  // Whether a node strictly between i and j reads or writes the buffer.
  bool touched_between(int buffer, int i, int j) const;
  // Whether a node strictly between i and j writes the buffer.
  bool written_between(int buffer, int i, int j) const;
};
BufferUses buffer_uses(const Graph& g);
// Drops the nodes marked in `drop`, keeping the others in order.
void drop_nodes(Graph& g, const std::vector<bool>& drop);
// The loop of a pass that merges nodes into earlier ones: visit(i, drop) for each node i not yet
// marked, in graph order (it may rewrite node i and mark later or earlier nodes in `drop`); then the
// marked nodes go.
template <typename Visit>
void fuse_each(Graph& g, Visit visit) {
  std::vector<bool> drop(g.nodes.size(), false);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (!drop[i]) visit(i, drop);
  drop_nodes(g, drop);
}
// The loop of a pass that fuses one partner node into each anchor: for every node that `is_anchor`
// takes, match(i, why) gives the partner's index, or -1 with the reason in `why` (logged by why_not
// under REEL_LOG=fusion as "<pass>: <op> k<i> not fused with <with>: <reason>"); rewrite(i, partner,
// drop) then writes the fused node at i and marks what goes in `drop`.
template <typename IsAnchor, typename Match, typename Rewrite>
void fuse_partners(Graph& g, const char* pass, const char* with, IsAnchor is_anchor, Match match, Rewrite rewrite);

// Whether node n reads or writes the buffer.
bool refers_to(const Node& n, int buffer);
// Whether node m writes a buffer that node n reads (n may not move across m, nor run beside it).
bool writes_an_input_of(const Node& m, const Node& n);
// An Internal buffer written by exactly one node.
bool internal_once(const Graph& g, const BufferUses& u, const TensorRef& r);
// Contiguous, or a dense channels-last 4-D view (where autocast puts a convolution's 16-bit operands
// on the GPU): a layout the norm kernels read and write where it lies.
bool is_dense(const TensorRef& r);
// tensor/shape.h's is_position_broadcast of r's shape and strides.
bool is_position_broadcast(const TensorRef& r);
// bf16 or f16: the compute dtypes of autocast.
inline bool is_16bit(DType d) { return d == DType::bf16 || d == DType::f16; }
// Node k as a plain cast (a copy) of all of src into a contiguous Internal buffer of src's shape
// written only there. Which dtype it casts to is for the caller to check.
bool is_plain_cast_of(const Graph& g, const BufferUses& u, int k, const TensorRef& src);
// The node that alone reads z's buffer, reading it once (not a graph output): its index, or -1.
int sole_reader(const Graph& g, const BufferUses& u, const TensorRef& z);
// A ref with its leading dims folded into rows, (..., C) -> (rows, C), when its strides allow: how
// a GEMM node's batched operand or result is handed to a 2-D GEMM kernel.
std::optional<TensorRef> as_matrix(const TensorRef& r);
// The tensor r is in the traced step's memory, or a meta stand-in of its geometry where a pass made
// the buffer: what a pass hands a kernel's support query, which looks at shapes, layouts and
// alignment only, never at values.
Tensor traced(const Graph& g, const TensorRef& r);

// A fresh Internal buffer of `shape` and `dtype` on `device`, appended to g's buffers, and the
// contiguous view of all of it: what a pass writes a value no traced buffer holds into.
TensorRef new_internal_buffer(Graph& g, const Shape& shape, DType dtype, const Device& device);
// A later cast of `out` to 16 bits (autocast's cast for a GEMM), with out's own geometry, into a
// contiguous Internal buffer that nothing touches before it: the cast's node index, or -1. The fusion
// passes fold such a cast into the kernel that produces `out`.
int later_16bit_cast(const Graph& g, const BufferUses& u, const TensorRef& out);

// Whether n is a GEMM + bias node (gemm_epilogue without GELU, possibly kept 16-bit by gemm_16bit):
// inputs x, W^T, bias; output z.
inline bool is_gemm_bias(const Node& n) { return n.op == OpKind::GemmEpilogue && !n.attrs.b("gelu", false); }

// The first condition a candidate fails, with its sentence: a matcher is a list of
//   if (!why(cond, "the reason it matters")) return ...;
// and the pass hands why.reason() to why_not() for the candidates it declines.
class Why {
 public:
  bool operator()(bool ok, const char* reason) {
    if (!ok && reason_.empty()) reason_ = reason;
    return ok;
  }
  bool operator()(bool ok, const std::string& reason) { return (*this)(ok, reason.c_str()); }
  const std::string& reason() const { return reason_; }

 private:
  std::string reason_;
};

// ---- chains ----
// A chain is a pattern stated by op and dtype: from a value, a node that reads it, then a node that
// reads that one's result, and so on ("a 16-bit GEMM result, cast to f32, GELU, cast back to 16
// bits"). Each link says which node may come next: a test of the node reading the previous value
// (`in`, the whole of it), and whether it must be that value's only reader.
struct Link {
  const char* what;  // "a cast to f32": for the reason when the chain breaks there
  std::function<bool(const Graph& g, const BufferUses& u, int k, const TensorRef& in)> test;
  bool sole = true;  // the only reader of the previous value (reading it once)
};
// Links of the common kinds: a plain cast of `in` into dtype (a 16-bit one with DType::f16 standing
// for either of bf16 and f16 when `any_16bit`), and op reading all of `in` into a fresh buffer of out's dtype.
Link cast_link(const char* what, DType to, bool any_16bit = false, bool sole = true);
Link op_link(const char* what, OpKind op, DType out, bool sole = true);
// The nodes along `links` from `from` (the first link may be any reader of it when not sole; the
// first that passes is taken), or nullopt with the link that broke in `why`.
std::optional<std::vector<int>> match_chain(const Graph& g, const BufferUses& u, const TensorRef& from,
                                            const std::vector<Link>& links, Why& why);

// Under REEL_LOG=fusion, one line saying why `pass` did not fuse node i of g with `with`:
//   "norm_cast: layer_norm k41 not fused with its cast: y has 2 readers"
void why_not(const char* pass, const Graph& g, size_t i, const char* with, const std::string& reason);


// Node k as a value times its dropout mask, v * m, where m is drawn by a dropout_mask node
// (compile/passes/redraw_dropout_masks.cpp) that writes it for k alone: the two nodes a norm pass
// folds into its kernel as attrs and the Philox state (kernels/philox_args.h). `value` is v's ref;
// the mask must be v's contiguous shape and dtype. nullopt otherwise.
struct DropoutProduct {
  int mask = -1;  // the dropout_mask node
  TensorRef value;
};
std::optional<DropoutProduct> dropout_product(const Graph& g, const BufferUses& u, int k);
// The fused op `n` with the dropout of node `mask`'s attrs, its Philox state (if any) as n's last input.
void add_fused_dropout(Node& n, const Node& mask);

// Whether the device of ref r has a kernel for op (the fused op a pass would write there).
bool device_supports(const Graph& g, const TensorRef& r, OpKind op);
// Whether node n, as a pass would write it, is a call its device's kernel takes: the schema accepts
// its inputs and attrs and predicts its outputs, and the kernel's own support query (a cuBLASLt
// epilogue's algorithm, say) says yes (kernels/dispatch.h: supports_call, on the traced tensors).
bool call_supported(const Graph& g, const Node& n);

// Node c as AccumulateGrad's write into a parameter's gradient: the copy that creates it (the first
// micro-batch) or the in-place add (params +=, the later ones). `source`
// is what it puts there; nullopt otherwise.
struct GradientWrite {
  const TensorRef* source;
  bool add;
};
std::optional<GradientWrite> gradient_write(const Node& c);
// Whether the producer at node i may write (or add to) the gradient z that node j writes, so that j
// can go: nothing touches z between them, and a copy j creates z.
bool may_write_gradient_early(const BufferUses& u, const TensorRef& z, int i, int j, bool add);
// Node j as the gradient write of all of one result of an earlier node: the result (output `output`
// of node `producer`, not in place) is an Internal buffer written there alone and read by j alone,
// wholly, contiguous like the gradient and of its dtype and element count, and the producer may
// write the gradient early (may_write_gradient_early): what a pass needs to have the producer write
// (or add to) the gradient itself. nullopt otherwise, the reason in `why` when j is a gradient write.
struct ResultWrite {
  int producer;
  size_t output;
  bool add;
};
std::optional<ResultWrite> whole_result_written_to_grad(const Graph& g, const BufferUses& u, size_t j, Why& why);

template <typename IsAnchor, typename Match, typename Rewrite>
void fuse_partners(Graph& g, const char* pass, const char* with, IsAnchor is_anchor, Match match, Rewrite rewrite) {
  fuse_each(g, [&](size_t i, std::vector<bool>& drop) {
    if (!is_anchor(g.nodes[i])) return;
    Why why;
    const int k = match(i, why);
    if (k < 0 || drop[size_t(k)]) return why_not(pass, g, i, with, why.reason());
    rewrite(i, k, drop);
  });
}

}  // namespace reel::compile
