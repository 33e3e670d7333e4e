"""The container launcher's GPU/CPU decisions, run here with named fakes for what we lack.

`python -m tritonstack.launcher` (the Triton image's entrypoint) runs unchanged with
tests/fakes/fake_nvidia-smi, fake_trtexec and fake_tritonserver on PATH (under their real names):
the fakes record every call, so each test checks the exact commands the launcher would run in the
container, the plan cache and its key, and the repository view it hands to tritonserver. The real
model repository and flags file are used. Finally every flag it passes is checked against the
real tritonserver's --help (2.51, the embedded runtime's release; the container runs a newer one
that keeps these flags, see docs/versions.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import REPOSITORY, ROOT
from tritonstack.launcher.flags import shared_flags
from tritonstack.serve.runtime import EmbeddedTriton, pytriton_root

ENTRYPOINT = [sys.executable, "-m", "tritonstack.launcher"]
FAKES = ROOT / "tests" / "fakes"
FLAGS = ROOT / "scripts" / "tritonserver.flags"
ONNX = REPOSITORY / "classifier" / "1" / "model.onnx"
A10G = "NVIDIA A10G, 8.6"
ADMIN_KEY = "test-admin-key"
SHAPES = [
    "--minShapes=features:1x128",
    "--optShapes=features:16x128",
    "--maxShapes=features:64x128",
]


@dataclass
class Run:
    returncode: int
    output: str  # stdout and stderr, interleaved as a container log shows them
    calls: list[str]  # "<tool> <args>" for every fake invocation, in order
    argv: list[str] | None  # what tritonserver was exec'd with; None if it never ran
    view: Path
    cache: Path
    engines: Path  # the container-local links to ONNX Runtime's engine caches (configs/gpu.pbtxt)
    status: Path  # what the launcher left out, for the health check

    def tool_calls(self, tool: str) -> list[str]:
        return [c for c in self.calls if c.split(" ", 1)[0] == tool]


def run_entrypoint(
    tmp_path: Path,
    gpus: str | None = None,
    *,
    nvidia_smi: bool = True,
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
) -> Run:
    """Run the entrypoint with the fakes; the cache in tmp_path survives between calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("nvidia-smi", "trtexec", "tritonserver"):
        link = bin_dir / tool
        if link.is_symlink():
            link.unlink()
        if tool != "nvidia-smi" or nvidia_smi:
            link.symlink_to(FAKES / f"fake_{tool}")
    log, argv = tmp_path / "calls.log", tmp_path / "argv.txt"
    log.write_text("")
    argv.unlink(missing_ok=True)
    environment = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "MODEL_REPOSITORY": str(REPOSITORY),
        "TRITONSTACK_FLAGS": str(FLAGS),
        "TRITONSTACK_CACHE": str(tmp_path / "cache"),
        "TRITONSTACK_VIEW": str(tmp_path / "view"),
        "TRITONSTACK_ORT_CACHE_LINK": str(tmp_path / "onnxruntime-trt"),
        "TRITONSTACK_LAUNCH_STATUS": str(tmp_path / "launch.json"),
        "FAKE_LOG": str(log),
        "FAKE_ARGV": str(argv),
        "TRITONSTACK_ADMIN_KEY": ADMIN_KEY,
        "TRITONSTACK_WATCHDOG": "off",
        **({"FAKE_GPUS": gpus} if gpus is not None else {}),
        **(env or {}),
    }
    result = subprocess.run(
        [*ENTRYPOINT, *args],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
    )
    return Run(
        result.returncode,
        result.stdout,
        log.read_text().splitlines(),
        argv.read_text().splitlines() if argv.exists() else None,
        tmp_path / "view",
        tmp_path / "cache",
        tmp_path / "onnxruntime-trt",
        tmp_path / "launch.json",
    )


def plan_key(gpu: str, cc: str, tensorrt: str = "10.5.0", fp16: bool = True) -> str:
    build = " ".join([*SHAPES, *(["--fp16"] if fp16 else [])])
    return (
        f"gpu={gpu}\ncompute_capability={cc}\ntensorrt={tensorrt}\n"
        f"onnx_sha256={hashlib.sha256(ONNX.read_bytes()).hexdigest()}\nbuild={build}"
    )


def onnx_key(model: Path = REPOSITORY / "classifier") -> str:
    """What keys a model's ONNX Runtime engine cache: its ONNX files' SHA-256s."""
    digest = hashlib.sha256()
    for path in sorted(model.rglob("*.onnx")):
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        digest.update(f"{path.relative_to(model)}\0{sha}\n".encode())
    return digest.hexdigest()[:12]


