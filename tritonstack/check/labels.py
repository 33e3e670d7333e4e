"""Class labels files, indexed by class (one label per class, in class-index order): Triton's
classification extension (`label_filename` on an output) and this stack's `labels_file` parameter
(a Python model that turns scores into labels).

No tensor is assumed to have a name: a class count is read from a config only where the config
itself says which dimension holds the classes.
"""

from __future__ import annotations

import os
from pathlib import Path

from tritonclient.grpc import model_config_pb2

from tritonstack.check.messages import Say, format_dims
from tritonstack.check.python_models import CALLED_MODEL_PARAMETERS
from tritonstack.core.repository import Model


def check_label_filenames(model: Model, say: Say) -> None:
    """Triton's classification extension: the label file of every output that names one.

    Triton reads every line of the file as a label, in class-index order, and answers a
    `classification` request with the label at the winning index; it never compares the count
    with the output's shape, so a wrong file only shows as wrong answers.
    """
    for index, io in enumerate(model.config.output):
        if io.label_filename:
            _check_label_filename(model, f'output[{index}] "{io.name}".label_filename', io, say)


def check_labels_file(model: Model, models: dict[str, Model], say: Say) -> None:
    """This stack's `labels_file` parameter: the labels a Python model maps its argmax onto.

    The model's reader (postprocess/1/labels_file.py) skips empty lines and strips each label.
    """
    relative = model.parameter("labels_file")
    if relative is None:
        return
    field = 'parameters "labels_file"'
    if not relative:
        say(field, "is empty", "set it to the labels file, relative to the model directory")
        return
    path = Path(os.path.normpath(model.directory / relative))
    text = _read(model, relative, path, field, say)
    if text is None:
        return
    numbered = [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    labels = [label for _, label in numbered]
    if not labels:
        say(
            field,
            f"points at {path}, which holds no label (no non-empty line)",
            "write one label per class, one per line, in class-index order",
        )
        return
    lines_of: dict[str, list[int]] = {}
    for number, label in numbered:
        lines_of.setdefault(label, []).append(number)
    duplicates = {label: lines for label, lines in lines_of.items() if len(lines) > 1}
    if duplicates:
        say(
            field,
            f"points at {path}, which has "
            + ", ".join(f'"{label}" on lines {_and(lines)}' for label, lines in duplicates.items()),
            "give each class a label of its own (answers could not tell those classes apart)",
        )
    wrong = [
        f"{source} has {n} scores" for source, n in _class_counts(model, models) if n != len(labels)
    ]
    if wrong:
        say(
            field,
            f"points at {path}, which has {_count(len(labels), 'label')}, but "
            + " and ".join(wrong),
            "write exactly one label per class, in class-index order",
        )


def _check_label_filename(
    model: Model, field: str, io: model_config_pb2.ModelOutput, say: Say
) -> None:
    relative = io.label_filename
    normalised = os.path.normpath(relative)
    if os.path.isabs(relative) or normalised.split(os.sep)[0] == os.pardir:
        say(
            field,
            f'is "{relative}", outside {model.directory}/',
            "put the labels file in the model directory and name it relative to it (a "
            "repository that Triton loads from cloud storage, or that is copied model by model, "
            "brings only each model's own directory)",
        )
        return
    path = model.directory / normalised
    text = _read(model, relative, path, field, say)
    if text is None:
        return
    # Split as Triton reads it (std::getline): at "\n" only, a final newline ending the last line.
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    classes = io.dims[-1] if io.dims else 0
    if not any(line.strip() for line in lines):
        how_many = f"its {classes} labels" if classes > 0 else "one label per class"
        say(
            field,
            f"points at {path}, which holds no label",
            f"write {how_many}, one per line, in class-index order",
        )
        return
    if "\r" in text:
        say(
            field,
            f"points at {path}, which has Windows line endings: Triton splits lines at the line "
            "feed only, so every label would end with a carriage return",
            "save the file with Unix line endings (line feed only)",
        )
    empty = [number for number, line in enumerate(lines, 1) if not line.strip()]
    if empty:
        say(
            field,
            f"points at {path}, where line{'s' if len(empty) > 1 else ''} {_and(empty)} "
            f"{'is' if len(empty) == 1 else 'are'} empty: Triton reads every line as a label, "
            "so the class of an empty line would be answered with an empty label",
            "write that class's label on each empty line, or delete a stray one (a line per "
            "class, in class-index order)",
        )
    if classes > 0 and len(lines) != classes:
        say(
            field,
            f"points at {path}, which has {_count(len(lines), 'label')}, but the output has "
            f"{classes} classes (the last dimension of dims {format_dims(io.dims)})",
            "write exactly one label per class, one per line, in class-index order",
        )


def _class_counts(model: Model, models: dict[str, Model]) -> list[tuple[str, int]]:
    """Class counts a `labels_file` must match, where a config alone tells them.

    A model that names the models it calls (preferred_model, fallback_model) labels their
    scores: each such model's single output, by its last dimension; its own inputs are what it
    forwards, not scores. Any other model labels its own input: when it has exactly one, with
    exactly one fixed dimension, that dimension counts the classes.
    """
    called = [model.parameter(key) for key in CALLED_MODEL_PARAMETERS]
    if any(called):
        counts = []
        for name in called:
            target = models.get(name or "")
            if target is None or len(target.config.output) != 1:
                continue
            io = target.config.output[0]
            if io.dims and io.dims[-1] > 0:
                source = f'output "{io.name}" of {target.name} (dims {format_dims(io.dims)})'
                counts.append((source, io.dims[-1]))
        return counts
    if len(model.config.input) == 1:
        io = model.config.input[0]
        fixed = [d for d in io.dims if d > 0]
        if len(fixed) == 1:
            return [(f'input "{io.name}" (dims {format_dims(io.dims)})', fixed[0])]
    return []


def _read(model: Model, relative: str, path: Path, field: str, say: Say) -> str | None:
    """The labels file's text with its line endings as written (text mode would turn CRLF into
    LF); None, said, when it is missing or unreadable."""
    if not path.is_file():
        say(
            field,
            f'is "{relative}" but {path} does not exist',
            f"create it (one label per line, in class-index order) or fix the path, which is "
            f"relative to {model.directory}/",
        )
        return None
    try:
        return path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        say(field, f"points at {path}, which cannot be read ({exc})", "write it as UTF-8 text")
        return None


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _and(numbers: list[int]) -> str:
    """[1] -> "1"; [1, 3] -> "1 and 3"; [1, 3, 4] -> "1, 3 and 4"."""
    words = [str(n) for n in numbers]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
