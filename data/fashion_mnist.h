// Fashion-MNIST (and any MNIST-style data set) from idx files: 28x28 grey images of 10 clothing classes,
// 60000 for training and 10000 for testing, as shipped by Debian's dataset-fashion-mnist package in
// /usr/share/datasets/fashion-mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz.
//
// The idx format (big-endian): a 4-byte magic 0x00 0x00 <type> <ndims> (type 0x08 = unsigned byte),
// then ndims 32-bit sizes, then the values row-major. Images: magic 2051 (0x00000803), sizes (N, H, W).
// Labels: magic 2049 (0x00000801), size (N). Files may be gzip-compressed or plain (zlib's gzread reads
// both).
//
// Pixels become f32 in [0, 1] (byte / 255) and are then normalised per pixel as x' = (x - mean) / std
// with Fashion-MNIST's training-set statistics mean 0.2860 and std 0.3530 (torchvision's usual figures),
// so the training images have roughly zero mean and unit variance. Labels become i64 class indices.
//
// Every defect is a reel::Error naming the file: missing (with the package to install), a bad magic,
// bad sizes, a truncated or over-long file (what was expected and what was found), image and label
// counts that differ, a label outside [0, num_classes).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace reel::data {

inline constexpr double kFashionMnistMean = 0.2860;
inline constexpr double kFashionMnistStd = 0.3530;
inline constexpr int64_t kFashionMnistClasses = 10;
// The default directory, Debian's dataset-fashion-mnist package.
inline constexpr const char* kFashionMnistDefaultDir = "/usr/share/datasets/fashion-mnist";

// A labelled image data set held in host memory.
struct ImageDataset {
  Tensor images;  // (N, 1, H, W) f32, normalised as described above
  Tensor labels;  // (N) i64 in [0, num_classes)
  int64_t num_classes = kFashionMnistClasses;
  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
};

// One decoded idx file of unsigned bytes.
struct IdxArray {
  std::vector<int64_t> dims;   // e.g. (N, H, W) for images, (N) for labels
  std::vector<uint8_t> bytes;  // prod(dims[0] -> min(dims[0], limit), dims[1:]) values, row-major
};

// Reads an idx file of unsigned bytes whose magic must be `expected_magic` (2051 or 2049). With
// limit >= 0 only the first `limit` items (along dim 0) are read, and the rest of the file is not
// checked; otherwise the file must hold exactly the data its header announces.
IdxArray read_idx(const std::string& path, uint32_t expected_magic, int64_t limit = -1);

// Reads an images idx file and a labels idx file into an ImageDataset: the counts must agree, labels
// must lie in [0, num_classes). limit >= 0 keeps the first `limit` items.
ImageDataset load_idx_dataset(const std::string& images_path, const std::string& labels_path, int64_t limit = -1,
                              double mean = kFashionMnistMean, double std = kFashionMnistStd,
                              int64_t num_classes = kFashionMnistClasses);

// $REEL_FASHION_MNIST when set and non-empty, else /usr/share/datasets/fashion-mnist.
std::string fashion_mnist_dir();

// The training (60000) or test (10000) split from `dir`: images (N, 1, 28, 28) f32 normalised with
// mean 0.2860 and std 0.3530, labels (N) i64 in [0, 10). Looks for <name>-ubyte.gz, then <name>-ubyte.
// The default location: load_fashion_mnist(fashion_mnist_dir(), train). (No (train) overload: a string
// literal would convert to bool before it converts to std::string.)
ImageDataset load_fashion_mnist(const std::string& dir, bool train, int64_t limit = -1);

// Fashion-MNIST's class names, index = label: "T-shirt/top", "Trouser", ..., "Ankle boot".
const std::vector<std::string>& fashion_mnist_classes();

}  // namespace reel::data
