"""Helpers for token-for-token parity against Hugging Face transformers (greedy, float32)."""

from __future__ import annotations

import random

import torch

PROMPT_LENGTHS = (1, 3, 7, 12, 17, 25, 31, 40, 48, 55, 63, 70, 81, 90, 100, 120)


def random_prompts(vocab_size: int, lengths=PROMPT_LENGTHS, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab_size) for _ in range(n)] for n in lengths]


def mixed_max_tokens(n: int, seed: int = 1) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(8, 24) for _ in range(n)]


@torch.inference_mode()
def hf_greedy(model, prompts: list[list[int]], max_new_tokens: list[int]) -> list[list[int]]:
    """One prompt at a time, so no padding can disturb the reference; never stops at EOS."""
    model.generation_config.eos_token_id = None
    outputs = []
    for prompt, n in zip(prompts, max_new_tokens, strict=True):
        ids = torch.tensor([prompt])
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=n,
            pad_token_id=0,
        )
        outputs.append(out[0, len(prompt) :].tolist())
    return outputs


def greedy_reference(folder) -> tuple[list[list[int]], list[int], list[list[int]]]:
    """16 random prompts, their output lengths, and transformers' greedy tokens for them from
    the tiny model in `folder` (float32)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompts = random_prompts(model.config.vocab_size)
    max_tokens = mixed_max_tokens(len(prompts))
    return prompts, max_tokens, hf_greedy(model, prompts, max_tokens)


def greedy_tokens(llm, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
    """The engine's greedy tokens for each prompt (never stopping at EOS), all at once."""
    from inflight import SamplingParams

    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in max_tokens]
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def assert_state_slots_free(llm) -> None:
    """Every request's convolution (and DeltaNet) state slot is back once all have ended, no
    state is left stashed for a swapped request, and the swap space is empty."""
    llm.core.step()  # (an empty step hands the runner the last requests' finished ids)
    state = llm.core.runner.conv_state
    assert state.num_free_slots == state.num_slots == llm.core.config.scheduler.max_num_seqs
    assert state.num_stashed == 0
    swap_space = llm.core.kv_cache_manager.cpu_pool
    assert swap_space is None or swap_space.num_used_blocks == 0


def assert_gguf_generates_as_its_weights(llm, folder, qtype, split_latent=None) -> None:
    """`llm` (an engine over the GGUF file written from `folder` in `qtype`) gives the greedy
    tokens of transformers' model of `folder` with the file's weights: every matrix through
    `qtype`'s blocks and back, as `write_tiny_gguf` rounds it (blocks run along rows, so a
    reordering of Q/K rows does not change them). For families whose GGUF transformers does not
    read. `split_latent` (a DeepSeek's (heads, qk_nope) where the file splits `kv_b_proj` as
    llama.cpp does): its W_UK is rounded along the rows of its transpose, as the file holds it."""
    from gguf import GGMLQuantizationType, dequantize
    from transformers import AutoModelForCausalLM

    from tests.gguf_files import quantize_any

    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    if qtype != GGMLQuantizationType.F32:
        with torch.no_grad():
            for name, param in reference.named_parameters():
                # (experts' stacks are matrices too; routers, their score biases, a shared
                # expert's gate of one row and convolution kernels stay float32 in the
                # file, as llama.cpp's quantizer leaves them)
                router = name.endswith(("mlp.gate.weight", "mlp.gate.wg.weight",
                                        "router.layer.weight",
                                        "shared_expert_gate.weight",
                                        "e_score_correction_bias",
                                        "feed_forward.gate.weight",  # (LFM2-MoE's)
                                        "conv.conv.weight",
                                        "linear_attn.conv1d.weight"))  # fmt: skip
                if name.endswith("kv_b_proj.weight") and split_latent is not None:
                    param.copy_(_rounded_as_split(param, split_latent, qtype))
                elif param.ndim in (2, 3) and not router:
                    blocks = quantize_any(param.numpy(), qtype)
                    param.copy_(torch.from_numpy(dequantize(blocks, qtype)).view(param.shape))
    assert_greedy_as(llm, reference, llm.core.arch.vocab_size)


def assert_greedy_as(llm, reference, vocab: int, lengths=(2, 9, 30, 64), max_tokens=12) -> None:
    """`llm` gives the greedy tokens of the transformers model `reference` on random prompts
    of `lengths` (ids below `vocab`)."""
    from inflight import SamplingParams

    prompts = random_prompts(vocab, lengths=lengths)
    expected = hf_greedy(reference, prompts, [max_tokens] * len(prompts))
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == expected


def _rounded_as_split(kv_b: torch.Tensor, split_latent: tuple[int, int], qtype) -> torch.Tensor:
    """A DeepSeek's `kv_b_proj` [H * (nope + v), latent] with W_UK rounded as `attn_k_b` holds
    it (each head's transpose, [latent, nope], in blocks along nope) and W_UV as `attn_v_b`."""
    from gguf import dequantize

    from tests.gguf_files import quantize_any

    heads, nope = split_latent
    per_head = kv_b.view(heads, -1, kv_b.shape[-1])

    def rounded(t: torch.Tensor) -> torch.Tensor:
        blocks = quantize_any(t.contiguous().numpy(), qtype)
        return torch.from_numpy(dequantize(blocks, qtype)).view(t.shape)

    k = rounded(per_head[:, :nope].transpose(1, 2)).transpose(1, 2)
    v = rounded(per_head[:, nope:])
    return torch.cat([k, v], dim=1).reshape(kv_b.shape)


def greedy_outputs(llm, prompts: list[list[int]], n: int) -> list[tuple]:
    """Each prompt's n greedy tokens and their log-probabilities."""
    from inflight import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logprobs=0)
    outs = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
    return [(o.token_ids, [lp.logprob for lp in o.logprobs]) for o in outs]


def assert_same_outputs(got: list[tuple], want: list[tuple]) -> None:
    """`greedy_outputs` of two runs that differ in batching, chunking, preemption or
    the cache: the same tokens and log-probabilities, bit for bit on a CPU (its kernels sum a
    row alike in any batch), to float32 rounding on a GPU (cuBLAS and PyTorch's ops pick their
    kernels by shape, so a row's sums follow its batch there)."""
    if not torch.cuda.is_available():
        assert got == want
        return
    assert [g[0] for g in got] == [w[0] for w in want]
    for (_, g), (_, w) in zip(got, want, strict=True):
        torch.testing.assert_close(torch.tensor(g), torch.tensor(w), rtol=0, atol=1e-5)