def plan_dir(cache: Path, slug: str, key: str) -> Path:
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return cache / "plans" / "classifier_trt" / f"{slug}-{digest}"


def expected_argv(view: Path, gpu: bool, argv: list[str]) -> list[str]:
    """The flags the entrypoint passes, the shut APIs' key (drawn at each start) taken from
    `argv` once its form is checked."""
    device = ["--allow-gpu-metrics=true", "--model-config-name=gpu"]
    return [
        f"--model-repository={view}",
        *shared_flags(FLAGS),
        "--exit-timeout-secs=20",
        "--http-address=0.0.0.0",
        "--http-port=8000",
        "--grpc-address=0.0.0.0",
        "--grpc-port=8001",
        "--metrics-address=0.0.0.0",
        "--metrics-port=8002",
        *(device if gpu else ["--allow-gpu-metrics=false"]),
        *restricted(ADMIN_KEY),
        *shut(shut_key(argv)),
    ]


def restricted(key: str) -> list[str]:
    """The APIs the stack's tools call, behind the admin key (contract.ADMIN_APIS)."""
    apis = "model-repository,statistics"
    return [
        f"--http-restricted-api={apis}:tritonstack-admin-key={key}",
        f"--grpc-restricted-protocol={apis}:tritonstack-admin-key={key}",
    ]


def shut(key: str) -> list[str]:
    """Every other restricted API, behind a key drawn at each start and kept nowhere."""
    apis = "shared-memory,trace,logging"
    return [
        f"--http-restricted-api={apis}:tritonstack-shut-key={key}",
        f"--grpc-restricted-protocol={apis}:tritonstack-shut-key={key}",
    ]


def shut_key(argv: list[str]) -> str:
    found = [a.rsplit("=", 1)[1] for a in argv if "tritonstack-shut-key=" in a]
    assert len(found) == 2 and found[0] == found[1], argv
    assert len(found[0]) == 48 and set(found[0]) <= set("0123456789abcdef"), found[0]
    return found[0]


def test_gpu_builds_the_plan_and_serves_the_gpu_configuration(tmp_path: Path) -> None:
    run = run_entrypoint(tmp_path, A10G)
    assert run.returncode == 0, run.output
    key = plan_key("NVIDIA A10G", "8.6")
    plans = plan_dir(run.cache, "NVIDIA_A10G-sm86-trt10.5.0", key)
    assert run.calls == [
        "nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader",
        "nvidia-smi --query-gpu=driver_version --format=csv,noheader",
        "trtexec --help",
        " ".join(
            [
                f"trtexec --onnx={ONNX}",
                *SHAPES,
                "--fp16",
                f"--saveEngine={plans}/model.plan.tmp",
                "--skipInference",
            ]
        ),
        "tritonserver " + " ".join(expected_argv(run.view, gpu=True, argv=run.argv)),
    ]
    assert run.argv == expected_argv(run.view, gpu=True, argv=run.argv)
    # The key names GPU, compute capability, TensorRT version, model and build options.
    assert (plans / "key").read_text() == key + "\n"
    assert (plans / "model.plan").read_text().startswith(f"fake plan from {ONNX}")
    assert not (plans / "model.plan.tmp").exists()
    assert "PASSED TensorRT.trtexec" in (plans / "trtexec.log").read_text()
    # Every model is served; classifier_trt's version 1 holds the cached plan.
    assert sorted(p.name for p in run.view.iterdir()) == [
        "classifier",
        "classifier_trt",
        "classify",
        "pipeline",
        "postprocess",
    ]
    assert (run.view / "classifier").resolve() == REPOSITORY / "classifier"
    trt = run.view / "classifier_trt"
    # Files beside the versions are copied: Triton resolves links when it checks that a label
    # file is inside its model's directory.
    config = trt / "config.pbtxt"
    assert not config.is_symlink()
    assert config.read_text() == (REPOSITORY / "classifier_trt" / "config.pbtxt").read_text()
    assert (trt / "1" / "model.plan").resolve() == plans / "model.plan"
    # ONNX Runtime's TensorRT engine cache (configs/gpu.pbtxt): a folder per model, a link to
    # a directory keyed by GPU, TensorRT and that model's weights.
    ort = run.engines / "classifier"
    keyed = f"onnxruntime-trt/classifier/NVIDIA_A10G-sm86-trt10.5.0-onnx{onnx_key()}"
    assert os.readlink(ort) == str(run.cache / keyed)
    assert ort.is_dir()
    assert "serving on gpu" in run.output
    assert "classifier_trt: plan built in " in run.output
    assert "  trtexec: [I] Engine built" in run.output  # trtexec's progress reaches the log


