// state_dict files: a module's parameters and buffers saved to and loaded from one binary file.
//
// Format (all integers little-endian; the order is Module::named_state()'s):
//   magic    8 bytes   "REELSD01"
//   count    u64       number of entries
//   entry    name_len u32, name (UTF-8, name_len bytes), dtype u8 (0 f32, 1 f64, 2 f16, 3 bf16, 4 i64),
//            ndim u32, shape i64 x ndim, nbytes u64 (= numel * element size), data (row-major,
//            little-endian, nbytes bytes)
//   checksum u64       FNV-1a 64 of every byte before it
// Saving writes `path + ".tmp"` and renames it over `path`, so a crash never leaves half a file at
// `path`. Loading reads the whole file, checks the magic, the structure (truncation), the checksum,
// then every key, dtype and shape against the module, and only then copies any value: a bad file
// throws reel::Error (naming the file and the key/shape) and leaves the module untouched.
// Loading is strict: missing keys, unexpected keys and dtype mismatches are errors (cast the module
// with to(dtype) to match the file first).
// For weights exchanged with PyTorch and Hugging Face, nn/safetensors.h reads and writes safetensors
// files under the same key names; load_weights there takes either format. REELSD01 stays readable
// and writable here.
#pragma once
#include <string>

#include "nn/module.h"

namespace reel::nn {

void save_state_dict(const Module& module, const std::string& path);
void load_state_dict(Module& module, const std::string& path);

// FNV-1a 64 of n bytes (offset basis 0xcbf29ce484222325, prime 0x100000001b3).
uint64_t fnv1a64(const void* data, size_t n);

}  // namespace reel::nn
