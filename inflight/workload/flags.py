"""The flags that choose a workload, and the help format, shared by `inflight bench` and
`inflight simulate`."""

from __future__ import annotations

import argparse
from pathlib import Path

from inflight.workload.requests import NAMED


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each flag's help ends with its default, unless the help already says it ("default:")
    or there is none to say (None: the help explains what being unset means)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or "default:" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def add_workload_flags(parser: argparse.ArgumentParser) -> None:
    named_list = ", ".join(NAMED)
    parser.add_argument("--workload", default="mixed64",
                        help=f"named ({named_list}) or JSONL file (default: mixed64)")  # fmt: skip
    parser.add_argument("--num-requests", type=int, default=None,
                        help="override the named workload's request count")  # fmt: skip
    parser.add_argument("--workload-seed", type=int, default=0, help="(default: 0)")
    parser.add_argument("--arrival", choices=("all", "poisson", "gamma"), default="all",
                        help="(default: all at once)")  # fmt: skip
    parser.add_argument("--rate", type=float, default=4.0,
                        help="mean requests/s when not 'all' (default: 4)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None,
                        help="results folder (default: results/bench-COMMAND-TIME)")  # fmt: skip
