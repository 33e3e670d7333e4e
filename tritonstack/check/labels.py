"""The class labels a Python model reads from the file its `labels_file` parameter names: the
file exists, and holds one label per class, in class-index order."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from tritonstack.check.messages import Say, format_dims
from tritonstack.check.python_models import CALLED_MODEL_PARAMETERS
from tritonstack.repository import Model


def check_labels_file(model: Model, models: dict[str, Model], say: Say) -> None:
    """The `labels_file` parameter, where the model has one."""
    relative = model.parameter("labels_file")
    if relative is not None:
        _check_labels(model, relative, models, say)


def _check_labels(model: Model, relative: str, models: dict[str, Model], say: Say) -> None:
    """Labels are indexed by the classifier's argmax: one per class, in class order."""
    field = 'parameters "labels_file"'
    if not relative:
        say(field, "is empty", "set it to the labels file, relative to the model directory")
        return
    path = Path(os.path.normpath(model.directory / relative))
    if not path.is_file():
        say(
            field,
            f'is "{relative}" but {path} does not exist',
            f"create it (one label per line, in class-index order) or fix the path, which is "
            f"relative to {model.directory}/",
        )
        return
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        say(field, f"points at {path}, which cannot be read ({exc})", "write it as UTF-8 text")
        return
    labels = [line.strip() for line in text.splitlines() if line.strip()]
    if len(labels) < 2:
        say(
            field,
            f"points at {path}, which has {len(labels)} non-empty line(s)",
            "write one label per class (a classifier has at least 2), one per line",
        )
        return
    wrong = [
        f"{source} has {n} scores" for source, n in _class_counts(model, models) if n != len(labels)
    ]
    if wrong:
        say(
            field,
            f"points at {path}, which has {len(labels)} labels, but " + " and ".join(wrong),
            "write exactly one label per class, in class-index order",
        )


def _class_counts(model: Model, models: dict[str, Model]) -> Iterable[tuple[str, int]]:
    """Class counts the labels must match: this model's `class` input, or the models it calls."""
    for io in model.config.input:
        if io.name == "class" and io.dims and io.dims[-1] > 0:
            yield f'input "class" (dims {format_dims(io.dims)})', io.dims[-1]
    for key in CALLED_MODEL_PARAMETERS:
        target = models.get(model.parameter(key) or "")
        for io in target.config.output if target else ():
            if io.name == "class" and io.dims and io.dims[-1] > 0:
                yield f'output "class" of {target.name} (dims {format_dims(io.dims)})', io.dims[-1]
