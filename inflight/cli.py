"""`inflight` command line: generate, serve, doctor, bench, simulate. Every engine knob becomes
a flag, generated from `inflight.config`, so flags, `LLM(**knobs)` keywords and documented
defaults can never disagree.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import types
import typing
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from inflight.config import knob_fields
from inflight.routing import ROUTERS

if TYPE_CHECKING:
    from inflight.server.api_server import ServerConfig

logger = logging.getLogger("inflight")

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "KI": 2**10, "MI": 2**20, "GI": 2**30}


def parse_bytes(text: str) -> int:
    """'2GiB', '512MiB', '1.5GB' or a plain integer -> bytes."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 2GiB or 536870912)")
    unit = (match.group(2) or "").upper().removesuffix("B")
    return int(float(match.group(1)) * _UNITS[unit])


def _flag_type(hint: Any) -> tuple[Any, list[str] | None]:
    """Maps a knob's type hint to an argparse type and choices."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = args[0]
        args = list(typing.get_args(hint))
    if typing.get_origin(hint) is typing.Literal:
        return str, list(args)
    return hint, None


def add_knob_flags(parser: argparse.ArgumentParser, skip: Collection[str] = ()) -> None:
    """Every knob as a flag, except those named in `skip`."""
    group = parser.add_argument_group("engine knobs")
    for owner, field in knob_fields():
        if field.name in skip or not field.metadata.get("flag", True):
            continue
        hint = typing.get_type_hints(owner)[field.name]
        kind, choices = _flag_type(hint)
        if field.name == "kv_cache_memory_bytes":
            kind = parse_bytes
        if kind is bool:
            group.add_argument(
                "--" + field.name.replace("_", "-"), dest=field.name,
                action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                help=field.metadata.get("help", "") + f" (default: {field.default})",
            )  # fmt: skip
            continue
        # A None default is explained by the knob's own help text.
        shown = "" if field.default is None else f" (default: {field.default})"
        group.add_argument(
            "--" + field.name.replace("_", "-"),
            dest=field.name,
            type=kind,
            choices=choices,
            default=argparse.SUPPRESS,
            help=field.metadata.get("help", "") + shown,
        )


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    """The MODEL positional and every engine knob as a flag."""
    parser.add_argument(
        "model_path",
        nargs="?",
        default=None,
        metavar="MODEL",
        help="HF model folder or GGUF file (default: SmolLM2-135M-Instruct)",
    )
    add_knob_flags(parser)


def knobs_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The knobs given as flags; MODEL (positional) fills `model` unless --model was given."""
    knobs = {f.name: getattr(args, f.name) for _, f in knob_fields() if hasattr(args, f.name)}
    knobs.setdefault("model", getattr(args, "model_path", None))
    return knobs


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inflight", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser(
        "generate",
        help="generate text offline for one or more prompts",
    )
    gen.add_argument(
        "--prompt", action="append", required=True, help="a prompt; repeat the flag for a batch"
    )
    gen.add_argument(
        "--chat",
        action="store_true",
        help="send each prompt as a user message through the chat template",
    )
    gen.add_argument("--max-tokens", type=int, default=64, help="(default: 64)")
    gen.add_argument("--temperature", type=float, default=0.0, help="(default: 0, greedy)")
    gen.add_argument("--top-p", type=float, default=1.0, help="(default: 1.0)")
    gen.add_argument("--top-k", type=int, default=0, help="(default: 0, off)")
    gen.add_argument("--sampling-seed", type=int, default=None, help="per-request seed")
    gen.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    gen.add_argument("--ignore-eos", action="store_true")
    add_engine_flags(gen)

    serve = sub.add_parser(
        "serve",
        help="serve an OpenAI-compatible HTTP API",
    )
    serve.add_argument("--host", default="127.0.0.1", help="(default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="(default: 8000)")
    serve.add_argument(
        "--api-key",
        default=os.environ.get("INFLIGHT_API_KEY"),
        help="require 'Authorization: Bearer KEY' (or set INFLIGHT_API_KEY)",
    )
    serve.add_argument(
        "--served-model-name",
        default=None,
        help="the model id clients send (default: the model file/folder name)",
    )
    serve.add_argument(
        "--tool-call-parser",
        default="auto",
        choices=["auto", "hermes", "llama3_json", "mistral", "pythonic"],
        help="the format the model writes tool calls in (tool_choice auto); auto: the one its "
        "chat template asks for (default: auto)",
    )
    serve.add_argument(
        "--reasoning-parser",
        default="auto",
        choices=["auto", "think", "none"],
        help="think: a <think> block returned as reasoning_content apart from content; auto: "
        "where the chat template has one (default: auto)",
    )
    serve.add_argument(
        "--max-queued-requests",
        type=int,
        default=None,
        help="waiting requests beyond which new ones get 429 (default: no limit)",
    )
    serve.add_argument(
        "--request-timeout",
        type=float,
        default=None,
        help="seconds before a request is aborted (default: no limit)",
    )
    serve.add_argument(
        "--max-body-bytes",
        type=parse_bytes,
        default=8 * 2**20,
        help="larger request bodies get 413 (default: 8MiB)",
    )
    serve.add_argument(
        "--allowed-hosts",
        nargs="+",
        default=None,
        metavar="HOST",
        help="Host header names accepted, '*' for any (default: any with "
        "--api-key or a non-loopback --host, else loopback names only)",
    )
    serve.add_argument(
        "--allowed-origins",
        nargs="+",
        default=None,
        metavar="ORIGIN",
        help="origins whose browsers may call the API (CORS), '*' for any (default: none)",
    )
    serve.add_argument(
        "--allow-unknown-fields",
        action="store_true",
        help="accept request fields OpenAI does not define (default: a 400 naming the field)",
    )
    serve.add_argument(
        "--read-timeout",
        type=float,
        default=10.0,
        help="seconds a client may take to send a request's head and body together, "
        "after which it gets 408 and the connection is closed (default: 10)",
    )
    serve.add_argument("--max-connections", type=int, default=1000,
                       help="open connections; past it a new one gets 503 and is closed at "
                            "once (default: 1000)")  # fmt: skip
    serve.add_argument("--max-header-bytes", type=int, default=32 * 1024,
                       help="a request's line and header fields in bytes, past which it gets "
                            "431 (default: 32768)")  # fmt: skip
    serve.add_argument("--max-headers", type=int, default=100,
                       help="header fields a request may carry, past which it gets 431 "
                            "(default: 100)")  # fmt: skip
    serve.add_argument("--shutdown-timeout", type=float, default=30.0,
                       help="on SIGTERM, seconds in-flight requests get to finish before they "
                            "are aborted (default: 30)")  # fmt: skip
    serve.add_argument("--api-keys-file", default=None,
                       help="API keys, one per line: KEY TENANT [WEIGHT]; each request belongs "
                            "to its key's tenant, whose weight is its share under "
                            "--scheduling-policy fair (default weight: 1)")  # fmt: skip
    serve.add_argument("--tenant-header", action="store_true",
                       help="trust a request's x-tenant header to name its tenant (where its "
                            "key names none)")  # fmt: skip
    serve.add_argument("--tenant-from-user", action="store_true",
                       help="a request's body field `user` names its tenant (where neither key "
                            "nor trusted header does)")  # fmt: skip
    serve.add_argument("--replicas", type=int, default=1,
                       help="engine replicas behind one endpoint, on Ray Serve (default: 1, "
                            "one process without Ray)")  # fmt: skip
    serve.add_argument("--router", default="prefix-aware",
                       choices=ROUTERS,
                       help="how --replicas share requests (default: prefix-aware)")  # fmt: skip
    serve.add_argument(
        "--ray-address",
        default=None,
        help="a Ray cluster to join, serving through Ray Serve (default: start Ray on this "
        "machine, where --replicas or --distributed-executor-backend ray asks for it)",
    )
    add_engine_flags(serve)

    doctor = sub.add_parser(
        "doctor", help="read a running server's /metrics for a while and print what to change"
    )
    doctor.add_argument("url", help="the server's base URL, e.g. http://127.0.0.1:8000")
    doctor.add_argument(
        "--window", type=float, default=30.0, help="seconds of metrics to read (default: 30)"
    )
    doctor.add_argument("--api-key", default=os.environ.get("INFLIGHT_API_KEY"))
    doctor.add_argument("--json", action="store_true", help="the report as JSON")  # fmt: skip

    from inflight.bench.parser import add_bench_parser

    add_bench_parser(sub, add_engine_flags)
    from inflight.sim.cli import add_simulate_parser

    add_simulate_parser(sub, add_engine_flags, add_knob_flags)
    return parser


def server_config(args: argparse.Namespace) -> ServerConfig:
    from inflight.server.api_server import ServerConfig

    return ServerConfig(
        host=args.host, port=args.port, api_key=args.api_key,
        served_model_name=args.served_model_name, max_body_bytes=args.max_body_bytes,
        allowed_hosts=args.allowed_hosts, read_timeout=args.read_timeout,
        max_connections=args.max_connections, max_header_bytes=args.max_header_bytes,
        max_headers=args.max_headers,
        shutdown_timeout=args.shutdown_timeout, tool_call_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser, allow_unknown_fields=args.allow_unknown_fields,
        allowed_origins=args.allowed_origins, api_keys_file=args.api_keys_file,
        tenant_header=args.tenant_header, tenant_from_user=args.tenant_from_user,
    )  # fmt: skip


def run_serve(args: argparse.Namespace) -> int:
    from inflight import InflightError
    from inflight.engine.async_engine import AsyncLLM
    from inflight.server.api_server import build_app
    from inflight.server.http_server import serve

    knobs = knobs_from_args(args)
    try:
        config = server_config(args)
    except (ValueError, OSError) as e:
        logger.error("%s", e)
        return 2
    if config.tenancy.weights:  # the keys file's weights are `fair` scheduling's
        knobs["tenant_weights"] = tuple(config.tenancy.weights.items())
    if args.replicas < 1:
        logger.error("--replicas must be >= 1, got %d", args.replicas)
        return 2
    on_ray = knobs.get("distributed_executor_backend") == "ray"
    if args.replicas > 1 or args.ray_address or on_ray:  # Ray Serve: replicas, or Ray ranks
        from inflight.server.fleet.deploy import deploy

        try:
            deploy(knobs, config, args.replicas, args.router, args.ray_address,
                   args.max_queued_requests, args.request_timeout)  # fmt: skip
        except InflightError as e:
            logger.error("%s", e)
            return 2
        return 0
    try:
        engine = AsyncLLM(
            max_queued_requests=args.max_queued_requests,
            request_timeout=args.request_timeout,
            **knobs,
        )
    except InflightError as e:
        logger.error("%s", e)
        return 2
    serve(build_app(engine, config), engine, config)
    logger.info("server stopped")
    return 0


def run_doctor(args: argparse.Namespace) -> int:
    """Scrapes `/metrics` once a second for `--window` seconds, then runs the doctor's rules."""
    import json
    import time

    import httpx

    from inflight.metrics.doctor import History, format_hints

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    history = History(seconds=args.window)
    url = args.url.rstrip("/") + "/metrics"
    start = time.monotonic()
    try:
        while True:
            now = time.monotonic()
            response = httpx.get(url, headers=headers, timeout=10)
            response.raise_for_status()
            history.take(now, response.text)
            if now - start >= args.window:
                break
            time.sleep(1)
    except httpx.HTTPError as e:
        logger.error("cannot read %s: %s", url, e)
        return 2
    report = history.report()
    print(json.dumps(report, indent=1) if args.json else format_hints(report))
    return 0


def run_generate(args: argparse.Namespace) -> int:
    from inflight import LLM, InflightError, SamplingParams

    try:
        params = SamplingParams(
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            max_tokens=args.max_tokens,
            seed=args.sampling_seed,
            stop=args.stop,
            ignore_eos=args.ignore_eos,
        )
        llm = LLM(**knobs_from_args(args))
        if args.chat:
            conversations = [[{"role": "user", "content": p}] for p in args.prompt]
            outputs = llm.chat(conversations, params)
        else:
            outputs = llm.generate(args.prompt, params)
    except InflightError as e:
        logger.error("%s", e)
        return 2
    for prompt, out in zip(args.prompt, outputs, strict=True):
        completion = out.outputs[0]
        if len(outputs) > 1:
            print(f"### {prompt}")
        print(completion.text)
        m = out.metrics
        logger.info(
            "request %s: %d prompt + %d output tokens, finish=%s, ttft=%.3fs, e2e=%.3fs",
            out.request_id,
            len(out.prompt_token_ids),
            len(completion.token_ids),
            completion.finish_reason,
            m.ttft or 0.0,
            m.e2e_latency or 0.0,
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # A process of its own restarts under tcmalloc before the parser is built: building it
    # imports torch and transformers (~5 s), which the restarted process would import again.
    if argv is None and sys.argv[1:2] in (["serve"], ["bench"]):
        from inflight.process_setup import restart_with_tcmalloc

        restart_with_tcmalloc([sys.executable, "-m", "inflight", *sys.argv[1:]])
    args = build_parser().parse_args(argv)
    from inflight.process_setup import skip_teardown_at_exit

    skip_teardown_at_exit()
    if args.command == "generate":
        return run_generate(args)
    if args.command == "serve":
        return run_serve(args)
    if args.command == "doctor":
        return run_doctor(args)
    if args.command == "bench":
        from inflight.bench.cli import run_bench

        return run_bench(args, knobs_from_args(args))
    if args.command == "simulate":
        from inflight.sim.cli import run_simulate

        return run_simulate(args, knobs_from_args(args))
    return 1


if __name__ == "__main__":
    sys.exit(main())
