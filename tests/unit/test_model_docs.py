"""docs/models.md says what the code does: its add-model commands are the ones
tests/functional/test_model_zoo.py runs, and the defaults it states are the code's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import model_zoo
from tests.support import ROOT
from tests.unit.test_docs import ZOO_COMMANDS
from tritonstack.check import onnx_serving

PAGE = (ROOT / "docs" / "models.md").read_text()


@pytest.mark.parametrize("name", sorted(ZOO_COMMANDS))
def test_each_documented_command_is_the_one_the_zoo_test_runs(tmp_path: Path, name: str):
    model = model_zoo.BUILDERS[name](tmp_path)
    options = "".join(f" {option}" for option in model.options)
    assert ZOO_COMMANDS[name] == options
    assert f"tritonstack add-model {name}.onnx --name {name}{options}\n" in PAGE


def test_the_stated_defaults_are_the_code_s():
    low, usual, high = onnx_serving.DEFAULT_DIM_BOUNDS
    assert f"or the default {low}:{usual}:{high}" in PAGE
    assert f"`max_batch_size` {onnx_serving.DEFAULT_MAX_BATCH_SIZE} (`--max-batch-size`)" in PAGE
    assert f"`--max-string-bytes` ({onnx_serving.DEFAULT_MAX_STRING_BYTES})" in PAGE
    assert re.search(r"over 64 MB even as binary tensors", PAGE)


def test_the_stated_sequence_idle_time_is_the_code_s():
    idle = onnx_serving.SEQUENCE_IDLE_US // 1_000_000
    assert f"a sequence idle {idle} s ended" in PAGE and f"END (or {idle} s idle)" in PAGE