def test_unchanged_key_reuses_the_plan(tmp_path: Path) -> None:
    first = run_entrypoint(tmp_path, A10G)
    assert first.returncode == 0, first.output
    plan = first.view / "classifier_trt" / "1" / "model.plan"
    built = plan.resolve()
    content = built.read_text()
    second = run_entrypoint(tmp_path, A10G)
    assert second.returncode == 0, second.output
    assert second.tool_calls("trtexec") == ["trtexec --help"]  # version probe only, no build
    assert "reusing the cached plan" in second.output
    assert plan.resolve() == built and built.read_text() == content
    assert second.argv == expected_argv(second.view, gpu=True, argv=second.argv)


@pytest.mark.parametrize(
    ("gpus", "env", "slug", "cc", "tensorrt"),
    [
        ("Tesla T4, 7.5", {}, "Tesla_T4-sm75-trt10.5.0", "7.5", "10.5.0"),  # other GPU
        (A10G, {"FAKE_TRT_VERSION": "100800"}, "NVIDIA_A10G-sm86-trt10.8.0", "8.6", "10.8.0"),
    ],
    ids=["new-gpu", "new-tensorrt"],
)
def test_changed_key_rebuilds(
    tmp_path: Path, gpus: str, env: dict[str, str], slug: str, cc: str, tensorrt: str
) -> None:
    first = run_entrypoint(tmp_path, A10G)
    assert first.returncode == 0, first.output
    old_plan = first.view / "classifier_trt" / "1" / "model.plan"
    old_target = old_plan.resolve()
    second = run_entrypoint(tmp_path, gpus, env=env)
    assert second.returncode == 0, second.output
    builds = [c for c in second.tool_calls("trtexec") if c != "trtexec --help"]
    assert len(builds) == 1, second.calls
    key = plan_key(gpus.split(", ")[0], cc, tensorrt)
    new_dir = plan_dir(second.cache, slug, key)
    assert f"--saveEngine={new_dir}/model.plan.tmp" in builds[0]
    assert (new_dir / "key").read_text() == key + "\n"
    assert (second.view / "classifier_trt" / "1" / "model.plan").resolve() == new_dir / "model.plan"
    assert old_target.is_file()  # the other key's plan is kept for when that GPU comes back


def test_changed_model_rebuilds(tmp_path: Path) -> None:
    """New weights under the same names: a new TensorRT plan, and a new directory for ONNX
    Runtime's engine cache, whose own id (file name, tensor names, versions) would not change."""
    repo = tmp_path / "model_repository"
    subprocess.run(["cp", "-r", str(REPOSITORY), str(repo)], check=True)
    env = {"MODEL_REPOSITORY": str(repo)}
    first = run_entrypoint(tmp_path, A10G, env=env)
    assert first.returncode == 0, first.output
    ort = first.engines / "classifier"
    old_engines = os.readlink(ort)
    (ort / "TensorrtExecutionProvider_TRTKernel_graph_main_123.engine").write_text("old weights")
    (repo / "classifier" / "1" / "model.onnx").write_bytes(ONNX.read_bytes() + b"\0")
    second = run_entrypoint(tmp_path, A10G, env=env)
    assert second.returncode == 0, second.output
    assert len(second.tool_calls("trtexec")) == 2  # probe and a new build
    assert "reusing" not in second.output
    assert os.readlink(ort) != old_engines
    assert os.readlink(ort).endswith(f"-onnx{onnx_key(repo / 'classifier')}")
    assert list(ort.iterdir()) == []  # no engine built from the old weights is in reach
    assert not Path(old_engines).exists()  # pruned: those weights are gone from the repository


def test_fp16_on_every_supported_gpu_unless_forced_off(tmp_path: Path) -> None:
    # The image's release supports compute capability 7.5 and later, all with fast FP16.
    run = run_entrypoint(tmp_path, "Tesla T4, 7.5")
    assert run.returncode == 0, run.output
    assert "--fp16" in run.tool_calls("trtexec")[1].split()
    assert "--noTF32" not in run.tool_calls("trtexec")[1].split()
    forced = run_entrypoint(tmp_path, A10G, env={"TRT_PRECISION": "fp32"})
    build = forced.tool_calls("trtexec")[1].split()
    assert "--fp16" not in build
    assert "--noTF32" in build  # an FP32 plan: trtexec's TF32 default would round its products


