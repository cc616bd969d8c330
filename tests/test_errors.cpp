// Bad input across the core: every class of user mistake gives a reel::Error naming the op and
// showing the offending shapes, dtypes, devices or values. Family-specific errors live beside each
// family's tests.
#include <gtest/gtest.h>

#include "tensor/cuda.h"
#include "test_util.h"

using namespace reel;
using reel::testing_util::expect_error;

namespace {
// Host memory that claims to be cuda:0, so device checks can be tested without a GPU.
class FakeDeviceAllocator : public Allocator {
 public:
  void* allocate(size_t n, Device) override { return std::malloc(n ? n : 1); }
  void deallocate(void* p, size_t, Device) override { std::free(p); }
};
}  // namespace

TEST(Errors, MixingDevicesInOneOp) {
  ones({1});  // dispatch registers the backends (and the CUDA allocator, when built) on first use
  FakeDeviceAllocator fake;
  Allocator* real = set_allocator(DeviceType::CUDA, &fake);
  {
    Tensor g = Tensor::empty({2, 3}, DType::f32, Device::cuda(0));
    expect_error([&] { ones({2, 3}) + g; }, {"add", "different devices", "cpu", "cuda:0"});
    expect_error([&] { where(ones({2, 3}), g, ones({2, 3})); }, {"where", "cpu", "cuda:0"});
  }
  set_allocator(DeviceType::CUDA, real);
  // Without a usable GPU, asking for device memory is a clear error, not a crash.
  if (!cuda::is_available())
    expect_error([] { zeros({2}, TensorOptions{}.with_device(Device::cuda(0))); }, {"cuda:0"});
}

TEST(Errors, ShapeMismatches) {
  expect_error([] { reshape(ones({2, 3}), {4, -1}); }, {"reshape", "(2, 3)", "(4, -1)"});
  expect_error([] { reshape(ones({2, 3}), {-1, -1}); }, {"reshape", "-1"});
  expect_error([] { permute(ones({2, 3}), {0, 0}); }, {"permute", "permutation"});
  expect_error([] { permute(ones({2, 3}), {0}); }, {"permute", "(2, 3)"});
  expect_error([] { expand(ones({2, 3}), {4, 3}); }, {"expand", "(2, 3)", "(4, 3)"});
  expect_error([] { slice(ones({4}), 0, 0, 4, 0); }, {"slice", "step"});
  expect_error([] { ones({2, 3}).sum({2}); }, {"dim 2", "out of range"});
  expect_error([] { concat({ones({2, 3}), ones({3, 3})}, 1); }, {"concat", "(3, 3)", "(2, 3)"});
  expect_error([] { split(ones({5}), {2, 2}, 0); }, {"split", "(2, 2)", "5"});
  expect_error([] { Tensor::from_vector<float>({1, 2, 3}, {2, 2}); }, {"from_vector", "3 values", "(2, 2)"});
}

TEST(Errors, OutOfRangeIndices) {
  expect_error([] { select(ones({3, 2}), 0, 3); }, {"select", "index 3", "size 3"});
  expect_error([] { select(ones({3, 2}), 1, -3); }, {"select", "index -3"});
  expect_error([] { transpose(ones({3, 2}), 0, 2); }, {"transpose", "dim 2"});
}

TEST(Errors, DtypeMismatches) {
  expect_error([] { ones({2}) - ones({2}, {DType::bf16}); }, {"sub", "f32", "bf16", "cast"});
  expect_error([] { sqrt(tensor_i64({4}, {1})); }, {"sqrt", "i64"});
  expect_error([] { randn({2}, {DType::i64}); }, {"random", "i64"});
}

TEST(Errors, UndefinedTensors) {
  expect_error([] { Tensor().shape(); }, {"undefined"});
  expect_error([] { ones({2}) + Tensor(); }, {"add", "undefined"});
}
