"""The entrypoint's TensorRT precision choice and its cache shared between replicas.

`docker compose up --scale triton=N` starts N entrypoints at once against one cache volume. Here
two real entrypoints run concurrently against one cache directory, with the named fakes of
tests/fakes/ for what this machine lacks (a slow trtexec, a tritonserver that becomes "ready"
when the test says so), and the precision choice runs against fakes of TensorRT 10's and 11's
trtexec (TensorRT 11 has no --fp16).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.unit.test_entrypoint import A10G, Run, run_entrypoint

TENSORRT_11 = {"FAKE_TRT_VERSION": "110100"}


def builds(run: Run) -> list[str]:
    return [c for c in run.tool_calls("trtexec") if c != "trtexec --help"]


def test_tensorrt_11_builds_in_the_models_precision(tmp_path: Path) -> None:
    run = run_entrypoint(tmp_path, A10G, env=TENSORRT_11)
    assert run.returncode == 0, run.output
    (build,) = builds(run)
    assert "--fp16" not in build.split()
    assert "TensorRT 11.1.0 builds strongly typed networks" in run.output
    assert "plans keep the ONNX model's precision" in run.output
    assert run.tool_calls("tritonserver")  # the container starts instead of restart-looping


def test_tensorrt_10_still_gets_fp16(tmp_path: Path) -> None:
    run = run_entrypoint(tmp_path, A10G, env={"FAKE_TRT_VERSION": "101401"})
    assert run.returncode == 0, run.output
    (build,) = builds(run)
    assert "--fp16" in build.split()


def test_fp16_demanded_from_tensorrt_11_is_refused_with_the_way_out(tmp_path: Path) -> None:
    run = run_entrypoint(tmp_path, A10G, env={**TENSORRT_11, "TRT_PRECISION": "fp16"})
    assert run.returncode == 1
    assert builds(run) == [] and run.argv is None
    assert "TRT_PRECISION=fp16, but trtexec of TensorRT 11.1.0 has no --fp16" in run.output
    assert "ModelOpt AutoCast" in run.output and "TRT_PRECISION=auto" in run.output


def test_the_fake_refuses_fp16_as_tensorrt_11_does(tmp_path: Path) -> None:
    """What the old entrypoint met on TensorRT 11: --fp16 is an unknown option, the build fails."""
    import subprocess

    from tests.unit.test_entrypoint import FAKES, ONNX

    result = subprocess.run(
        [str(FAKES / "fake_trtexec"), f"--onnx={ONNX}", "--fp16", f"--saveEngine={tmp_path}/p"],
        env={"FAKE_TRT_VERSION": "110000", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert "[E] Unknown option: --fp16" in result.stdout
    assert "&&&& FAILED TensorRT.trtexec [TensorRT v110000]" in result.stdout


def replica(tmp_path: Path, name: str, cache: Path, **env: str) -> tuple[Path, dict[str, str]]:
    """One replica's own directory (fakes' logs, repository view) and its shared cache."""
    own = tmp_path / name
    own.mkdir()
    return own, {"TRITONSTACK_CACHE": str(cache), **env}


def test_two_replicas_build_one_plan_and_share_it(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    slow = {"FAKE_TRTEXEC_SECONDS": "2"}
    replicas = [replica(tmp_path, name, cache, **slow) for name in ("a", "b")]
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda r: run_entrypoint(r[0], A10G, env=r[1]), replicas))
    for run in runs:
        assert run.returncode == 0, run.output
    assert sorted(len(builds(run)) for run in runs) == [0, 1], [run.calls for run in runs]
    waiter = next(run for run in runs if not builds(run))
    assert "another replica is building this plan; waiting for it" in waiter.output
    assert "reusing the cached plan" in waiter.output
    plans = {(run.view / "classifier_trt" / "1" / "model.plan").resolve() for run in runs}
    assert len(plans) == 1
    (plan,) = plans
    assert plan.read_text().startswith("fake plan from") and "with " in plan.read_text()
    assert not list(plan.parent.glob("*.tmp"))


def test_a_truncated_plan_is_rebuilt_not_trusted(tmp_path: Path) -> None:
    first = run_entrypoint(tmp_path, A10G)
    assert first.returncode == 0, first.output
    plan = (first.view / "classifier_trt" / "1" / "model.plan").resolve()
    whole = plan.read_bytes()
    plan.write_bytes(whole[: len(whole) // 2])  # a replica killed mid-copy, a full disk
    second = run_entrypoint(tmp_path, A10G)
    assert second.returncode == 0, second.output
    assert "is incomplete or does not match its checksum" in second.output
    assert len(builds(second)) == 1
    assert plan.read_bytes() == whole


def test_a_plan_without_its_checksum_is_rebuilt(tmp_path: Path) -> None:
    first = run_entrypoint(tmp_path, A10G)
    plan = (first.view / "classifier_trt" / "1" / "model.plan").resolve()
    (plan.parent / "model.plan.sha256").unlink()  # the build was cut off before it finished
    second = run_entrypoint(tmp_path, A10G)
    assert second.returncode == 0, second.output
    assert len(builds(second)) == 1 and "reusing" not in second.output


def wait_for(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_next_replica_loads_only_once_the_engines_are_written(tmp_path: Path) -> None:
    """ONNX Runtime writes its TensorRT engines while the first replica's models warm up; the
    second replica's tritonserver must not start (and read them) before the first is ready."""
    cache = tmp_path / "cache"
    serving = {"FAKE_TRITONSERVER_WAIT": "1"}
    runs: dict[str, Run] = {}
    dirs = {}
    for name, seconds in (("a", "8"), ("b", "2")):
        probe = f"test -e {tmp_path / f'ready-{name}'}"
        env = {**serving, "FAKE_TRITONSERVER_SECONDS": seconds, "TRITONSTACK_READY_PROBE": probe}
        dirs[name] = replica(tmp_path, name, cache, **env)

    def start(name: str) -> threading.Thread:
        own, env = dirs[name]
        thread = threading.Thread(
            target=lambda: runs.__setitem__(name, run_entrypoint(own, A10G, env=env))
        )
        thread.start()
        return thread

    def exec_logged(name: str) -> bool:
        log = dirs[name][0] / "calls.log"
        return log.exists() and "tritonserver " in log.read_text()

    first = start("a")
    wait_for(lambda: exec_logged("a"))
    second = start("b")
    time.sleep(2.0)
    assert not exec_logged("b"), "b started tritonserver while a was still loading"
    (tmp_path / "ready-a").touch()
    wait_for(lambda: exec_logged("b"), timeout=10)
    (tmp_path / "ready-b").touch()
    first.join(30)
    second.join(30)
    # 3: each fake tritonserver served its full time, so neither replica stopped early.
    assert runs["a"].returncode == runs["b"].returncode == 3, runs["a"].output + runs["b"].output
    assert "models ready: ONNX Runtime's engine cache is released" in runs["a"].output
    assert "another replica is loading its models against ONNX Runtime's" in runs["b"].output
    engines = [(runs[n].engines / "classifier").resolve() for n in "ab"]
    assert engines[0] == engines[1] and engines[0].is_relative_to(cache)