@pytest.mark.parametrize("device", ["auto", "gpu"])
def test_gpu_older_than_the_release_supports_is_refused(tmp_path: Path, device: str) -> None:
    """A Pascal GPU (6.1) with a GPU reserved: stop with the reason, never serve on CPU."""
    run = run_entrypoint(tmp_path, "Tesla P40, 6.1", env={"TRITONSTACK_DEVICE": device})
    assert run.returncode == 1
    assert run.argv is None and run.tool_calls("trtexec") == []
    assert "Tesla P40 has compute capability 6.1; this image's Triton release supports 7.5" in (
        run.output
    )
    assert "TRITONSTACK_DEVICE=cpu" in run.output


def test_r470_driver_without_compute_cap_stops_instead_of_serving_on_cpu(tmp_path: Path) -> None:
    """R470's nvidia-smi lists the GPU but has no `compute_cap` field: `auto` must not take that
    for a CPU-only host."""
    run = run_entrypoint(tmp_path, "Tesla T4, 7.5", env={"FAKE_DRIVER": "470"})
    assert run.returncode == 1
    assert run.argv is None
    assert run.tool_calls("nvidia-smi") == [
        "nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader",
        "nvidia-smi -L",
    ]
    assert "GPU 0: Tesla T4" in run.output and "cannot report its compute capability" in run.output
    assert 'Field "compute_cap" is not a valid field to query.' in run.output
    assert "driver R580 or later" in run.output


def test_a_plan_that_is_not_written_leaves_the_model_out_and_serves_the_rest(
    tmp_path: Path,
) -> None:
    """trtexec reports success but leaves no engine (a full disk): classifier_trt is not served,
    the log and the status file the health check reads say why, and every other model is."""
    run = run_entrypoint(tmp_path, A10G, env={"FAKE_TRTEXEC_NO_ENGINE": "1"})
    assert run.returncode == 0, run.output
    assert run.argv == expected_argv(run.view, gpu=True, argv=run.argv)
    assert "classifier_trt" not in {p.name for p in run.view.iterdir()}
    assert "classifier" in {p.name for p in run.view.iterdir()}
    assert "wrote no plan to" in run.output and "classifier_trt is not served" in run.output
    assert not list(run.cache.glob("plans/*/*/key"))  # no key for a plan that does not exist
    assert "wrote no plan" in json.loads(run.status.read_text())["classifier_trt"]


def test_cpu_host_skips_tensorrt(tmp_path: Path) -> None:
    run = run_entrypoint(tmp_path, None)  # nvidia-smi present, no driver reachable
    assert run.returncode == 0, run.output
    assert run.calls == [
        "nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader",
        "nvidia-smi -L",
        "tritonserver " + " ".join(expected_argv(run.view, gpu=False, argv=run.argv)),
    ]
    assert run.argv == expected_argv(run.view, gpu=False, argv=run.argv)
    assert sorted(p.name for p in run.view.iterdir()) == [
        "classifier",
        "classify",
        "pipeline",
        "postprocess",
    ]
    assert "not served on CPU (GPU only): classifier_trt" in run.output
    assert "couldn't communicate with the NVIDIA driver" in run.output
    assert "WARNING: nvidia-smi is in the container but failed" in run.output  # loudly
    assert not run.cache.exists()  # nothing built, nothing cached


def test_cpu_without_nvidia_smi(tmp_path: Path) -> None:
    run = run_entrypoint(tmp_path, nvidia_smi=False)
    assert run.returncode == 0, run.output
    assert run.argv == expected_argv(run.view, gpu=False, argv=run.argv)
    assert "no nvidia-smi in the container" in run.output


def test_forced_cpu_ignores_a_visible_gpu(tmp_path: Path) -> None:
    # compose.cpu.yml sets TRITONSTACK_DEVICE=cpu: a GPU that a default nvidia runtime exposes
    # anyway is not used.
    run = run_entrypoint(tmp_path, A10G, env={"TRITONSTACK_DEVICE": "cpu"})
    assert run.returncode == 0, run.output
    assert run.tool_calls("nvidia-smi") == [] and run.tool_calls("trtexec") == []
    assert run.argv == expected_argv(run.view, gpu=False, argv=run.argv)


