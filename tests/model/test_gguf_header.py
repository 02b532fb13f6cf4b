"""The GGUF header reader against gguf's own `GGUFReader`: every field's value and every tensor's
place, type, shape and data layout, on files of several families and block formats; a file that
is not GGUF or whose header is cut short is refused naming it."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType, GGUFReader
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inflight.errors import ModelLoadError
from inflight.model.gguf_header import read_gguf_header
from tests.gguf_files import k_quant_mix, write_tiny_gguf

Q = GGMLQuantizationType


def _extra_fields(writer):  # every value type the format has, arrays of numbers and bools too
    writer.add_array("test.flags", [True, False, True])
    writer.add_array("test.floats", [0.5, -2.25])
    writer.add_array("test.strings", ["a", "", "ü"])
    writer.add_int8("test.i8", -3)
    writer.add_uint16("test.u16", 65535)
    writer.add_int64("test.i64", -(2**40))
    writer.add_float64("test.f64", 1e-300)
    writer.add_bool("test.bool", False)


@pytest.mark.parametrize(("arch", "qtype"), [("llama", Q.Q4_1), ("llama_wide", None),
                                             ("gemma3", Q.F32), ("qwen3", Q.Q8_0)])  # fmt: skip
def test_the_header_reads_as_ggufs_reader_does(tmp_path, tiny_model_factory, arch, qtype):
    mix = k_quant_mix if qtype is None else None
    path = write_tiny_gguf(tiny_model_factory(arch), tmp_path / "tiny.gguf", qtype, mix=mix,
                           metadata=_extra_fields)  # fmt: skip
    reader = GGUFReader(path)
    header = read_gguf_header(path)
    want_fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert header.fields == want_fields
    assert header.fields["test.i64"] == -(2**40) and header.fields["test.flags"][1] is False
    assert [t.name for t in header.tensors] == [t.name for t in reader.tensors]
    for got, want in zip(header.tensors, reader.tensors, strict=True):
        assert got.type == int(want.tensor_type)
        assert got.shape == tuple(int(d) for d in want.shape)
        assert got.offset == want.data_offset
        assert got.data_layout() == (want.data.dtype.str, want.data.shape)
    assert len({t.type for t in header.tensors}) > 1 or qtype == Q.F32


def test_a_file_that_is_not_gguf_or_cut_short_is_refused(tmp_path, tiny_llama):
    path = write_tiny_gguf(tiny_llama, tmp_path / "tiny.gguf", Q.Q8_0)
    whole = path.read_bytes()
    not_gguf = tmp_path / "not.gguf"
    not_gguf.write_bytes(b"GGML" + whole[4:])
    with pytest.raises(ModelLoadError, match=r"not\.gguf: not a valid GGUF file \(no GGUF magic"):
        read_gguf_header(not_gguf)
    for cut in (10, 200, 3000):  # inside the counts, a key, the vocabulary
        short = tmp_path / f"short{cut}.gguf"
        short.write_bytes(whole[:cut])
        with pytest.raises(ModelLoadError, match=rf"short{cut}\.gguf: not a valid GGUF file"):
            read_gguf_header(short)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="not a valid GGUF file"):
        read_gguf_header(empty)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_damaged_header_is_refused_or_read_never_crashes(tmp_path_factory, data):
    """Bytes of a real header overwritten at random (counts near 2**64, lengths past the end,
    unknown types): a ModelLoadError or a header, in bounded time; no other exception."""
    whole = _HEADER_SAMPLE.read_bytes()[:4096]
    damaged = bytearray(whole)
    for _ in range(data.draw(st.integers(1, 8))):
        at = data.draw(st.integers(0, len(damaged) - 8))
        value = data.draw(st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1]))
        damaged[at : at + 8] = value.to_bytes(8, "little")
    path = tmp_path_factory.mktemp("damaged") / "d.gguf"
    path.write_bytes(bytes(damaged))
    with contextlib.suppress(ModelLoadError):
        read_gguf_header(path)


def _sample_header() -> Path:
    """A small real GGUF written once for the property test (its first 4 KiB: the header)."""
    import numpy as np
    from gguf import GGUFWriter

    path = Path(tempfile.mkdtemp()) / "sample.gguf"
    writer = GGUFWriter(path, "llama")
    writer.add_block_count(2)
    writer.add_token_list([f"t{i}" for i in range(200)])
    writer.add_array("test.floats", [0.5, 1.5])
    writer.add_tensor("token_embd.weight", np.zeros((8, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


_HEADER_SAMPLE = _sample_header()
