"""inflight's C++ CPU kernels, compiled together into one torch extension on first use.

`csrc/paged_attention.cpp` and `csrc/prefill_attention.cpp` (decode and prefill attention over
the paged KV cache, laid out as `csrc/kv_layout.h` says and written by `csrc/kv_cache.cpp`; an
AVX-512 path, an AVX2 one built from `csrc/attention_avx2.h`, and a generic loop for the rest),
`csrc/layer_ops.cpp` (fused RMSNorm, residual add + RMSNorm, SiLU-and-mul, RoPE),
`csrc/decoder_layers.cpp` (every decoder layer driven from C++), `csrc/bf16_linear.cpp`
(bfloat16 linears for decode-sized batches), `csrc/gguf_linear.cpp` (float32 linears for them,
over a GGUF file's Q4_0 / Q4_1 / Q8_0 blocks), `csrc/gguf_int_linear.cpp` (the same with 8- or
16-bit activations, over the 5-bit and K-quant formats too, laid out by
`csrc/gguf_regroup.cpp`), `csrc/experts.cpp` (a mixture of experts' routed experts over those
linears) and `csrc/argmax.cpp` (greedy sampling) are built with the machine's
own compiler (`-march=native`) by torch's cpp_extension and cached by torch
(`~/.cache/torch_extensions`, or `TORCH_EXTENSIONS_DIR`): ~1 min on 2 cores, once per CPU kind
and source version. No file includes `torch/extension.h` (the whole C++ frontend, and most of
that minute again): the kernels include ATen's Tensor and the operators they call, and
`csrc/bindings.cpp` pybind11 with torch's tensor casters. Those ATen headers (`csrc/common.h`)
are parsed once per build, into a precompiled header every file reads first (a 164 MB file in
the build folder): the build took 81 s without it on 2 Zen 3 cores, 66 s with it. Their
argument checks (`csrc/check.h`) join messages without iostreams, which segfault in some
compiler/wheel pairs. The build's name carries a digest of the CPU's feature flags, so a
cache shared between machines (a network home) never hands one CPU code compiled for
another's instructions. Callers fall back to pure
PyTorch when no compiler is available; `bf16_linear` exists only where the compiler targets
AVX-512 BF16 (`bf16_linear_available()`), `gguf_linear` where it targets AVX2, FMA and F16C
(`gguf_linear_available()`, and `gguf_int_linear_available()` likewise).
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
from pathlib import Path
from types import ModuleType

from inflight.platform import cpu_flags

logger = logging.getLogger(__name__)

# Longest to compile first (seconds alone on a Zen 3 core, before the precompiled header: 24,
# 22, 20, 15, 13, 10, 9, 9, 8, 6, 6): ninja starts them in this order, and a long file started
# last runs alone at the end while the other cores idle (the build: 82 s -> 72 s on 2 cores).
_SOURCES = (
    "bindings.cpp",
    "gguf_int_linear.cpp",
    "prefill_attention.cpp",
    "decoder_layers.cpp",
    "paged_attention.cpp",
    "gguf_linear.cpp",
    "kv_cache.cpp",
    "layer_ops.cpp",
    "gated_delta.cpp",
    "gguf_regroup.cpp",
    "argmax.cpp",
    "bf16_linear.cpp",
    "experts.cpp",
)
_extension: ModuleType | None = None


def load_extension() -> ModuleType:
    """The compiled kernel module (built once per machine and source version)."""
    global _extension
    if _extension is None:
        csrc = Path(__file__).parent / "csrc"
        name = f"inflight_cpu_kernels_{_cpu_digest()}"
        # NOTE: no fused multiply-add contraction, so float32 element-wise results round
        # exactly as PyTorch's separate ops do (the attention kernels call FMA explicitly).
        # No floating-point traps (values unchanged: only exception flags could differ): with
        # them, GCC will not turn a float comparison into a vector select without AVX-512's
        # masks, and left loops through `exp_poly`'s clamp (SiLU) scalar on AVX2 CPUs.
        cflags = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-fno-trapping-math"]
        built = _BuiltExtension(name, _build_digest(csrc, cflags))
        _extension = built.load()
        if _extension is None:
            from torch.utils.cpp_extension import load

            logger.info("loading the CPU kernels (the first use on a CPU kind compiles them, "
                        "~1 min)")  # fmt: skip
            _extension = load(
                name=name,
                sources=[str(csrc / source) for source in _SOURCES],
                extra_include_paths=[str(csrc)],
                extra_cflags=cflags + _precompiled_common_header(name, csrc, cflags),
                extra_ldflags=["-fopenmp"],
                verbose=False,
            )
            built.remember(Path(_extension.__file__))
    return _extension


def _build_digest(csrc: Path, cflags: list[str]) -> str:
    """What the built library depends on: every source and header, the flags, torch, Python."""
    import sys

    import torch

    digest = hashlib.sha256()
    for part in (torch.__version__, sys.version, os.environ.get("CXX", ""), *cflags):
        digest.update(part.encode() + b"\0")
    for path in sorted(csrc.iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


class _BuiltExtension:
    """The library torch's `load` built last for these sources, imported directly when it is
    still there and unchanged: `load` itself imports setuptools (~0.3 s in every engine
    process) to find out that nothing needs building. The record (`$INFLIGHT_CACHE/kernels`)
    names the library and its size and modification time; another build of the same name
    (other sources, another checkout) changes them, so it is never taken for this one."""

    def __init__(self, name: str, digest: str) -> None:
        from inflight.file_cache import cache_dir

        self.digest = digest
        self.record = cache_dir() / "kernels" / f"{name}.json"

    def load(self) -> ModuleType | None:
        import importlib.util
        import json

        try:
            record = json.loads(self.record.read_text())
            library = Path(record["library"])
            if record["digest"] != self.digest or record["stat"] != _stat(library):
                return None
            spec = importlib.util.spec_from_file_location(library.name.split(".")[0], library)
            if spec is None or spec.loader is None:
                return None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
        except (OSError, ValueError, KeyError, TypeError, ImportError):
            return None  # no record, a stale one, or a library that does not load: build

    def remember(self, library: Path) -> None:
        import json

        record = {"digest": self.digest, "library": str(library), "stat": _stat(library)}
        partial = self.record.with_suffix(f".{os.getpid()}")
        try:
            self.record.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps(record))
            os.replace(partial, self.record)
        except OSError as e:  # a read-only cache only costs `load`'s check next time
            logger.info("could not record the built CPU kernels at %s: %s", self.record, e)


def _stat(library: Path) -> list[int]:
    stat = library.stat()
    return [stat.st_size, stat.st_mtime_ns]


def _precompiled_common_header(name: str, csrc: Path, cflags: list[str]) -> list[str]:
    """Flags that make every kernel file read `csrc/common.h` precompiled (about a third of the
    build's time saved), built into the extension's build folder when missing or stale; none
    where it cannot be built. The header is compiled with the flags torch's build gives the
    files (`torch.utils.cpp_extension`: the extension's name, its include paths, -fPIC,
    -std=c++20, then ours); where they differ after all, GCC finds the precompiled header
    invalid and reads the text one, so the kernels never depend on it, only the build's time."""
    import sysconfig

    import torch
    from torch.utils.cpp_extension import get_default_build_root, include_paths

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    folder = Path(root) / name / "common_header"
    text = (csrc / "common.h").read_text()
    flags = [f"-DTORCH_EXTENSION_NAME={name}", "-DTORCH_API_INCLUDE_EXTENSION_H",
             f"-I{csrc}", *(f"-isystem{p}" for p in include_paths("cpu")),
             f"-isystem{sysconfig.get_path('include', scheme='posix_prefix')}", "-fPIC",
             "-std=c++20", *cflags]  # fmt: skip
    stamp = hashlib.sha256("\n".join([text, torch.__version__, *flags]).encode()).hexdigest()
    header, compiled, stamp_file = folder / "common.h", folder / "common.h.gch", folder / "stamp"
    try:
        fresh = header.is_file() and compiled.is_file() and stamp_file.is_file()
        if not (fresh and stamp_file.read_text() == stamp):
            folder.mkdir(parents=True, exist_ok=True)
            header.write_text(text)
            partial = folder / f"common.h.gch.{os.getpid()}"  # processes may race: each its own
            subprocess.run([os.environ.get("CXX", "c++"), *flags, "-x", "c++-header", str(header),
                            "-o", str(partial)], check=True, capture_output=True)  # fmt: skip
            os.replace(partial, compiled)
            stamp_file.write_text(stamp)
    except (OSError, subprocess.CalledProcessError) as e:
        logger.info("the CPU kernels build without a precompiled header (%s)", e)
        return []
    return ["-include", str(header)]


def _cpu_digest() -> str:
    """A short digest of this CPU's feature flags (what `-march=native` compiles for)."""
    return hashlib.sha256(" ".join(sorted(cpu_flags())).encode()).hexdigest()[:10]