def test_forced_gpu_without_gpu_fails_with_the_cpu_command(tmp_path: Path) -> None:
    run = run_entrypoint(tmp_path, None, env={"TRITONSTACK_DEVICE": "gpu"})
    assert run.returncode == 1
    assert run.argv is None
    assert "TRITONSTACK_DEVICE=gpu but no GPU is visible" in run.output
    assert "-f compose.cpu.yml" in run.output


def test_a_failed_build_leaves_the_model_out_and_the_next_start_builds_again(
    tmp_path: Path,
) -> None:
    """A graph TensorRT cannot build never stops the container: that model is left out (the
    ONNX model serves, `classify` routes to it) and the next start tries again."""
    run = run_entrypoint(tmp_path, A10G, env={"FAKE_TRTEXEC_FAIL": "1"})
    assert run.returncode == 0, run.output
    assert run.argv == expected_argv(run.view, gpu=True, argv=run.argv)
    assert "classifier_trt" not in {p.name for p in run.view.iterdir()}
    assert "classifier_trt: trtexec failed; full log in" in run.output
    assert "  trtexec: [E] Error[4]" in run.output
    assert not list(run.cache.glob("plans/*/*/model.plan*"))  # no half-written plan cached
    assert "trtexec failed" in json.loads(run.status.read_text())["classifier_trt"]
    retry = run_entrypoint(tmp_path, A10G)  # the next start builds again
    assert retry.returncode == 0, retry.output
    assert len(retry.tool_calls("trtexec")) == 2
    assert "classifier_trt" in {p.name for p in retry.view.iterdir()}
    assert json.loads(retry.status.read_text()) == {}


def test_gpus_of_different_kinds_are_refused(tmp_path: Path) -> None:
    run = run_entrypoint(tmp_path, f"{A10G};Tesla T4, 7.5")
    assert run.returncode == 1
    assert "GPUs of different kinds are visible" in run.output
    assert run.argv is None


def test_ports_timeout_and_extra_arguments(tmp_path: Path) -> None:
    env = {"TRITON_HTTP_PORT": "9000", "TRITON_EXIT_TIMEOUT_SECS": "5"}
    run = run_entrypoint(tmp_path, nvidia_smi=False, env=env, args=("--log-verbose=1",))
    assert run.returncode == 0, run.output
    assert "--http-port=9000" in run.argv and "--exit-timeout-secs=5" in run.argv
    assert run.argv[-1] == "--log-verbose=1"


def test_invalid_settings_are_named(tmp_path: Path) -> None:
    device = run_entrypoint(tmp_path, env={"TRITONSTACK_DEVICE": "tpu"})
    assert (
        device.returncode == 1 and "TRITONSTACK_DEVICE=tpu: use auto, gpu or cpu" in device.output
    )
    precision = run_entrypoint(tmp_path, A10G, env={"TRT_PRECISION": "int4"})
    assert precision.returncode == 1 and "TRT_PRECISION=int4" in precision.output


def test_every_flag_is_one_the_real_tritonserver_knows(tmp_path: Path) -> None:
    """Triton 2.51's own --help lists every option the entrypoint passes, GPU and CPU alike."""
    try:
        binary = pytriton_root() / "bin" / "tritonserver"
    except Exception as exc:  # nvidia-pytriton is a test dependency; say so if it is missing
        pytest.fail(f"nvidia-pytriton's tritonserver is needed: {exc}")
    env = EmbeddedTriton(REPOSITORY).environment()
    help_text = subprocess.run(
        [str(binary), "--help"], env=env, capture_output=True, text=True, timeout=60
    )
    known = {
        line.split()[0]
        for line in (help_text.stdout + help_text.stderr).splitlines()
        if line.startswith("  --")
    }
    assert "--model-config-name" in known, help_text.stdout[-2000:]
    gpu = run_entrypoint(tmp_path, A10G).argv
    cpu = run_entrypoint(tmp_path, None).argv
    names = {arg.split("=", 1)[0] for arg in [*gpu, *cpu]}
    assert names - known == set()


def test_admin_key_is_generated_once_private_and_never_logged(tmp_path: Path) -> None:
    env = {"TRITONSTACK_ADMIN_KEY": ""}
    first = run_entrypoint(tmp_path, env=env)
    key_file = tmp_path / "cache" / "admin-key"
    key = key_file.read_text().strip()
    assert first.returncode == 0, first.output
    assert len(key) >= 32
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert first.argv[-4:-2] == restricted(key)
    assert key not in first.output and "tritonstack-admin-key=<secret>" in first.output
    assert shut_key(first.argv) not in first.output
    assert "tritonstack-shut-key=<secret>" in first.output
    second = run_entrypoint(tmp_path, env=env)
    assert second.argv[-4:-2] == restricted(key)  # stable across restarts of the container
    assert shut_key(second.argv) != shut_key(first.argv)  # drawn anew: kept nowhere


