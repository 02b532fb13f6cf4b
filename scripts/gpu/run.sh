#!/usr/bin/env bash
# On the GPU machine (the device tool: `run` with carry [".whl", ".gpu"], after prepare.sh here):
# `bash scripts/gpu/run.sh [STAGE ...]` installs the carried wheels, builds the random-weight
# models, then runs the stages named (all, in this order, when none is):
#   tests     the GPU tests (graphs, Triton attention and experts, tiny-model parity)
#   families  every family's other tests on the GPU: GGUF files, logprobs, RoPE variants, prefix
#             caching
#   cold      cold_steps.py, eager and with graphs: what the first prompt steps of a shape cost
#   mixed     `inflight bench offline --workload mixed64 --profile`, eager then graphs
#   decode    decode_bench.py: graphs vs eager decode throughput, the decode kernel alone
#   moe       decode_bench.py on the Qwen3-MoE: graphs, eager, eager with experts routed on the
#             host
#   longtail  `inflight bench offline --workload longtail`, 320 requests, 256 seats, profiled
#   roofline  `inflight bench roofline` on a 1B Llama
#   compare   `inflight bench compare --workload mixed64` with the transformers peers, both models
#   cpu       the CPU kernels' tests on this machine's CPU (its AVX-512, VNNI, BF16 or AMX paths,
#             which a 2-core AVX2 CI machine skips), the GPU hidden
#   kv        the KV cache dtypes: their Triton kernel tests, then mixed64 with each (auto, int8,
#             fp8)
#   state     the state-carrying families (LFM2, Qwen3.5, Qwen3-Next) on the GPU: tiny-model
#             parity under every engine setting, their swap, speculation and saved states; and
#             the prefix cache's parity (attention families)
#   quant-prep  starts quant's builds and its F16 file in the background, so that the stages
#             named between it and quant run meanwhile
#   quant     quantized weights on this machine's CPU against llama.cpp, the GPU hidden: builds
#             llama-server and llama-quantize from the carried source (.gpu/llama-src.tgz, with
#             .gpu/cmake-min.txz where the image has no cmake), writes a Llama-3.2-3B-shaped F16
#             file (.gpu/smol-tokenizer.gguf's tokenizer; LIKE=.gpu/gemma3-like.gguf: Gemma 3
#             270M's architecture, tokenizer and shapes instead), converts it to Q4_K_M, then runs
#             prefill_decode.py, `bench compare --workload mixed64` (16 requests) and `bench
#             memory` (`inflight serve`'s peak against file + KV pool + 1 GiB)
# Logs and results go to $OUT, which comes back. All stages: about 8 minutes on an H100.
set -uo pipefail
stages=${*:-tests cold mixed decode longtail roofline}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}
mkdir -p /tmp/models /tmp/res "$OUT"
nvidia-smi -L
python3 scripts/gpu/random_models.py /tmp/models ${MODELS:-} 2>&1 | grep parameters  # MODELS: all, or some
bench="python3 -m inflight bench"
quant_builds=""
# quant's builds (llama-quantize and llama-server, inflight's C++ kernels) and its F16 file, in
# the background, every core's
start_quant_builds() {
  lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|Socket" | tr -s ' '
  command -v cmake > /dev/null || { mkdir -p /tmp/cmake && tar xJf .gpu/cmake-min.txz -C /tmp/cmake \
    && export PATH=/tmp/cmake/bin:$PATH; }
  local gen targets
  gen=$(command -v ninja > /dev/null && echo "-G Ninja")
  targets="llama-quantize"; [ "${PEER:-1}" = 1 ] && targets="llama-quantize llama-server"
  tar xzf .gpu/llama-src.tgz -C /tmp
  ( cmake -B /tmp/lb -S /tmp/llama.cpp $gen -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
      -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      && timeout 300 cmake --build /tmp/lb -j "$(nproc)" --target $targets
  ) > "$OUT/llama-build.log" 2>&1 &
  quant_builds="$!"
  local shape=(llama-3.2-3b --tokenizer .gpu/smol-tokenizer.gguf)
  [ -n "${LIKE:-}" ] && shape=(--like "$LIKE")
  CUDA_VISIBLE_DEVICES= timeout 200 python3 scripts/synthetic_gguf.py "${shape[@]}" --type F16 \
    --out /tmp/models/q-f16.gguf > "$OUT/f16.log" 2>&1 &
  quant_builds="$quant_builds $!"
  CUDA_VISIBLE_DEVICES= timeout 300 python3 -c \
    "from inflight.kernels import load_extension; load_extension(); print('kernels built')" \
    > "$OUT/kernels-build.log" 2>&1 &
  quant_builds="$quant_builds $!"
}
for stage in $stages; do
  echo "== $stage"
  case $stage in
  tests)
    timeout 300 python3 -m pytest -q -p no:cacheprovider tests/runner/test_cuda_graphs.py \
      tests/runner/test_attention.py tests/model/test_parity_tiny.py tests/model/test_layer_ops.py \
      tests/model/test_expert_kernels.py -k "graphs or triton or one_batch or expert" \
      > "$OUT/pytest.log" 2>&1
    echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.log" | tail -20 ;;
  cpu)
    lscpu | grep -E "Model name|Flags" | sed -E 's/(Flags:).*/\1/'
    grep -o -w -E "avx512[a-z_0-9]*|amx[a-z_0-9]*|avx_vnni" /proc/cpuinfo | sort -u | tr '\n' ' '; echo
    CUDA_VISIBLE_DEVICES= timeout 400 python3 -m pytest -q -p no:cacheprovider -n 8 \
      tests/model/test_bf16_linear.py tests/model/test_gguf_int_linear.py \
      tests/model/test_gguf_linear.py tests/model/test_fused_layers.py \
      tests/model/test_gguf_blocks.py tests/model/test_layer_ops.py tests/runner/test_attention.py \
      tests/runner/test_kv_cache_dtype.py tests/model/test_parity_tiny.py -k "not triton" \
      > "$OUT/cpu.log" 2>&1
    echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cpu.log" | tail -20
    grep -E "^SKIPPED" "$OUT/cpu.log" | head -20 ;;
  families)
    timeout 180 python3 -m pytest -q -p no:cacheprovider tests/model/test_gguf.py \
      tests/model/test_logprobs_parity.py tests/model/test_rope_variants.py \
      tests/model/test_granite.py tests/model/test_prefix_cache_parity.py \
      > "$OUT/families.log" 2>&1
    echo "pytest rc=$?"; grep -E "FAILED|ERROR|passed|failed" "$OUT/families.log" | tail -12 ;;
  cold)
    for mode in --enforce-eager ""; do
      timeout 120 python3 scripts/gpu/cold_steps.py /tmp/models/smol $mode 2>&1 \
        | grep -v -i warn | tee -a "$OUT/cold.log"
    done ;;
  mixed)
    # eager first, then graphs: the first session saw slow first prompt steps in whichever ran first
    for mode in --enforce-eager --no-enforce-eager; do
      timeout 100 $bench offline /tmp/models/smol --workload mixed64 $mode --profile \
        --out /tmp/res/smol-mixed64$mode > "$OUT/smol-mixed64$mode.log" 2>&1
      echo "mixed64 $mode"; grep "inflight-cont" "$OUT/smol-mixed64$mode.log"
      find /tmp/res/smol-mixed64$mode -name profile.md -exec sed -n 3,16p {} \;
    done ;;
  decode)
    timeout 150 python3 scripts/gpu/decode_bench.py /tmp/models/smol 2>&1 | grep -v -i warn \
      | tee "$OUT/decode.log" ;;
  moe)
    timeout 200 python3 scripts/gpu/decode_bench.py /tmp/models/qwen3moe --one-stream \
      --no-kernel 2>&1 | grep -v -i warn | tee "$OUT/moe-decode.log" ;;
  longtail)
    timeout 100 $bench offline /tmp/models/smol --workload longtail --num-requests 320 \
      --max-num-seqs 256 --profile --out /tmp/res/smol-longtail-profile > "$OUT/longtail.log" 2>&1
    grep "inflight-cont" "$OUT/longtail.log" ;;
  roofline)
    timeout 100 $bench roofline /tmp/models/llama1b --workload mixed64 \
      --out /tmp/res/llama1b-roofline > "$OUT/llama1b-roofline.log" 2>&1
    grep -E "fraction|inflight-cont" "$OUT/llama1b-roofline.log" ;;
  kv)
    timeout 240 python3 -m pytest -q -p no:cacheprovider tests/runner/test_kv_cache_dtype.py \
      tests/runner/test_attention.py tests/runner/test_cuda_graphs.py -k "cuda or graphs" \
      > "$OUT/kv-pytest.log" 2>&1
    echo "pytest rc=$?"; tail -3 "$OUT/kv-pytest.log"
    for kv in auto int8 fp8; do
      timeout 100 $bench offline /tmp/models/smol --workload mixed64 --kv-cache-dtype $kv \
        --out /tmp/res/smol-mixed64-kv-$kv > "$OUT/smol-mixed64-kv-$kv.log" 2>&1
      echo "mixed64 kv $kv"; grep "inflight-cont" "$OUT/smol-mixed64-kv-$kv.log"
    done ;;
  compare)
    for model in smol llama1b; do
      timeout 220 $bench compare /tmp/models/$model --workload mixed64 \
        --peers hf-static,hf-continuous --out /tmp/res/compare-$model > "$OUT/compare-$model.log" 2>&1
      echo "compare $model"; grep -E "^\| (inflight|hf|transformers)|x\*\*" "$OUT/compare-$model.log"
    done ;;
  state)
    timeout 240 python3 -m pytest -q -p no:cacheprovider tests/model/test_parity_tiny.py \
      tests/model/test_state_layers.py -k "(lfm2 or qwen3_5 or qwen3_next) and not two_ranks" \
      > "$OUT/state.log" 2>&1
    echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/state.log" | tail -20
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/model/test_prefix_cache_parity.py \
      > "$OUT/prefix-cache.log" 2>&1
    echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/prefix-cache.log" | tail -8 ;;
  quant-prep) start_quant_builds ;;
  quant)
    # PEER=0: llama-quantize alone (no llama-server runs); PD_MODES, PD_ROUNDS: prefill_decode's
    # inflight modes and rounds; CMP_MODES: bench compare's (CMP=0 skips it); MEM=0 skips
    # `bench memory`
    [ -n "$quant_builds" ] || start_quant_builds
    export CUDA_VISIBLE_DEVICES=
    wait $quant_builds; echo "llama.cpp build: $(tail -1 "$OUT/llama-build.log")"
    tail -1 "$OUT/f16.log"; tail -1 "$OUT/kernels-build.log"
    q=/tmp/models/q4_k_m.gguf
    timeout 120 /tmp/lb/bin/llama-quantize /tmp/models/q-f16.gguf $q Q4_K_M > "$OUT/quantize.log" 2>&1
    rm -f /tmp/models/q-f16.gguf; ls -la $q
    peer=(); cmp_peer=()
    if [ "${PEER:-1}" = 1 ]; then
      peer=(--llama-server /tmp/lb/bin/llama-server)
      cmp_peer=(--peers llama-server --llama-server /tmp/lb/bin/llama-server)
    fi
    timeout 240 python3 scripts/prefill_decode.py $q "${peer[@]}" --modes "${PD_MODES:-int16,int8}" \
      --rounds "${PD_ROUNDS:-2}" --out /tmp/res/prefill_decode.json 2>&1 | grep -E "^round|Error"
    if [ "${CMP:-1}" = 1 ]; then
      timeout 300 $bench compare $q --workload mixed64 --num-requests 16 --max-num-seqs 16 \
        --modes "${CMP_MODES:-continuous,int8}" "${cmp_peer[@]}" \
        --out /tmp/res/q4km-mixed64 > "$OUT/q4km-mixed64.log" 2>&1
      grep -E "weights hold|^\| (inflight|llama)|x\*\*" "$OUT/q4km-mixed64.log"
    fi
    # `inflight serve`'s peak RSS against the file + KV pool + 1 GiB target (MEM=0: skipped)
    if [ "${MEM:-1}" = 1 ]; then
      timeout 240 $bench memory $q "${peer[@]}" --max-num-seqs 4 --num-requests 4 \
        --out /tmp/res/q4km-memory > "$OUT/q4km-memory.log" 2>&1
      grep -E "^\| (inflight|llama)" "$OUT/q4km-memory.log"
    fi ;;
  *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
tar czf "$OUT/results.tgz" -C /tmp res
