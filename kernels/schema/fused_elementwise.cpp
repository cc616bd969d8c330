// Schema of fused_elementwise: a chain of elementwise ops (and casts) as one op, written by the
// compiler's elementwise fusion (compile/passes/fuse_elementwise.cpp).
//
//   fused_elementwise (x0, ..., xk[, s0, ..., sj])
//                                     attrs program, inputs, outputs, states, shape, device_type,
//                                     device_index (kernels/fused_expr.h; the device for a program
//                                     without inputs)
//       -> (y0, ..., ym), each of `shape` in the dtypes `outputs` lists
//       Every input has the dtype `inputs` lists and broadcasts to `shape`. Element e of the loop
//       computes the program once: its loads read each x_i at e (broadcast), its stores write y_j[e].
//       An output may be an input's memory (an in-place update in the chain) when that input is read
//       at the same element: the kernels load every input before any store. s0.. are Philox states
//       ((2,) i64 on the device, `states` of them) that the program's dropout masks read whole.
#include "kernels/fused_expr.h"
#include "kernels/schema/schema_util.h"

namespace reel {
namespace {

std::vector<TensorMeta> infer_fused_elementwise(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::FusedElementwise;
  const FusedExpr expr = fused_expr_of(a);
  const Shape shape = fused_shape_of(a);
  REEL_ASSERT(in.size() == expr.inputs.size() + size_t(expr.states), "fused_elementwise: ", in.size(),
              " inputs for a program of ", expr.inputs.size(), " loads and ", expr.states, " Philox states");
  for (size_t i = 0; i < expr.inputs.size(); ++i) {
    schema::expect_defined(op, in[i], "input");
    REEL_CHECK(in[i].dtype() == expr.inputs[i], "fused_elementwise: input ", i, " is ", schema::desc(in[i]),
               " but the program loads ", dtype_name(expr.inputs[i]));
    REEL_CHECK(broadcast_shapes(in[i].shape(), shape, "fused_elementwise") == shape, "fused_elementwise: input ", i, " ",
               schema::desc(in[i]), " does not broadcast to the loop's shape ", shape_str(shape));
  }
  const Device device = in.empty() ? schema::attr_device(a) : in[0].device();
  for (size_t i = expr.inputs.size(); i < in.size(); ++i) schema::expect_philox_state(op, in, i, device);
  std::vector<TensorMeta> out;
  for (DType d : expr.outputs) out.push_back({shape, d, device});
  return out;
}

}  // namespace

void register_fused_elementwise_schemas() { register_schema(OpKind::FusedElementwise, infer_fused_elementwise); }

}  // namespace reel
