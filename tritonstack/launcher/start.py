"""The container's start: settings, the device, the repository view, then exec tritonserver.

GPU (a GPU answers `nvidia-smi`, or TRITONSTACK_DEVICE=gpu): every model `<name>_trt` with
platform "tensorrt_plan" and no committed plan gets one built from `<name>/1/model.onnx`
(tritonstack.launcher.tensorrt); a model whose plan cannot be built is left out, named in the log
and in the status file the health check reads, and every other model is served (`classify` then
routes to the ONNX model). tritonserver gets --model-config-name=gpu and GPU metrics.
CPU (no GPU, or TRITONSTACK_DEVICE=cpu): models that need a GPU (TensorRT plans, KIND_GPU
instances) are left out of the view, as `tritonstack serve` does.
Both: an ONNX model Triton's onnxruntime backend would load and then crash on (a rank-0 graph
tensor in a batching model: onnxruntime_fault) is left out too, its graph read by onnx_wire.

Arguments after the subcommand (compose `command:`) are appended to tritonserver's.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tritonstack.core.contract import ADMIN_APIS_ENV, GRPC_PORT, HTTP_PORT, METRICS_PORT
from tritonstack.core.errors import UserError
from tritonstack.core.health import LAUNCH_STATUS, LAUNCH_STATUS_ENV, serving_address
from tritonstack.core.onnxruntime_rules import serving_errors
from tritonstack.launcher import flags, gpu, onnx_wire, tensorrt, watch
from tritonstack.launcher.cache import lock_or_wait
from tritonstack.launcher.messages import LaunchError, log
from tritonstack.launcher.model_config import (
    ModelConfig,
    max_batch_size,
    model_filename,
    models,
    tensors,
)

USAGE = "usage: python3 -m tritonstack.launcher [prepare|llm] [tritonserver arguments...]"


@dataclass(frozen=True)
class Settings:
    """The container's environment, read once (the image's and compose's variables)."""

    home: Path
    repository: Path
    flags_file: Path
    cache: Path
    view: Path
    device: str
    opt_batch: int
    precision: str
    lock_timeout: float
    engine_links: Path
    exit_timeout: int
    http_port: int
    grpc_port: int
    metrics_port: int
    admin_key_file: Path
    serving_name: str
    public_models: list[str]
    watchdog: bool
    watchdog_interval: float
    watchdog_failures: int
    watchdog_probe: str
    ready_probe: str
    status: Path
    env: dict[str, str] = field(repr=False)

    @classmethod
    def from_environment(cls, env: dict[str, str]) -> Settings:
        def get(name: str, default: str) -> str:
            return env.get(name) or default

        def number(name: str, default: str, kind: type = int):
            value = get(name, default)
            try:
                return kind(value)
            except ValueError:
                raise LaunchError(f"{name}={value}: expected a number") from None

        home = Path(get("TRITONSTACK_HOME", "/opt/tritonstack"))
        cache = Path(get("TRITONSTACK_CACHE", "/var/cache/tritonstack"))
        return cls(
            home=home,
            repository=Path(get("MODEL_REPOSITORY", str(home / "model_repository"))),
            flags_file=Path(get("TRITONSTACK_FLAGS", str(home / "tritonserver.flags"))),
            cache=cache,
            view=Path(get("TRITONSTACK_VIEW", f"{get('TMPDIR', '/tmp')}/tritonstack-repository")),
            device=get("TRITONSTACK_DEVICE", "auto"),
            opt_batch=number("TRT_OPT_BATCH", "16"),
            precision=get("TRT_PRECISION", "auto"),
            lock_timeout=number("TRITONSTACK_CACHE_LOCK_TIMEOUT", "900", float),
            engine_links=Path(get("TRITONSTACK_ORT_CACHE_LINK", tensorrt.ENGINE_LINKS)),
            exit_timeout=number("TRITON_EXIT_TIMEOUT_SECS", str(flags.EXIT_TIMEOUT_SECS)),
            http_port=number("TRITON_HTTP_PORT", str(HTTP_PORT)),
            grpc_port=number("TRITON_GRPC_PORT", str(GRPC_PORT)),
            metrics_port=number("TRITON_METRICS_PORT", str(METRICS_PORT)),
            admin_key_file=Path(get("TRITONSTACK_ADMIN_KEY_FILE", str(cache / "admin-key"))),
            serving_name=get("TRITONSTACK_SERVING_NAME", ""),
            public_models=get("PUBLIC_MODELS", "").split(),
            watchdog=get("TRITONSTACK_WATCHDOG", "on") == "on",
            watchdog_interval=number("TRITONSTACK_WATCHDOG_INTERVAL", "5", float),
            watchdog_failures=number("TRITONSTACK_WATCHDOG_FAILURES", "3"),
            watchdog_probe=get("TRITONSTACK_WATCHDOG_PROBE", f"python3 {home}/healthcheck.py"),
            ready_probe=get("TRITONSTACK_READY_PROBE", ""),
            status=Path(get(LAUNCH_STATUS_ENV, LAUNCH_STATUS)),
            env=env,
        )


