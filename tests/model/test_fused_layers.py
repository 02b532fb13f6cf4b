"""The decoder layers as one C++ call (`FusedDecoderLayers`) against the Python layer loop it
replaces: same tokens and bit-identical logprobs, with oneDNN-packed linears (float32, and
bfloat16 where the CPU computes it), plain ones, and a GGUF model's blocks for small batches,
through chunked prefills mixed with decodes and pure decode steps, for every tiny architecture
(Qwen2's QKV bias, Mistral's sliding window, Gemma 3's output norms, tanh-GELU and windowed
layers with RoPE of their own)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from gguf import GGMLQuantizationType

from inflight import LLM, SamplingParams
from inflight.kernels import load_extension
from inflight.model import loader, packed_linear
from inflight.model.arch import EXPERT_ARCHS
from inflight.model.fused_layers import FusedDecoderLayers
from inflight.model.packed_linear import can_pack
from tests.conftest import TINY_ARCHS
from tests.gguf_files import write_tiny_gguf
from tests.parity import mixed_max_tokens, random_prompts

# families with banded layers, whose blocks past a window go back to the pool: a pool that
# holds the longest prompt's global layers (Gemma 3's, one in six layers, a sixth of it;
# theirs may never preempt; the chunks still mix)
WINDOWED = ("mixtral", "phi3", "mistral", "gemma2", "gemma3", "exaone4", "olmo3", "gpt_oss")

# families whose tiny models' layers the C++ loop does not compute: experts routed in Python
# (in a float32 model over blocks some do: tested below)
UNFUSED_ARCHS = EXPERT_ARCHS


def _run(llm: LLM, prompts, max_tokens):
    params = [
        SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logprobs=2) for n in max_tokens
    ]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outputs]


@pytest.mark.parametrize(("dtype", "plain"), [("float32", False), ("bfloat16", False),
                                              ("float32", True)])  # fmt: skip
@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_fused_layers_match_the_python_loop_bit_for_bit(
    tiny_model_factory, arch, dtype, plain, monkeypatch
):
    if arch in UNFUSED_ARCHS and (dtype, plain) != ("float32", False):
        pytest.skip("its layers run in Python whatever the dtype: the float32 case shows it")
    # steps of at most 4 rows take inflight's bf16 linear kernel, larger ones oneDNN: both paths
    monkeypatch.setattr(packed_linear, "SMALL_BATCH_ROWS", 4)
    if plain:  # what a CPU without oneDNN gets: nn.Linear's weights as they are
        monkeypatch.setattr(loader, "can_pack", lambda dtype, device: False)
    llm = LLM(str(tiny_model_factory(arch)), dtype=dtype, attention_backend="cpu", device="cpu",
              prefill_chunk_size=8, max_num_batched_tokens=64,
              enable_prefix_caching=False)  # fmt: skip
    model = llm.core.loaded.model
    fused = model.fused_layers
    if arch in UNFUSED_ARCHS:  # routing to experts runs in Python
        assert fused is None and not model.fusable
        return
    assert isinstance(fused, FusedDecoderLayers)
    assert fused.packed == (not plain and can_pack(getattr(torch, dtype), torch.device("cpu")))
    kernel = fused.packed and dtype == "bfloat16" and load_extension().bf16_linear_available()
    assert fused.small_batch_rows == (4 if kernel else 0)
    assert all((w is not None) == kernel for w in fused.small_weights)
    assert llm.core.runner.sampler.argmax is load_extension().first_argmax  # the kernels' argmax
    _assert_fused_matches_the_loop(llm)


def _assert_fused_matches_the_loop(llm: LLM) -> None:
    model = llm.core.loaded.model
    prompts = random_prompts(model.cfg.vocab_size)
    max_tokens = mixed_max_tokens(len(prompts))
    got = _run(llm, prompts, max_tokens)
    model.fused_layers = None
    want = _run(llm, prompts, max_tokens)
    assert got == want


@pytest.mark.skipif(not load_extension().gguf_linear_available(), reason="no AVX2 GGUF kernel")
@pytest.mark.parametrize("activations", ["off", "int16", "int8"])
def test_fused_layers_match_the_python_loop_over_gguf_blocks(tmp_path, tiny_llama, monkeypatch,
                                                             activations):  # fmt: skip
    # steps of at most 4 rows multiply from the Q4_1 blocks, larger ones through oneDNN
    monkeypatch.setattr(packed_linear, "GGUF_SMALL_BATCH_ROWS", 4)
    monkeypatch.setattr(packed_linear, "GGUF_INT_SMALL_BATCH_ROWS", {8: 4, 16: 4})
    path = write_tiny_gguf(tiny_llama, tmp_path / "tiny.gguf", GGMLQuantizationType.Q4_1)
    llm = LLM(str(path), dtype="float32", attention_backend="cpu", device="cpu",
              prefill_chunk_size=8, max_num_batched_tokens=64,
              enable_prefix_caching=False, quantized_activations=activations)  # fmt: skip
    fused = llm.core.loaded.model.fused_layers
    assert fused.small_batch_rows == 4
    bits = {"off": 0, "int16": 16, "int8": 8}[activations]
    assert fused.activation_bits == bits
    assert all(w is not None and w.dtype == torch.uint8 for w in fused.small_weights)
    assert not fused.decode_weights  # a float32 engine's blocks serve every row
    _assert_fused_matches_the_loop(llm)


@pytest.mark.skipif(not (packed_linear.decode_rows_from_blocks(torch.bfloat16, 16)
                         and load_extension().bf16_linear_available()),
                    reason="no 16-column integer layout (AVX-512 VNNI) or bf16 kernel")  # fmt: skip
def test_fused_layers_match_the_python_loop_with_decode_rows_over_gguf_blocks(
    tmp_path, tiny_llama, monkeypatch
):
    # a bf16 model's decode rows multiply from the blocks, its prompt rows in bf16: steps mixing
    # both, all decodes, and prompt rows past the bf16 kernel's limit (oneDNN)
    monkeypatch.setattr(packed_linear, "SMALL_BATCH_ROWS", 4)
    path = write_tiny_gguf(tiny_llama, tmp_path / "tiny.gguf", GGMLQuantizationType.Q4_1)
    llm = LLM(str(path), dtype="bfloat16", attention_backend="cpu", device="cpu",
              prefill_chunk_size=8, max_num_batched_tokens=64, enable_prefix_caching=False,
              quantized_activations="int16")  # fmt: skip
    fused = llm.core.loaded.model.fused_layers
    assert fused.small_batch_rows == 4
    assert all(w is not None and w.dtype == torch.bfloat16 for w in fused.small_weights)
    assert fused.decode_weights
    assert all(w is not None and w.dtype == torch.uint8 for w in fused.decode_weights)
    _assert_fused_matches_the_loop(llm)


@pytest.mark.skipif(not can_pack(torch.bfloat16, torch.device("cpu")), reason="no oneDNN bf16")
def test_mixed_weight_kinds_are_refused(tiny_llama):
    """One call packs or not for all layers: a model half packed cannot be fused."""
    llm = LLM(str(tiny_llama), dtype="bfloat16", attention_backend="cpu", device="cpu")
    layers = llm.core.loaded.model.layers
    layers[0].qkv_proj = torch.nn.Linear(layers[0].qkv_proj.in_features, 4, bias=False)
    with pytest.raises(ValueError, match="all packed or all plain"):
        FusedDecoderLayers(layers)


def test_bad_inputs_are_refused_before_any_write(tiny_llama):
    """The C++ loop checks what it indexes: the model's weight lists once, when it is built; a
    step's slots, caches and states at each call, before anything is written."""
    llm = LLM(str(tiny_llama), dtype="float32", attention_backend="cpu", device="cpu")
    fused = llm.core.loaded.model.fused_layers
    caches = llm.core.runner.kv_cache.layers
    num_heads, _, head_dim = fused.shape
    L = len(caches)
    hidden = torch.randn(2, num_heads * head_dim)
    cos = sin = torch.ones(2, head_dim // 2)
    build = load_extension().DecoderLayers

    def refused(says, **model):
        with pytest.raises(RuntimeError, match=says):
            build(**{**fused.model_args(), **model})

    def run(layers=None, slots=(0, 1), k_caches=None, local=(None, None), groups=(),
            group_slots=(), query_scale=None, conv=((), ()), delta=()):  # fmt: skip
        layers = fused.run if layers is None else layers
        return layers(
            hidden, residual=None, cos=cos, sin=sin, local_cos=local[0], local_sin=local[1],
            query_scale=query_scale,
            k_caches=[k for k, _ in caches] if k_caches is None else k_caches,
            v_caches=[v for _, v in caches], slot_mapping=torch.tensor(slots), decode_rows=None,
            decode_tables=None, decode_lens=None, decode_all_rows=False, prefill_chunks=None,
            prefill_tables=None, layer_groups=list(groups),
            group_slots=[torch.tensor(s) for s in group_slots], group_decode_tables=[],
            group_prefill_tables=[], conv_states=list(conv[0]), conv_rows=list(conv[1]),
            delta_states=list(delta), delta_starts=[0, 2],
        )  # fmt: skip

    assert run()[0].shape == hidden.shape  # (the arguments below differ from these alone)
    refused("six weights", weights=fused.weights[:-1])
    refused("four optional small-batch packings", small_weights=fused.small_weights[:-1])
    refused("optional qkv and o biases, optional sinks", o_biases=fused.o_biases[:-1])
    refused("optional qkv and o biases, optional sinks", sinks=[None])
    refused("sinks", sinks=[torch.zeros(num_heads + 1)] * L)  # gpt-oss's: a float32 logit a head
    refused("a window and a rotation per layer", rotations=[0])
    refused("or four optional ones per layer", decode_weights=[None])
    refused("a query and a key norm weight per layer", qk_norms=[torch.ones(head_dim)])
    refused("a q/k norm weight spans a head or all heads",
            qk_norms=[torch.ones(head_dim + 1)] * (2 * L))  # fmt: skip
    refused("one after attention and one after the MLP",
            output_norms=[torch.ones(num_heads * head_dim)])  # fmt: skip
    refused("a layer's rotation is none", rotations=[2] * L)
    # norms over all heads of a split model: the whole model's heads, a rank among the ranks,
    # an all-reduce (here none: one rank)
    for whole in ([num_heads, 1, 0], [num_heads, 1, 1, 1], [num_heads, 1, 0, 2],
                  [-1, 1, 0, 1], [num_heads, 0, 0, 1], [num_heads, 1, 0, 1],
                  [num_heads, 1, 2**62, 1]):  # fmt: skip
        refused("whole_qk_norms", whole_qk_norms=whole)
    refused("softmax, sigmoid or softmax_of_chosen", router_scoring="tanh")
    for limit in (-1.0, float("nan"), float("inf")):
        refused("swiglu_limit", swiglu_limit=limit)
    with pytest.raises(TypeError):  # (not a string: pybind's own refusal)
        build(**{**fused.model_args(), "router_scoring": None})
    # LFM2's short convolutions: an index per layer into kernels that match
    kernel = torch.ones(num_heads * head_dim, 3)
    refused("one convolution index per layer", conv_index=[0], conv_weights=[kernel])
    refused("convolution 1 out of range", conv_index=[1] + [-1] * (L - 1), conv_weights=[kernel])
    refused(r"a convolution's kernel \[C, K\]", conv_index=[0] + [-1] * (L - 1),
            conv_weights=[torch.ones(num_heads * head_dim, 1)])  # fmt: skip
    # DeltaNet layers in the convolutions' places: four tensors and two optional weights each
    convs = {"conv_index": [0] + [-1] * (L - 1), "conv_weights": [kernel]}
    tensors = [torch.zeros(2, num_heads * head_dim)] * 4
    for bad in ({"delta_tensors": tensors[:3], "delta_small": [None] * 2},
                {"delta_tensors": tensors, "delta_small": [None]}):  # fmt: skip
        refused("each convolution layer's four tensors", **convs, **bad)
    # experts in place of a layer's MLP: an index per layer into routers and packings that match
    router = torch.zeros(4, num_heads * head_dim)
    sparse = {"routers": [router], "router_biases": [None], "expert_gate_up": [[]],
              "expert_down": [[]], "expert_gate_up_bias": [[]],
              "expert_down_bias": [[]]}  # fmt: skip
    refused("one expert index per layer", expert_index=[0], **sparse)
    for name in ("router_biases", "expert_gate_up_bias"):  # (a list short)
        refused("the experts' packings and their biases per sparse layer",
                expert_index=[0] + [-1] * (L - 1), **{**sparse, name: []})  # fmt: skip
    refused("sparse layer 1 out of range", expert_index=[1] + [-1] * (L - 1), **sparse)
    # (0 of its 4 experts)
    refused(r"a float32 router \[E, hidden\]", expert_index=[0] + [-1] * (L - 1), **sparse)
    # a sparse layer's shared expert: nine optional tensors, whole
    whole_experts = {**sparse, "expert_index": [0] + [-1] * (L - 1),
                     "expert_gate_up": [[router] * 4], "expert_down": [[router] * 4]}  # fmt: skip
    w = torch.zeros(8, num_heads * head_dim)
    whole = "and down, and a gate only beside them"
    for bad, says in (
        ([None] * 8, "nine optional tensors"),
        ([None, w] + [None] * 7, "come with its weight"),
        ([w] + [None] * 8, whole),
        ([None] * 6 + [w] + [None] * 2, whole),
    ):
        refused(says, **whole_experts, shared_experts=bad)

    # a step's inputs, checked at each call before anything is written
    with pytest.raises(RuntimeError, match="two caches per layer"):
        run(k_caches=[k for k, _ in caches][:-1])
    with pytest.raises(RuntimeError, match="RoPE tables come as a pair"):
        run(local=(cos, None))
    local = build(**{**fused.model_args(), "rotations": [1] * L})
    with pytest.raises(RuntimeError, match="the windowed layers' own RoPE tables"):
        run(local)  # (its tables not given)
    for query_scale in (torch.ones(2), torch.ones(3, 1), torch.ones(2, 1, dtype=torch.float64)):
        with pytest.raises(RuntimeError, match=r"query_scale: \[T, 1\]"):
            run(query_scale=query_scale)
    values = caches[0][1]  # [NB, KVH, BS, D]
    num_slots = values.shape[0] * values.shape[2]
    values[0, :, 0] = 7.0
    with pytest.raises(RuntimeError, match="out of range"):
        run(slots=(0, num_slots))
    assert bool((values[0, :, 0] == 7.0).all())  # slot 0 was not written
    with pytest.raises(RuntimeError, match="one int64 slot per token"):
        run(slots=(0,))
    with pytest.raises(RuntimeError, match="one KV group per layer"):
        run(groups=[0])
    with pytest.raises(RuntimeError, match="KV group 2 out of range"):
        run(groups=[0, 2], group_slots=[(0, 1)])
    with pytest.raises(RuntimeError, match="out of range"):  # a later group's slots too
        run(groups=[0, 1], group_slots=[(0, num_slots)])
    assert bool((values[0, :, 0] == 7.0).all())
    with pytest.raises(RuntimeError, match="caches must be contiguous"):
        run(k_caches=[k.to(torch.bfloat16) for k, _ in caches])
    # a convolution layer's state beside its kernel, and the step's five row indices
    conv_layers = build(**{**fused.model_args(), **convs})
    state = torch.zeros(4, 2, num_heads * head_dim)
    rows = [torch.zeros(3, 2, dtype=torch.long)] + [torch.zeros(2, dtype=torch.long)] * 3
    rows.append(torch.zeros(0, dtype=torch.long))  # (no snapshots)
    with pytest.raises(RuntimeError, match="a state per convolution layer"):
        run(conv_layers, conv=([], rows))
    with pytest.raises(RuntimeError, match="the step's five row indices"):
        run(conv_layers, conv=([state], rows[:4]))
    with pytest.raises(RuntimeError, match=r"state \[rows, K - 1, C\]"):
        run(conv_layers, conv=([torch.zeros(4, 3, num_heads * head_dim)], rows))
    delta_layers = build(**{**fused.model_args(), **convs, "delta_tensors": tensors,
                            "delta_small": [None] * 2})  # fmt: skip
    with pytest.raises(RuntimeError, match="state matrices for each DeltaNet layer"):
        run(delta_layers, conv=([state], rows))
    assert bool((values[0, :, 0] == 7.0).all())


@pytest.fixture(scope="module")
def smol_shaped(tmp_path_factory, tokenizer_dir):
    """Two layers of SmolLM2-135M's widths (576, a 1,536-wide MLP), random weights: wide enough
    that kernels which sum in other orders give other bits (the tiny models' 64 are not)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("smol-shaped")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=2, num_attention_heads=9, num_key_value_heads=3,
                         max_position_embeddings=512, rms_norm_eps=1e-5, bos_token_id=1,
                         eos_token_id=2, pad_token_id=0)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.mark.parametrize(("dtype", "source"), [("bfloat16", "hf"), ("bfloat16", "q4_1"),
                                               ("float32", "hf")])  # fmt: skip
def test_a_token_rounds_alike_in_any_batch(tmp_path, smol_shaped, dtype, source):
    """An engine's log-probabilities, bit for bit, alone and in company: all at once, and in a
    pool that preempts and recomputes, prompts chunked beside decodes (one-token prompts, whose
    lone row oneDNN sums another way than a batch's, and prompts past 64 rows). bf16 weights
    take every row through inflight's bf16 kernel, a Q4_1 file's decode rows go through its
    blocks where AVX-512 VNNI has their layout, and float32 weights without blocks go through
    oneDNN, a lone row as two."""
    bf16 = dtype == "bfloat16"
    if bf16 and not (load_extension().bf16_linear_available()
                     and can_pack(torch.bfloat16, torch.device("cpu"))):  # fmt: skip
        pytest.skip("no AVX-512 BF16: no bf16 kernel of inflight's")
    path = smol_shaped
    if source == "q4_1":
        path = write_tiny_gguf(smol_shaped, tmp_path / "smol.gguf", GGMLQuantizationType.Q4_1)
    _assert_alike_in_any_batch(path, {"dtype": dtype, "attention_backend": "cpu", "device": "cpu"})


def _assert_alike_in_any_batch(path, knobs, check=None, kv_blocks=15, preempts=True) -> None:
    """The engine's tokens and log-probabilities, bit for bit, alone and in company: all at
    once, and in a pool of `kv_blocks` that preempts and recomputes (`preempts`: asserted),
    prompts chunked beside decodes. `check`: called with each engine."""
    prompts = random_prompts(400, lengths=[1, 3, 90, 17, 130, 1, 40, 70])
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0)

    def run(llm: LLM) -> list[tuple[list[int], list[float]]]:
        if check is not None:
            check(llm)
        outs = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
        return [(o.token_ids, [lp.logprob for lp in o.logprobs]) for o in outs]

    want = run(LLM(str(path), **knobs, max_num_seqs=1))
    assert run(LLM(str(path), **knobs)) == want
    llm = LLM(str(path), **knobs, num_kv_blocks=kv_blocks, max_num_batched_tokens=96)
    assert run(llm) == want
    assert llm.core.scheduler.num_preemptions > 0 or not preempts


@pytest.mark.skipif(not load_extension().gguf_linear_available(), reason="no AVX2 GGUF kernel")
def test_a_token_chooses_its_experts_alike_in_any_batch(tmp_path, tokenizer_dir):
    """A Qwen3-MoE of SmolLM2's width (16 experts, 4 a token) from a Q8_0 file, in float32 over
    its blocks: its softmax router is the C++ one, which scores each token's row alone, so a
    token's experts and log-probabilities are the same bits alone, all at once and recomputed
    after a preemption, prompts chunked beside decodes."""
    from transformers import AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

    folder = tmp_path / "qwen3-moe"
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(folder)
    torch.manual_seed(0)
    config = Qwen3MoeConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                            moe_intermediate_size=256, num_experts=16, num_experts_per_tok=4,
                            norm_topk_prob=True, num_hidden_layers=2, num_attention_heads=9,
                            num_key_value_heads=3, head_dim=64, max_position_embeddings=512,
                            bos_token_id=1, eos_token_id=2, pad_token_id=0)  # fmt: skip
    Qwen3MoeForCausalLM(config).save_pretrained(folder)
    path = write_tiny_gguf(folder, tmp_path / "qwen3-moe.gguf", GGMLQuantizationType.Q8_0)

    def fused(llm: LLM) -> None:  # (the C++ router's path)
        assert isinstance(llm.core.loaded.model.fused_layers, FusedDecoderLayers)

    _assert_alike_in_any_batch(
        path, {"dtype": "float32", "attention_backend": "cpu", "device": "cpu"}, fused
    )


@pytest.mark.skipif(not load_extension().gguf_linear_available(), reason="no AVX2 GGUF kernel")
@pytest.mark.parametrize("arch", ["qwen2_moe", "qwen3_5_moe", "qwen3_next", "glm4_moe",
                                  "deepseek_v3"])  # fmt: skip
def test_a_gated_shared_expert_and_a_grouped_router_are_alike_in_any_batch(
    tmp_path, tiny_model_factory, arch
):
    """From a Q8_0 file in float32: a shared expert's sigmoid gate (Qwen2-MoE's, Qwen3.5-MoE's,
    Qwen3-Next's; `router_sigmoids`: a one-output linear and ATen's sigmoid of a column both
    round a row by its batch) and a router with expert groups (the tiny GLM-4.5's and
    DeepSeek-V3's, routed in Python: `router_logits`, and its sigmoid scores
    `router_sigmoids`) give a token the same bits alone, together and chunked beside others,
    in either layer loop."""
    path = write_tiny_gguf(tiny_model_factory(arch), tmp_path / f"{arch}.gguf",
                           GGMLQuantizationType.Q8_0)  # fmt: skip
    knobs = {"dtype": "float32", "attention_backend": "cpu", "device": "cpu"}
    _assert_alike_in_any_batch(path, knobs)


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_every_family_gives_a_token_alike_in_any_batch(tiny_model_factory, arch):
    """Every tiny family from its HF folder, float32 on the C++ kernels: a token's bits the
    same alone, all at once, and chunked beside others in a pool that preempts (what found a
    banded layer's chunking, the shared experts' gates, the Python routers' sums and sigmoids
    and DeepSeek's small products depending on their batch)."""
    knobs = {"dtype": "float32", "attention_backend": "cpu", "device": "cpu"}
    windowed = arch in WINDOWED
    _assert_alike_in_any_batch(
        tiny_model_factory(arch),
        knobs,
        kv_blocks=(80 if arch == "gemma3" else 40) if windowed else 15,
        preempts=not windowed,
    )


@pytest.mark.parametrize("arch", ["llama", "gemma3", "granitemoe", "gpt_oss", "lfm2_moe",
                                  "qwen3_5_moe", "qwen3_next", "deepseek_v3"])  # fmt: skip
def test_a_family_at_odd_widths_gives_a_token_alike_in_any_batch(tiny_model_factory, arch):
    """The same at widths no multiple of 32 (hidden 80, MLP 136, experts 24), where an ATen
    sigmoid over a whole [T, 24] tensor made gpt-oss's experts round by the step's size:
    a family of each kind of layer and router."""
    windowed = arch in WINDOWED
    _assert_alike_in_any_batch(
        tiny_model_factory(arch, odd_widths=True),
        {"dtype": "float32", "attention_backend": "cpu", "device": "cpu"},
        kv_blocks=(80 if arch == "gemma3" else 40) if windowed else 15,
        preempts=not windowed,
    )


@pytest.mark.skipif(not load_extension().gguf_linear_available(), reason="no AVX2 GGUF kernel")
def test_a_gpt_oss_token_chooses_its_experts_alike_in_any_batch(tmp_path, tokenizer_dir):
    """gpt-oss of SmolLM2's width (16 biased experts, 4 a token, sinks, a banded and a global
    layer) from a Q8_0 file, in float32 over its blocks: its biased gate is the C++ router
    (the chosen logits softmaxed), its layers the fused loop's, so a token's experts and
    log-probabilities are the same bits alone, all at once and recomputed after a preemption."""
    from transformers import AutoTokenizer, GptOssConfig, GptOssForCausalLM

    folder = tmp_path / "gpt-oss"
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(folder)
    torch.manual_seed(0)
    config = GptOssConfig(vocab_size=49152, hidden_size=576, intermediate_size=256,
                          num_local_experts=16, num_experts_per_tok=4, num_hidden_layers=2,
                          num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                          sliding_window=32, layer_types=["sliding_attention", "full_attention"],
                          max_position_embeddings=512, attention_bias=True, bos_token_id=1,
                          eos_token_id=2, pad_token_id=0)  # fmt: skip
    model = GptOssForCausalLM(config)
    with torch.no_grad():  # sinks and biases start at 0: make them matter
        for name, param in model.named_parameters():
            if name.endswith(("sinks", "bias")):
                param.uniform_(-1.0, 1.0)
    model.save_pretrained(folder)
    path = write_tiny_gguf(folder, tmp_path / "gpt-oss.gguf", GGMLQuantizationType.Q8_0)

    def fused(llm: LLM) -> None:  # (the C++ router's path)
        assert isinstance(llm.core.loaded.model.fused_layers, FusedDecoderLayers)
        assert llm.core.loaded.model.layers[0].scoring == "softmax_of_chosen"

    # (its banded and global layers hold a pool each: 15 blocks of 16 for the global one)
    knobs = {"dtype": "float32", "attention_backend": "cpu", "device": "cpu"}
    _assert_alike_in_any_batch(path, knobs, fused, kv_blocks=30)


@pytest.mark.skipif(not load_extension().gguf_linear_available(), reason="no AVX2 GGUF kernel")
@pytest.mark.parametrize("arch", ["lfm2_moe", "minimax_m2", "qwen3_moe", "mixtral", "olmoe",
                                  "granitemoe", "qwen2_moe", "hunyuan_moe", "qwen3_5_moe",
                                  "qwen3_next", "ernie4_5_moe", "gpt_oss"])  # fmt: skip
def test_fused_layers_route_experts_as_the_python_loop(tmp_path, tiny_model_factory, arch):
    """A model whose sparse layers route through a float32 router (sigmoid plus a learned bias;
    or a softmax `gate`, float32 in a float32 model; gpt-oss's biased gate, softmaxed over the
    chosen) and whose experts multiply from their blocks runs in the C++ loop, experts included
    (and a shared expert beside them, under its gate where it has one; gpt-oss's biases, clamped
    SwiGLU, attention sinks and output bias), with the same bits as the Python loop: through
    chunked prefills beside decodes."""
    path = write_tiny_gguf(tiny_model_factory(arch), tmp_path / f"{arch}.gguf",
                           GGMLQuantizationType.Q8_0)  # fmt: skip
    llm = LLM(str(path), dtype="float32", attention_backend="cpu", device="cpu",
              prefill_chunk_size=8, max_num_batched_tokens=64, enable_prefix_caching=False,
              quantized_activations="int8")  # fmt: skip
    model = llm.core.loaded.model
    assert model.fusable and isinstance(model.fused_layers, FusedDecoderLayers)
    sparse = [i for i, layer in enumerate(model.layers) if layer.sparse]
    assert [i for i, e in enumerate(model.fused_layers.expert_index) if e >= 0] == sparse
    _assert_fused_matches_the_loop(llm)


@pytest.mark.skipif(not load_extension().gguf_linear_available(), reason="no AVX2 GGUF kernel")
def test_fused_layers_route_glm_experts_without_groups(tmp_path, tiny_model_factory):
    """GLM-4.5's published routers have one expert group (the tiny model has two, which keep the
    Python loop): its sigmoid router with a score bias, its shared expert and its dense first
    layer then run in the C++ loop, bit for bit as in the Python one."""
    folder = tmp_path / "glm4-moe"
    shutil.copytree(tiny_model_factory("glm4_moe"), folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "n_group": 1, "topk_group": 1}))
    path = write_tiny_gguf(folder, tmp_path / "glm4-moe.gguf", GGMLQuantizationType.Q8_0)
    llm = LLM(str(path), dtype="float32", attention_backend="cpu", device="cpu",
              prefill_chunk_size=8, max_num_batched_tokens=64, enable_prefix_caching=False,
              quantized_activations="int8")  # fmt: skip
    assert llm.core.arch.expert_groups == 1 and llm.core.arch.dense_layers == (0,)
    assert isinstance(llm.core.loaded.model.fused_layers, FusedDecoderLayers)
    _assert_fused_matches_the_loop(llm)


