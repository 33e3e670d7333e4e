"""`tritonstack` command line: export, check, serve, infer.

Every failure a user can fix ends as one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
from pathlib import Path

from tritonstack.core.contract import GRPC_PORT, HTTP_PORT, LLM_REPOSITORY, LOOPBACK, METRICS_PORT
from tritonstack.core.errors import UserError, require_extra
from tritonstack.core.project import PROJECT_DIR_ENV, use_project_dir


def _repository_arg(parser: argparse.ArgumentParser) -> None:
    from tritonstack import DEFAULT_MODEL_REPOSITORY

    parser.add_argument(
        "--model-repository",
        type=Path,
        default=DEFAULT_MODEL_REPOSITORY,
        help="model repository directory (default: the project's model_repository/)",
    )


#: Commands whose module holds both their arguments and their logic: each module defines
#: `configure(parser)` and `run(args) -> int`. Modules must import heavy dependencies lazily.
PLUGGED_COMMANDS: dict[str, tuple[str, str]] = {
    # "name": ("tritonstack.module", "one-line help"),
    "add-model": (
        "tritonstack.models.add_model",
        "serve an ONNX model of yours: write its repository folder",
    ),
    "remove-model": (
        "tritonstack.models.remove_model",
        "stop serving a model: remove its folders, as add-model wrote them",
    ),
    "loadtest": ("tritonstack.load.loadtest", "headless Locust run with pass/fail gates"),
    "dashboards": ("tritonstack.render.dashboards", "regenerate grafana/dashboards/*.json"),
    "top": ("tritonstack.clients.top", "live per-model view of Triton's metrics in the terminal"),
    "soak": ("tritonstack.load.soak", "steady load for N minutes: RSS, /dev/shm and latency drift"),
    "up": ("tritonstack.stack", "Triton, Prometheus and the Locust web UI on loopback, no Docker"),
    "generate": ("tritonstack.clients.generate", "stream an answer from the LLM (serve --llm)"),
}


#: The extras each command needs beyond the core (pyproject.toml; errors.EXTRAS names their
#: modules): a missing one stops the command with one line before it starts any work.
COMMAND_EXTRAS: dict[str, tuple[str, ...]] = {
    "infer": ("clients",),
    "export": ("export",),
    "check": ("serve",),
    "add-model": ("serve",),
    "remove-model": ("serve",),
    "serve": ("serve",),
    "soak": ("serve", "render"),
    "up": ("serve", "load"),
    "loadtest": ("load",),
    "dashboards": ("render",),
}


def gateway_arguments(parser: argparse.ArgumentParser) -> None:
    from tritonstack.serve.gateway import add_arguments

    add_arguments(parser)


def cmd_export(args: argparse.Namespace) -> int:
    from tritonstack.models.export import export

    export(args.model_repository, seed=args.seed)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from tritonstack.check.repository import check_repository
    from tritonstack.core.mounts import check_mounts
    from tritonstack.core.project import project_dir

    checked = [(args.model_repository, check_repository(args.model_repository))]
    llm_repository = project_dir() / LLM_REPOSITORY
    if llm_repository.is_dir():  # served beside the classifier by `serve --llm` and compose
        checked.append((llm_repository, check_repository(llm_repository)))
    compose = project_dir() / "docker-compose.yml"
    if compose.is_file():  # what `docker compose up` hands its containers from this checkout
        checked.append((compose, check_mounts(compose)))
    stack_env = project_dir() / "stack.env"
    if stack_env.is_file() and _is_project_repository(args.model_repository):
        checked.append((stack_env, _check_public_models(args.model_repository)))
    failed = 0
    for what, problems in checked:
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            failed += 1
            print(f"{len(problems)} problem(s) in {what}", file=sys.stderr)
        else:
            print(f"{what}: ok")
    if args.load and not failed:
        failed += _check_loads(args.model_repository)
    return 1 if failed else 0


def _is_project_repository(repository: Path) -> bool:
    from tritonstack import DEFAULT_MODEL_REPOSITORY

    return Path(repository).resolve() == Path(DEFAULT_MODEL_REPOSITORY).resolve()


def _check_public_models(repository: Path) -> list[str]:
    """stack.env's PUBLIC_MODELS against the repository, read as `serve`, compose and the
    gateway read them: a public model the repository no longer holds stops them all."""
    from tritonstack.core.limits import limits

    try:
        limits(repository)
    except UserError as exc:
        return [str(exc)]
    return []


def _check_loads(repository: Path) -> int:
    """Load the repository in the real tritonserver (the models a CPU serves): what it refuses,
    in its own words. 1 when a model does not load."""
    import tempfile

    from tritonstack.core.ports import free_ports
    from tritonstack.serve.runtime import EmbeddedTriton

    http, grpc, metrics = free_ports(3)
    with tempfile.TemporaryDirectory(prefix="tritonstack-check-") as folder:
        server = EmbeddedTriton(
            repository, http, grpc, metrics, log_path=Path(folder) / "tritonserver.log",
            exit_timeout_secs=2,
        )  # fmt: skip
        try:
            server.start()
        except UserError as exc:
            print(f"{repository}: Triton loads none of its models: {exc}", file=sys.stderr)
            return 1
        server.stop(grace=0.5)  # a throwaway server: no request of anyone's to drain
    for name, reason in server.failed.items():
        print(f"{repository}/{name}: Triton does not load it: {reason}", file=sys.stderr)
    if server.failed:
        print(f"{len(server.failed)} model(s) of {repository} do not load", file=sys.stderr)
        return 1
    skipped = f" ({', '.join(server.skipped)}: GPU hosts only)" if server.skipped else ""
    print(f"{repository}: every model loads in tritonserver {server_version()}{skipped}")
    return 0


def server_version() -> str:
    from importlib.metadata import version

    return f"2.51 (nvidia-pytriton {version('nvidia-pytriton')})"


def cmd_serve(args: argparse.Namespace) -> int:
    from tritonstack.serve import gateway as gw
    from tritonstack.serve import llm
    from tritonstack.serve.runtime import EmbeddedTriton, default_cache_dir
    from tritonstack.serve.supervisor import Supervisor

    gw.check_arguments(args)
    http_port, grpc_port = gw.triton_ports(args)
    llm_plan = llm.plan(args, default_cache_dir())
    server = EmbeddedTriton(
        model_repository=args.model_repository,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=args.metrics_port,
        address=LOOPBACK if args.gateway else args.address,
        log_path=args.log_file,
        **llm.runtime_options(llm_plan),
    )
    gateway = None
    stop = threading.Event()
    # The handlers only append: Event.set() there deadlocks when the signal lands while the
    # main thread holds that Event's lock inside wait() (seen: a SIGTERM that never stopped
    # serve), and print() there can meet stdout's lock held the same way. _wait acts on them.
    signals: list[int] = []
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda signum, _frame: signals.append(signum))
    print(f"starting Triton (models in {args.model_repository})", flush=True)
    if llm_plan:
        print(llm_plan.describe(), flush=True)
    server.start(timeout=args.timeout)
    try:
        if args.gateway:
            print(f"starting the gateway on {args.address}", flush=True)
            gateway = gw.from_arguments(args, server).start()
        print(f"ready: {', '.join(server.loaded)}", flush=True)
        for name, reason in server.failed.items():
            print(f"not loaded: {name}: {reason}", flush=True)
        if server.skipped:
            print(f"not served on CPU (GPU only): {', '.join(server.skipped)}", flush=True)
        for label, url in gw.endpoint_rows(server, gateway).items():
            print(f"  {label:<26} {url}", flush=True)
        if gateway is not None and gateway.api_keys is not None:
            print(f"kill -HUP {os.getpid()} reloads {gateway.api_keys}", flush=True)
        print("Ctrl-C stops the server", flush=True)
        if args.supervise:
            supervisor = Supervisor(server, log=lambda line: print(line, flush=True))
            watcher = threading.Thread(target=supervisor.watch, args=(stop,), daemon=True)
            watcher.start()
            try:
                _wait(stop, signals, gateway)
            finally:
                stop.set()
                supervisor.join(watcher)  # a restart under way finishes before the final stop
            if supervisor.failed:
                raise UserError(supervisor.failed)
        else:
            _wait(stop, signals, gateway, server)
    finally:
        # In order: the gateway stops accepting and its in-flight requests finish, then Triton.
        if gateway is not None:
            gateway_code = gateway.stop()
            print(
                f"gateway stopped (haproxy exit code {gateway_code}), stopping Triton", flush=True
            )
        code = server.stop()
    print(f"stopped (tritonserver exit code {code})", flush=True)
    return 0


def _wait(stop: threading.Event, signals: list[int], gateway, server=None) -> None:
    """Until SIGINT or SIGTERM (in `signals`, appended by the handlers), until `stop` is set (a
    failed restart), or until the gateway or (unsupervised) Triton exits on its own; SIGHUP
    swaps in the API keys file's current content without a restart."""
    while not stop.wait(0.2):
        while signals:
            signum = signals.pop(0)
            if signum != signal.SIGHUP:
                print(f"{signal.Signals(signum).name}: stopping", flush=True)
                return
            try:
                if gateway is None or gateway.api_keys is None:
                    raise UserError("SIGHUP ignored: no gateway with API keys (--api-keys FILE)")
                print(f"SIGHUP: {gateway.reload_keys()} API keys loaded", flush=True)
            except UserError as exc:  # a bad keys file keeps the old keys, and says why
                print(f"SIGHUP: keys not reloaded: {exc}", file=sys.stderr, flush=True)
        if gateway is not None and gateway.process.poll() is not None:
            print(gateway.log_tail(), file=sys.stderr)
            raise UserError(f"haproxy exited unexpectedly with code {gateway.process.returncode}")
        if server is not None and server.process.poll() is not None:
            raise UserError(f"tritonserver exited unexpectedly with code {server.process.poll()}")