@dataclass
class View:
    """The repository as tritonserver gets it: what is served, and what was left out why."""

    served: list[str] = field(default_factory=list)
    left_out: dict[str, str] = field(default_factory=dict)
    engine_caches: int = 0


def check_public_models(settings: Settings) -> None:
    """A stale image: compose gives the checkout's PUBLIC_MODELS (env_file: stack.env), and the
    gateway routes them from the checkout's gateway/models.map, but the repository is the one
    baked in at build time. A model added since would be routed to a server that lacks it."""
    missing = [
        m
        for m in settings.public_models
        if not (settings.repository / m / "config.pbtxt").is_file()
    ]
    if missing:
        raise LaunchError(
            f"this image's model repository has no {' '.join(missing)}, which stack.env makes "
            "public: the image was built before the model was added; rebuild it: "
            "docker compose up -d --build"
        )


def _copy_with_plan(model: ModelConfig, target: Path, plan: Path) -> None:
    """A model directory whose version 1 is the built plan. Files beside the versions (the
    config, labels) are copied, not linked: Triton resolves links when it checks that a label
    file is inside its model's directory."""
    (target / "1").mkdir(parents=True)
    for entry in model.directory.iterdir():
        if entry.name == "1":
            continue
        if entry.is_dir():
            shutil.copytree(entry, target / entry.name)
        else:
            shutil.copy2(entry, target / entry.name)
    for entry in (model.directory / "1").iterdir() if (model.directory / "1").is_dir() else ():
        (target / "1" / entry.name).symlink_to(entry)
    (target / "1" / "model.plan").symlink_to(plan)


def build_view(settings: Settings, device: gpu.Gpu | None) -> View:
    view = View()
    builder = None
    trt = None
    if device is not None:
        trt = tensorrt.probe(settings.precision, settings.env)
        builder = tensorrt.PlanBuilder(
            settings.repository,
            settings.cache,
            device,
            trt,
            settings.opt_batch,
            settings.lock_timeout,
        )
    shutil.rmtree(settings.view, ignore_errors=True)
    settings.view.mkdir(parents=True)
    for model in models(settings.repository):
        target = settings.view / model.name
        if device is None and model.needs_gpu:
            view.left_out[model.name] = "needs a GPU; this container serves on CPU"
            continue
        fault = onnxruntime_fault(model, gpu=device is not None)
        if fault:
            log(f"WARNING: {model.name}: {fault}. {model.name} is not served; every other model is")
            view.left_out[model.name] = fault
            continue
        if (
            builder is not None
            and model.is_tensorrt_plan
            and not (model.directory / "1" / "model.plan").exists()
        ):
            try:
                plan = builder.plan(model)
            except tensorrt.PlanError as exc:
                log(f"WARNING: {exc}. {model.name} is not served; every other model is")
                view.left_out[model.name] = str(exc)
                continue
            _copy_with_plan(model, target, plan)
        else:
            target.symlink_to(model.directory)
        if (
            device is not None
            and trt is not None
            and tensorrt.engine_cache(model, device, trt, settings.cache, settings.engine_links)
        ):
            view.engine_caches += 1
        view.served.append(model.name)
    if not view.served:
        raise LaunchError(f"no servable model in {settings.repository}")
    log(f"models: {' '.join(view.served)}")
    gpu_only = [m for m, why in view.left_out.items() if why.startswith("needs a GPU")]
    if gpu_only:
        log(f"not served on CPU (GPU only): {' '.join(gpu_only)}")
    return view


def onnxruntime_fault(model: ModelConfig, *, gpu: bool) -> str:
    """What Triton's onnxruntime backend would load and then serve wrongly, or crash on
    (tritonstack.core.onnxruntime_rules.serving_errors: a rank-0 graph tensor in a batching
    model), found from the config it would get and each version's graph; empty when nothing is.
    `tritonstack check` and the embedded runtime refuse such a model; a config written by hand
    and never checked would otherwise take this container's Triton down with every model."""
    text = model.gpu_text if gpu else model.text
    batch = max_batch_size(text)
    if not model.is_onnx or batch <= 0:
        return ""
    config = {"max_batch_size": batch, "output": [{"name": n} for n, _ in tensors(text, "output")]}
    versions = sorted(
        (p for p in model.directory.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)
    )
    for version in versions:
        path = version / model_filename(text)
        try:
            graph = onnx_wire.graph_of(path)
        except (OSError, onnx_wire.WireError):
            continue  # no file, or not one this reader follows: Triton's load names the problem
        errors = serving_errors(config, graph)
        if errors:
            return f"version {version.name}: {errors[0]}"
    return ""


