// Writes into the CPU kernels' paged KV cache layout (kv_layout.h).
#include "kv_layout.h"
#include "kv_quant.h"
#include "ops.h"

#include <cstring>
#include <vector>

namespace {

// `Pair` is two elements' worth of bytes (uint32_t for 16-bit dtypes): keys move a pair of dims
// at a time, the unit of their transposed rows.
template <typename Pair>
void write_rows(char* k_cache, char* v_cache, const KVLayout& lay, const char* key,
                const char* value, int64_t key_stride, int64_t value_stride, int64_t T,
                const int64_t* slots) {
  const int64_t element = sizeof(Pair) / 2, D = lay.head_dim, BS = lay.block_size;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t block = slots[t] / BS, offset = slots[t] % BS;
    for (int64_t h = 0; h < lay.kv_heads; ++h) {
      const char* k = key + t * key_stride + h * D * element;
      auto* krun = reinterpret_cast<Pair*>(k_cache + lay.run(block, h) * element);
      for (int64_t i = 0; i < D / 2; ++i) {
        std::memcpy(krun + i * BS + offset, k + i * sizeof(Pair), sizeof(Pair));
      }
      if (!lay.values_in_keys)
        std::memcpy(v_cache + (lay.run(block, h) + lay.value_in_run(offset)) * element,
                    value + t * value_stride + h * D * element, D * element);
    }
  }
}

// Rows converted to another cache type (bf16 from float32, or 8-bit with scales): the
// quantization happens once, here, per (token, head) row of D values.
template <typename cache_t, typename src_t>
void convert_rows(cache_t* k_cache, cache_t* v_cache, const KVLayout& lay, const src_t* key,
                  const src_t* value, int64_t key_stride, int64_t value_stride, int64_t T,
                  const int64_t* slots) {
  const int64_t D = lay.head_dim, BS = lay.block_size;
  std::vector<cache_t> row(D);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t block = slots[t] / BS, offset = slots[t] % BS;
    for (int64_t h = 0; h < lay.kv_heads; ++h) {
      cache_t* krun = k_cache + lay.run(block, h);
      const float k_scale = quantize_row(key + t * key_stride + h * D, D, row.data());
      for (int64_t d = 0; d < D; d += 2) {  // a pair of dims: the unit of the keys' rows
        std::memcpy(krun + lay.key_in_run(offset, d), row.data() + d, 2 * sizeof(cache_t));
      }
      if constexpr (kScaledCache<cache_t>)
        std::memcpy(lay.key_scales(krun) + offset, &k_scale, sizeof k_scale);
      if (lay.values_in_keys) continue;
      cache_t* vrow = v_cache + lay.run(block, h) + lay.value_in_run(offset);
      const float v_scale = quantize_row(value + t * value_stride + h * D, D, vrow);
      if constexpr (kScaledCache<cache_t>) std::memcpy(vrow + D, &v_scale, 4);
    }
  }
}

}  // namespace

const float* sink_logits(const c10::optional<at::Tensor>& sinks, int64_t heads) {
  if (!sinks.has_value()) return nullptr;
  INFLIGHT_CHECK(sinks->scalar_type() == at::kFloat && sinks->dim() == 1 &&
                  sinks->size(0) == heads && sinks->is_contiguous(),
              "sinks: float32 [", heads, "], one logit per query head, contiguous");
  return sinks->data_ptr<float>();
}

KVLayout kv_layout(const at::Tensor& k_cache, const at::Tensor& v_cache) {
  INFLIGHT_CHECK(k_cache.dim() == 5 && v_cache.dim() == 4 && k_cache.size(4) == 2,
              "caches must be keys [NB, KVH, D/2, BS, 2] and values [NB, KVH, BS, D]");
  INFLIGHT_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  k_cache.scalar_type() == v_cache.scalar_type(),
              "caches must be contiguous and share a dtype");
  const bool scaled = is_scaled_cache(k_cache.scalar_type());
  const int64_t NB = v_cache.size(0), KVH = v_cache.size(1), BS = v_cache.size(2),
                D = v_cache.size(3) - (scaled ? 4 : 0);
  INFLIGHT_CHECK(k_cache.size(0) == NB && k_cache.size(1) == KVH &&
                  k_cache.size(2) * 2 == D + (scaled ? 4 : 0) && k_cache.size(3) == BS,
              "key and value caches disagree: keys ", k_cache.sizes(), ", values ",
              v_cache.sizes());
  return {BS, KVH, D, scaled, v_cache.data_ptr() == k_cache.data_ptr()};
}

