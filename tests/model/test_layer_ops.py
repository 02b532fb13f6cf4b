"""The fused layer ops (C++ for CPUs, Triton for GPUs: here under its interpreter) against the
PyTorch reference ops, and the packed bf16 linears."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from inflight.model import packed_linear
from inflight.model.layer_ops import CpuLayerOps, TorchLayerOps
from inflight.model.packed_linear import PackedLinear, can_pack, pack_linears, warm_up
from inflight.model.triton_layer_ops import TritonLayerOps, checked_layer_ops

REF, FUSED = TorchLayerOps(), CpuLayerOps()
DTYPES = [torch.float32, torch.bfloat16]
INTERPRETED = pytest.mark.skipif(torch.cuda.is_available(), reason="Triton compiles for the GPU")


@pytest.fixture(
    params=[pytest.param(CpuLayerOps, id="cpu"),
            pytest.param(TritonLayerOps, id="triton", marks=INTERPRETED)]
)  # fmt: skip
def fused(request):
    return request.param()


def assert_norms_agree(out: torch.Tensor, want: torch.Tensor) -> None:
    """The float32 mean is summed in another order, so a row's scale may differ in its last
    place: a float32 rounding error, which bfloat16 rounding almost always hides. When it does
    not, the normalised value is one bf16 step off, and the product with the weight, rounded
    again, up to two (seen on an Intel host, whose PyTorch sums in another order than here)."""
    if out.dtype == torch.float32:
        torch.testing.assert_close(out, want, rtol=2e-6, atol=1e-6)
        return
    steps = (out.view(torch.int16).long() - want.view(torch.int16).long()).abs()
    assert int(steps.max()) <= 2
    assert (out == want).float().mean() > 0.99


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", [1, 5, 300])
def test_rms_norm_and_residual_add(fused, dtype, num_tokens):
    torch.manual_seed(0)
    wide = torch.randn(num_tokens, 700, dtype=dtype) * 3
    x = wide[:, :576]  # rows with a stride: the kernel must not assume contiguity
    weight = torch.randn(576, dtype=dtype)
    out, want = fused.rms_norm(x, weight, 1e-5), REF.rms_norm(x, weight, 1e-5)
    assert out.shape == want.shape and out.dtype == dtype
    assert_norms_agree(out, want)

    residual = torch.randn(num_tokens, 576, dtype=dtype)
    res_fused, res_ref = residual.clone(), residual.clone()
    out = fused.add_rms_norm(x, res_fused, weight, 1e-6)
    want = REF.add_rms_norm(x, res_ref, weight, 1e-6)
    assert torch.equal(res_fused, res_ref), "the residual sum rounds exactly as torch's add"
    assert torch.equal(res_fused, residual + x)
    assert_norms_agree(out, want)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # exp(100) = inf, as meant
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(fused, dtype):
    torch.manual_seed(1)
    gate_up = torch.randn(67, 2 * 1536, dtype=dtype) * 6  # exp over a wide range
    gate_up[0, :4] = torch.tensor([0.0, -100.0, 100.0, -0.0])
    out, want = fused.silu_and_mul(gate_up), REF.silu_and_mul(gate_up)
    assert out.shape == (67, 1536)
    torch.testing.assert_close(out, want, rtol=1e-6 if dtype == torch.float32 else 0, atol=1e-6)
    # the C++ kernel's exp is PyTorch's; Triton's is not: float32 within 1e-6, not bit for bit
    if dtype == torch.bfloat16 or isinstance(fused, CpuLayerOps):
        assert (out == want).float().mean() > 0.99


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("dtype", DTYPES)
def test_clamped_swiglu_is_pytorchs_and_each_row_alone(dtype):
    """gpt-oss's expert activation in C++: PyTorch's ops' values (float32 within its exp's
    ulps, bfloat16 nearly bit for bit), and a row's bits the same in a step of any size, where
    ATen's sigmoid over a [T, 24] tensor rounds an element by whether it falls in a vector lane
    or the scalar tail (which moves with T)."""
    torch.manual_seed(3)
    gate_up = torch.randn(37, 2 * 24, dtype=dtype) * 6  # past the clamp both ways
    gate_up[0, :4] = torch.tensor([0.0, -100.0, 100.0, float("nan")])
    gate_up[0, 24:28] = torch.tensor([-100.0, 100.0, float("nan"), -0.0])
    out, want = FUSED.clamped_swiglu(gate_up, 7.0, 1.702), REF.clamped_swiglu(gate_up, 7.0, 1.702)
    assert out.shape == (37, 24) and out.dtype == dtype
    torch.testing.assert_close(out, want, rtol=1e-6 if dtype == torch.float32 else 0, atol=1e-6,
                               equal_nan=True)  # fmt: skip
    assert (out == want).float().mean() > 0.98
    alone = torch.cat([FUSED.clamped_swiglu(gate_up[t : t + 1], 7.0, 1.702) for t in range(37)])
    assert torch.equal(out.nan_to_num(), alone.nan_to_num()) and out[0, 2:4].isnan().all()


@pytest.mark.parametrize("rope_dim", [64, 48])  # every dimension; the first 3/4 (Phi-4-mini's)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_in_place_matches_reference_exactly(fused, dtype, rope_dim):
    torch.manual_seed(2)
    num_tokens, heads, kv_heads, head_dim = 9, 9, 3, 64
    qkv = torch.randn(num_tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rope_dim, 2).float() / rope_dim))
    freqs = torch.randint(0, 4000, (num_tokens,)).float()[:, None] * inv_freq[None]
    cos, sin = freqs.cos().to(dtype), freqs.sin().to(dtype)
    got, want = qkv.clone(), qkv.clone()
    fused.rope_(got, cos, sin, heads + kv_heads, head_dim)
    REF.rope_(want, cos, sin, heads + kv_heads, head_dim)
    assert torch.equal(got, want)
    rotated = (heads + kv_heads) * head_dim
    assert torch.equal(got[:, rotated:], qkv[:, rotated:]), "values must not be rotated"
    by_head = got[:, :rotated].view(num_tokens, heads + kv_heads, head_dim)
    before = qkv[:, :rotated].view(num_tokens, heads + kv_heads, head_dim)
    assert torch.equal(by_head[..., rope_dim:], before[..., rope_dim:]), "past R: passed through"
    # transformers' rotation (Phi-3's `apply_rotary_pos_emb`: the first R dims rotate)
    x1, x2 = before[..., : rope_dim // 2], before[..., rope_dim // 2 : rope_dim]
    c, s = cos[:, None], sin[:, None]
    assert torch.equal(by_head[..., :rope_dim], torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1))


@INTERPRETED
def test_triton_ops_pass_their_own_check():
    """The start-up check that keeps them (a GPU whose compiler refuses them gets PyTorch's)."""
    for dtype in DTYPES:
        assert isinstance(checked_layer_ops(torch.device("cpu"), dtype), TritonLayerOps)


def test_bad_inputs_raise_instead_of_reading_out_of_bounds():
    x = torch.randn(4, 8)
    with pytest.raises(RuntimeError, match="weight"):
        FUSED.rms_norm(x, torch.ones(7), 1e-5)
    with pytest.raises(RuntimeError, match="dtype"):
        FUSED.rms_norm(x, torch.ones(8, dtype=torch.bfloat16), 1e-5)
    with pytest.raises(RuntimeError, match="residual"):
        FUSED.add_rms_norm(x, torch.randn(4, 9), torch.ones(8), 1e-5)
    with pytest.raises(RuntimeError, match="gate_up"):
        FUSED.silu_and_mul(torch.randn(4, 7))
    with pytest.raises(RuntimeError, match="gate_up"):
        FUSED.clamped_swiglu(torch.randn(4, 7), 7.0, 1.0)
    for limit, alpha in ((0.0, 1.0), (-1.0, 1.0), (float("nan"), 1.0), (float("inf"), 1.0),
                         (7.0, float("nan")), (7.0, float("inf"))):  # fmt: skip
        with pytest.raises(RuntimeError, match="limit"):
            FUSED.clamped_swiglu(torch.randn(4, 8), limit, alpha)
    with pytest.raises(RuntimeError, match="cos"):  # rotating more than a head holds
        FUSED.rope_(x, torch.randn(4, 5), torch.randn(4, 5), 1, 8)
    with pytest.raises(RuntimeError, match="cos"):
        FUSED.rope_(x, torch.randn(4, 3), torch.randn(4, 2), 1, 8)


def conv_step(
    lengths: list[int], back: int, rows: int, in_place: bool = False,
    snapshots: dict[int, int] | None = None,
) -> SimpleNamespace:  # fmt: skip
    """A `ConvStep`'s indices for requests of these many rows each (the step's rows in request
    order), request r reading state row r and writing row `rows - 1 - r` (row r again:
    `in_place`, as a running request's slot is written): each token's taps are the `back + 1`
    inputs ending at its own, the earliest from the state rows read (table rows after the
    step's T); `snapshots`: token -> the row its state after it is written to as well."""
    T, taps, keep, start = sum(lengths), [], [], 0
    read = torch.arange(len(lengths))
    for r, n in enumerate(lengths):
        inputs = [T + r * back + j for j in range(back)] + list(range(start, start + n))
        taps += [inputs[j : j + back + 1] for j in range(n)]
        keep += inputs[-back:]
        start += n
    snapshot_rows = [-1] * T if snapshots else []
    for token, row in (snapshots or {}).items():
        snapshot_rows[token] = row
    return SimpleNamespace(
        taps=torch.tensor(taps).reshape(T, back + 1).t().contiguous(), keep=torch.tensor(keep),
        read_rows=read, write_rows=read if in_place else rows - 1 - read,
        snapshot_rows=torch.tensor(snapshot_rows, dtype=torch.long),
    )  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("state_dtype", DTYPES)
@pytest.mark.parametrize("lengths", [[1], [1, 1, 1], [3, 1, 17], [40]])
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("snapshots", [False, True])
def test_short_convolution_rounds_as_pytorch(dtype, state_dtype, lengths, in_place, snapshots):
    """LFM2's and Qwen3.5's causal convolution in C++: PyTorch's outputs and written state,
    bit for bit, from the step's rows and the state rows each request reads (and writes again,
    `in_place`), whose earlier inputs round to x's dtype as PyTorch's `.to` rounds them; with
    `snapshots`, the state after the first token and after the last written to rows of their
    own too (a speculating request's)."""
    torch.manual_seed(len(lengths))
    C, kernel, rows = 72, 4, 8
    x = torch.randn(sum(lengths), C + 5, dtype=dtype)[:, :C]  # strided rows
    weight = torch.randn(kernel, C, dtype=dtype).t()  # strided, as a folder's squeeze leaves it
    state = torch.randn(rows, kernel - 1, C).to(state_dtype)
    last = sum(lengths) - 1
    written = {0: 3, last: 4} if last else {0: 4}  # (a token's state after it, at a row)
    step = conv_step(lengths, kernel - 1, rows, in_place, written if snapshots else None)
    want_state, got_state = state.clone(), state.clone()
    want = REF.short_convolution(x, weight, want_state, step)
    got = FUSED.short_convolution(x, weight, got_state, step)
    assert got.dtype == want.dtype == dtype
    assert torch.equal(got, want)
    assert torch.equal(got_state, want_state)
    if snapshots:  # (the state after the step's last token is its request's written one)
        assert not torch.equal(want_state[3], state[3]) or not last
        assert torch.equal(want_state[4], want_state[step.write_rows[-1]])


def test_short_convolution_refuses_rows_out_of_range():
    x, weight, state = torch.randn(2, 8), torch.randn(8, 3), torch.zeros(4, 2, 8)
    step = conv_step([2], 2, 4)
    ext = FUSED.ext
    bad = {"taps": step.taps + 3, "keep": step.keep * 9, "read_rows": step.read_rows + 4,
           "write_rows": step.write_rows - 9, "snapshot_rows": torch.tensor([-1, 4])}  # fmt: skip
    for name, value in bad.items():
        rows = {**vars(step), name: value}
        what = "snapshot row" if name == "snapshot_rows" else name
        with pytest.raises(RuntimeError, match=f"{what} .* out of range"):
            ext.short_convolution(x, weight, state, rows["taps"], rows["keep"], rows["read_rows"],
                                  rows["write_rows"], rows["snapshot_rows"])  # fmt: skip
    assert not state.any(), "nothing written before the checks pass"
    with pytest.raises(RuntimeError, match="taps"):  # a token without its taps
        ext.short_convolution(x, weight, state, step.taps[:, :1].contiguous(), step.keep,
                              step.read_rows, step.write_rows, step.snapshot_rows)  # fmt: skip
    with pytest.raises(RuntimeError, match="snapshot_rows"):  # a row for one token of two
        ext.short_convolution(x, weight, state, step.taps, step.keep, step.read_rows,
                              step.write_rows, torch.tensor([3]))  # fmt: skip
    with pytest.raises(RuntimeError, match="weight"):
        ext.short_convolution(x, weight.double(), state, step.taps, step.keep, step.read_rows,
                              step.write_rows, step.snapshot_rows)  # fmt: skip


CPU = torch.device("cpu")
# float32 everywhere oneDNN is; bfloat16 where the CPU computes it
PACKABLE = [dtype for dtype in (torch.float32, torch.bfloat16) if can_pack(dtype, CPU)]


def assert_same_as_linear(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal up to the dtype's rounding: float32's `F.linear` is MKL's sgemm, which sums in
    another order, and bf16's may be another oneDNN kernel than the packed weight's (seen on a
    Xeon with AMX)."""
    tol = 1.6e-2 if got.dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def test_only_cpu_float32_and_bf16_are_packed():
    assert can_pack(torch.float32, CPU) == torch.backends.mkldnn.is_available()
    assert not can_pack(torch.float16, CPU)
    assert not can_pack(torch.float32, torch.device("cuda"))


@pytest.mark.parametrize("dtype", PACKABLE)
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_computes_linear(dtype, bias):
    torch.manual_seed(3)
    linear = nn.Linear(576, 960, bias=bias).to(dtype)
    packed = PackedLinear(linear)
    for num_tokens in (1, 4, 64, 300):
        x = torch.randn(num_tokens, 576, dtype=dtype)
        assert_same_as_linear(packed(x), F.linear(x, linear.weight, linear.bias))
    assert packed(torch.randn(0, 576, dtype=dtype)).shape == (0, 960), "an empty batch"


@pytest.mark.parametrize("dtype", PACKABLE)
def test_pack_linears_replaces_every_linear_and_keeps_ties(dtype):
    model = nn.Sequential(nn.Embedding(50, 16), nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 50))
    model = model.to(dtype)
    model[3].weight = nn.Parameter(torch.randn(50, 32, dtype=dtype))
    ids = torch.tensor([1, 7, 49])
    before = model(ids)
    assert pack_linears(model) == 2
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert_same_as_linear(model(ids), before)


def record_calls(monkeypatch) -> list[tuple[int, int, int]]:
    """(in features, out features, rows) of every PackedLinear call from now on."""
    calls = []
    original = PackedLinear.forward

    def record(self, x):
        calls.append((self.in_features, self.out_features, x.shape[0]))
        return original(self, x)

    monkeypatch.setattr(PackedLinear, "forward", record)
    return calls


@pytest.mark.parametrize("dtype", PACKABLE)
def test_warm_up_runs_each_packed_shape_once_per_batch_size(dtype, monkeypatch):
    model = nn.Sequential(nn.Linear(16, 32), nn.Linear(16, 32), nn.Linear(32, 8))
    pack_linears(model.to(dtype))
    calls = record_calls(monkeypatch)
    # no call counts as slow, whatever else the machine is running
    monkeypatch.setattr(packed_linear, "WARM_UP_MAX_CALL_S", float("inf"))
    warm_up(model, [3, 1, 3, 2])
    assert sorted(calls) == sorted((i, o, n) for i, o in [(16, 32), (32, 8)] for n in (1, 2, 3))


@pytest.mark.parametrize("dtype", PACKABLE)
def test_warm_up_runs_a_slow_shape_at_its_first_size_only(dtype, monkeypatch):
    """A call slower than the limit is mostly multiply: warming it at every size costs more
    than the kernel builds it would save."""
    model = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 8))
    pack_linears(model.to(dtype))
    calls = record_calls(monkeypatch)
    monkeypatch.setattr(packed_linear, "WARM_UP_MAX_CALL_S", 0.0)
    warm_up(model, [3, 1, 2])
    assert sorted(calls) == [(16, 32, 1), (32, 8, 1)]
