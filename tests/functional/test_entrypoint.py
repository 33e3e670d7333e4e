"""What the entrypoint's GPU path relies on in Triton itself, shown on the real tritonserver 2.51:
`--model-config-name` falls back to config.pbtxt where a model has no variant."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.support import REPOSITORY
from tritonstack.serve.runtime import EmbeddedTriton


def test_model_config_name_falls_back_to_config_pbtxt(tmp_path: Path) -> None:
    """What the GPU path relies on, shown on the real Triton 2.51: with --model-config-name=gpu
    a model's configs/gpu.pbtxt is used where it exists and config.pbtxt everywhere else."""
    import tritonclient.http as httpclient

    from tritonstack.core.ports import free_ports

    repo = tmp_path / "model_repository"
    shutil.copytree(REPOSITORY, repo, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.rmtree(repo / "classifier" / "configs")  # KIND_GPU: not loadable on this machine
    default = (repo / "postprocess" / "config.pbtxt").read_text()
    assert default.count("max_queue_delay_microseconds: 100") == 1
    variant = repo / "postprocess" / "configs" / "gpu.pbtxt"
    variant.parent.mkdir()
    variant.write_text(
        default.replace("max_queue_delay_microseconds: 100", "max_queue_delay_microseconds: 250")
    )
    http, grpc, metrics = free_ports(3)
    server = EmbeddedTriton(
        repo, http, grpc, metrics, log_path=tmp_path / "triton.log",
        extra_args=["--model-config-name=gpu"],
    )  # fmt: skip
    with server:
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            delays = {
                name: client.get_model_config(name)["dynamic_batching"][
                    "max_queue_delay_microseconds"
                ]
                for name in ("postprocess", "classifier")
            }
        finally:
            client.close()
    assert delays == {"postprocess": 250, "classifier": 100}