def cmd_infer(args: argparse.Namespace) -> int:
    import numpy as np

    from tritonstack.clients.client import fetch_signature, infer, new_sequence_id, table
    from tritonstack.core.settings import load
    from tritonstack.core.signature import load_arrays

    model = args.model or load().default_model
    url = args.url or f"{LOOPBACK}:{HTTP_PORT if args.protocol == 'http' else GRPC_PORT}"
    signature = fetch_signature(url, model, args.protocol, args.api_key)
    if args.steps < 1:
        raise UserError(f"--steps {args.steps}: at least 1")
    if args.input:
        arrays = load_arrays(args.input, signature)
    else:
        rows = args.rows if args.rows is not None else min(4, signature.max_rows)
        arrays = signature.random_inputs(rows, np.random.default_rng(args.seed))
    classified = bool(signature.labelled_outputs)
    if args.steps > 1 and signature.state:
        carried = ", ".join(f"{out} -> {name}" for name, out in signature.state)
        print(f"state carried from each answer to the next request: {carried}")
    sequence_id = new_sequence_id()
    if signature.sequence:
        print(f"sequence {sequence_id}: the server keeps the state across its {args.steps} "
              "request(s)")  # fmt: skip
    for step in range(args.steps):
        if args.steps > 1:
            print(f"step {step + 1}")
        outputs = infer(
            url,
            model,
            arrays,
            protocol=args.protocol,
            api_key=args.api_key,
            classification=1 if classified else 0,
            signature=signature,
            sequence=(sequence_id, step == 0, step == args.steps - 1),
        )
        for line in table(signature, outputs, classified):
            print(line)
        arrays = signature.next_state(arrays, outputs)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tritonstack", description="Serve small models on NVIDIA Triton."
    )
    parser.add_argument(
        "--project-dir",
        type=Path,
        default=None,
        help=f"the project folder (model_repository/, gateway/, prometheus/...; default: "
        f"${PROJECT_DIR_ENV}, else the checkout this package runs from, else the current folder)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("export", help="train the demo classifier and write model.onnx")
    _repository_arg(p)
    p.add_argument("--seed", type=int, default=None, help="training seed (default: fixed)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser(
        "check",
        help="validate the model repository against Triton's schema, then load it in Triton",
    )
    _repository_arg(p)
    p.add_argument(
        "--no-load",
        dest="load",
        action="store_false",
        help="only the static checks: do not load the models in the real tritonserver",
    )
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("serve", help="run the real tritonserver on CPU, no Docker needed")
    _repository_arg(p)
    p.add_argument(
        "--address",
        default=LOOPBACK,
        help="client listen address (default: loopback; any other needs --api-keys)",
    )
    p.add_argument("--http-port", type=int, default=HTTP_PORT, help="clients' HTTP port (gateway)")
    p.add_argument("--grpc-port", type=int, default=GRPC_PORT, help="clients' gRPC port (gateway)")
    p.add_argument("--metrics-port", type=int, default=METRICS_PORT, help="Triton's metrics port")
    p.add_argument("--log-file", type=Path, default=None, help="write Triton's log here")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for readiness")
    p.add_argument(
        "--no-supervise",
        dest="supervise",
        action="store_false",
        help="do not probe the public models every second and restart Triton when it fails",
    )
    gateway_arguments(p)
    from tritonstack.serve.llm import add_arguments as llm_arguments

    llm_arguments(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("infer", help="send one request to a model of a running Triton")
    p.add_argument("--model", default=None, help="default: the first of stack.env's PUBLIC_MODELS")
    p.add_argument("--protocol", default="http", choices=["http", "grpc"])
    p.add_argument(
        "--url", default=None, help=f"host:port (default {LOOPBACK}:{HTTP_PORT} / :{GRPC_PORT})"
    )
    p.add_argument(
        "--rows",
        type=int,
        default=None,
        help="random rows to send (1 to the model's max_batch_size; default 4, or fewer)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=1,
        help="requests to send one after the other; a model whose client carries state gets "
        "each answer's state back in the next request, one keeping state in the server gets "
        "them as one sequence (default 1)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed for the random values")
    p.add_argument(
        "--input",
        type=Path,
        default=None,
        help=".npy (a model with one input) or .npz (an array per input name), batch dim first; "
        "strings as numpy string arrays (array.astype(str)), not object arrays",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("TRITONSTACK_API_KEY") or None,
        help="the gateway's API key, if it has keys (default: $TRITONSTACK_API_KEY)",
    )
    p.set_defaults(func=cmd_infer)

    for name, (module_name, help_text) in PLUGGED_COMMANDS.items():
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=help_text)
        module.configure(p)
        p.set_defaults(func=module.run)
    return parser


def _project_dir_option(argv: list[str] | None) -> Path | None:
    """`--project-dir`, read before the command modules import: they locate their files then."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--project-dir", type=Path, default=None)
    known, _ = early.parse_known_args(argv)
    return known.project_dir


def main(argv: list[str] | None = None) -> int:
    try:
        chosen = _project_dir_option(argv)
        if chosen is not None:
            use_project_dir(chosen)
    except UserError as exc:
        print(f"tritonstack: error: {exc}", file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    if getattr(args, "seed", 0) is None:
        from tritonstack.models.export import SEED

        args.seed = SEED
    try:
        for extra in COMMAND_EXTRAS.get(args.command, ()):
            require_extra(extra)
        return args.func(args)
    except UserError as exc:
        print(f"tritonstack {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
