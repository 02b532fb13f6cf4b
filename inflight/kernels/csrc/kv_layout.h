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
//
// 8-bit caches (int8, or float8 e4m3) carry a float32 scale per (position, head) for keys and
// for values, inside the same runs, so that a block stays one index of dim 0 (swap, prefix
// sharing and CUDA graphs copy blocks without knowing of scales):
//
//   keys    [NB, KVH, D/2 + 2, BS, 2]   the D/2 rows above, then the BS key scales (4 bytes each)
//   values  [NB, KVH, BS, D + 4]        each position's D values, then its scale
//
// A stored element times its scale is the value written (`kv_quant.h`).
//
// A layer whose values are its keys (DeepSeek's latent attention) may keep the keys alone: its
// value cache is then a view of the key cache's memory (`values_in_keys`), nothing is written
// as values, and the kernels read each value from its key's pairs of dims (`value_tile` in
// attention_avx2.h; the AVX2 items alone, so blocks of multiples of 16 positions and heads of
// multiples of 32 dims). A value's scale is its key's.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

struct KVLayout {
  int64_t block_size, kv_heads, head_dim;
  bool scaled = false;  // an 8-bit cache: scales follow the keys and each value row
  bool values_in_keys = false;  // the value cache is a view of the keys' memory (above)

  int64_t value_row() const { return head_dim + (scaled ? 4 : 0); }
  // First element of (block, head)'s run, in either cache (one element is one byte when scaled).
  int64_t run(int64_t block, int64_t head) const {
    return (block * kv_heads + head) * block_size * value_row();
  }
  // Dim d of the key at `offset` in the block, from the start of its run.
  int64_t key_in_run(int64_t offset, int64_t d) const {
    return (d / 2) * block_size * 2 + offset * 2 + d % 2;
  }
  // The value row at `offset` in the block, from the start of its run.
  int64_t value_in_run(int64_t offset) const { return offset * value_row(); }
  int64_t num_slots(int64_t num_blocks) const { return num_blocks * block_size; }

  // Scales of a scaled cache's run (`run_start`: its first element): the keys' BS scales (for
  // vector loads), the key and the value at `offset` (1 for the other caches).
  template <typename T>
  auto* key_scales(T* run_start) const {  // const float* for a const run, float* to write
    using Scale = std::conditional_t<std::is_const_v<T>, const float, float>;
    return reinterpret_cast<Scale*>(run_start + head_dim * block_size);
  }
  template <typename T>
  float key_scale(const T* run_start, int64_t offset) const {
    if (!scaled) return 1.f;
    float s;
    std::memcpy(&s, key_scales(run_start) + offset, sizeof s);
    return s;
  }
  template <typename T>
  float value_scale(const T* run_start, int64_t offset) const {
    if (!scaled) return 1.f;
    if (values_in_keys) return key_scale(run_start, offset);
    float s;
    std::memcpy(&s, run_start + value_in_run(offset) + head_dim, sizeof s);
    return s;
  }
};

// int8 and float8 caches: scaled, as above.
bool is_scaled_cache(at::ScalarType dtype);

// The layout of a layer's two caches, after checking their shapes, dtype and contiguity (values
// in keys where the value cache starts at the key cache's first byte).
KVLayout kv_layout(const at::Tensor& k_cache, const at::Tensor& v_cache);

// The attention kernels' `sinks` argument checked: null, or the data of float32 [H] (one logit
// per query head, gpt-oss's), contiguous.
const float* sink_logits(const c10::optional<at::Tensor>& sinks, int64_t heads);

// The attention kernels' check of a layout whose values are in its keys: the shapes and dtypes
// `values_from_keys` (ops.h) names, those of the AVX2 items.
void check_values_in_keys(const KVLayout& layout, at::ScalarType dtype);

// Writes key/value [T, KVH, D] (rows may be strided) at slots[t] = block * BS + offset,
// converted to the cache's type where it differs; the keys alone where values are keys (then
// `value` must be `key` itself). The caller has checked the slots against the cache size.
void write_kv(const at::Tensor& k_cache, const at::Tensor& v_cache, const KVLayout& layout,
              const at::Tensor& key, const at::Tensor& value, const int64_t* slots);