def test_a_key_file_that_cannot_be_written_falls_back_to_the_cache(tmp_path: Path) -> None:
    """Kubernetes mounts the optional admin Secret read-only where TRITONSTACK_ADMIN_KEY_FILE
    points: its key when the Secret exists, else a key generated into the cache volume (here the
    key file's folder is a regular file, which nobody, root included, can write into)."""
    blocked = tmp_path / "secret-volume"
    blocked.write_text("")
    env = {"TRITONSTACK_ADMIN_KEY": "", "TRITONSTACK_ADMIN_KEY_FILE": str(blocked / "key")}
    first = run_entrypoint(tmp_path, env=env)
    assert first.returncode == 0, first.output
    key = (tmp_path / "cache" / "admin-key").read_text().strip()
    assert len(key) >= 32 and first.argv[-4:-2] == restricted(key)
    assert f"generated the admin key in {tmp_path / 'cache' / 'admin-key'}" in first.output
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    (mounted / "key").write_text("from-the-secret")
    env["TRITONSTACK_ADMIN_KEY_FILE"] = str(mounted / "key")
    second = run_entrypoint(tmp_path, env=env)
    assert second.argv[-4:-2] == restricted("from-the-secret")


def watchdog_run(tmp_path: Path, probe_script: str) -> Run:
    probe = tmp_path / "probe.sh"
    probe.write_text(probe_script)
    probe.chmod(0o755)
    env = {
        "TRITONSTACK_WATCHDOG": "on",
        "TRITONSTACK_WATCHDOG_INTERVAL": "0.2",
        "TRITONSTACK_WATCHDOG_FAILURES": "3",
        "TRITONSTACK_WATCHDOG_PROBE": f"{probe} {tmp_path / 'probes'}",
        "FAKE_TRITONSERVER_WAIT": "1",
    }
    return run_entrypoint(tmp_path, env=env)


def test_watchdog_stops_tritonserver_after_failed_deep_probes(tmp_path: Path) -> None:
    """Healthy for two probes, then the deep probe fails (a dead stub): after three failures in
    a row the watchdog SIGTERMs tritonserver, so the container exits and is restarted."""
    run = watchdog_run(tmp_path, '#!/usr/bin/env bash\necho x >>"$1"\n[ "$(wc -l <"$1")" -le 2 ]\n')
    assert run.returncode == 0, run.output
    assert run.calls[-1] == "tritonserver got SIGTERM"
    assert "watchdog: deep probe failed (3/3)" in run.output
    assert "watchdog: stopping tritonserver" in run.output


def test_watchdog_waits_for_the_first_good_probe(tmp_path: Path) -> None:
    """While models load the probe fails; that must not count: failures only count once armed."""
    run = watchdog_run(
        tmp_path,
        '#!/usr/bin/env bash\necho x >>"$1"\nn=$(wc -l <"$1")\n[ "$n" -ge 6 ] && [ "$n" -le 8 ]\n',
    )
    assert run.returncode == 0, run.output
    failures = [line for line in run.output.splitlines() if "deep probe failed" in line]
    assert failures == [
        "[entrypoint] watchdog: deep probe failed (1/3)",
        "[entrypoint] watchdog: deep probe failed (2/3)",
        "[entrypoint] watchdog: deep probe failed (3/3)",
    ]
    assert len((tmp_path / "probes").read_text().splitlines()) == 11  # 5 loading + 3 good + 3


