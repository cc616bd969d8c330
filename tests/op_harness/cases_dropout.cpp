// Op-harness cases of dropout and dropout_mask (the norm family's random ops; schemas:
// kernels/schema/norm.cpp). Dropout runs at p = 0.3, 0, 1 and 0.5 with a large Philox offset;
// dropout_mask from its attrs and from a Philox state input. Plain-loop references: dropout's mask is
// Philox's (tensor/rng.h), and dropout_mask's is dropout's.
#include "tensor/rng.h"
#include "tests/op_harness/inputs.h"

namespace reel::harness {
namespace {

using Inputs = std::vector<Tensor>;

struct Drop {
  const char* name;
  Shape x;
  Layout layout;
  double p;
  int64_t seed, offset;
  bool gradcheck;
};

// (y, mask): element i is kept when philox_uniform(seed, offset, i) >= p; mask = 1/(1-p) or 0.
Expected dropout_reference(const Drop& d, const OpCall& c) {
  std::vector<double> x = host_values(c.inputs[0]), y, mask;
  const double keep = d.p < 1 ? 1 / (1 - d.p) : 0;
  const DType t = c.inputs[0].dtype();
  const double stored_keep = host_values(scalar_input(keep, t))[0];  // the mask holds it in x's dtype
  for (size_t i = 0; i < x.size(); ++i) {
    const bool kept = philox_uniform(uint64_t(d.seed), uint64_t(d.offset), i) >= float(d.p);
    mask.push_back(kept ? stored_keep : 0);
    y.push_back(x[i] * mask.back());
  }
  return {y, mask};
}

void add_dropout_cases(std::vector<OpTestCase>& cases) {
  using L = Layout;
  for (const Drop& d :
       {Drop{"p_0_3_4x5", {4, 5}, L::contiguous, 0.3, 7, 2, true},
        Drop{"p_0_3x4", {3, 4}, L::contiguous, 0.0, 8, 0, false},
        Drop{"p_1_2x3", {2, 3}, L::contiguous, 1.0, 9, 0, false},
        Drop{"p_0_5_transposed_high_offset_5x40", {5, 40}, L::transposed, 0.5, 10, int64_t(1) << 35, false}}) {
    GradcheckFn grad;
    if (d.gradcheck)
      grad = [d](const Inputs& x) {
        Generator gen(uint64_t(d.seed));  // the same mask on every evaluation
        return dropout(x[0], d.p, true, &gen);
      };
    cases.push_back({.op = OpKind::Dropout,
                     .name = std::string("dropout_") + d.name,
                     .dtypes = kFloatTypes,
                     .make =
                         [d](Device, DType t) {
                           return OpCall{{randn_input(d.x, t, 130, d.layout)},
                                         Attrs().set("p", d.p).set("seed", d.seed).set("offset", d.offset)};
                         },
                     .grad = grad,
                     .tol_scale = 0,
                     .reference = [d](const OpCall& c) { return dropout_reference(d, c); }});
  }
}

// dropout_mask: dropout's mask alone, from its attrs or from a Philox state {seed, base} (the offset
// attr then relative to the base), as a compiled plan draws it again where the mask is read.
void add_dropout_mask_cases(std::vector<OpTestCase>& cases) {
  struct Mask {
    const char* name;
    Shape shape;
    double p;
    int64_t seed, offset;
    bool state;  // {seed + 1000, 40} as a state input
  };
  for (const Mask& m : {Mask{"p_0_3_4x5", {4, 5}, 0.3, 7, 2, false},
                        Mask{"p_0_1_state_3x37", {3, 37}, 0.1, 11, 3, true}, Mask{"p_1_2x3", {2, 3}, 1.0, 9, 0, false},
                        Mask{"p_0_5_high_offset_6x7", {6, 7}, 0.5, 10, int64_t(1) << 35, false}}) {
    const uint64_t key = uint64_t(m.state ? m.seed + 1000 : m.seed), start = uint64_t(m.offset) + (m.state ? 40 : 0);
    cases.push_back({.op = OpKind::DropoutMask,
                     .name = std::string("dropout_mask_") + m.name,
                     .dtypes = kFloatTypes,
                     .make =
                         [m](Device d, DType t) {
                           Attrs a = with_device(Attrs()
                                                     .set("shape", std::vector<int64_t>(m.shape.begin(), m.shape.end()))
                                                     .set("dtype", t)
                                                     .set("p", m.p)
                                                     .set("seed", m.seed)
                                                     .set("offset", m.offset),
                                                 d);
                           std::vector<Tensor> in;
                           if (m.state) in.push_back(values_input({double(m.seed + 1000), 40}, {2}, DType::i64));
                           return OpCall{in, a};
                         },
                     .tol_scale = 0,
                     .reference =
                         [m, key, start](const OpCall& c) {
                           const DType t = c.attrs.dtype("dtype");
                           const double keep = host_values(scalar_input(m.p < 1 ? 1 / (1 - m.p) : 0, t))[0];
                           std::vector<double> v;
                           for (uint64_t i = 0; i < uint64_t(numel_of(m.shape)); ++i)
                             v.push_back(philox_uniform(key, start, i) >= float(m.p) ? keep : 0);
                           return Expected{v};
                         }});
  }
}

}  // namespace

std::vector<OpTestCase> dropout_cases() {
  std::vector<OpTestCase> cases;
  add_dropout_cases(cases);
  add_dropout_mask_cases(cases);
  return cases;
}

}  // namespace reel::harness
