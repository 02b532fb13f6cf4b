"""The engine's step-cost model, fitted online to its own step records: what a step of `n`
query tokens costs in seconds. Speculation weighs drafts with it (`speculation.py`), and SLO
admission predicts a request's wait and first token with it (`slo.py`).

An exponentially weighted least-squares line of step time on query tokens (older steps weigh
`DECAY` per step, so about the last 20 count), with the mean step time, batch size and drafts
per step beside it, and a draft model's seconds per draft token.
"""

from __future__ import annotations

DECAY = 0.95  # weight of older steps in the fit (~20 steps)


class StepCostFit:
    """The fit (the module docstring says what it holds)."""

    def __init__(self) -> None:
        self.n = self.sx = self.sy = self.sxx = self.sxy = 0.0
        self.mean_seconds = self.mean_seqs = self.mean_drafts = 0.0
        self.drafter_seconds_per_token = 0.0  # 0 without a draft model

    def observe(self, num_tokens: int, num_seqs: int, seconds: float, num_drafts: int = 0) -> None:
        if not num_seqs:
            return
        x, y = float(num_tokens), seconds
        self.n = DECAY * self.n + 1.0
        self.sx, self.sy = DECAY * self.sx + x, DECAY * self.sy + y
        self.sxx, self.sxy = DECAY * self.sxx + x * x, DECAY * self.sxy + x * y
        first = self.mean_seconds == 0.0
        self.mean_seconds = _ewma(self.mean_seconds, seconds, first)
        self.mean_seqs = _ewma(self.mean_seqs, num_seqs, first)
        self.mean_drafts = _ewma(self.mean_drafts, num_drafts, first)

    def observe_drafter(self, seconds: float, num_drafts: int) -> None:
        """A step's draft-model passes, which wrote `num_drafts` drafts in all."""
        if num_drafts:
            per_token = seconds / num_drafts
            first = self.drafter_seconds_per_token == 0.0
            self.drafter_seconds_per_token = _ewma(self.drafter_seconds_per_token, per_token, first)

    @property
    def seconds_per_token(self) -> float | None:
        """The fitted slope, or None while the steps seen vary too little to fit one."""
        var = self.sxx / max(self.n, 1e-9) - (self.sx / max(self.n, 1e-9)) ** 2
        if self.n < 4 or var < 1.0:
            return None
        cov = self.sxy / self.n - (self.sx / self.n) * (self.sy / self.n)
        return max(0.0, cov / var)

    def line(self) -> tuple[float, float] | None:
        """(seconds a step costs at no tokens, seconds per token), or None before any step. While
        the steps seen vary too little to fit a slope, the line goes through the origin and
        their mean."""
        if self.n == 0 or self.sx <= 0:
            return None
        slope = self.seconds_per_token
        mean_x, mean_y = self.sx / self.n, self.sy / self.n
        if slope is None:
            return 0.0, mean_y / mean_x
        return max(0.0, mean_y - slope * mean_x), slope

    def break_even_rate(self) -> float:
        """The acceptance rate above which a draft token pays: its cost (the query token, and
        the draft model's share of its passes) over the batch's time per token without drafts
        (0 while nothing is fitted; infinite where the estimates leave no such time)."""
        per_draft = (self.seconds_per_token or 0.0) + self.drafter_seconds_per_token
        if per_draft == 0.0 or self.mean_seconds <= 0:
            return 0.0
        plain_seconds = self.mean_seconds - per_draft * self.mean_drafts
        if plain_seconds <= 0:
            return float("inf")
        return per_draft * self.mean_seqs / plain_seconds


def _ewma(mean: float, value: float, first: bool) -> float:
    return value if first else DECAY * mean + (1 - DECAY) * value