def test_watchdog_leaves_a_busy_server_alone(tmp_path: Path) -> None:
    """The real healthcheck as the watchdog's probe: one healthy probe arms it, then the server
    sheds load (503 on every request). Busy is not dead: tritonserver is never stopped (the old
    probe counted each 503 and stopped it after two)."""
    import sys

    from tests.unit.test_health import HEALTHCHECK, StandInTriton

    probe = f"{sys.executable} {HEALTHCHECK} --url {{}} --model ranker"
    with StandInTriton(503, "Exceeds maximum queue size", good=4) as busy:
        env = {
            "TRITONSTACK_WATCHDOG": "on",
            "TRITONSTACK_WATCHDOG_INTERVAL": "0.2",
            "TRITONSTACK_WATCHDOG_FAILURES": "2",
            "TRITONSTACK_WATCHDOG_PROBE": probe.format(busy.url),
            "FAKE_TRITONSERVER_WAIT": "1",
            "FAKE_TRITONSERVER_SECONDS": "5",
        }
        run = run_entrypoint(tmp_path, env=env)
        requests = busy.requests
    assert "watchdog: deep probe passed" in run.output  # armed by the 4 good answers
    assert requests >= 4 + 2, requests  # then at least two busy probes
    assert run.returncode == 3, run.output  # ran its full time: never signalled
    assert "deep probe failed" not in run.output
    assert "tritonserver got SIGTERM" not in run.calls


@pytest.mark.parametrize(
    ("driver", "words"),
    [
        ("615.61", "[entrypoint] driver 615.61\n"),
        ("580.95.05", "CUDA 13.4 in minor-version compatibility mode"),
        ("575.57.08", "WARNING: driver 575.57.08 is older than R580"),
    ],
    ids=["recommended", "minor-version compatibility", "older than R580"],
)
def test_the_driver_is_named_against_the_images_cuda(tmp_path: Path, driver, words) -> None:
    """The host's driver decides how the image's CUDA 13.4 runs: said once at start, and the
    container serves on the GPU whichever it is (forward compatibility may still carry it)."""
    run = run_entrypoint(tmp_path, A10G, env={"FAKE_DRIVER": driver})
    assert run.returncode == 0, run.output
    assert words in run.output
    assert "--model-config-name=gpu" in run.argv


def test_an_added_models_plan_is_built_with_the_profile_of_its_bounds(tmp_path: Path) -> None:
    """add-model writes trtexec's shapes into NAME_trt (names quoted); the entrypoint passes
    them as they are: a variable-size image model gets the profile of its --shape bounds."""
    import onnx

    from tests import model_zoo
    from tritonstack.check import onnx_serving
    from tritonstack.models import add_model

    zoo = model_zoo.image(tmp_path / "zoo")
    plan = onnx_serving.plan(zoo.path, shapes=onnx_serving.parse_shapes([zoo.options[1]]))
    repository = tmp_path / "repository"
    (repository / "image" / "1").mkdir(parents=True)
    (repository / "image" / "configs").mkdir()
    (repository / "image_trt" / "1").mkdir(parents=True)
    onnx.save(plan.model, str(repository / "image" / "1" / "model.onnx"))
    (repository / "image" / "config.pbtxt").write_text(add_model.cpu_config("image", plan, [], "x"))
    (repository / "image" / "configs" / "gpu.pbtxt").write_text(
        add_model.gpu_config("image", plan, [], "x")
    )
    (repository / "image_trt" / "config.pbtxt").write_text(
        add_model.trt_config("image_trt", plan, [])
    )
    run = run_entrypoint(tmp_path, A10G, env={"MODEL_REPOSITORY": str(repository)})
    assert run.returncode == 0, run.output
    build = run.tool_calls("trtexec")[1].split()
    assert [a for a in build if "Shapes=" in a] == [
        "--minShapes='images':1x3x8x8",
        "--optShapes='images':2x3x16x24",
        "--maxShapes='images':4x3x32x32",
    ]


