"""Process-level defaults that `inflight serve` and `inflight bench` apply to themselves.

tcmalloc, when the machine has it (Debian: `libtcmalloc-minimal4`; `scripts/setup.sh` installs
it where it can): glibc's malloc hands PyTorch's per-step activations back and forth through the
kernel; with tcmalloc preloaded a serving workload runs faster (docs/benchmarks.md, "Figures
behind design decisions"; vLLM's CPU docs advise the same). A preload must be in place before
the process starts, so the command re-executes itself once with `LD_PRELOAD` set.
`INFLIGHT_ALLOCATOR=system` keeps glibc's malloc.

Measured and not applied (no gain beyond noise here): OpenMP thread binding (`OMP_PROC_BIND`),
transparent huge pages for PyTorch's allocations (`THP_MEM_ALLOC_ENABLE`). Threads: PyTorch's
default, one per physical core.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

TCMALLOC_PATHS = (
    "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
    "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4",
    "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4",
    "/usr/lib/aarch64-linux-gnu/libtcmalloc.so.4",
)


def return_free_memory() -> None:
    """Hands the heap memory that the allocator holds free back to the kernel. Loading a model
    frees buffers of every size as it goes (a weight's blocks read, regrouped, concatenated),
    and tcmalloc and glibc's malloc keep such memory for allocations of the same sizes, which a
    loaded model no longer makes: an engine on a Llama-3.1-8B-shaped Q8_0 file held 1.16 GiB of
    it once loaded (docs/benchmarks.md). A no-op where neither allocator is there."""
    process = ctypes.CDLL(None)
    release = getattr(process, "MallocExtension_ReleaseFreeMemory", None)  # tcmalloc, preloaded
    if release is not None:
        release()
        return
    trim = getattr(process, "malloc_trim", None)  # glibc
    if trim is not None:
        trim(0)


def skip_teardown_at_exit() -> None:
    """Spares an exiting process work that its end makes pointless, ~1-2 s of CPU in every
    server, rank and test worker: torch deregistering each of its Python-registered operators
    (`torch.library`, from `weakref.finalize` hooks), and the interpreter's last garbage
    collections walking every object the process made (torch's, transformers', pydantic's
    schemas...). The exit hook below is registered after torch's, so it runs first (last in,
    first out): it detaches torch's hooks and freezes what is alive, which collections then
    pass over (not where Triton is loaded). Idempotent."""
    import atexit

    import torch.library  # noqa: F401  (its hooks exist before ours)

    atexit.unregister(_skip_teardown)
    atexit.register(_skip_teardown)


def _skip_teardown() -> None:
    import gc
    import weakref

    import torch.library

    for hook in list(getattr(weakref.finalize, "_registry", ())):
        alive = hook.peek()
        if alive is not None and alive[1] is torch.library._del_library:
            hook.detach()
    # Triton's extension (nanobind) reports each of its objects still alive at exit as a leak,
    # on stderr: where it is loaded, the last collections run as usual.
    if "triton" not in sys.modules:
        gc.freeze()


def find_tcmalloc() -> Path | None:
    return next((Path(p) for p in TCMALLOC_PATHS if Path(p).is_file()), None)


def tcmalloc_environment(environ: Mapping[str, str]) -> dict[str, str] | None:
    """The environment to restart with, or None when there is nothing to change (tcmalloc
    already preloaded, not installed, or declined with INFLIGHT_ALLOCATOR=system)."""
    allocator = environ.get("INFLIGHT_ALLOCATOR", "tcmalloc")
    if allocator not in ("tcmalloc", "system"):
        raise ValueError(f"INFLIGHT_ALLOCATOR must be tcmalloc or system, got {allocator!r}")
    preload = environ.get("LD_PRELOAD", "")
    if allocator == "system" or "tcmalloc" in preload:
        return None
    library = find_tcmalloc()
    if library is None:
        return None
    return {**environ, "LD_PRELOAD": ":".join(p for p in (str(library), preload) if p)}


def restart_with_tcmalloc(command: Sequence[str]) -> None:
    """Replaces this process with `command` under tcmalloc when `tcmalloc_environment` says so;
    returns only when it does not. The restarted process sees tcmalloc preloaded: no loop."""
    env = tcmalloc_environment(os.environ)
    if env is None:
        return
    logger.info("restarting with tcmalloc preloaded (%s)", env["LD_PRELOAD"].split(":")[0])
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(command[0], list(command), env)
