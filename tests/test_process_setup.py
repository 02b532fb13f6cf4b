"""`inflight serve` / `bench` restart themselves once under tcmalloc when the machine has it;
heap memory that a load freed goes back to the kernel under either allocator."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from inflight import process_setup
from inflight.process_setup import find_tcmalloc, tcmalloc_environment


def test_tcmalloc_goes_first_in_the_preload_list(monkeypatch, tmp_path):
    library = tmp_path / "libtcmalloc_minimal.so.4"
    library.touch()
    monkeypatch.setattr(process_setup, "TCMALLOC_PATHS", (str(tmp_path / "no.so"), str(library)))
    env = tcmalloc_environment({"PATH": "/bin", "LD_PRELOAD": "/opt/libiomp5.so"})
    assert env == {"PATH": "/bin", "LD_PRELOAD": f"{library}:/opt/libiomp5.so"}
    assert tcmalloc_environment({})["LD_PRELOAD"] == str(library)


def test_no_restart_when_declined_present_or_missing(monkeypatch, tmp_path):
    library = tmp_path / "libtcmalloc.so.4"
    library.touch()
    monkeypatch.setattr(process_setup, "TCMALLOC_PATHS", (str(library),))
    assert tcmalloc_environment({"INFLIGHT_ALLOCATOR": "system"}) is None
    assert tcmalloc_environment({"LD_PRELOAD": "/lib/libtcmalloc.so.4"}) is None  # no loop
    with pytest.raises(ValueError, match="tcmalloc or system"):
        tcmalloc_environment({"INFLIGHT_ALLOCATOR": "jemalloc"})
    monkeypatch.setattr(process_setup, "TCMALLOC_PATHS", (str(tmp_path / "missing.so"),))
    assert tcmalloc_environment({}) is None


@pytest.mark.skipif(find_tcmalloc() is None, reason="tcmalloc is not installed here")
def test_restarted_process_runs_under_tcmalloc():
    probe = "print('tcmalloc' in open('/proc/self/maps').read())"
    script = (
        "import sys; from inflight.process_setup import restart_with_tcmalloc; "
        f"restart_with_tcmalloc([sys.executable, '-c', {probe!r}]); print('not restarted')"
    )
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


# Frees ~190 MiB of heap blocks below one still in use (so that free() cannot trim them off the
# heap's top), then reports the resident memory before and after `return_free_memory`.
FREED_HEAP_PROBE = """
import sys
from inflight.process_setup import return_free_memory
def rss():
    return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1])
chunks = [bytearray(64 * 1024) for _ in range(3000)]
top = bytearray(64 * 1024)
del chunks
before = rss()
return_free_memory()
print(before, rss(), len(top))
"""


@pytest.mark.parametrize("allocator", ["glibc", "tcmalloc"])
def test_freed_heap_memory_goes_back_to_the_kernel(allocator):
    """What loading a model frees between its weights' copies: glibc's malloc and tcmalloc
    each keep it resident until asked."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if allocator == "tcmalloc":
        library = find_tcmalloc()
        if library is None:
            pytest.skip("no tcmalloc on this machine")
        env["LD_PRELOAD"] = str(library)
    out = subprocess.run([sys.executable, "-c", FREED_HEAP_PROBE], env=env, capture_output=True,
                         text=True)  # fmt: skip
    assert out.returncode == 0, out.stderr
    before_kib, after_kib, _ = map(int, out.stdout.split())
    assert before_kib - after_kib > 100 * 1024, (before_kib, after_kib)


def test_an_exiting_process_skips_torchs_operator_teardown_and_the_last_collections():
    """The exit hook runs before torch's (registered after it): torch's operator
    deregistration hooks are detached, and what is alive is frozen, before they would run."""
    script = """if True:
        import atexit, gc, weakref
        import torch.library
        from inflight.process_setup import skip_teardown_at_exit

        def torch_hooks():
            return sum(1 for hook in list(weakref.finalize._registry)
                       if (alive := hook.peek()) and alive[1] is torch.library._del_library)

        before = torch_hooks()
        skip_teardown_at_exit()
        skip_teardown_at_exit()  # idempotent: one hook
        atexit._run_exitfuncs()  # ours first, then torch's (none left to run)
        print(before, torch_hooks(), gc.get_freeze_count() > 0)
    """
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=True)  # fmt: skip
    before, after, frozen = done.stdout.split()
    assert int(before) > 100 and int(after) == 0 and frozen == "True"


def test_a_process_with_triton_loaded_exits_without_leak_reports():
    """Triton's nanobind extension reports objects still alive at exit: nothing is frozen there."""
    script = ("import triton\nfrom inflight.process_setup import skip_teardown_at_exit\n"
              "skip_teardown_at_exit()\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=True)  # fmt: skip
    assert "leaked" not in done.stderr