def test_inference_binds_only_the_serving_network_s_address(tmp_path: Path) -> None:
    """TRITONSTACK_SERVING_NAME (compose's alias on the gateway's network): HTTP and gRPC bind
    to this container's address among the name's, metrics stay on every address; a name that
    resolves to no address of this container stops the start with one line."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "healthcheck.py").symlink_to(ROOT / "tritonstack" / "core" / "health.py")
    env = {"TRITONSTACK_HOME": str(home), "TRITONSTACK_SERVING_NAME": "localhost"}
    run = run_entrypoint(tmp_path, nvidia_smi=False, env=env)
    assert run.returncode == 0, run.output
    assert "--http-address=127.0.0.1" in run.argv and "--grpc-address=127.0.0.1" in run.argv
    assert "--metrics-address=0.0.0.0" in run.argv
    env["TRITONSTACK_SERVING_NAME"] = "no-such-alias.invalid"
    run = run_entrypoint(tmp_path, nvidia_smi=False, env=env)
    assert run.returncode == 1 and run.argv is None
    assert "no-such-alias.invalid does not resolve here" in run.output
    assert "Traceback" not in run.output


def test_a_public_model_the_image_lacks_stops_the_start_saying_to_rebuild(tmp_path: Path) -> None:
    """compose's PUBLIC_MODELS is the checkout's stack.env: a model added after the image was
    built is named, with the command that rebuilds it, and nothing is served."""
    run = run_entrypoint(tmp_path, nvidia_smi=False, env={"PUBLIC_MODELS": "pipeline ranker"})
    assert run.returncode == 1 and run.argv is None
    assert "this image's model repository has no ranker, which stack.env makes public" in run.output
    assert "docker compose up -d --build" in run.output
    served = run_entrypoint(tmp_path, nvidia_smi=False, env={"PUBLIC_MODELS": "pipeline classify"})
    assert served.returncode == 0, served.output


def test_asked_restricted_apis_open_with_the_admin_key_and_the_rest_stay_shut(tmp_path: Path):
    run = run_entrypoint(tmp_path, env={"TRITONSTACK_ADMIN_APIS": "logging,trace"})
    assert run.returncode == 0, run.output
    opened = f"model-repository,statistics,trace,logging:tritonstack-admin-key={ADMIN_KEY}"
    assert run.argv[-4:-2] == [
        f"--http-restricted-api={opened}", f"--grpc-restricted-protocol={opened}"
    ]  # fmt: skip
    key = run.argv[-1].rsplit("=", 1)[1]
    assert run.argv[-2:] == [
        f"--http-restricted-api=shared-memory:tritonstack-shut-key={key}",
        f"--grpc-restricted-protocol=shared-memory:tritonstack-shut-key={key}",
    ]


def test_the_llm_starts_with_the_same_flags_on_its_own_repository(tmp_path: Path) -> None:
    """`launcher llm`: the vLLM model's repository as it is (no view, no device, no GPU
    metrics), with every flag the models' Triton gets."""
    from tests.support import LLM_REPOSITORY

    env = {"MODEL_REPOSITORY": str(LLM_REPOSITORY)}
    run = run_entrypoint(tmp_path, A10G, env=env, args=("llm", "--log-verbose=1"))
    assert run.returncode == 0, run.output
    assert run.tool_calls("nvidia-smi") == [] and run.tool_calls("trtexec") == []
    expected = expected_argv(run.view, gpu=False, argv=run.argv[:-1])
    expected[0] = f"--model-repository={LLM_REPOSITORY}"
    assert run.argv == [*expected, "--log-verbose=1"]
    assert not run.view.exists()


def test_a_model_the_onnxruntime_backend_would_crash_on_is_left_out_and_the_rest_served(
    tmp_path: Path,
) -> None:
    """A hand-written config that batches a graph with a rank-0 output (`dims: [1]`, `reshape:
    { shape: [] }`): Triton's onnxruntime backend loads it, then tritonserver dies of SIGSEGV at
    its first request, every model with it (onnxruntime_rules.serving_errors). The launcher reads
    the graph without `onnx` and leaves it out, on CPU and GPU, saying why in the log and the
    status file; a batching model whose file is not ONNX at all is left to Triton's load."""
    import shutil

    import onnx
    from onnx import TensorProto, helper

    repository = tmp_path / "repository"
    shutil.copytree(REPOSITORY, repository, symlinks=True)
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0)], "total",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("total", TensorProto.FLOAT, [])],
    )  # fmt: skip
    config = (
        'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } } ]\n'
        'output [\n  {\n    name: "total"\n    data_type: TYPE_FP32\n    dims: [ 1 ]\n'
        "    reshape: { shape: [ ] }\n  }\n]\n"
    )
    for name, model in (("total", onnx.helper.make_model(graph).SerializeToString()),
                        ("garbled", b"this is not an ONNX file")):  # fmt: skip
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "1" / "model.onnx").write_bytes(model)
        (repository / name / "config.pbtxt").write_text(config)
    for gpus in (None, A10G):
        run = run_entrypoint(tmp_path, gpus, env={"MODEL_REPOSITORY": str(repository)})
        assert run.returncode == 0, run.output
        served = {p.name for p in run.view.iterdir()}
        assert "total" not in served and {"classifier", "garbled"} <= served, (gpus, served)
        reason = json.loads(run.status.read_text())["total"]
        assert reason.startswith("version 1: output 'total' has rank 0 in the graph but "
                                 "max_batch_size is 8"), reason  # fmt: skip
        assert "crashes (SIGSEGV)" in reason and "set max_batch_size: 0" in reason
        assert f"WARNING: total: {reason}. total is not served; every other model is" in run.output
