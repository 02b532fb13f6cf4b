// The paged KV cache as the CPU kernels lay it out (`CpuKernelBackend.cache_shapes` makes the
// tensors), per layer:
//
//   keys    [NB, KVH, D/2, BS, 2]   one block's keys of one head, transposed in pairs of dims:
//                                   a row holds dims (2i, 2i+1) of every position of the block
//                                   (16 bf16 positions = 64 bytes = one vdpbf16ps operand, so
//                                   scoring 16 positions needs no horizontal sums)
//   values  [NB, KVH, BS, D]        one block's values of one head, position by position
//
// Either way a (block, head) pair is one contiguous run of BS * D elements (2 KB for 16 bf16
// positions of 64 dims): attention streams whole runs instead of one head's 128-byte slices
// strided by the other heads' (the token-major layout ran at ~40% of the memory bandwidth).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>

struct KVLayout {
  int64_t block_size, kv_heads, head_dim;

  // First element of (block, head)'s run, in either cache.
  int64_t run(int64_t block, int64_t head) const {
    return (block * kv_heads + head) * block_size * head_dim;
  }
  // Dim d of the key at `offset` in the block, from the start of its run.
  int64_t key_in_run(int64_t offset, int64_t d) const {
    return (d / 2) * block_size * 2 + offset * 2 + d % 2;
  }
  // The value row at `offset` in the block, from the start of its run.
  int64_t value_in_run(int64_t offset) const { return offset * head_dim; }
  int64_t num_slots(int64_t num_blocks) const { return num_blocks * block_size; }
};

// The layout of a layer's two caches, after checking their shapes, dtype and contiguity.
KVLayout kv_layout(const at::Tensor& k_cache, const at::Tensor& v_cache);

// Writes key/value [T, KVH, D] (rows may be strided) at slots[t] = block * BS + offset. The
// caller has checked the slots against the cache size.
void write_kv(const at::Tensor& k_cache, const at::Tensor& v_cache, const KVLayout& layout,
              const at::Tensor& key, const at::Tensor& value, const int64_t* slots);
