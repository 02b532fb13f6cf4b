"""The kernels' precompiled header: built once with the files' flags, rebuilt when it goes stale,
and skipped, never fatal, where the compiler cannot build it. The built library is imported
directly while its sources, flags and file are the ones recorded, and through torch otherwise."""

from __future__ import annotations

import stat
from pathlib import Path

from inflight import kernels

CSRC = Path(kernels.__file__).parent / "csrc"


def fake_compiler(tmp_path: Path, body: str) -> Path:
    """A compiler that records its arguments, then runs `body` (its last argument is -o's)."""
    script = tmp_path / "cxx"
    script.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/calls\n{body}\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_the_header_is_compiled_once_with_the_files_flags_and_again_when_stale(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    monkeypatch.setenv("CXX", str(fake_compiler(tmp_path, 'for a; do out=$a; done; touch "$out"')))
    flags = kernels._precompiled_common_header("k", CSRC, ["-O3", "-march=native"])
    header = tmp_path / "ext" / "k" / "common_header" / "common.h"
    assert flags == ["-include", str(header)]
    assert header.read_text() == (CSRC / "common.h").read_text()
    assert (header.parent / "common.h.gch").is_file()
    (call,) = (tmp_path / "calls").read_text().splitlines()
    assert "-DTORCH_EXTENSION_NAME=k" in call and "-std=c++20" in call
    assert call.index("-fPIC") < call.index("-O3 -march=native")  # torch's flags, then ours
    assert "-x c++-header" in call
    kernels._precompiled_common_header("k", CSRC, ["-O3", "-march=native"])
    assert len((tmp_path / "calls").read_text().splitlines()) == 1  # up to date: not again
    kernels._precompiled_common_header("k", CSRC, ["-O2"])  # other flags: stale
    assert len((tmp_path / "calls").read_text().splitlines()) == 2
    header.unlink()  # the text header is what `-include` names: without it, built again
    kernels._precompiled_common_header("k", CSRC, ["-O2"])
    assert header.is_file() and len((tmp_path / "calls").read_text().splitlines()) == 3


def test_a_compiler_that_fails_leaves_the_build_without_the_header(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    monkeypatch.setenv("CXX", str(fake_compiler(tmp_path, "exit 1")))
    assert kernels._precompiled_common_header("k", CSRC, ["-O3"]) == []
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    assert kernels._precompiled_common_header("k", CSRC, ["-O3"]) == []


def test_the_built_library_is_imported_directly_only_while_it_is_the_one_recorded(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("INFLIGHT_CACHE", str(tmp_path))
    library = Path(kernels.load_extension().__file__)
    digest = kernels._build_digest(CSRC, ["-O3"])
    assert digest != kernels._build_digest(CSRC, ["-O2"])
    built = kernels._BuiltExtension(library.name.split(".")[0], digest)
    assert built.load() is None  # nothing recorded yet
    built.remember(library)
    module = built.load()
    assert module is not None and module.__file__ == str(library)
    assert hasattr(module, "gguf_linear_available")
    other = kernels._BuiltExtension(
        library.name.split(".")[0], kernels._build_digest(CSRC, ["-O2"])
    )
    assert other.load() is None  # other flags (or sources): built by torch's `load`
    record = built.record.read_text()
    built.record.write_text(record.replace(f'"stat": [{library.stat().st_size}',
                                           f'"stat": [{library.stat().st_size + 1}'))  # fmt: skip
    assert built.load() is None  # the library was rebuilt since (another checkout's sources)
    built.record.write_text("{not json")
    assert built.load() is None
    built.record.write_text(record.replace(str(library), str(tmp_path / "gone.so")))
    assert built.load() is None
    (tmp_path / "a-file").touch()  # a cache that cannot be written: nothing raised
    monkeypatch.setenv("INFLIGHT_CACHE", str(tmp_path / "a-file"))
    unwritable = kernels._BuiltExtension(library.name.split(".")[0], digest)
    unwritable.remember(library)
    assert unwritable.load() is None
