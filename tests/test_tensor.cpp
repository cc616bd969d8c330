// Tensor basics: views share storage, strides, contiguous copies, casts, printing, RNG.
#include <gtest/gtest.h>

#include "reel.h"

using namespace reel;

TEST(Tensor, FromVectorAndShape) {
  Tensor t = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(t.strides(), (Shape{3, 1}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
}
