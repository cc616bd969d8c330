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
//   with attrs column_sums k (and accumulate): -> (y0, ..., ym, sums) and, accumulating, one more input
//       after the states, the sums to add to: sums (C) f32 = [sums +] the sums over the rows of y_k
//       viewed as (rows, C), C = shape's last dim (kernels/fused_expr.h, FusedColumnSums). y_k is f32,
//       f16 or bf16, as the column_sums op's x.
#include "kernels/fused_expr.h"
#include "kernels/schema/schema_util.h"

namespace reel {
namespace {

std::vector<TensorMeta> infer_fused_elementwise(const std::vector<Tensor>& in, const Attrs& a) {
  constexpr OpKind op = OpKind::FusedElementwise;
  const FusedExpr expr = fused_expr_of(a);
  const Shape shape = fused_shape_of(a);
  const FusedColumnSums sums = fused_column_sums_of(a);
  const size_t loads_and_states = expr.inputs.size() + size_t(expr.states);
  REEL_ASSERT(in.size() == loads_and_states + (sums.accumulate ? 1 : 0), "fused_elementwise: ", in.size(),
              " inputs for a program of ", expr.inputs.size(), " loads and ", expr.states, " Philox states",
              sums.accumulate ? " and the column sums to add to" : "");
  for (size_t i = 0; i < expr.inputs.size(); ++i) {
    schema::expect_defined(op, in[i], "input");
    REEL_CHECK(in[i].dtype() == expr.inputs[i], "fused_elementwise: input ", i, " is ", schema::desc(in[i]),
               " but the program loads ", dtype_name(expr.inputs[i]));
    REEL_CHECK(broadcast_shapes(in[i].shape(), shape, "fused_elementwise") == shape, "fused_elementwise: input ", i, " ",
               schema::desc(in[i]), " does not broadcast to the loop's shape ", shape_str(shape));
  }
  const Device device = in.empty() ? schema::attr_device(a) : in[0].device();
  for (size_t i = expr.inputs.size(); i < loads_and_states; ++i) schema::expect_philox_state(op, in, i, device);
  std::vector<TensorMeta> out;
  for (DType d : expr.outputs) out.push_back({shape, d, device});
  if (!sums.on()) return out;
  REEL_CHECK(sums.output < int(expr.outputs.size()), "fused_elementwise: column_sums names output ", sums.output,
             " of a program of ", expr.outputs.size(), " outputs");
  const DType summed = expr.outputs[size_t(sums.output)];
  REEL_CHECK(!shape.empty() && (summed == DType::f32 || summed == DType::f16 || summed == DType::bf16),
             "fused_elementwise: the column sums of output ", sums.output, " (", dtype_name(summed), ", shape ",
             shape_str(shape), ") need an f32, f16 or bf16 output with at least one dim");
  const Shape cols{shape.back()};
  if (sums.accumulate) {
    const Tensor& base = in.back();
    REEL_CHECK(base.defined() && base.shape() == cols && base.dtype() == DType::f32 && base.device() == device,
               "fused_elementwise: the column sums to add to ", base.defined() ? schema::desc(base) : "(undefined)",
               " must be f32 of shape ", shape_str(cols), " on ", device.str());
  }
  out.push_back({cols, DType::f32, device});
  return out;
}

}  // namespace

void register_fused_elementwise_schemas() { register_schema(OpKind::FusedElementwise, infer_fused_elementwise); }

}  // namespace reel
