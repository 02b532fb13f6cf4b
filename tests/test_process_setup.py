"""`inflight serve` / `bench` restart themselves once under tcmalloc when the machine has it."""

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
