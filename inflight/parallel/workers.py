"""Ranks 1..N-1 of a tensor-parallel engine: processes on this machine (`ProcessRanks`), or Ray
actors placed across a cluster's nodes (`ray_ranks.py`).

Rank 0 is the engine: it schedules, samples and runs its own slice of the model. Before each of
its forward passes it hands the step's scheduled requests to every other rank over a pipe (the
pipe, not a collective, so that an idle engine waits on nothing that times out), and each rank
builds the same step inputs and runs its slice; their all-reduces meet inside the layers, and
the LM head's slices are gathered on rank 0 (`model/llama.py`). Swaps go the same way, so every
rank's share of a block moves with it. A rank that fails exits; rank 0's next collective or
message then fails with ModelFailedError naming it, and the engine stops. Every rank, however
started, runs `run_rank`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pickle
import secrets
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, answer_challenge, deliver_challenge
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from inflight.core.kv_groups import KVLayout
from inflight.core.outputs import ScheduledRequest
from inflight.errors import ModelFailedError
from inflight.parallel.group import TPGroup
from inflight.parallel.shm import SHM_DIR, segment_bytes, shared_memory_usable
from inflight.process_setup import skip_teardown_at_exit

if TYPE_CHECKING:
    from inflight.attention import AttentionBackend
    from inflight.model.llama import LlamaModel

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"
START_TIMEOUT_S = 120.0  # for a rank's process to start (imports) and report
STOP_GRACE_S = 5.0  # for a rank told to stop to exit before it is killed


@dataclass(frozen=True)
class RankSpec:
    """What every rank loads and how: the same for all of them."""

    path: str
    dtype: torch.dtype
    device: str
    block_size: int
    attention_backend: str
    quantized_activations: str
    threads: int  # each rank's compute threads


@dataclass(frozen=True)
class KVSetup:
    """Rank 0's KV plan, which every rank's share of the pool follows block for block."""

    num_blocks: int
    num_cpu_blocks: int
    kv_dtype: torch.dtype
    layout: KVLayout | None
    max_model_len: int  # (LongRoPE's factors are chosen by it)
    conv_slots: int = 0  # the convolution state's slots (LFM2's: `max_num_seqs`), or none
    conv_snapshots: int = 0  # its rows of states saved for prefix-cache hits
    conv_drafts: int = 0  # its draft rows a slot (the states after a speculating step's tokens)


def threads_per_rank(size: int) -> int:
    """The machine's cores shared out between the ranks, one at least."""
    return max(1, (os.cpu_count() or 1) // size)


class RankLauncher(Protocol):
    """How ranks 1..N-1 start and end, and how rank 0 learns that one has died."""

    host: str  # the address every rank reaches rank 0 at
    same_machine: bool  # every rank runs on rank 0's machine (all-reduces through /dev/shm)

    def start(self, rank: int, args: RankArgs) -> None: ...

    def dead_rank(self) -> str | None: ...

    def peak_rss_bytes(self) -> list[int]: ...

    def stop(self) -> None:
        """Lets the ranks exit on their own, and ends those that do not (in the background)."""
        ...


@dataclass(frozen=True)
class RankArgs:
    """What a rank other than 0 is started with."""

    size: int
    host: str  # rank 0's
    address_port: int  # rank 0's socket, which the rank dials with `authkey`
    group_port: int  # the collectives' TCP store
    spec: RankSpec
    authkey: bytes
    shm_path: str | None  # the all-reduces' file, where the ranks share a machine


class RankWorkers:
    """Rank 0's side: starts the other ranks, connects the group, hands them the steps.

    Each rank dials back to rank 0 on a socket that answers only with this engine's key."""

    def __init__(self, spec: RankSpec, size: int, launcher: RankLauncher | None = None) -> None:
        """Starts the ranks (`ProcessRanks` by default), which load their slices while this
        rank loads its own; `connect` then joins them."""
        self.size = size
        self.launcher = launcher or ProcessRanks()
        host = self.launcher.host
        self.group = TPGroup(0, size, host, 0)
        self._authkey = secrets.token_bytes(32)
        self._server = socket.create_server((host, 0))
        self._server.settimeout(1.0)
        # all-reduces through a file of /dev/shm, which every rank maps before it dials back
        self._shm_path: Path | None = None
        if self.launcher.same_machine and shared_memory_usable():
            self._shm_path = SHM_DIR / f"inflight-tp-{os.getpid()}-{secrets.token_hex(8)}"
            with self._shm_path.open("wb") as f:
                f.truncate(segment_bytes(size))
            self.group.use_shared_memory(self._shm_path)
        shm = None if self._shm_path is None else str(self._shm_path)
        args = RankArgs(size, host, self._server.getsockname()[1], self.group.port, spec,
                        self._authkey, shm)  # fmt: skip
        self._conns: list[Connection | None] = [None] * (size - 1)
        self._finalizer = weakref.finalize(self, _stop, self._conns, self.launcher, self._server,
                                           self._shm_path)  # fmt: skip
        for rank in range(1, size):
            self.launcher.start(rank, args)
        self.group.explain_failure = self.dead_rank

    def connect(self) -> None:
        """Waits for every rank to dial back with its slice loaded, and joins the group."""
        try:
            self._accept(self._server, self._authkey)
        finally:
            self._server.close()
        self.group.connect()
        if self._shm_path is not None:  # mapped by every rank: the name can go
            self._shm_path.unlink(missing_ok=True)

    def _accept(self, server: socket.socket, authkey: bytes) -> None:
        """Each rank's connection, by the rank it names (or the error its load raised)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all(self._conns):
            if why := self.dead_rank():
                raise ModelFailedError(f"tensor-parallel {why} while starting")
            if time.monotonic() > deadline:
                raise ModelFailedError(f"tensor-parallel ranks did not start within "
                                       f"{START_TIMEOUT_S:g} s")  # fmt: skip
            try:
                sock, _ = server.accept()
            except TimeoutError:
                continue
            sock.setblocking(True)
            conn = Connection(sock.detach())
            try:
                deliver_challenge(conn, authkey)
                answer_challenge(conn, authkey)
                rank, error = conn.recv()
            except (OSError, EOFError, AuthenticationError):
                conn.close()  # not one of ours
                continue
            if error is not None:
                conn.close()
                raise ModelFailedError(f"tensor-parallel rank {rank}: {error}")
            self._conns[rank - 1] = conn

    def dead_rank(self) -> str | None:
        """Which rank has ended, and how, if one has."""
        return self.launcher.dead_rank()

    def peak_rss_bytes(self) -> list[int]:
        """Each other rank's peak resident memory (0 where it cannot be read)."""
        return self.launcher.peak_rss_bytes()

    def setup(self, kv: KVSetup) -> None:
        """Each rank builds its share of the pool, once its weights are in."""
        self._send(("setup", kv))
        for rank in range(1, self.size):
            self._receive(rank, "ready")

    def forward(self, scheduled: list[ScheduledRequest], **build: Any) -> None:
        """Every other rank runs this step's forward pass (`build_step_inputs`'s options)."""
        # the grammar is rank 0's business (it masks the logits); matchers do not pickle
        plain = [dataclasses.replace(s, grammar=None) if s.grammar is not None else s
                 for s in scheduled]  # fmt: skip
        self._send(("forward", plain, build))

    def swap(self, swap_out: Any, swap_in: Any, states: Any) -> None:
        """Every other rank copies the KV blocks, and keeps the drafts, stashes or drops its
        share of the convolution states (`ConvState.mirror`), as rank 0 did."""
        self._send(("swap", swap_out, swap_in, states))

    def close(self) -> None:
        self._finalizer()

    def _send(self, message: tuple) -> None:
        for conn in self._conns:
            try:
                assert conn is not None
                conn.send(message)
            except OSError as e:  # (BrokenPipeError among them)
                raise ModelFailedError(f"tensor-parallel {self.dead_rank() or e}") from e

    def _receive(self, rank: int, expected: str) -> None:
        """Waits for rank `rank`'s `expected` report, watching that its process lives."""
        conn = self._conns[rank - 1]
        assert conn is not None
        while not conn.poll(1.0):
            if why := self.dead_rank():
                raise ModelFailedError(f"tensor-parallel {why}")
        try:
            kind, *detail = conn.recv()
        except EOFError as e:
            raise ModelFailedError(f"tensor-parallel rank {rank} closed its connection") from e
        if kind == "error":
            raise ModelFailedError(f"tensor-parallel rank {rank}: {detail[0]}")
        assert kind == expected, (kind, expected)


def _stop(
    conns: list[Connection | None], launcher: RankLauncher, server: socket.socket,
    shm_path: Path | None,
) -> None:  # fmt: skip
    """Tells every rank to stop and lets them exit on their own (an interpreter's teardown
    takes about a second); the launcher ends those that do not."""
    server.close()
    if shm_path is not None:
        shm_path.unlink(missing_ok=True)
    for conn in conns:
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.send(("stop",))
            conn.close()
    launcher.stop()


class ProcessRanks:
    """Ranks as `python -m inflight.parallel.workers` on this machine, not multiprocessing
    children: a spawned child would run the caller's script again (an unguarded `LLM(...)` at
    its top level)."""

    host = HOST
    same_machine = True

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen] = []

    def start(self, rank: int, args: RankArgs) -> None:
        env = {**os.environ, "INFLIGHT_TP_ARGS": pickle.dumps(args).hex()}
        command = [sys.executable, "-m", "inflight.parallel.workers", str(rank)]
        self._procs.append(subprocess.Popen(command, env=env))

    def dead_rank(self) -> str | None:
        for rank, proc in enumerate(self._procs, start=1):
            if proc.poll() is not None:
                return f"rank {rank} (pid {proc.pid}) exited with code {proc.returncode}"
        return None

    def peak_rss_bytes(self) -> list[int]:
        return [peak_rss_bytes(proc.pid) for proc in self._procs]

    def stop(self) -> None:
        def reap() -> None:
            for proc in self._procs:
                try:
                    proc.wait(timeout=STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

        threading.Thread(target=reap, name="inflight-tp-reaper", daemon=True).start()


def peak_rss_bytes(pid: int) -> int:
    """A process's peak resident memory (Linux; 0 where it cannot be read)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        kib = next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return 0
    return int(kib) * 1024


class RankFailedError(Exception):
    """A rank other than 0 could not load its slice, or failed while running (logged)."""


def run_rank(rank: int, args: RankArgs, rank0_gone: Callable[[], bool] = lambda: False) -> None:
    """A rank other than 0: loads its slice, dials rank 0, builds its share of the pool, then
    runs the steps rank 0 hands it until told to stop or rank 0 is gone (returns), or fails
    (RankFailedError, after telling rank 0 why)."""
    spec = args.spec
    torch.set_num_threads(spec.threads)
    group = TPGroup(rank, args.size, args.host, args.group_port)
    if args.shm_path is not None:
        group.use_shared_memory(Path(args.shm_path))
    group.explain_failure = lambda: "rank 0 is gone" if rank0_gone() else None
    address = (args.host, args.address_port)
    try:
        model = _load_slice(spec, group)
    except Exception as e:  # told to rank 0, which names it
        logger.exception("rank %d could not load its slice", rank)
        Client(address, authkey=args.authkey).send((rank, f"{type(e).__name__}: {e}"))
        raise RankFailedError(f"rank {rank} could not load its slice: {e}") from e
    conn = Client(address, authkey=args.authkey)
    conn.send((rank, None))
    group.connect()
    try:
        rank_loop(spec, model, conn)
    except (EOFError, KeyboardInterrupt):  # the engine is gone, or stopping with its Ctrl-C
        pass
    except Exception as e:
        logger.exception("rank %d failed", rank)
        with contextlib.suppress(OSError):
            conn.send(("error", f"{type(e).__name__}: {e}"))
        raise RankFailedError(f"rank {rank} failed: {type(e).__name__}: {e}") from e


def worker_main(rank: int) -> None:
    """`python -m inflight.parallel.workers RANK`, its `RankArgs` in the environment."""
    log_format = f"%(asctime)s rank {rank} %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=logging.INFO, format=log_format)
    args: RankArgs = pickle.loads(bytes.fromhex(os.environ.pop("INFLIGHT_TP_ARGS")))
    skip_teardown_at_exit()
    parent = os.getppid()
    try:
        run_rank(rank, args, lambda: os.getppid() != parent)
    except RankFailedError as e:
        raise SystemExit(1) from e


def _load_slice(spec: RankSpec, group: TPGroup) -> LlamaModel:
    from inflight.model.loader import load_model

    # (rank 0 warns where quantized activations were asked for and have no effect)
    loaded = load_model(Path(spec.path), spec.dtype, torch.device(spec.device),
                        spec.block_size, spec.attention_backend, spec.quantized_activations,
                        tp=group, warn_unused=False)  # fmt: skip
    return loaded.model


def rank_loop(spec: RankSpec, model: LlamaModel, conn: Connection) -> None:
    """Builds the rank's share of the pool as rank 0 planned it, then runs what it is handed."""
    from inflight.runner.conv_state import ConvState
    from inflight.runner.kv_cache import KVCache
    from inflight.runner.step_inputs import build_step_inputs, kv_group_args

    device = torch.device(spec.device)
    kind, kv = conn.recv()
    assert kind == "setup"
    model.fit_rope_to(kv.max_model_len)
    attn: AttentionBackend = model.layers[0].attn
    cache = KVCache(model.cfg, attn, kv.num_blocks, kv.kv_dtype, device, kv.num_cpu_blocks,
                    scratch_block=True, layout=kv.layout)  # fmt: skip
    layer_groups, null_block = kv_group_args(kv.layout, cache)
    conv_state = None
    if kv.conv_slots:  # its share of every channel, in the slots rank 0 assigns
        conv_state = ConvState.for_model(model.cfg, kv.conv_slots, model.norm.weight.dtype,
                                         device, kv.conv_snapshots, kv.conv_drafts)  # fmt: skip
    conn.send(("ready",))
    while True:
        kind, *args = conn.recv()
        if kind == "stop":
            return
        if kind == "swap":
            swap_out, swap_in, states = args
            cache.swap(swap_out, swap_in)
            if conv_state is not None:
                conv_state.mirror(*states)
        elif kind == "forward":
            scheduled, build = args
            conv_rows = build.pop("conv_rows", None)
            inputs = build_step_inputs(scheduled, spec.block_size, attn, device,
                                       layer_groups=layer_groups, null_block=null_block,
                                       **build)  # fmt: skip
            conv = {}
            if conv_state is not None and conv_rows is not None:
                conv_state.mirror_step_copies(scheduled, conv_rows[1])
                conv["conv_step"] = conv_state.at_rows(conv_rows, inputs.query_start_loc)
            with torch.inference_mode():
                model(inputs.input_ids, inputs.positions, cache.layers, inputs.attn_metadata,
                      inputs.logits_indices, inputs.layer_metadata, **conv)  # fmt: skip


if __name__ == "__main__":
    worker_main(int(sys.argv[1]))
