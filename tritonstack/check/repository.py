"""The whole repository, model by model and configuration by configuration: which checks each
model gets (its own, then against the models it names), and which messages are said once."""

from __future__ import annotations

from pathlib import Path

from tritonstack.check.ensemble import check_ensemble
from tritonstack.check.labels import check_label_filenames, check_labels_file
from tritonstack.check.messages import sayer, shown
from tritonstack.check.model_config import check_basics, check_queue_policy
from tritonstack.check.onnx_graph import check_onnx
from tritonstack.check.python_models import check_called_models, check_python_files
from tritonstack.check.schema_skew import check_schema_skew
from tritonstack.check.tensorrt import check_tensorrt_files, check_tensorrt_twin
from tritonstack.check.vllm_model import check_vllm
from tritonstack.core.errors import UserError
from tritonstack.core.repository import Model, parse_config


def check_repository(repository: Path) -> list[str]:
    """Return one message per problem; an empty list means the repository is servable.

    Every model is checked even when another one is broken (a syntax error in one config does
    not hide the problems of the others), because fixing a repository one server start per
    mistake is exactly the slow loop this check exists to avoid.
    """
    repository = shown(Path(repository))
    if not repository.is_dir():
        return [
            f"{repository}: model repository not found; pass the directory that holds one "
            "sub-directory per model (e.g. model_repository)"
        ]
    problems: list[str] = []
    models: dict[str, Model] = {}
    broken: set[str] = set()  # models whose own problem is already reported: no follow-ups
    for directory in sorted(p for p in repository.iterdir() if p.is_dir()):
        if directory.name.startswith("."):
            continue
        config_path = directory / "config.pbtxt"
        if not config_path.is_file():
            broken.add(directory.name)
            problems.append(
                f"{config_path}: missing; every model directory needs a config.pbtxt "
                "(Triton loads every sub-directory as a model): add one or move "
                f"{directory.name}/ out of the repository"
            )
            continue
        try:
            models[directory.name] = Model(directory, parse_config(config_path))
        except UserError as exc:
            broken.add(directory.name)
            problems.append(" ".join(str(exc).split("\n")))
    if not models and not broken:
        problems.append(
            f"{repository}: no models (no sub-directory with a config.pbtxt); add one "
            "directory per model, e.g. classifier/config.pbtxt and classifier/1/model.onnx"
        )
    # Two passes: a model with problems of its own is not also compared with the models that
    # mirror it (classifier_trt would be told to copy classifier's mistake).
    own = {name: _check_model(model) for name, model in models.items()}
    suspect = broken | {name for name, found in own.items() if found}
    for name, model in models.items():
        problems.extend(own[name])
        problems.extend(_check_references(model, models, broken, suspect))
        problems.extend(check_queue_policy(model))
    problems.extend(_check_variants(models, broken, suspect, problems))
    problems.extend(check_schema_skew(repository))
    return problems


def _check_variants(
    models: dict[str, Model], broken: set[str], suspect: set[str], reported: list[str]
) -> list[str]:
    """`<model>/configs/<name>.pbtxt`, served with --model-config-name=<name> (configs/gpu.pbtxt
    on GPU hosts): the same checks, against the repository that server sees, i.e. every model's
    variant where it has one and its config.pbtxt otherwise. Messages already given are not
    repeated."""
    problems: list[str] = []
    variant_names = sorted(
        {p.stem for m in models.values() for p in (m.directory / "configs").glob("*.pbtxt")}
    )
    for variant_name in variant_names:
        variants, paths = {}, {}
        for name, model in models.items():
            path = model.directory / "configs" / f"{variant_name}.pbtxt"
            if not path.is_file():
                continue
            try:
                variants[name] = Model(model.directory, parse_config(path))
                paths[name] = path
            except UserError as exc:
                problems.append(" ".join(str(exc).split("\n")))
        for name, model in variants.items():
            problems.extend(check_queue_policy(model, paths[name]))
        served = {**models, **variants}
        own = {name: _check_model(model, paths[name]) for name, model in variants.items()}
        doubtful = suspect | {name for name, found in own.items() if found}
        for name, model in served.items():
            found = own.get(name, [])
            found += _check_references(model, served, broken, doubtful, paths.get(name))
            for message in found:
                # A problem of the model's files (a missing model.onnx) is the same for every
                # configuration: said once, for config.pbtxt.
                default = message.replace(
                    str(paths.get(name)), str(model.directory / "config.pbtxt"), 1
                )
                if default not in reported and message not in problems:
                    problems.append(message)
    return problems


def _check_model(model: Model, config_path: Path | None = None) -> list[str]:
    """What one model directory and its config must satisfy on their own."""
    problems, say = sayer(model, config_path)
    kind, versions = check_basics(model, say)
    if kind == "python":
        check_python_files(model, versions, say)
    elif kind == "onnxruntime":
        check_onnx(model, versions, say)
    elif kind == "tensorrt":
        check_tensorrt_files(model, versions, say)
    elif kind == "vllm":
        check_vllm(model, versions, say)
    check_label_filenames(model, say)
    return problems


def _check_references(
    model: Model,
    models: dict[str, Model],
    broken: set[str],
    suspect: set[str],
    config_path: Path | None = None,
) -> list[str]:
    """What a model must satisfy against the other models it names, mirrors or wires up."""
    problems, say = sayer(model, config_path)
    if model.kind == "python":
        check_called_models(model, models, broken, say)
        check_labels_file(model, models, say)
    elif model.kind == "tensorrt":
        check_tensorrt_twin(model, models, suspect, say)
    elif model.kind == "ensemble":
        check_ensemble(model, models, broken, say)
    return problems
