"""`check_repository` against the real repository and against copies with one mistake each.

Each broken copy asserts the message's content (file, field, problem, fix), not just that
something was reported: a check that fires with a useless message is as bad as none. No server
is started; every test runs in milliseconds.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import REPOSITORY
from tritonstack.check.repository import check_repository


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    copy = tmp_path / "model_repository"
    shutil.copytree(REPOSITORY, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def edit(repo: Path, relative: str, old: str, new: str) -> None:
    """Replace exactly one occurrence, so a drifting fixture fails loudly instead of silently."""
    path = repo / relative
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{relative}: expected exactly one {old!r}"
    path.write_text(text.replace(old, new), encoding="utf-8")


def assert_well_formed(messages: list[str], repo: Path) -> None:
    for message in messages:
        assert "\n" not in message and "Traceback" not in message, message
        assert message.startswith(str(repo)), message
        assert "; " in message, f"no fix given: {message}"


def test_real_repository_is_servable() -> None:
    assert check_repository(REPOSITORY) == []


def test_real_repository_copy_is_servable(repo: Path) -> None:
    # classifier_trt/1/model.plan is built at container start: its absence is not a problem.
    assert not (repo / "classifier_trt" / "1" / "model.plan").exists()
    assert check_repository(repo) == []


def test_path_is_shown_relative_to_working_directory(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    edit(repo, "postprocess/config.pbtxt", 'name: "postprocess"', 'name: "postproces"')
    monkeypatch.chdir(repo.parent)
    assert check_repository(repo.resolve()) == [
        'model_repository/postprocess/config.pbtxt: name "postproces" does not match its '
        'directory "postprocess"; rename one of them (Triton requires them to be equal)'
    ]


def test_missing_repository(tmp_path: Path) -> None:
    messages = check_repository(tmp_path / "nowhere")
    assert len(messages) == 1
    assert messages[0].startswith(f"{tmp_path / 'nowhere'}: model repository not found; ")


def test_empty_repository(tmp_path: Path) -> None:
    messages = check_repository(tmp_path)
    assert len(messages) == 1
    assert messages[0].startswith(f"{tmp_path}: no models (no sub-directory with a config.pbtxt)")


def test_syntax_error_names_line_and_other_models_are_still_checked(repo: Path) -> None:
    edit(repo, "classifier/config.pbtxt", "max_batch_size: 64", "max_batch: 64")
    edit(repo, "postprocess/config.pbtxt", 'name: "postprocess"', 'name: "postproces"')
    line = 1 + next(
        number
        for number, text in enumerate((repo / "classifier/config.pbtxt").read_text().splitlines())
        if text.startswith("max_batch:")
    )
    messages = check_repository(repo)
    assert_well_formed(messages, repo)
    # Models that use the unparsable classifier (pipeline, classifier_trt, classify) stay quiet:
    # their only problem is the classifier's, already reported.
    assert len(messages) == 2, messages
    syntax, name = messages
    assert syntax.startswith(f"{repo}/classifier/config.pbtxt:{line}:1 : ")
    assert 'has no field named "max_batch"' in syntax
    assert "not valid Triton model configuration" in syntax
    assert name.startswith(f'{repo}/postprocess/config.pbtxt: name "postproces" does not match')


def _remove(relative: str) -> Callable[[Path], None]:
    def mutate(repo: Path) -> None:
        path = repo / relative
        shutil.rmtree(path) if path.is_dir() else path.unlink()

    return mutate


def _edit(relative: str, old: str, new: str) -> Callable[[Path], None]:
    return lambda repo: edit(repo, relative, old, new)


def _edits(relative: str, *pairs: tuple[str, str]) -> Callable[[Path], None]:
    def mutate(repo: Path) -> None:
        for old, new in pairs:
            edit(repo, relative, old, new)

    return mutate


def _relink(relative: str, target: str) -> Callable[[Path], None]:
    def mutate(repo: Path) -> None:
        (repo / relative).unlink()
        (repo / relative).symlink_to(target)

    return mutate


def _write(relative: str, data: bytes) -> Callable[[Path], None]:
    return lambda repo: (repo / relative).write_bytes(data)


def _append(relative: str, text: str) -> Callable[[Path], None]:
    def mutate(repo: Path) -> None:
        with (repo / relative).open("a", encoding="utf-8") as handle:
            handle.write(text)

    return mutate


def _label_output(label_filename: str, labels: bytes | None) -> Callable[[Path], None]:
    """Triton's classification extension on classifier's output "class" (dims [ 2 ])."""

    def mutate(repo: Path) -> None:
        edit(
            repo,
            "classifier/config.pbtxt",
            CLASS_OUTPUT,
            f'{CLASS_OUTPUT}\n    label_filename: "{label_filename}"',
        )
        if labels is not None:
            (repo / "classifier" / "labels.txt").write_bytes(labels)

    return mutate


def _rename_postprocess_input(repo: Path) -> None:
    edit(repo, "postprocess/config.pbtxt", 'name: "class"', 'name: "scores"')
    edit(
        repo,
        "pipeline/config.pbtxt",
        'input_map { key: "class" value: "scores" }',
        'input_map { key: "scores" value: "scores" }',
    )


CLASS_FP32 = 'name: "class"\n    data_type: TYPE_FP32'
FEATURES_FP32 = 'name: "features"\n    data_type: TYPE_FP32'
CLASS_OUTPUT = 'output [\n  {\n    name: "class"'
LABELS = "postprocess/labels.txt"
# Checked in both directions: the config's name is not in the graph, the graph's is not in config.
RENAME_FEATURES = _edit("classifier/config.pbtxt", 'name: "features"', 'name: "feature"')

# (mutation, config file the message starts with, fragments of that one message, message count)
CASES = {
    # --- the mistakes the guide's snippets made (docs/guide.md) ---
    "class-declared-as-input": (
        _edit("classifier/config.pbtxt", CLASS_OUTPUT, 'input [\n  {\n    name: "class"'),
        "classifier/config.pbtxt",
        [
            'input[1] "class" is an output of 1/model.onnx, not an input',
            '(its inputs: "features")',
            "; move it from input to output",
        ],
        None,  # pipeline and classifier_trt also (rightly) report the missing output
    ),
    "name-typo": (
        _edit("postprocess/config.pbtxt", 'name: "postprocess"', 'name: "postproces"'),
        "postprocess/config.pbtxt",
        [
            'name "postproces" does not match its directory "postprocess"; rename one of them '
            "(Triton requires them to be equal)"
        ],
        1,
    ),
    "python-model-declared-tensorrt": (
        _edit("postprocess/config.pbtxt", 'backend: "python"', 'platform: "tensorrt_plan"'),
        "postprocess/config.pbtxt",
        [
            'platform "tensorrt_plan" does not fit',
            "postprocess/1/model.py, which is a Python backend model",
            '; replace it with backend: "python"',
        ],
        1,
    ),
    "missing-model-py": (
        _remove("postprocess/1/model.py"),
        "postprocess/config.pbtxt",
        ['backend "python" loads 1/model.py and', "postprocess/1/model.py is missing; add"],
        1,
    ),
    "shared-module-link-broken": (
        _relink("classify/1/labels_file.py", "../../postprocess/1/labels.py"),
        "classify/config.pbtxt",
        [
            'backend "python" imports from 1/, where',
            "classify/1/labels_file.py links to ../../postprocess/1/labels.py,",
            "which does not exist",
            "; point the link at the file",
        ],
        1,
    ),
    "classifier-dims-64": (
        _edit("classifier/config.pbtxt", "dims: [ 128 ]", "dims: [ 64 ]"),
        "classifier/config.pbtxt",
        [
            'input[0] "features".dims is [ 64 ] but 1/model.onnx has [ batch, 128 ]',
            "i.e. [ 128 ] after the batch dimension",
            "; set dims: [ 128 ]",
        ],
        # + pipeline feeds [ 128 ] into [ 64 ]; classifier_trt is not told to copy the mistake
        2,
    ),
    "dims-include-batch": (
        _edit("classifier/config.pbtxt", "dims: [ 128 ]", "dims: [ -1, 128 ]"),
        "classifier/config.pbtxt",
        [
            'input[0] "features".dims is [ -1, 128 ] but 1/model.onnx has [ batch, 128 ]',
            "do not include the batch dimension in dims when max_batch_size > 0: set dims: [ 128 ]",
        ],
        2,  # + pipeline feeds [ 128 ] into [ -1, 128 ]
    ),
    "ensemble-step-model-typo": (
        _edit("pipeline/config.pbtxt", 'model_name: "postprocess"', 'model_name: "postproces"'),
        "pipeline/config.pbtxt",
        [
            'ensemble_scheduling.step[1].model_name "postproces" is not a model in the repository',
            '(did you mean "postprocess"?)',
        ],
        1,
    ),
    "ensemble-input-nothing-produces": (
        _edit(
            "pipeline/config.pbtxt",
            'input_map { key: "class" value: "scores" }',
            'input_map { key: "class" value: "score" }',
        ),
        "pipeline/config.pbtxt",
        [
            'ensemble_scheduling.step[1].input_map "class" reads "score", which neither an '
            "ensemble input nor any step's output_map produces",
            '(available: "features", "scores", "label", "class")',
            '(did you mean "scores"?)',
        ],
        2,  # + "scores" from step[0] is now read by nobody
    ),
    "ensemble-dtype-mismatch": (
        _edit("postprocess/config.pbtxt", CLASS_FP32, CLASS_FP32.replace("FP32", "INT32")),
        "pipeline/config.pbtxt",
        [
            'ensemble_scheduling.step[1].input_map "class" connects tensor "scores" of TYPE_FP32 '
            '(output "class" of classifier (step[0])) to TYPE_INT32 '
            '(input "class" of postprocess (step[1]))',
            "; declare the same data_type on both ends",
        ],
        1,
    ),
    "labels-file-missing": (
        _remove(LABELS),
        "postprocess/config.pbtxt",
        [
            'parameters "labels_file" is "labels.txt" but',
            "postprocess/labels.txt does not exist; create it (one label per line",
        ],
        2,  # classify reads the same file through ../postprocess/labels.txt
    ),
    "trt-dims-differ": (
        _edit("classifier_trt/config.pbtxt", "dims: [ 128 ]", "dims: [ 64 ]"),
        "classifier_trt/config.pbtxt",
        [
            'input[0] "features".dims is [ 64 ] but classifier has [ 128 ]',
            "classifier_trt is the same network as classifier",
            "set dims: [ 128 ]",
        ],
        1,
    ),
    # --- check 1/2: models, names, platform/backend, version directories ---
    "directory-without-config": (
        lambda repo: (repo / "stray").mkdir(),
        "stray/config.pbtxt",
        ["missing; every model directory needs a config.pbtxt", "move stray/ out"],
        1,
    ),
    "unknown-backend": (
        _edit("postprocess/config.pbtxt", 'backend: "python"', 'backend: "pytorch"'),
        "postprocess/config.pbtxt",
        ['backend "pytorch" is not one this repository serves', '; use backend: "python"'],
        1,
    ),
    "python-as-platform": (
        _edit("postprocess/config.pbtxt", 'backend: "python"', 'platform: "python"'),
        "postprocess/config.pbtxt",
        ['platform "python" is not a known platform', '; write backend: "python" instead'],
        1,
    ),
    "platform-unset": (
        _edit("classifier/config.pbtxt", 'platform: "onnxruntime_onnx"\n', ""),
        "classifier/config.pbtxt",
        ["platform/backend is not set", '; add platform: "onnxruntime_onnx" (model.onnx)'],
        1,
    ),
    "platform-contradicts-backend": (
        _edit(
            "classifier/config.pbtxt",
            'platform: "onnxruntime_onnx"',
            'platform: "onnxruntime_onnx"\nbackend: "python"',
        ),
        "classifier/config.pbtxt",
        ['platform "onnxruntime_onnx" contradicts backend "python"', "; remove platform"],
        1,
    ),
    "no-version-directory": (
        _remove("classifier/1"),
        "classifier/config.pbtxt",
        ["version directory is missing", "; create 1/ holding model.onnx"],
        1,
    ),
    "ensemble-without-version-directory": (
        _remove("pipeline/1"),
        "pipeline/config.pbtxt",
        ["version directory is missing", "even for an ensemble"],
        1,
    ),
    # --- check 3: Python models and their labels ---
    "labels-count-differs": (
        _append(LABELS, "maybe\n"),
        "postprocess/config.pbtxt",
        ['which has 3 labels, but input "class" (dims [ 2 ]) has 2 scores', "; write exactly"],
        2,
    ),
    "labels-count-differs-bls": (
        _append(LABELS, "maybe\n"),
        "classify/config.pbtxt",
        [
            "postprocess/labels.txt, which has 3 labels, but",
            'output "class" of classifier_trt (dims [ 2 ]) has 2 scores and '
            'output "class" of classifier (dims [ 2 ]) has 2 scores',
        ],
        2,
    ),
    "labels-count-differs-any-input-name": (
        # The class count is the single input's fixed dimension, whatever the input is called.
        lambda repo: (_rename_postprocess_input(repo), _append(LABELS, "maybe\n")(repo)),
        "postprocess/config.pbtxt",
        ['which has 3 labels, but input "scores" (dims [ 2 ]) has 2 scores', "; write exactly"],
        2,
    ),
    "labels-one-for-two-classes": (
        _write(LABELS, b"relevant\n\n"),
        "postprocess/config.pbtxt",
        ['which has 1 label, but input "class" (dims [ 2 ]) has 2 scores', "; write exactly"],
        2,
    ),
    "labels-file-without-a-label": (
        _write(LABELS, b"\n  \n"),
        "postprocess/config.pbtxt",
        [
            "postprocess/labels.txt, which holds no label (no non-empty line)",
            "; write one label per class, one per line, in class-index order",
        ],
        2,
    ),
    "labels-file-duplicate": (
        _write(LABELS, b"relevant\n\nrelevant\n"),
        "postprocess/config.pbtxt",
        [
            'postprocess/labels.txt, which has "relevant" on lines 1 and 3',
            "; give each class a label of its own",
        ],
        2,
    ),
    "labels-file-unreadable": (
        _write(LABELS, b"\xffrelevant\n"),
        "postprocess/config.pbtxt",
        ["postprocess/labels.txt, which cannot be read (", "; write it as UTF-8 text"],
        2,
    ),
    "bls-fallback-typo": (
        _edit("classify/config.pbtxt", '"classifier" }', '"clasifier" }'),
        "classify/config.pbtxt",
        ['parameters "fallback_model" names model "clasifier", which is not in the repository'],
        1,
    ),
    # --- Triton's classification extension: label_filename on an output ---
    "label-filename-missing": (
        _label_output("labels.txt", None),
        "classifier/config.pbtxt",
        [
            'output[0] "class".label_filename is "labels.txt" but',
            "classifier/labels.txt does not exist; create it (one label per line, in class-index "
            "order) or fix the path, which is relative to",
        ],
        1,
    ),
    "label-filename-outside-model-directory": (
        _label_output("../postprocess/labels.txt", None),
        "classifier/config.pbtxt",
        [
            'output[0] "class".label_filename is "../postprocess/labels.txt", outside',
            "; put the labels file in the model directory and name it relative to it",
        ],
        1,
    ),
    "label-filename-empty-file": (
        _label_output("labels.txt", b""),
        "classifier/config.pbtxt",
        ["classifier/labels.txt, which holds no label; write its 2 labels, one per line"],
        1,
    ),
    "label-filename-unreadable": (
        _label_output("labels.txt", b"\xffnot relevant\nrelevant\n"),
        "classifier/config.pbtxt",
        ["classifier/labels.txt, which cannot be read (", "; write it as UTF-8 text"],
        1,
    ),
    "label-filename-empty-line": (
        _label_output("labels.txt", b"\nrelevant\n"),
        "classifier/config.pbtxt",
        [
            "classifier/labels.txt, where line 1 is empty: Triton reads every line as a label",
            "; write that class's label on each empty line, or delete a stray one",
        ],
        1,
    ),
    "label-filename-windows-line-endings": (
        _label_output("labels.txt", b"not relevant\r\nrelevant\r\n"),
        "classifier/config.pbtxt",
        [
            "classifier/labels.txt, which has Windows line endings",
            "; save the file with Unix line endings",
        ],
        1,
    ),
    "label-filename-count-differs": (
        _label_output("labels.txt", b"not relevant\nrelevant\nmaybe\n"),
        "classifier/config.pbtxt",
        [
            'output[0] "class".label_filename points at',
            "classifier/labels.txt, which has 3 labels, but the output has 2 classes (the last "
            "dimension of dims [ 2 ])",
            "; write exactly one label per class",
        ],
        1,
    ),
    # --- check 4: ONNX against its config ---
    "onnx-missing": (
        _remove("classifier/1/model.onnx"),
        "classifier/config.pbtxt",
        ['platform "onnxruntime_onnx" loads 1/model.onnx and', "`tritonstack export`"],
        1,
    ),
    "onnx-unreadable": (
        _write("classifier/1/model.onnx", b"not an onnx model"),
        "classifier/config.pbtxt",
        ["1/model.onnx cannot be loaded by onnx (", "; re-export the model"],
        1,
    ),
    "onnx-dtype": (
        _edit("classifier/config.pbtxt", FEATURES_FP32, FEATURES_FP32.replace("FP32", "FP64")),
        "classifier/config.pbtxt",
        [
            'input[0] "features".data_type is TYPE_FP64 but 1/model.onnx has FLOAT',
            "; set data_type: TYPE_FP32",
        ],
        2,  # + pipeline feeds TYPE_FP32 into TYPE_FP64
    ),
    "onnx-input-renamed": (
        RENAME_FEATURES,
        "classifier/config.pbtxt",
        [
            'input[0] "feature" is not an input of 1/model.onnx (its inputs: "features")',
            '(did you mean "features"?)',
        ],
        None,
    ),
    "onnx-input-undeclared": (
        RENAME_FEATURES,
        "classifier/config.pbtxt",
        [
            'input does not declare "features", an input of 1/model.onnx',
            '; add input { name: "features" data_type: TYPE_FP32 dims: [ 128 ] }',
        ],
        None,
    ),
    "onnx-unbatched-config": (
        _edit("classifier/config.pbtxt", "max_batch_size: 64", "max_batch_size: 0"),
        "classifier/config.pbtxt",
        [
            'input[0] "features".dims is [ 128 ] but 1/model.onnx has [ batch, 128 ] '
            "(max_batch_size is 0)",
            "first dimension is a dynamic batch: set max_batch_size",
        ],
        None,
    ),
    # --- check 5: TensorRT twin ---
    "trt-max-batch-size-differs": (
        _edit("classifier_trt/config.pbtxt", "max_batch_size: 64", "max_batch_size: 32"),
        "classifier_trt/config.pbtxt",
        ["max_batch_size is 32 but classifier has 64", "; classifier_trt is the same network"],
        1,
    ),
    # --- check 6: ensemble wiring ---
    "ensemble-output-not-produced": (
        _edit("pipeline/config.pbtxt", 'name: "label"', 'name: "labels"'),
        "pipeline/config.pbtxt",
        ['output[0] "labels" is not produced by any step', 'value: "labels" }'],
        2,  # + step[1] now produces "label" that nothing uses
    ),
    "ensemble-output-map-key": (
        _edit(
            "pipeline/config.pbtxt",
            'output_map { key: "label" value: "label" }',
            'output_map { key: "labels" value: "label" }',
        ),
        "pipeline/config.pbtxt",
        [
            'ensemble_scheduling.step[1].output_map key "labels" is not an output of '
            'postprocess (its outputs: "label", "probabilities")'
        ],
        1,
    ),
    "ensemble-input-map-key": (
        _edit(
            "pipeline/config.pbtxt",
            'input_map { key: "class" value: "scores" }',
            'input_map { key: "scores" value: "scores" }',
        ),
        "pipeline/config.pbtxt",
        [
            'ensemble_scheduling.step[1].input_map does not map input "class" of postprocess',
            '; add input_map { key: "class" value: "<ensemble tensor>" }',
        ],
        2,  # + key "scores" is not an input of postprocess
    ),
    "ensemble-tensor-written-twice": (
        _edit(
            "pipeline/config.pbtxt",
            'output_map { key: "probabilities" value: "class" }',
            'output_map { key: "probabilities" value: "scores" }',
        ),
        "pipeline/config.pbtxt",
        [
            'ensemble_scheduling.step[1].output_map "probabilities" writes tensor "scores", '
            "which step[0] already writes",
        ],
        2,  # + ensemble output "class" is no longer produced
    ),
    "ensemble-output-also-read-by-a-step": (
        # The wiring before postprocess passed the scores through: loads, but deadlocks.
        _edits(
            "pipeline/config.pbtxt",
            (
                'output_map { key: "class" value: "scores" }',
                'output_map { key: "class" value: "class" }',
            ),
            (
                'input_map { key: "class" value: "scores" }',
                'input_map { key: "class" value: "class" }',
            ),
            ('      output_map { key: "probabilities" value: "class" }\n', ""),
        ),
        "pipeline/config.pbtxt",
        [
            'output[1] "class" is also read by step[1]',
            '"unexpected deadlock" (triton-inference-server/server#7482)',
            "; feed the step from an internal tensor of another name",
        ],
        1,
    ),
    "ensemble-step-batch-too-small": (
        _edit("postprocess/config.pbtxt", "max_batch_size: 64", "max_batch_size: 8"),
        "pipeline/config.pbtxt",
        [
            'ensemble_scheduling.step[1].model_name "postprocess" allows max_batch_size 8, '
            "less than the ensemble's 64"
        ],
        1,
    ),
    "ensemble-unused-input": (
        _append(
            "pipeline/config.pbtxt", 'input { name: "extra" data_type: TYPE_FP32 dims: [ 1 ] }\n'
        ),
        "pipeline/config.pbtxt",
        ['input[1] "extra" is not read by any step', "; map it in a step's input_map"],
        1,
    ),
}


@pytest.mark.parametrize(("mutate", "config", "fragments", "count"), CASES.values(), ids=CASES)
def test_broken_repository(
    repo: Path,
    mutate: Callable[[Path], None],
    config: str,
    fragments: list[str],
    count: int | None,
) -> None:
    mutate(repo)
    messages = check_repository(repo)
    assert_well_formed(messages, repo)
    matching = [
        m for m in messages if m.startswith(f"{repo / config}: ") and all(f in m for f in fragments)
    ]
    assert len(matching) == 1, "\n".join(messages)
    if count is not None:
        assert len(messages) == count, "\n".join(messages)


def test_a_labelled_output_with_one_label_per_class_is_servable(repo: Path) -> None:
    _label_output("labels.txt", b"not relevant\nrelevant\n")(repo)
    assert check_repository(repo) == []


# --- configs/<name>.pbtxt (--model-config-name), e.g. classifier/configs/gpu.pbtxt ---------------


def test_gpu_variant_is_checked_like_config_pbtxt(repo: Path) -> None:
    assert (repo / "classifier" / "configs" / "gpu.pbtxt").is_file()
    edit(repo, "classifier/configs/gpu.pbtxt", "dims: [ 128 ]\n", "dims: [ 127 ]\n")
    messages = check_repository(repo)
    assert_well_formed(messages, repo)
    variant = f"{repo}/classifier/configs/gpu.pbtxt"
    assert messages[0] == (
        f'{variant}: input[0] "features".dims is [ 127 ] but 1/model.onnx has [ batch, 128 ], i.e. '
        "[ 128 ] after the batch dimension that max_batch_size 64 adds; set dims: [ 128 ]"
    )
    # The GPU server's ensemble sees the variant: pipeline's wiring is named too, once.
    assert any(m.startswith(f"{repo}/pipeline/config.pbtxt: ") for m in messages[1:]), messages
    assert len(messages) == len(set(messages))
    assert not any("classifier/config.pbtxt" in m for m in messages)  # the CPU config is fine
    assert not any("classifier_trt" in m for m in messages)  # not told to copy the mistake


def test_gpu_variant_syntax_and_name_errors_name_the_variant(repo: Path) -> None:
    edit(repo, "classifier/configs/gpu.pbtxt", 'name: "classifier"', 'name: "clasifier"')
    messages = check_repository(repo)
    assert messages == [
        f'{repo}/classifier/configs/gpu.pbtxt: name "clasifier" does not match its directory '
        '"classifier"; rename one of them (Triton requires them to be equal)'
    ]
    edit(repo, "classifier/configs/gpu.pbtxt", "kind: KIND_GPU", "kind: GPU")
    syntax = check_repository(repo)
    assert len(syntax) == 1 and syntax[0].startswith(f"{repo}/classifier/configs/gpu.pbtxt:")
    assert "not valid Triton model configuration" in syntax[0]


# --- no queue policy: it stalls the dynamic batcher; the gateway refuses overload --------------

BATCHING = "dynamic_batching {\n  max_queue_delay_microseconds: 100\n"
QUEUE_POLICIES = {
    "max-queue-size": (
        "default_queue_policy { max_queue_size: 256 }",
        "default_queue_policy.max_queue_size 256",
    ),
    "default-timeout": (
        "default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 1000000 }",
        "default_queue_policy.default_timeout_microseconds 1000000",
    ),
    "priority-levels": ("priority_levels: 2 default_priority_level: 1", "priority_levels 2"),
    "priority-queue-policy": (
        "priority_levels: 2 default_priority_level: 1 "
        "priority_queue_policy { key: 1 value: { max_queue_size: 8 } }",
        "priority_levels 2, priority_queue_policy 1",
    ),
}


@pytest.mark.parametrize(("policy", "named"), QUEUE_POLICIES.values(), ids=QUEUE_POLICIES)
@pytest.mark.parametrize(
    "config", ["classifier/config.pbtxt", "postprocess/config.pbtxt", "classifier_trt/config.pbtxt"]
)
def test_a_queue_policy_is_reported_as_the_batcher_stall(
    repo: Path, config: str, policy: str, named: str
) -> None:
    edit(repo, config, BATCHING, f"{BATCHING}  {policy}\n")
    messages = check_repository(repo)
    assert_well_formed(messages, repo)
    # Only this one: a queue policy does not make the model unservable, so the checks against
    # the models it feeds or mirrors go on as before.
    assert messages == [
        f"{repo / config}: dynamic_batching has a queue policy ({named}), which stalls the "
        "dynamic batcher: any queue policy turns off its payload prefetching, and then Triton "
        "waits out a 500 ms idle timeout whenever a busy instance frees up under load (p99 "
        "~500 ms); delete default_queue_policy, priority_levels and priority_queue_policy, and "
        "let the gateway refuse overload (gateway/haproxy.cfg: requests in flight capped, then "
        "503)"
    ]


def test_a_queue_policy_in_the_gpu_variant_is_reported_for_that_file(repo: Path) -> None:
    policy = "  default_queue_policy { max_queue_size: 1024 }\n"
    edit(repo, "classifier/configs/gpu.pbtxt", BATCHING, BATCHING + policy)
    edit(repo, "classifier/config.pbtxt", BATCHING, BATCHING + policy)
    messages = check_repository(repo)
    assert_well_formed(messages, repo)
    # Both files are named: fixing config.pbtxt alone would leave GPU hosts stalling.
    assert [m.split(": ", 1)[0] for m in messages] == [
        f"{repo}/classifier/config.pbtxt",
        f"{repo}/classifier/configs/gpu.pbtxt",
    ]
    assert all("max_queue_size 1024" in m and "gateway" in m for m in messages)


def test_no_committed_config_has_a_queue_policy() -> None:
    configs = sorted(REPOSITORY.glob("*/config.pbtxt")) + sorted(
        REPOSITORY.glob("*/configs/*.pbtxt")
    )
    assert len(configs) >= 6
    for path in configs:
        text = path.read_text()
        for field in ("default_queue_policy", "priority_levels", "priority_queue_policy"):
            # Comments may explain why there is none; no config line may set one.
            lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
            assert not any(field in line for line in lines), f"{path}: {field}"
