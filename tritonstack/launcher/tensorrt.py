"""TensorRT on a GPU host: plans built with trtexec, and ONNX Runtime's engine cache, per model.

A plan is specific to the GPU, its compute capability, the TensorRT release, the ONNX file and
the build options, so each is cached under a key made of all five: an unchanged key reuses the
plan, a changed one builds a new plan, and the plans it replaces on the same GPU and TensorRT are
pruned. ONNX Runtime checks a cached engine against none of these (its id hashes the file name,
tensor names and library versions, not the weights), so each model's engine directory is a link,
made in this container, to a cache directory keyed the same way.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tritonstack.launcher import cache
from tritonstack.launcher.gpu import Gpu
from tritonstack.launcher.messages import LaunchError, log
from tritonstack.launcher.model_config import ModelConfig

PRECISIONS = ("auto", "fp16", "fp32")
#: Where each model's ONNX Runtime engine directory is, as its GPU config names it
#: (`<ENGINE_LINKS>/<model>`): a link in the container to the model's keyed cache directory.
ENGINE_LINKS = "/tmp/tritonstack-onnxruntime-trt"


class PlanError(LaunchError):
    """One model's plan cannot be had: that model is left out, every other one is served."""


@dataclass(frozen=True)
class TensorRT:
    """This image's trtexec: its release, and the precision flags a plan is built with."""

    version: str
    precision_flags: tuple[str, ...]

    @property
    def tag(self) -> str:
        return f"trt{self.version}"


def _takes(help_text: str, option: str) -> bool:
    return re.search(rf"^\s*{re.escape(option)}(\s|$)", help_text, re.MULTILINE) is not None


def probe(precision: str, env: dict[str, str]) -> TensorRT:
    """Ask trtexec (once) its version and which precision flags it takes, and choose them.

    auto: FP16 where trtexec still takes --fp16 (TensorRT 10; every GPU the release supports has
    fast FP16); TensorRT 11 removed the precision flags (networks are strongly typed), so there a
    plan keeps the ONNX model's own precision. fp16 insists (and stops where it cannot be had).
    """
    if precision not in PRECISIONS:
        raise LaunchError(f"TRT_PRECISION={precision}: use auto, fp16 or fp32")
    binary = shutil.which("trtexec")
    if binary is None:
        raise LaunchError("trtexec not found on PATH (/usr/src/tensorrt/bin)")
    answer = subprocess.run(
        ["trtexec", "--help"], capture_output=True, text=True, check=False, timeout=120
    )
    help_text = answer.stdout + answer.stderr
    version = env.get("TENSORRT_VERSION", "")
    banner = re.search(r"\[TensorRT v(\d+)\]", help_text)
    if not version and banner:
        number = int(banner[1])
        version = f"{number // 10000}.{number // 100 % 100}.{number % 100}"
    elif not version:  # an unknown banner: the binary's hash still changes with every release
        version = f"trtexec-{cache.sha256(Path(binary))[:12]}"
    log(f"TensorRT {version}")
    flags: tuple[str, ...] = ()
    if precision in ("auto", "fp16"):
        if _takes(help_text, "--fp16"):
            flags = ("--fp16",)
            log(f"TensorRT plans in FP16 (--fp16; TRT_PRECISION={precision})")
        elif precision == "fp16":
            raise LaunchError(
                f"TRT_PRECISION=fp16, but trtexec of TensorRT {version} has no --fp16 (TensorRT "
                "11 builds strongly typed networks: a plan runs in the ONNX model's own types). "
                "Convert the model to FP16 (ModelOpt AutoCast, docs/deployment.md) or set "
                "TRT_PRECISION=auto"
            )
        else:
            log(
                f"TensorRT {version} builds strongly typed networks (its trtexec has no --fp16): "
                "plans keep the ONNX model's precision; for FP16 convert the model "
                "(docs/deployment.md)"
            )
    else:
        log("TensorRT plans in the ONNX model's precision (TRT_PRECISION=fp32)")
    # Without FP16 a plan is meant to keep the model's FP32, but trtexec lets FP32 matrix
    # products run in TF32 (10 mantissa bits) by default: --noTF32 keeps them FP32.
    if not flags and _takes(help_text, "--noTF32"):
        flags = ("--noTF32",)
        log(
            "TensorRT plans keep FP32 matrix products in FP32 (--noTF32; TF32 is trtexec's default)"
        )
    return TensorRT(version, flags)


