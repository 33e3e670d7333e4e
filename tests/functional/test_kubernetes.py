"""What the Kubernetes manifests rely on of the real Triton: a model folder mounted from a
ConfigMap, in the layout the kubelet writes (`..<timestamp>/` holding the files, `..data` linking
to it, one link per top-level entry), is served when the mount is the model's own directory, as
components/llm mounts the LLM's; mounted at the repository's root, the kubelet's folders are
taken for models that fail to load. tests/unit/test_kubernetes.py checks the rendered
manifest mounts it so; this is why.

The model is a small Python one: what is under test is how Triton reads the directories, which
does not depend on the backend (the vLLM engine would add a minute and prove nothing more)."""

from __future__ import annotations

import time
from pathlib import Path

from tests.unit.test_kubernetes import render
from tritonstack.core import contract
from tritonstack.core.ports import free_ports
from tritonstack.launcher.start import Settings
from tritonstack.serve import processes
from tritonstack.serve.runtime import EmbeddedTriton, default_cache_dir, prepare_backends

CONFIG = """backend: "python"
max_batch_size: 0
input [{ name: "IN", data_type: TYPE_FP32, dims: [1] }]
output [{ name: "OUT", data_type: TYPE_FP32, dims: [1] }]
instance_group [{ kind: KIND_CPU, count: 1 }]
"""
MODEL = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]
            )
            for r in requests
        ]
"""


def kubelet_configmap_volume(mount: Path, items: dict[str, str]) -> None:
    """`items` (path -> content) written under `mount` as the kubelet's atomic writer does."""
    stamp = "..2026_12_03_10_00_00.123456789"
    for path, content in items.items():
        target = mount / stamp / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    (mount / "..data").symlink_to(stamp)
    for top in {path.split("/")[0] for path in items}:
        (mount / top).symlink_to(f"..data/{top}")


def serve(repository: Path, model: str, log: Path) -> tuple[bool, int | None]:
    """(whether `model` became ready, tritonserver's exit status if it exited)."""
    http, grpc, metrics = free_ports(3)
    server = EmbeddedTriton(repository, http, grpc, metrics)
    command = server.command(prepare_backends(default_cache_dir()), repository)
    process = processes.spawn(command, log, env=server.environment())
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            if processes.http_ok(f"http://127.0.0.1:{http}/v2/models/{model}/ready"):
                return True, None
            time.sleep(0.5)
        return False, process.poll()
    finally:
        process.terminate()
        process.wait(60)


def test_a_configmap_mounted_at_the_model_directory_is_served(tmp_path: Path) -> None:
    objects = render("gpu", ("llm",), tmp_path / "kustomize")
    (deployment,) = [
        o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "triton-llm"
    ]
    pod = deployment["spec"]["template"]["spec"]
    variables = {e["name"]: e.get("value", "") for e in pod["containers"][0]["env"]}
    repository = str(Settings.from_environment(variables).repository)  # what the command serves
    (mount,) = [
        m
        for m in pod["containers"][0]["volumeMounts"]
        if m["mountPath"].startswith(repository + "/")
    ]
    model = Path(mount["mountPath"]).relative_to(repository).as_posix()
    assert model == contract.LLM_MODEL
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    # The manifest's item paths (config.pbtxt, 1/<file>), with this model's files.
    paths = sorted(item["path"] for item in volume["configMap"]["items"])
    assert paths == ["1/model.json", "config.pbtxt"]
    root = tmp_path / "repository"
    kubelet_configmap_volume(root / model, {"config.pbtxt": CONFIG, "1/model.py": MODEL})
    ready, status = serve(root, model, tmp_path / "model-dir.log")
    assert ready, f"exit {status}:\n{(tmp_path / 'model-dir.log').read_text()[-3000:]}"


def test_a_configmap_mounted_at_the_repository_root_makes_models_of_the_kubelets_folders(
    tmp_path: Path,
) -> None:
    """The kubelet's `..data` is taken for a model, which cannot load: Triton reports it (and,
    with --exit-on-error=false, serves what does load), a failed model on every start."""
    root = tmp_path / "repository"
    root.mkdir()
    kubelet_configmap_volume(root, {"echo/config.pbtxt": CONFIG, "echo/1/model.py": MODEL})
    serve(root, "echo", tmp_path / "root.log")
    log = (tmp_path / "root.log").read_text()
    assert "failed to load model '..data'" in log or "failed to load '..data'" in log, log[-3000:]
