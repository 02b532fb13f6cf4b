"""Which engines give windowed layers their own block tables: a model with windows, unless the
knob is off or a draft model shares the target's one table; the pool is then in pages of one
group's layers."""

from __future__ import annotations

import logging

from inflight import LLM, SamplingParams


def test_a_windowed_model_gets_kv_groups_and_its_pool_in_pages(tiny_model_factory):
    gemma3 = LLM(str(tiny_model_factory("gemma3")), dtype="float32", num_kv_blocks=64)
    core = gemma3.core
    # 6 layers, the sixth global: groups of one layer
    assert core.kv_layout.group_windows == (None, 24, 24, 24, 24, 24)
    assert len(core.kv_cache.slots) == 1 and len(core.kv_cache.layers) == 6
    per_layer_block = 16 * 2 * core.arch.num_kv_heads * core.arch.head_dim * 4
    assert core.kv_cache.num_bytes == 64 * per_layer_block
    llama = LLM(str(tiny_model_factory("llama")), dtype="float32", num_kv_blocks=64)
    assert llama.core.kv_layout is None and len(llama.core.kv_cache.slots) == 2


def test_the_knob_or_a_draft_model_keeps_one_table(tiny_model_factory, caplog):
    folder = str(tiny_model_factory("gemma3"))
    off = LLM(folder, dtype="float32", num_kv_blocks=64, free_window_blocks=False)
    assert off.core.kv_layout is None and off.core.kv_cache_manager.group_windows == (None,)
    with caplog.at_level(logging.INFO, logger="inflight.engine.engine_core"):
        drafted = LLM(folder, dtype="float32", num_kv_blocks=64, speculative_model=folder,
                      num_speculative_tokens=2)  # fmt: skip
    assert drafted.core.kv_layout is None
    assert "the windowed layers keep every block (a draft model's KV shares one table)" in (
        caplog.text
    )
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompt = list(range(5, 45))  # past the window of 24
    assert (off.generate([prompt], params)[0].outputs[0].token_ids
            == drafted.generate([prompt], params)[0].outputs[0].token_ids)  # fmt: skip
