// safetensors files: the format PyTorch and Hugging Face users exchange weights in, read and written
// with reel's own checks (https://github.com/huggingface/safetensors).
//
// Format (integers little-endian):
//   N        u64       length of the header in bytes
//   header   N bytes   a UTF-8 JSON object, padded with spaces to a multiple of 8 bytes:
//              {"__metadata__": {"key": "value", ...},                                   (optional)
//               "<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
//   data     the tensors' bytes, row-major and little-endian; offsets count from the start of this
//            section, and the tensors' ranges tile it: no gap, no overlap, nothing after the last
// Dtypes reel holds: "F32" f32, "F64" f64, "F16" f16, "BF16" bf16, "I64" i64. Other safetensors
// dtypes ("I32", "U8", "F8_E4M3", ...) are refused by name.
//
// Writing lays the data out by element size, largest first (stable, so a module's order is kept
// within one size), the order the reference writer uses: after the 8-byte-aligned header every
// tensor starts at a multiple of its element size, which readers that map the file rely on. The
// header lists the tensors in the caller's order; reading returns them in the header's order. The
// file goes to a temporary beside `path`, is fsynced and renamed over `path` (write_file_atomically),
// so a crash never leaves half a file.
//
// Reading checks the whole file before returning anything: the header length (within the file,
// at most 100 MiB), the JSON, each entry (a known dtype, a shape of non-negative integers, offsets
// [begin <= end] inside the data section with end - begin == numel * element size), no key twice,
// and that the ranges tile the data section. Any violation is a reel::Error naming the file, the
// key and the numbers.
//
// A module's file holds named_state(): parameters and buffers under PyTorch's key names
// (BatchNorm's num_batches_tracked an i64 0-dim buffer), with metadata {"format": "pt"} as
// PyTorch's own writers add. Loading is strict as load_state_dict is: missing or unexpected keys,
// shape or dtype mismatches are one error listing them all, and nothing is copied until every
// check has passed.
#pragma once
#include <map>
#include <string>

#include "nn/module.h"

namespace reel::nn {

struct SafetensorsFile {
  NamedTensors tensors;                         // in the header's order, CPU tensors
  std::map<std::string, std::string> metadata;  // "__metadata__"
};

void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata = {});
SafetensorsFile read_safetensors(const std::string& path);

void save_safetensors(const Module& module, const std::string& path);
// Values go to each of the module's tensors on its own device.
void load_safetensors(Module& module, const std::string& path);

// Either format, told apart by the file's first bytes: "REELSD01" (nn/state_dict.h) goes to
// load_state_dict, anything else to load_safetensors.
void load_weights(Module& module, const std::string& path);

}  // namespace reel::nn