bool values_from_keys(int64_t block_size, int64_t head_dim, at::ScalarType dtype) {
#if defined(__AVX2__) && defined(__FMA__)
  return block_size % 16 == 0 && head_dim % 32 == 0 && dtype != at::kHalf;
#else
  return false;
#endif
}

void check_values_in_keys(const KVLayout& layout, at::ScalarType dtype) {
  INFLIGHT_CHECK(!layout.values_in_keys ||
                     values_from_keys(layout.block_size, layout.head_dim, dtype),
                 "values read from keys need blocks of multiples of 16 positions, heads of "
                 "multiples of 32 dims and a cache of other than float16, on a CPU with AVX2");
}

bool is_scaled_cache(at::ScalarType dtype) {
  return dtype == at::kChar || dtype == at::kFloat8_e4m3fn;
}

void write_kv(const at::Tensor& k_cache, const at::Tensor& v_cache, const KVLayout& layout,
              const at::Tensor& key, const at::Tensor& value, const int64_t* slots) {
  const int64_t T = key.size(0);
  INFLIGHT_CHECK(!layout.values_in_keys ||
                     (value.data_ptr() == key.data_ptr() && value.strides() == key.strides()),
                 "a cache that keeps its keys alone takes values that are its keys");
  if (key.scalar_type() != k_cache.scalar_type()) {
    const int64_t ks = key.stride(0), vs = value.stride(0);
    INFLIGHT_CHECK(key.scalar_type() == value.scalar_type(), "key and value must share a dtype");
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, key.scalar_type(), "write_kv", [&] {
      using src_t = scalar_t;
      const auto* k = key.data_ptr<src_t>();
      const auto* v = value.data_ptr<src_t>();
      switch (k_cache.scalar_type()) {
        case at::kBFloat16:
          convert_rows(k_cache.data_ptr<c10::BFloat16>(), v_cache.data_ptr<c10::BFloat16>(),
                       layout, k, v, ks, vs, T, slots);
          break;
        case at::kChar:
          convert_rows(k_cache.data_ptr<int8_t>(), v_cache.data_ptr<int8_t>(), layout, k, v, ks,
                       vs, T, slots);
          break;
        case at::kFloat8_e4m3fn:
          convert_rows(k_cache.data_ptr<fp8>(), v_cache.data_ptr<fp8>(), layout, k, v, ks, vs, T,
                       slots);
          break;
        default:
          INFLIGHT_CHECK(false, "no conversion from ", key.scalar_type(), " to a ",
                      k_cache.scalar_type(), " cache");
      }
    });
    return;
  }
  auto* kc = static_cast<char*>(k_cache.data_ptr());
  auto* vc = static_cast<char*>(v_cache.data_ptr());
  const auto* k = static_cast<const char*>(key.data_ptr());
  const auto* v = static_cast<const char*>(value.data_ptr());
  const int64_t element = key.element_size();
  const int64_t ks = key.stride(0) * element, vs = value.stride(0) * element;
  if (element == 2) {
    write_rows<uint32_t>(kc, vc, layout, k, v, ks, vs, T, slots);
  } else if (element == 4) {
    write_rows<uint64_t>(kc, vc, layout, k, v, ks, vs, T, slots);
  } else {
    INFLIGHT_CHECK(element == 8, "unsupported cache dtype");
    write_rows<__uint128_t>(kc, vc, layout, k, v, ks, vs, T, slots);
  }
}

void write_kv_cache(at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& key,
                    const at::Tensor& value, const at::Tensor& slot_mapping) {
  const KVLayout lay = kv_layout(k_cache, v_cache);
  const int64_t T = slot_mapping.numel();
  for (const auto* rows : {&key, &value}) {
    INFLIGHT_CHECK(rows->dim() == 3 && rows->size(0) == T && rows->size(1) == lay.kv_heads &&
                    rows->size(2) == lay.head_dim && rows->stride(2) == 1 &&
                    rows->stride(1) == lay.head_dim && rows->scalar_type() == key.scalar_type(),
                "key and value must be [T, KVH, D] with contiguous heads, of one dtype");
  }
  INFLIGHT_CHECK(slot_mapping.dim() == 1 && slot_mapping.scalar_type() == at::kLong &&
                  slot_mapping.is_contiguous(),
              "slot_mapping: one int64 slot per token");
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  const int64_t num_slots = lay.num_slots(k_cache.size(0));
  for (int64_t t = 0; t < T; ++t) {
    INFLIGHT_CHECK(slots[t] >= 0 && slots[t] < num_slots, "slot ", slots[t], " out of range");
  }
  write_kv(k_cache, v_cache, lay, key, value, slots);
}
