"""Which engines give windowed layers their own block tables: a model with windows, unless the
knob is off, or a draft model needs a table of every block and no layer attends to every
position; the pool is then in pages of one group's layers."""

from __future__ import annotations

import logging

from inflight import LLM, SamplingParams
from inflight.core.speculation import StepCostFit


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


def test_the_knob_keeps_one_table(tiny_model_factory):
    folder = str(tiny_model_factory("gemma3"))
    off = LLM(folder, dtype="float32", num_kv_blocks=64, free_window_blocks=False)
    assert off.core.kv_layout is None and off.core.kv_cache_manager.group_windows == (None,)


def test_a_model_drafting_for_itself_on_kv_groups_has_every_draft_kept(tiny_model_factory,
                                                                     monkeypatch):  # fmt: skip
    """The drafter's KV lives in the pages of the global layers' table, which holds every
    block: a model drafting for itself then proposes its own greedy tokens, every one kept,
    while its windowed layers give their pages back (and the tokens are one table's). Every
    step drafts (the cost rule, timed, would turn a tiny drafter off)."""
    monkeypatch.setattr(StepCostFit, "break_even_rate", lambda self: 0.0)
    folder = str(tiny_model_factory("gemma3"))
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = [list(range(5, 45)), list(range(50, 60)) * 3]  # past the window of 24
    off = LLM(folder, dtype="float32", num_kv_blocks=64, free_window_blocks=False)
    want = [o.outputs[0].token_ids for o in off.generate(prompts, params, use_tqdm=False)]
    drafted = LLM(folder, dtype="float32", num_kv_blocks=6 * 64, speculative_model=folder,
                  num_speculative_tokens=3)  # fmt: skip
    core = drafted.core
    assert core.kv_layout is not None and core.kv_layout.group_windows[0] is None
    got = [o.outputs[0].token_ids for o in drafted.generate(prompts, params, use_tqdm=False)]
    assert got == want
    stats = core.scheduler.speculation.stats
    assert stats.drafted > 20 and stats.accepted == stats.drafted
    assert core.kv_cache_manager.num_window_releases > 0
    assert core.kv_cache_manager.pool.num_used_blocks == 0


def test_a_draft_model_beside_windows_only_keeps_one_table(tiny_model_factory, caplog):
    """Mistral windows every layer: no group holds every block for the drafter."""
    folder = str(tiny_model_factory("mistral"))
    with caplog.at_level(logging.INFO, logger="inflight.engine.engine_core"):
        drafted = LLM(folder, dtype="float32", num_kv_blocks=64, speculative_model=folder,
                      num_speculative_tokens=2)  # fmt: skip
    assert drafted.core.kv_layout is None
    assert "a draft model's KV needs a table of every block, and every layer is windowed" in (
        caplog.text
    )
