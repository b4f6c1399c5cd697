"""The portable llama-server: ``python -m opod.engines.xllama <llama-server flags>``.

``xllamacpp`` ships llama.cpp's own HTTP server (``/health``, ``/metrics``,
``/props``, ``/slots``, ``/tokenize``, ``/v1/*``) built for AVX2, but it is
configured through ``CommonParams`` fields rather than llama-server's flags.
This launcher accepts the subset of llama-server flags opod's driver emits
(and a few common ones), maps them onto ``CommonParams``, serves until SIGTERM
or SIGINT, and stops the server cleanly. A flag outside that subset is refused
by name, so a plan's ``extra`` never silently does nothing.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

EXIT_USAGE = 2
POOLING = ("none", "mean", "cls", "last", "rank")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's default prints usage; say what to do instead
        sys.stderr.write(f"opod.engines.xllama: {message}\n")
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m opod.engines.xllama",
        allow_abbrev=False,
        add_help=True,
        description="llama.cpp's server from xllamacpp, taking a subset of llama-server's flags.",
    )
    p.add_argument(
        "--list-devices",
        action="store_true",
        help="List the devices llama.cpp can use, as llama-server does, and exit.",
    )
    p.add_argument("-m", "--model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("-a", "--alias")
    p.add_argument("-c", "--ctx-size", type=int)
    p.add_argument("-np", "--parallel", type=int)
    p.add_argument("-t", "--threads", type=int)
    p.add_argument("-tb", "--threads-batch", type=int)
    p.add_argument("--threads-http", type=int)
    p.add_argument("-b", "--batch-size", type=int)
    p.add_argument("-ub", "--ubatch-size", type=int)
    p.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="gpu_layers")
    p.add_argument("-ctk", "--cache-type-k")
    p.add_argument("-ctv", "--cache-type-v")
    p.add_argument("--metrics", action="store_true")
    p.add_argument("--props", action="store_true")
    p.add_argument("--slots", dest="slots", action="store_true", default=None)
    p.add_argument("--no-slots", dest="slots", action="store_false")
    p.add_argument("--embedding", "--embeddings", dest="embedding", action="store_true")
    p.add_argument("--rerank", "--reranking", dest="rerank", action="store_true")
    p.add_argument("--pooling", choices=POOLING)
    p.add_argument("--jinja", dest="jinja", action="store_true", default=None)
    p.add_argument("--no-jinja", dest="jinja", action="store_false")
    p.add_argument("--chat-template")
    p.add_argument("--webui", "--ui", dest="ui", action="store_true", default=None)
    p.add_argument("--no-webui", "--no-ui", dest="ui", action="store_false")
    p.add_argument("--slot-save-path")
    p.add_argument("--cache-reuse", type=int)
    p.add_argument("-kvu", "--kv-unified", dest="kv_unified", action="store_true", default=None)
    p.add_argument("--api-key")
    p.add_argument("-to", "--timeout", type=int)
    return p


def device_list(devices: list[dict[str, Any]]) -> str:
    """``llama-server --list-devices``'s text for xllamacpp's devices: the accelerators, the CPU left out."""
    lines, mib = ["Available devices:"], 1 << 20
    for d in devices:
        if str(d.get("type", "")).endswith("_CPU") or d.get("name") == "CPU":
            continue
        lines.append(
            f"  {d.get('name', '?')}: {d.get('description', '')} ({d.get('memory_total', 0) // mib} MiB, {d.get('memory_free', 0) // mib} MiB free)"
        )
    return "\n".join(lines if len(lines) > 1 else [*lines, "  (none)"])


def _ggml_type(xlc: Any, flag: str, name: str) -> Any:
    member = getattr(xlc.ggml_type, "GGML_TYPE_" + name.upper(), None)
    if member is None:
        raise ValueError(f"{flag} {name!r} is not a ggml type (f16, q8_0, q4_0…)")
    return member


def _gpu_layers(value: str) -> int:
    if value == "auto":
        return -1
    if value == "all":
        return 999
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"--gpu-layers {value!r} is not a number, 'auto' or 'all'") from None


def to_params(args: argparse.Namespace, xlc: Any) -> Any:
    """``CommonParams`` for parsed llama-server flags."""
    p = xlc.CommonParams()
    p.model.path = args.model
    p.hostnames = [args.host]
    p.port = args.port
    if args.alias:
        p.model_alias = {a for a in args.alias.split(",") if a}
    simple = {
        "ctx_size": "n_ctx",
        "parallel": "n_parallel",
        "threads_http": "n_threads_http",
        "batch_size": "n_batch",
        "ubatch_size": "n_ubatch",
        "chat_template": "chat_template",
        "slot_save_path": "slot_save_path",
        "cache_reuse": "n_cache_reuse",
        "jinja": "use_jinja",
        "ui": "ui",
        "slots": "endpoint_slots",
        "kv_unified": "kv_unified",
        "timeout": "timeout_read",
    }
    for arg, attr in simple.items():
        value = getattr(args, arg)
        if value is not None:
            setattr(p, attr, value)
    if args.timeout is not None:
        p.timeout_write = args.timeout
    if args.threads is not None:
        p.cpuparams.n_threads = args.threads
        p.cpuparams_batch.n_threads = args.threads
    if args.threads_batch is not None:
        p.cpuparams_batch.n_threads = args.threads_batch
    if args.gpu_layers is not None:
        p.n_gpu_layers = _gpu_layers(args.gpu_layers)
    if args.cache_type_k:
        p.cache_type_k = _ggml_type(xlc, "--cache-type-k", args.cache_type_k)
    if args.cache_type_v:
        p.cache_type_v = _ggml_type(xlc, "--cache-type-v", args.cache_type_v)
    p.endpoint_metrics = bool(args.metrics)
    p.endpoint_props = bool(args.props)
    if args.embedding or args.rerank:
        p.embedding = True
    pooling = "rank" if args.rerank else args.pooling
    if pooling:
        p.pooling_type = getattr(xlc.llama_pooling_type, "LLAMA_POOLING_TYPE_" + pooling.upper())
    if args.api_key:
        p.api_keys = [k for k in args.api_key.split(",") if k]
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        sys.stderr.write(
            f"opod.engines.xllama: {' '.join(unknown)} is not supported by the portable llama.cpp launcher "
            "(it maps only the flags listed by --help onto xllamacpp); set OPOD_LLAMA_SERVER to a llama-server binary "
            "for the full flag set\n"
        )
        return EXIT_USAGE
    if not args.list_devices and not (args.model and Path(args.model).is_file()):
        sys.stderr.write(f"opod.engines.xllama: -m {args.model}: no such model file; give the path of a GGUF file\n")
        return EXIT_USAGE
    try:
        import xllamacpp as xlc
    except ImportError:
        sys.stderr.write("opod.engines.xllama: the xllamacpp package is not installed; pip install xllamacpp\n")
        return EXIT_USAGE
    if args.list_devices:
        print(device_list(xlc.get_device_info()))
        return 0
    try:
        params = to_params(args, xlc)
    except ValueError as err:
        sys.stderr.write(f"opod.engines.xllama: {err}\n")
        return EXIT_USAGE
    # Block the stop signals before the server starts its threads, so they inherit the mask
    # and the signal reaches sigwait below rather than a server thread.
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    try:
        server = xlc.Server(params)  # returns once the model is loaded and the socket listens
    except Exception as err:  # the binding raises plain exceptions for a bad model or a taken port
        sys.stderr.write(f"opod.engines.xllama: could not start llama.cpp's server: {err}\n")
        return 1
    print(f"opod.engines.xllama: serving {args.model} on {server.listening_address}", flush=True)
    got = signal.sigwait(stop)
    print(f"opod.engines.xllama: {signal.Signals(got).name} received, stopping", flush=True)
    del server  # its destructor stops the HTTP loop and frees the model
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
