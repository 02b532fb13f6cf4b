#include "decoder_layers.h"
#include "ops.h"

// The pybind11 casters of tensors alone: torch/python.h would add the C++ frontend and every
// operator, twice this file's build.
#include <torch/csrc/utils/pybind.h>
// std::function arguments from Python callables (None: an empty one); each call takes the GIL
#include <pybind11/functional.h>

// Every kernel runs without the GIL: a step is milliseconds to seconds of C++, and the
// server's event loop (health checks, new requests, streaming) must run meanwhile. Arguments are
// converted before the GIL is released and results after it is taken back.
using no_gil = py::call_guard<py::gil_scoped_release>;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention", &paged_decode_attention, no_gil(),
        "decode attention over a paged KV cache");
  m.def("paged_prefill_attention", &paged_prefill_attention, no_gil(),
        "causal attention of prompt chunks over a paged KV cache, into out");
  m.def("write_kv_cache", &write_kv_cache, no_gil(), "keys and values written at their cache slots");
  m.def("values_from_keys", &values_from_keys, no_gil(),
        "whether the kernels read values out of their keys in this block size, head_dim and dtype");
  m.def("rms_norm", &rms_norm, no_gil(), "RMSNorm of each row, HF rounding");
  m.def("add_rms_norm", &add_rms_norm, no_gil(), "residual += x (in place), then RMSNorm of the residual");
  m.def("silu_and_mul", &silu_and_mul, no_gil(), "silu(gate) * up for rows [gate | up]");
  m.def("clamped_swiglu", &clamped_swiglu, no_gil(),
        "gpt-oss's (clamp(up, +-limit) + 1) * g * sigmoid(alpha g), g = min(gate, limit), for "
        "rows [gate | up]", py::arg("gate_up"), py::arg("limit"), py::arg("alpha"));
  m.def("rope_", &rope_, no_gil(), "rotary embedding (rotate-half layout) in place on the first heads");
  m.def("short_convolution", &short_convolution, no_gil(),
        "a causal depthwise convolution over the step's rows and each request's state row",
        py::arg("x"), py::arg("weight"), py::arg("state"), py::arg("taps"), py::arg("keep"),
        py::arg("read_rows"), py::arg("write_rows"), py::arg("snapshot_rows"));
  m.def("gated_delta_rule", &gated_delta_rule, no_gil(),
        "the gated delta rule over each request's rows, its state matrices read and written");
  m.def("gated_delta_net", &gated_delta_net, no_gil(),
        "a DeltaNet layer between its projections: convolution, SiLU, the gated delta rule, "
        "RMSNorm times SiLU(z)",
        py::arg("qkvz"), py::arg("ba"), py::arg("conv_weight"), py::arg("conv_state"),
        py::arg("taps"), py::arg("keep"), py::arg("read_rows"), py::arg("write_rows"),
        py::arg("snapshot_rows"), py::arg("starts"), py::arg("states"), py::arg("decay_rate"), py::arg("dt_bias"),
        py::arg("norm_weight"), py::arg("eps"), py::arg("key_heads"), py::arg("tiled"));
  m.def("bf16_linear_available", &bf16_linear_available, no_gil(),
        "whether this machine compiled bf16_linear (AVX-512 BF16)");
  m.def("pack_bf16_linear", &pack_bf16_linear, no_gil(),
        "a [N, K] bf16 weight in bf16_linear's layout (in out, where given)", py::arg("weight"),
        py::arg("out") = py::none());
  m.def("bf16_linear", &bf16_linear, no_gil(), "x @ W.T (+ bias) over a weight from pack_bf16_linear");
  m.def("gguf_linear_available", &gguf_linear_available, no_gil(),
        "whether this machine compiled gguf_linear (AVX2, FMA and F16C)");
  m.def("gguf_linear", &gguf_linear, no_gil(), "x @ W.T (+ bias) over W's GGUF Q4_0 / Q4_1 / Q8_0 blocks");
  m.def("gguf_int_linear_available", &gguf_int_linear_available, no_gil(),
        "whether this machine compiled gguf_int_linear (AVX2, FMA and F16C)");
  m.def("gguf_int_linear_columns", &gguf_int_linear_columns, no_gil(),
        "columns per group of the widest blocks' layout for x of that many bits (8, or 16 for "
        "the legacy formats with 16-bit x on AVX-512 VNNI); the 8-column layout serves all");
  m.def("gguf_int_linear_tile_rows", &gguf_int_linear_tile_rows, no_gil(),
        "the fewest rows of a batch with 8-bit x that gguf_int_linear multiplies on AMX tiles "
        "(0: never on this machine, or INFLIGHT_NO_AMX set)");
  m.def("gguf_int_linear_byte_dots", &gguf_int_linear_byte_dots, no_gil(),
        "whether gguf_int_linear sums 8-bit x's products four at a time in one instruction "
        "(AVX-512 VNNI's vpdpbusd)");
  m.def("gguf_int_linear", &gguf_int_linear, no_gil(),
        "x @ W.T (+ bias), x rounded to 8 or 16 bits per block of 32, over W's regrouped GGUF "
        "blocks",
        py::arg("x"), py::arg("packed"), py::arg("bias"), py::arg("out_features"),
        py::arg("activation_bits"));
  m.def("gguf_int_linear_heads", &gguf_int_linear_heads, no_gil(),
        "each head's rows of x [rows, heads, in] through its own packing (gguf_int_linear's, "
        "without bias) -> [heads, rows, out_features]",
        py::arg("x"), py::arg("packed"), py::arg("out_features"), py::arg("activation_bits"));
  m.def("gguf_int_experts", &gguf_int_experts, no_gil(),
        "a mixture of experts' chosen experts over their gguf_int_linear packings (SiLU-gated, "
        "or gpt-oss's clamped SwiGLU; biased where given), each output weighted and added into "
        "its token's row in expert order",
        py::arg("x"), py::arg("chosen"), py::arg("weights"), py::arg("gate_up"), py::arg("down"),
        py::arg("intermediate"), py::arg("activation_bits"),
        py::arg("gate_up_bias") = std::vector<at::Tensor>{},
        py::arg("down_bias") = std::vector<at::Tensor>{}, py::arg("swiglu_limit") = 0.0,
        py::arg("swiglu_alpha") = 0.0);
  m.def("router_logits", &router_logits, no_gil(),
        "x @ router.T in float32, each logit summed in one order whatever the batch",
        py::arg("x"), py::arg("router"));
  m.def("router_sigmoids", &router_sigmoids, no_gil(),
        "sigmoid(x @ router.T) in float32, alike for a row in any batch", py::arg("x"),
        py::arg("router"));
  m.def("route_experts", &route_experts, no_gil(),
        "a float32 router's best top_k experts for each token and their weights",
        py::arg("x"), py::arg("router"), py::arg("bias"), py::arg("top_k"), py::arg("scoring"),
        py::arg("renormalize"), py::arg("eps"), py::arg("scale"));
  m.def("gguf_routed_experts", &gguf_routed_experts, no_gil(),
        "route_experts, then gguf_int_experts in passes of at most pass_tokens tokens",
        py::arg("x"), py::arg("router"), py::arg("bias"), py::arg("top_k"), py::arg("scoring"),
        py::arg("renormalize"), py::arg("eps"), py::arg("scale"), py::arg("gate_up"),
        py::arg("down"), py::arg("intermediate"), py::arg("activation_bits"),
        py::arg("pass_tokens"), py::arg("gate_up_bias") = std::vector<at::Tensor>{},
        py::arg("down_bias") = std::vector<at::Tensor>{}, py::arg("swiglu_limit") = 0.0,
        py::arg("swiglu_alpha") = 0.0);
  m.def("gguf_int_linear_many", &gguf_int_linear_many, no_gil(),
        "several unbiased gguf_int_linear products into their outputs, the few-row ones in one "
        "parallel region",
        py::arg("xs"), py::arg("packed"), py::arg("out_features"), py::arg("ys"),
        py::arg("activation_bits"));
  m.def("gguf_dequantize_rows", &gguf_dequantize_rows, no_gil(),
        "rows of a weight's 5-bit, K-quant or MXFP4 GGUF blocks as float32 (gguf's values)",
        py::arg("blocks"), py::arg("ids"));
  m.def("gguf_dequantize_layout_rows", &gguf_dequantize_layout_rows, no_gil(),
        "the same rows read from the blocks' 8-column layout of `rows` rows",
        py::arg("layout"), py::arg("ids"), py::arg("rows"));
  m.def("gguf_regroup_blocks", &gguf_regroup_blocks, no_gil(),
        "a weight's 5-bit or K-quant GGUF blocks in gguf_int_linear's 8-column layout (in out, "
        "where given)",
        py::arg("blocks"), py::arg("out") = py::none());
  m.def("first_argmax", &first_argmax, no_gil(), "index of each row's first maximum (NaN is maximal)");
  py::class_<DecoderLayers>(m, "DecoderLayers",
                            "every decoder layer of a Llama-family model, built once from its "
                            "weights and settings; called with a step's inputs")
      .def(py::init<DecoderLayers::Tensors, DecoderLayers::OptTensors, DecoderLayers::OptTensors,
                    int64_t, DecoderLayers::OptTensors, DecoderLayers::OptTensors,
                    DecoderLayers::OptTensors, DecoderLayers::Tensors, DecoderLayers::Tensors,
                    int64_t, int64_t, int64_t, double, double, std::vector<int64_t>,
                    std::vector<int64_t>, bool, bool, bool, bool, bool, int64_t, double, double,
                    std::function<void(const at::Tensor&)>, std::vector<int64_t>,
                    DecoderLayers::Tensors, std::vector<int64_t>, DecoderLayers::Tensors,
                    DecoderLayers::OptTensors, std::vector<DecoderLayers::Tensors>,
                    std::vector<DecoderLayers::Tensors>, std::vector<DecoderLayers::Tensors>,
                    std::vector<DecoderLayers::Tensors>, int64_t, std::string, bool, double,
                    double, int64_t, int64_t, int64_t, double, double, DecoderLayers::OptTensors,
                    bool, DecoderLayers::Tensors, DecoderLayers::OptTensors, int64_t, bool,
                    std::vector<int64_t>>(),
           py::kw_only(), py::arg("weights"), py::arg("small_weights"), py::arg("decode_weights"),
           py::arg("small_rows"), py::arg("qkv_biases"), py::arg("o_biases"), py::arg("sinks"),
           py::arg("qk_norms"), py::arg("output_norms"), py::arg("num_heads"),
           py::arg("num_kv_heads"), py::arg("head_dim"), py::arg("eps"), py::arg("scale"),
           py::arg("windows"), py::arg("rotations"), py::arg("pre_norms"),
           py::arg("qk_norm_after_rope"), py::arg("gelu"), py::arg("squared_relu"),
           py::arg("packed"), py::arg("activation_bits"), py::arg("residual_scale"),
           py::arg("softcap"), py::arg("all_reduce"), py::arg("conv_index"),
           py::arg("conv_weights"), py::arg("expert_index"), py::arg("routers"),
           py::arg("router_biases"), py::arg("expert_gate_up"), py::arg("expert_down"),
           py::arg("expert_gate_up_bias"), py::arg("expert_down_bias"), py::arg("top_k"),
           py::arg("router_scoring"), py::arg("renormalize"), py::arg("router_eps"),
           py::arg("routed_scale"), py::arg("expert_intermediate"), py::arg("expert_bits"),
           py::arg("expert_pass_tokens"), py::arg("swiglu_limit"), py::arg("swiglu_alpha"),
           py::arg("shared_experts"), py::arg("output_gate"), py::arg("delta_tensors"),
           py::arg("delta_small"), py::arg("delta_key_heads"), py::arg("delta_tiled"),
           py::arg("whole_qk_norms"))
      .def("__call__", &DecoderLayers::operator(), no_gil(),
           "one step through every layer; returns [hidden, residual]", py::arg("hidden"),
           py::arg("residual"), py::arg("cos"), py::arg("sin"), py::arg("local_cos"),
           py::arg("local_sin"), py::arg("query_scale"), py::arg("k_caches"),
           py::arg("v_caches"), py::arg("slot_mapping"), py::arg("decode_rows"),
           py::arg("decode_tables"), py::arg("decode_lens"), py::arg("decode_all_rows"),
           py::arg("prefill_chunks"), py::arg("prefill_tables"), py::arg("layer_groups"),
           py::arg("group_slots"), py::arg("group_decode_tables"),
           py::arg("group_prefill_tables"), py::arg("conv_states"), py::arg("conv_rows"),
           py::arg("delta_states"), py::arg("delta_starts"));
}
