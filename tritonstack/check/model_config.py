"""What Triton requires of one model's configuration on its own: a name equal to its directory, a
platform or backend this repository serves, version directories, and no queue policy."""

from __future__ import annotations

from pathlib import Path

from tritonstack.check.messages import Say, did_you_mean, sayer
from tritonstack.core.repository import Model, ModelConfig

# Platforms and backends this repository serves, with the backend each platform runs on.
PLATFORM_BACKENDS = {
    "onnxruntime_onnx": "onnxruntime",
    "tensorrt_plan": "tensorrt",
    "ensemble": "ensemble",
}
BACKENDS = ("python", "onnxruntime", "vllm")
DEFAULT_FILENAMES = {"onnxruntime": "model.onnx", "tensorrt": "model.plan", "python": "model.py"}


def check_basics(model: Model, say: Say) -> tuple[str | None, list[Path]]:
    """Name, platform/backend and version directories: what Triton reads before any model file.

    Returns the backend the model runs on (None when unset or unknown, after saying why) and its
    version directories in version order, for the checks of the model's own files.
    """
    config = model.config
    if config.name and config.name != model.name:
        say(
            f'name "{config.name}"',
            f'does not match its directory "{model.name}"',
            "rename one of them (Triton requires them to be equal)",
        )
    kind = _kind(config, say)
    versions = sorted(
        (p for p in model.directory.iterdir() if p.is_dir() and p.name.isdigit()),
        key=lambda p: int(p.name),
    )
    if not versions:
        what = {
            "ensemble": "an empty 1/ (Triton requires a version directory even for an "
            "ensemble; keep it in git with a .gitkeep)",
            "onnxruntime": "1/ holding model.onnx",
            "tensorrt": "1/ (model.plan inside it may be built at container start)",
            "python": "1/ holding model.py",
            "vllm": "1/ holding model.json (vLLM's engine arguments)",
        }.get(kind or "", "1/ holding the model file")
        say(
            "version directory",
            f"is missing: {model.directory}/ has no numeric sub-directory, so Triton loads "
            "no version of this model",
            f"create {what}",
        )
    return kind, versions


def check_queue_policy(model: Model, config_path: Path | None = None) -> list[str]:
    """No queue policy: it makes the dynamic batcher stall, and overload belongs to the gateway.

    Triton's core turns the batcher's payload prefetching off whenever a model has a
    max_queue_size, a default queue timeout or priority levels; on that path the batcher is not
    woken when a busy instance frees up and sleeps out its 500 ms idle timeout (Triton 2.51, and
    core at HEAD). Kept apart from the model's other checks: the model is still servable and the
    checks of the models that mirror or wire it up (a TensorRT twin, an ensemble) stay meaningful.
    """
    problems, say = sayer(model, config_path)
    batching = model.config.dynamic_batching
    policy = batching.default_queue_policy
    fields = [
        f"{name} {value}"
        for name, value in (
            ("default_queue_policy.max_queue_size", policy.max_queue_size),
            (
                "default_queue_policy.default_timeout_microseconds",
                policy.default_timeout_microseconds,
            ),
            ("priority_levels", batching.priority_levels),
            ("priority_queue_policy", len(batching.priority_queue_policy)),
        )
        if value
    ]
    if fields:
        say(
            "dynamic_batching",
            "has a queue policy (" + ", ".join(fields) + "), which stalls the dynamic batcher: "
            "any queue policy turns off its payload prefetching, and then Triton waits out a "
            "500 ms idle timeout whenever a busy instance frees up under load (p99 ~500 ms)",
            "delete default_queue_policy, priority_levels and priority_queue_policy, and let the "
            "gateway refuse overload (gateway/haproxy.cfg: requests in flight capped, then 503)",
        )
    return problems


def say_python_in_disguise(model: Model, version: Path, say: Say) -> None:
    """The config names a compiled runtime but the version directory holds a model.py."""
    field = f'platform "{model.config.platform}"' if model.config.platform else "backend"
    say(
        field,
        f"does not fit {version / 'model.py'}, which is a Python backend model",
        'replace it with backend: "python"',
    )


def _kind(config: ModelConfig, say: Say) -> str | None:
    """The backend the model runs on, or None (after saying why) when it is unset or unknown."""
    platform, backend = config.platform, config.backend
    known_platforms = ", ".join(f'"{p}"' for p in PLATFORM_BACKENDS)
    if backend:
        if backend not in BACKENDS:
            say(
                f'backend "{backend}"',
                'is not one this repository serves (known: backend "python", backend '
                f'"onnxruntime", or platform {known_platforms})',
                'use backend: "python" for a model.py model, platform: "onnxruntime_onnx" '
                'for model.onnx, platform: "tensorrt_plan" for model.plan',
            )
            return None
        if platform and PLATFORM_BACKENDS.get(platform) != backend:
            say(
                f'platform "{platform}"',
                f'contradicts backend "{backend}"',
                f'remove platform (backend "{backend}" alone selects the runtime)',
            )
            return None
        return backend
    if platform:
        if platform in PLATFORM_BACKENDS:
            return PLATFORM_BACKENDS[platform]
        if platform in BACKENDS:
            fix = f'write backend: "{platform}" instead (it is a backend, not a platform)'
        else:
            fix = f'use one of {known_platforms}, or backend: "python" for a model.py model'
            fix += did_you_mean(platform, PLATFORM_BACKENDS)
        say(f'platform "{platform}"', f"is not a known platform (known: {known_platforms})", fix)
        return None
    say(
        "platform/backend",
        "is not set, so Triton cannot tell which runtime loads this model",
        'add platform: "onnxruntime_onnx" (model.onnx), platform: "tensorrt_plan" (model.plan), '
        'platform: "ensemble", or backend: "python" (model.py)',
    )
    return None