@pytest.mark.skipif(not load_extension().gguf_linear_available(), reason="no AVX2 GGUF kernel")
def test_fused_layers_take_a_delta_net_whose_b_and_a_are_floats(tmp_path, tiny_model_factory):
    """A Qwen3.5 file whose DeltaNet layers keep `ssm_beta` and `ssm_alpha` in F32 beside
    Q8_0 blocks: [b | a] is then a float linear (oneDNN's) among block ones, and the C++ loop
    multiplies each as the Python loop does, bit for bit."""

    def mix(name: str) -> GGMLQuantizationType:
        floats = name.endswith(("ssm_beta.weight", "ssm_alpha.weight"))
        return GGMLQuantizationType.F32 if floats else GGMLQuantizationType.Q8_0

    path = write_tiny_gguf(tiny_model_factory("qwen3_5"), tmp_path / "qwen3_5.gguf", None, mix)
    llm = LLM(str(path), dtype="float32", attention_backend="cpu", device="cpu",
              prefill_chunk_size=8, max_num_batched_tokens=64, enable_prefix_caching=False,
              quantized_activations="int8")  # fmt: skip
    model = llm.core.loaded.model
    delta = next(layer for layer in model.layers if layer.is_conv)
    assert delta.ba_proj.small_weight is None and delta.qkvz_proj.blocks_only
    assert isinstance(model.fused_layers, FusedDecoderLayers)
    _assert_fused_matches_the_loop(llm)
