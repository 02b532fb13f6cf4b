#!/usr/bin/env bash
# On the GPU machine (the device tool: `run` with carry [".whl", ".gpu"], after prepare.sh here):
# installs the carried wheels, builds the random-weight models, runs the GPU tests, the decode
# benchmark and `inflight bench` on SmolLM2's shapes and a 1B Llama's. Logs and results go to
# $OUT, which comes back. About 7 minutes on an H100.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}
mkdir -p /tmp/models /tmp/res "$OUT"
nvidia-smi -L
python3 scripts/gpu/random_models.py /tmp/models 2>&1 | grep parameters
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/runner/test_cuda_graphs.py \
  tests/runner/test_attention.py tests/model/test_parity_tiny.py -k "graphs or triton or one_batch" \
  > "$OUT/pytest.log" 2>&1; echo "pytest rc=$?"; tail -3 "$OUT/pytest.log"
timeout 150 python3 scripts/gpu/decode_bench.py /tmp/models/smol 2>&1 | grep -v -i warn | tee "$OUT/decode.log"
bench="python3 -m inflight bench"
# eager first, then graphs: the first session saw slow first prompt steps in whichever ran first
for mode in --enforce-eager --no-enforce-eager; do
  timeout 90 $bench offline /tmp/models/smol --workload mixed64 $mode \
    --out /tmp/res/smol-mixed64$mode > "$OUT/smol-mixed64$mode.log" 2>&1
  echo "mixed64 $mode"; grep "inflight-cont" "$OUT/smol-mixed64$mode.log"
done
timeout 90 $bench offline /tmp/models/smol --workload longtail --num-requests 320 \
  --max-num-seqs 256 --profile --out /tmp/res/smol-longtail-profile > "$OUT/longtail.log" 2>&1
grep "inflight-cont" "$OUT/longtail.log"
timeout 90 $bench roofline /tmp/models/llama1b --workload mixed64 --out /tmp/res/llama1b-roofline \
  > "$OUT/llama1b-roofline.log" 2>&1; grep -E "fraction|inflight-cont" "$OUT/llama1b-roofline.log"
tar czf "$OUT/results.tgz" -C /tmp res
