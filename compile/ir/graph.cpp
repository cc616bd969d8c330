// Printing of the IR (see graph.h).
#include "compile/ir/graph.h"

#include <sstream>

namespace reel::compile {

const char* buffer_kind_name(BufferKind k) {
  switch (k) {
    case BufferKind::Input: return "input";
    case BufferKind::External: return "external";
    case BufferKind::Internal: return "internal";
  }
  return "?";
}

bool is_random_op(OpKind op) {
  return op == OpKind::Dropout || op == OpKind::DropoutMask || op == OpKind::RandUniform || op == OpKind::RandNormal;
}

bool same_ref(const TensorRef& a, const TensorRef& b) {
  return a.buffer == b.buffer && a.shape == b.shape && a.strides == b.strides && a.offset == b.offset &&
         a.dtype == b.dtype;
}

bool is_contiguous(const TensorRef& r) {
  int64_t expected = 1;
  for (size_t d = r.shape.size(); d-- > 0;) {
    if (r.shape[d] == 1) continue;
    if (r.strides[d] != expected) return false;
    expected *= r.shape[d];
  }
  return true;
}

std::string ref_str(const TensorRef& r) {
  std::ostringstream os;
  os << "b" << r.buffer << shape_str(r.shape) << " " << dtype_name(r.dtype);
  if (!is_contiguous(r)) os << " strides " << shape_str(r.strides);
  if (r.offset != 0) os << " +" << r.offset;
  return os.str();
}

Tensor view_of(const std::shared_ptr<Storage>& storage, size_t byte_offset, const TensorRef& r) {
  REEL_ASSERT(storage != nullptr, "compile: buffer b", r.buffer, " has no memory");
  const size_t es = dtype_size(r.dtype);
  REEL_ASSERT(byte_offset % es == 0, "compile: buffer b", r.buffer, " is misaligned for ", dtype_name(r.dtype));
  Tensor base = Tensor::from_storage(storage, {int64_t(storage->nbytes() / es)}, r.dtype);
  return Tensor::make_view(base, r.shape, r.strides, int64_t(byte_offset / es) + r.offset);
}

std::string Graph::str() const {
  std::ostringstream os;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    os << i << ": " << op_name(n.op) << (n.in_place ? " (in place)" : "")
       << (n.stream == 1              ? " (side stream)"
           : n.stream == kAheadStream ? " (side stream 2)"
                                      : "")
       << " (";
    for (size_t k = 0; k < n.inputs.size(); ++k) os << (k ? ", " : "") << (n.inputs[k] ? ref_str(*n.inputs[k]) : "-");
    os << ") -> (";
    for (size_t k = 0; k < n.outputs.size(); ++k) os << (k ? ", " : "") << ref_str(n.outputs[k]);
    os << ")";
    if (!n.attrs.items().empty()) os << " [" << n.attrs.str(16) << "]";
    os << "\n";
  }
  for (const RandomSource& r : random_sources) {
    os << "random: " << r.span << " Philox counters per run from one generator, state in";
    for (int b : r.buffers) os << " b" << b;
    os << "\n";
  }
  return os.str();
}

}  // namespace reel::compile