def profile(model: ModelConfig, opt_batch: int) -> list[str]:
    """trtexec's shape options: add-model writes them from the inputs' bounds (names quoted);
    a hand-written config gets them from max_batch_size and its fixed dims."""
    given = model.parameter("tritonstack.trtexec_min_shapes")
    if given:
        return [
            f"--minShapes={given}",
            f"--optShapes={model.parameter('tritonstack.trtexec_opt_shapes')}",
            f"--maxShapes={model.parameter('tritonstack.trtexec_max_shapes')}",
        ]
    largest = model.max_batch_size
    if largest <= 0:
        raise PlanError(f"{model.name}: max_batch_size must be > 0 to build a plan")
    inputs = model.inputs()
    if not inputs:
        raise PlanError(f"{model.name}/config.pbtxt: no input with dims found")
    rows = (1, min(opt_batch, largest), largest)
    return [
        f"--{kind}Shapes="
        + ",".join(f"{name}:{'x'.join([str(n), *dims])}" for name, dims in inputs)
        for kind, n in zip(("min", "opt", "max"), rows, strict=True)
    ]


def _plan_is_valid(directory: Path, key: str) -> bool:
    plan, recorded, checksum = (directory / n for n in ("model.plan", "key", "model.plan.sha256"))
    if not (plan.is_file() and recorded.is_file() and checksum.is_file()):
        return False
    if recorded.read_text() != key + "\n":
        return False
    return cache.sha256(plan) == checksum.read_text().strip()


