"""Cost model: the time of one engine step from what the scheduler put in it.

    memory  = weights (read once per step: of a mixture of experts, those its tokens chose)
              + KV read for every attended context token + KV written for every new token
    compute = 2 FLOPs per linear parameter a token multiplies (its experts alone, in a sparse
              layer) per token + LM head for sampling tokens
              + 4 * layers * heads * head_dim per (query, key) pair of causal attention
    step    = overhead + per-sequence overhead * seqs
              + combine(memory / bandwidth, compute / peak)   (max: roofline; sum: serial)
              + swapped blocks / host link bandwidth
              + all-reduces and the logits' gather (tensor parallelism)

Efficiencies scale bandwidth and peak (1.0 = roofline). Sliding-window models attend to at
most `window` keys per query.

Under tensor parallelism every count is one rank's (`ModelProfile` says how the model splits),
and a step adds what its ranks exchange over the `Link`: two all-reduces per layer (after the
attention's o and after the MLP's down projection) of tokens x hidden activations, each a ring
costing the link's latency plus 2 (TP - 1) / TP of its bytes over the link's bandwidth, and one
all-gather of the sampled rows' float32 logits ((TP - 1) / TP of them). Nothing overlaps the
exchanges with compute, as in an engine that all-reduces between its layers' kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

from inflight.core.outputs import SchedulerOutput
from inflight.model.arch import LlamaArchConfig
from inflight.sim.hardware import HardwareProfile, Link
from inflight.sim.model_profile import ModelProfile


@dataclass(slots=True)
class StepWork:
    """What one step asks of the hardware, before any timing."""

    num_tokens: int = 0
    num_seqs: int = 0
    num_sampled: int = 0
    # context tokens whose K/V are read (once per sequence), and (query, key) pairs attended:
    # per layer, averaged over the layers (fractional where windowed and global layers mix)
    kv_read_tokens: float = 0
    attention_pairs: float = 0
    swapped_blocks: int = 0


@dataclass(slots=True)
class StepCost:
    seconds: float
    weight_bytes: float
    kv_bytes: float
    flops: float
    link_bytes: float = 0.0  # sent by each rank to the others (tensor parallelism)


def step_work(
    out: SchedulerOutput, sliding_window: int | None = None, windowed: float = 1.0
) -> StepWork:
    """`windowed`: the fraction of layers that attend within `sliding_window` (Gemma 3's five
    in six; the rest see every position)."""
    work = StepWork(swapped_blocks=len(out.swap_out) + len(out.swap_in))
    for s in out.scheduled:
        n, start = s.num_tokens, s.start_pos
        work.num_tokens += n
        work.num_seqs += 1
        work.num_sampled += s.sample
        # Query i (0-based in the chunk) attends to keys 0..start+i: start*n + n(n+1)/2 pairs.
        pairs = start * n + n * (n + 1) // 2
        context = start + n
        if sliding_window is not None and context > sliding_window:
            capped_pairs = min(pairs, n * sliding_window)
            capped_context = min(context, sliding_window + n - 1)
            if windowed == 1.0:  # every layer: whole numbers, as they were
                pairs, context = capped_pairs, capped_context
            else:
                pairs += windowed * (capped_pairs - pairs)
                context += windowed * (capped_context - context)
        work.attention_pairs += pairs
        work.kv_read_tokens += context
    return work


def model_step_work(out: SchedulerOutput, arch: LlamaArchConfig) -> StepWork:
    """`step_work` with the model's window over the layers it applies to."""
    return step_work(out, arch.sliding_window, arch.windowed_fraction)