def write_status(path: Path, left_out: dict[str, str]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(left_out, indent=1, sort_keys=True) + "\n")
    except OSError as exc:
        log(f"WARNING: cannot write {path} ({exc}); the health check will not name left-out models")


def server_address(settings: Settings) -> tuple[str, str]:
    """Where inference is served: in compose TRITONSTACK_SERVING_NAME is this service's alias on
    the network it shares with the gateway, and HTTP and gRPC bind to this container's address
    there and nowhere else (metrics on every address: Prometheus reaches the container on
    another network, docs/security.md "Who reaches what"). Unset (Kubernetes, where
    NetworkPolicies filter by port): every address. Returns (bind address, host to call)."""
    if not settings.serving_name:
        return "0.0.0.0", "127.0.0.1"
    try:
        address = serving_address(settings.serving_name)
    except LookupError as exc:
        raise LaunchError(
            f"{exc}; no address to serve on (TRITONSTACK_SERVING_NAME={settings.serving_name})"
        ) from None
    log(f"inference on {address} ({settings.serving_name}), metrics on every address")
    return address, address


def admin_key(settings: Settings) -> str:
    """TRITONSTACK_ADMIN_KEY, else the key file (compose's secrets volume, a Kubernetes Secret
    mounted read-only), else one generated there on first start, or in the cache volume when
    the key file's place cannot be written (an optional Secret that does not exist)."""
    try:
        return flags.admin_key(
            settings.admin_key_file, settings.cache / "admin-key", settings.env, say=log
        )
    except UserError as exc:
        raise LaunchError(str(exc)) from None


def server_flags(settings: Settings, repository: Path, address: str, *, gpu: bool) -> list[str]:
    try:
        return flags.server_flags(
            repository,
            flags.shared_flags(settings.flags_file),
            admin_key(settings),
            address=address,
            http_port=settings.http_port,
            grpc_port=settings.grpc_port,
            metrics_port=settings.metrics_port,
            exit_timeout_secs=settings.exit_timeout,
            gpu=gpu,
            asked_apis=settings.env.get(ADMIN_APIS_ENV, ""),
        )
    except UserError as exc:
        raise LaunchError(str(exc)) from None


def start(settings: Settings, extra: list[str], *, prepare_only: bool = False) -> list[str]:
    """Prepare the repository and return tritonserver's argv (empty when only preparing)."""
    if not settings.repository.is_dir():
        raise LaunchError(f"model repository {settings.repository} not found")
    if not settings.flags_file.is_file():
        raise LaunchError(f"shared tritonserver flags {settings.flags_file} not found")
    check_public_models(settings)
    device = gpu.choose(settings.device)
    log(f"serving on {'gpu' if device else 'cpu'}")
    view = build_view(settings, device)
    write_status(settings.status, view.left_out)
    if prepare_only:
        log("prepared: plans and caches are ready for the server's start")
        return []
    address, host = server_address(settings)
    argv = server_flags(settings, settings.view, address, gpu=device is not None)
    if view.engine_caches:
        ready = (
            watch.shell_probe(settings.ready_probe)
            if settings.ready_probe
            else watch.ready_probe(f"http://{host}:{settings.http_port}/v2/health/ready")
        )
        # Held by the guard alone: forked with it, then closed here before anything else forks.
        lock = lock_or_wait(
            settings.cache / "onnxruntime-trt" / "loading.lock",
            "another replica is loading its models against ONNX Runtime's engine cache; "
            "waiting until they are ready",
            settings.lock_timeout,
        )
        watch.fork(watch.engine_guard(ready, settings.lock_timeout))
        os.close(lock)
    if settings.watchdog:
        probe = watch.shell_probe(settings.watchdog_probe)
        watch.fork(watch.watchdog(probe, settings.watchdog_interval, settings.watchdog_failures))
    return [*argv, *extra]


def llm(settings: Settings, extra: list[str]) -> list[str]:
    """The vLLM model's Triton: its own repository as it is (no view, no plans, no GPU metrics:
    they describe the whole device, which the models' Triton reports already)."""
    if not settings.repository.is_dir():
        raise LaunchError(f"model repository {settings.repository} not found")
    address, _ = server_address(settings)
    return [*server_flags(settings, settings.repository, address, gpu=False), *extra]


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args.pop(0) if args and not args[0].startswith("-") else "serve"
    try:
        settings = Settings.from_environment(dict(os.environ))
        if command == "prepare":
            start(settings, args, prepare_only=True)
            return 0
        if command == "serve":
            server = start(settings, args)
        elif command == "llm":
            server = llm(settings, args)
        else:
            raise LaunchError(f"unknown command {command!r}; {USAGE}")
    except LaunchError as exc:
        print(f"[entrypoint] ERROR: {exc}", file=sys.stderr, flush=True)
        return 1
    log(f"exec tritonserver {flags.shown(server)}")
    sys.stderr.flush()
    os.execvp("tritonserver", ["tritonserver", *server])
    return 1  # not reached