@dataclass(frozen=True)
class PlanBuilder:
    repository: Path
    cache_dir: Path
    gpu: Gpu
    tensorrt: TensorRT
    opt_batch: int
    lock_timeout: float

    def plan(self, model: ModelConfig) -> Path:
        """The plan of model `<name>_trt`, built now or reused from the cache."""
        name = model.name
        source = name.removesuffix("_trt")
        onnx = self.repository / source / "1" / "model.onnx"
        if name == source or not onnx.is_file():
            raise PlanError(
                f"{name}: platform tensorrt_plan without {name}/1/model.plan, and no ONNX twin to "
                f"build it from (expected {onnx}); commit a plan or name the model <onnx model>_trt"
            )
        build = [f"--onnx={onnx}", *profile(model, self.opt_batch), *self.tensorrt.precision_flags]
        head = (
            f"gpu={self.gpu.name}\ncompute_capability={self.gpu.compute_capability}\n"
            f"tensorrt={self.tensorrt.version}\n"
        )
        key = f"{head}onnx_sha256={cache.sha256(onnx)}\nbuild={' '.join(build[1:])}"
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        directory = (
            self.cache_dir / "plans" / name / f"{self.gpu.slug}-{self.tensorrt.tag}-{digest}"
        )
        directory.mkdir(parents=True, exist_ok=True)
        # One builder per plan: replicas sharing the cache volume start together.
        lock = cache.lock_or_wait(
            directory / "lock",
            f"{name}: another replica is building this plan; waiting for it",
            self.lock_timeout,
        )
        try:
            if _plan_is_valid(directory, key):
                plan = directory / "model.plan"
                log(f"{name}: reusing the cached plan {plan} (same GPU, TensorRT and model)")
            else:
                self._build(name, build, directory, key)
            self._prune(name, directory, head)
        finally:
            os.close(lock)
        return directory / "model.plan"

    def _build(self, name: str, build: list[str], directory: Path, key: str) -> None:
        plan, draft = directory / "model.plan", directory / "model.plan.tmp"
        if plan.exists():
            log(
                f"{name}: the cached plan in {directory} is incomplete or does not match its "
                "checksum (truncated or changed); rebuilding it"
            )
        for stale in ("key", "model.plan.sha256"):  # no valid entry until the new plan is whole
            (directory / stale).unlink(missing_ok=True)
        log(
            f"{name}: building a TensorRT plan for {self.gpu.name} (compute capability "
            f"{self.gpu.compute_capability}, TensorRT {self.tensorrt.version}): trtexec "
            f"{' '.join(build)}; first start only, cached afterwards"
        )
        started = time.monotonic()
        # trtexec's progress goes to the container log (prefixed) and to trtexec.log in the cache.
        with (directory / "trtexec.log").open("w") as record:
            process = subprocess.Popen(
                ["trtexec", *build, f"--saveEngine={draft}", "--skipInference"],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            assert process.stdout is not None
            for line in process.stdout:
                record.write(line)
                log(f" trtexec: {line.rstrip()}")
            failed = process.wait() != 0
        if failed:
            draft.unlink(missing_ok=True)
            raise PlanError(f"{name}: trtexec failed; full log in {directory}/trtexec.log")
        if not draft.is_file() or draft.stat().st_size == 0:
            raise PlanError(
                f"{name}: trtexec reported success but wrote no plan to {draft} (disk full?); "
                f"full log in {directory}/trtexec.log"
            )
        # Plan, then its checksum, then the key: a reader trusts the plan only when all agree.
        checksum = cache.sha256(draft)
        os.replace(draft, plan)
        cache.write_atomically(directory / "model.plan.sha256", checksum + "\n")
        cache.write_atomically(directory / "key", key + "\n")
        seconds = round(time.monotonic() - started)
        log(f"{name}: plan built in {seconds} s: {plan} ({plan.stat().st_size} bytes)")

    def _prune(self, name: str, keep: Path, head: str) -> None:
        """Plans this one replaces: same GPU and TensorRT, another model file or build. Other
        GPUs' and releases' plans stay for when those come back."""
        for other in keep.parent.iterdir():
            recorded = other / "key"
            if other == keep or not recorded.is_file() or not recorded.read_text().startswith(head):
                continue
            try:
                lock = cache.lock_or_wait(other / "lock", "", timeout=0)
            except LaunchError:
                continue  # another replica is building it right now
            try:
                shutil.rmtree(other)
                log(f"{name}: pruned the plan it replaces, {other}")
            finally:
                os.close(lock)


def onnx_digest(model: ModelConfig) -> str:
    """What an ONNX model's engines are built from: every .onnx file of its directory."""
    digest = hashlib.sha256()
    for path in sorted(model.directory.rglob("*.onnx")):
        digest.update(f"{path.relative_to(model.directory)}\0{cache.sha256(path)}\n".encode())
    return digest.hexdigest()[:12]


def engine_cache(
    model: ModelConfig, gpu: Gpu, tensorrt: TensorRT, cache_dir: Path, link_root: Path
) -> Path | None:
    """Point the model's ONNX Runtime engine directory (its GPU config's trt_engine_cache_path,
    a link under `link_root` in this container: never on the shared volume, where replicas would
    repoint it under each other) at its keyed directory of the cache; prune the directories of
    its older weights. None when the model caches no engine."""
    configured = model.onnxruntime_engine_cache()
    if not configured:
        return None
    if Path(configured).parent != Path(ENGINE_LINKS):
        log(
            f"WARNING: {model.name}: trt_engine_cache_path {configured} is not a folder of "
            f"{ENGINE_LINKS}, so its TensorRT engines are not cached per model and weights; set "
            f"it to {ENGINE_LINKS}/{model.name} in {model.name}/configs/gpu.pbtxt"
        )
        return None
    link = link_root / Path(configured).name  # link_root is ENGINE_LINKS but in tests
    prefix = f"{gpu.slug}-{tensorrt.tag}-onnx"
    keyed = cache_dir / "onnxruntime-trt" / model.name / f"{prefix}{onnx_digest(model)}"
    keyed.mkdir(parents=True, exist_ok=True)
    for other in keyed.parent.iterdir():
        if other != keyed and other.name.startswith(prefix):
            shutil.rmtree(other, ignore_errors=True)
            log(f"{model.name}: pruned ONNX Runtime engines of its former weights, {other}")
    link_root.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(keyed)
    return keyed