def step_amounts(model: ModelProfile, work: StepWork) -> tuple[float, float, float]:
    """What the step moves and computes on one rank: (weight bytes, KV bytes, FLOPs). A
    state-carrying model's sequences each read and write their state once a step (counted with
    the KV: per-sequence bytes at the memory's rate)."""
    tp = model.tensor_parallel
    weight_bytes = model.step_weight_bytes(work.num_tokens) / tp
    kv_bytes = float((work.kv_read_tokens + work.num_tokens) * model.kv_bytes_per_token)
    kv_bytes += 2.0 * work.num_seqs * model.sequence_state_bytes
    flops = (
        2.0 * model.active_linear_params * work.num_tokens
        + 2.0 * model.head_params * work.num_sampled
        + float(model.attention_flops_per_pair) * work.attention_pairs
    ) / tp
    return weight_bytes, kv_bytes, flops


def require_link(model: ModelProfile, link: Link | None) -> None:
    """Refuses a model split over several ranks with nothing to join them."""
    if model.tensor_parallel > 1 and link is None:
        raise ValueError("tensor parallelism needs a link between its ranks")


def link_time(model: ModelProfile, work: StepWork, link: Link) -> tuple[float, float]:
    """(seconds, bytes each rank sends) of the step's exchanges among its tensor-parallel ranks:
    none on one rank."""
    tp = model.tensor_parallel
    if tp == 1 or not work.num_tokens:
        return 0.0, 0.0
    arch = model.arch
    reduced = work.num_tokens * arch.hidden_size * model.activation_bytes_per_value
    calls = 2 * arch.num_layers
    ring = 2 * (tp - 1) / tp * reduced
    gathered = (tp - 1) / tp * work.num_sampled * arch.vocab_size * 4
    sent = calls * ring + gathered
    gathers = 1 if work.num_sampled else 0
    return (calls + gathers) * link.latency_s + sent / link.bandwidth, sent


class CostModel:
    def __init__(
        self, hardware: HardwareProfile, model: ModelProfile, block_size: int,
        link: Link | None = None,
        page_bytes_per_token: int = 0,
    ) -> None:  # fmt: skip
        """`link`: what joins the model's tensor-parallel ranks (needed when it has several);
        `page_bytes_per_token`: a pool page's, where KV groups make it less than a token's."""
        require_link(model, link)
        self.hw = hardware
        self.model = model
        self.link = link
        self.block_bytes = (page_bytes_per_token or model.kv_bytes_per_token) * block_size
        self.peak = hardware.peak_flops(model.compute_dtype)

    def cost(self, work: StepWork) -> StepCost:
        hw = self.hw
        weight_bytes, kv_bytes, flops = step_amounts(self.model, work)
        memory_s = weight_bytes / (hw.memory_bw * hw.weight_bw_efficiency) + kv_bytes / (
            hw.memory_bw * hw.kv_bw_efficiency
        )
        compute_s = flops / (self.peak * hw.compute_efficiency)
        device_s = max(memory_s, compute_s) if hw.combine == "max" else memory_s + compute_s
        link_s, link_bytes = link_time(self.model, work, self.link) if self.link else (0.0, 0.0)
        seconds = (
            hw.step_overhead_s
            + hw.seq_overhead_s * work.num_seqs
            + device_s
            + work.swapped_blocks * self.block_bytes / hw.host_link_bw
            + link_s
        )
        return StepCost(seconds, weight_bytes, kv_bytes, flops, link_bytes)

    def step_cost(self, out: SchedulerOutput) -> StepCost:
        return self.cost(model_step_work(out, self.model.arch))


class LineCost:
    """A step's seconds as a line in its tokens and sequences, fitted to an engine run's own
    steps (`fit_line`): the simulator's cost where a run of the same engine on this machine is
    at hand, with no roofline terms (it counts no bytes or FLOPs)."""

    peak = 1.0  # utilizations read 0: nothing is counted

    def __init__(self, base_s: float, per_token_s: float, per_seq_s: float) -> None:
        self.base_s, self.per_token_s, self.per_seq_s = base_s, per_token_s, per_seq_s

    def step_cost(self, out: SchedulerOutput) -> StepCost:
        seconds = (self.base_s + self.per_token_s * out.num_batched_tokens
                   + self.per_seq_s * len(out.scheduled))  # fmt: skip
        return StepCost(seconds, 0.0, 0.0, 0.0)
