"""`inflight generate` end to end on the tiny model: flags become knobs, errors exit cleanly."""

from __future__ import annotations

import pytest

from inflight.cli import build_parser, main, parse_bytes


def test_generate_prints_what_the_engine_generates(tiny_llama, capsys):
    """Greedy by default: the text printed for each prompt is the offline API's for the same
    knobs, under a header naming its prompt when there are several."""
    from inflight import LLM, SamplingParams

    prompts = ["The quick", "Paged attention"]
    code = main(
        ["generate", str(tiny_llama), "--prompt", prompts[0], "--prompt", prompts[1],
         "--max-tokens", "4", "--dtype", "float32", "--num-kv-blocks", "64", "--ignore-eos"]
    )  # fmt: skip
    assert code == 0
    llm = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=64)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    want = [o.outputs[0].text for o in llm.generate(prompts, params, use_tqdm=False)]
    expected = "".join(f"### {p}\n{text}\n" for p, text in zip(prompts, want, strict=True))
    assert capsys.readouterr().out == expected


def test_bad_knob_values_exit_with_a_message(tiny_llama, caplog):
    code = main(["generate", str(tiny_llama), "--prompt", "x", "--max-num-seqs", "0"])
    assert code == 2
    assert "max_num_seqs must be >= 1" in caplog.text


def test_every_knob_is_a_flag_with_its_default_in_help():
    help_text = build_parser()._subparsers._group_actions[0].choices["generate"].format_help()
    for flag in ("--max-num-seqs", "--max-num-batched-tokens", "--prefill-chunk-size",
                 "--kv-block-size", "--kv-cache-memory-bytes", "--num-kv-blocks", "--batching",
                 "--dtype", "--max-model-len"):  # fmt: skip
        assert flag in help_text
    assert "(default: 64)" in help_text and "(default: 2048)" in help_text


def test_each_default_is_said_once_in_every_commands_help():
    """Flags shared by several commands say their default in their help; the bench and simulate
    commands' formatter must not say it again."""
    import argparse

    def parsers(parser: argparse.ArgumentParser):
        yield parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    yield from parsers(child)

    seen = 0
    for parser in parsers(build_parser()):
        for action in parser._actions:
            if action.help in (None, argparse.SUPPRESS):
                continue
            text = parser.formatter_class(parser.prog)._expand_help(action)
            assert text.count("default:") <= 1, (parser.prog, action.dest, text)
            seen += "(default:" in text
    assert seen > 100


@pytest.mark.parametrize(
    ("text", "value"),
    [("1024", 1024), ("2GiB", 2 * 2**30), ("512MiB", 512 * 2**20), ("1.5GB", 1.5e9)],
)
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


def test_one_replica_serves_without_importing_ray():
    """`--replicas 1` is the single process: building the server must not pull Ray in."""
    import subprocess
    import sys

    code = ("import sys, inflight.cli, inflight.server.api_server, inflight.routing; "
            "sys.exit(1 if 'ray' in sys.modules else 0)")  # fmt: skip
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_the_parser_imports_no_torch():
    """`inflight --help` and `inflight doctor` (a client of a server) build the whole parser:
    torch would be ~2.3 s of each."""
    import subprocess
    import sys

    code = ("import sys, inflight.cli; inflight.cli.build_parser(); "
            "sys.exit(1 if 'torch' in sys.modules else 0)")  # fmt: skip
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
