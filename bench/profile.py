"""Where the Python stubs' time goes, sampled by py-spy while the bench's load runs.

The targets compare `pipeline` (ensemble) and `classify` (BLS) with the direct `classifier`, and
their extra cost sits in the stub processes and in tritonserver. Per-process CPU says how much;
py-spy (with native frames) says what for: a sample with a frame in the model's own file is time
in `execute()` (numpy, onnxruntime, metric calls), which vectorising or trimming the model can
cut; a sample without one is the Python backend's C++ around it (reading requests from shared
memory, wrapping tensors, sending responses, waiting on the parent), which no model code changes.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.servers import ProcessTree, process_role

#: Samples per second and process: enough for a few thousand samples in a 5 s point.
RATE = 250
FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


@dataclass
class StubProfile:
    """py-spy samples of one model's stub processes (all its instances) while busy."""

    model: str
    processes: int = 0
    samples: int = 0  # py-spy records only samples where a thread is on the CPU
    in_model_code: int = 0  # samples with a frame in the model's file (its execute and helpers)
    #: innermost model-file line of those samples: (file:line, source text, samples), top first
    top_lines: list[tuple[str, str, int]] = field(default_factory=list)


def py_spy_path() -> str | None:
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def _is_model_file(path: str) -> bool:
    return path.endswith("/model.py") or path == "model.py"


def parse_raw(text: str, profile: StubProfile, lines: Counter) -> None:
    """Add py-spy's raw (collapsed-stack) output to `profile`; count model lines in `lines`."""
    for row in text.splitlines():
        stack, _, count = row.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        samples = int(count)
        profile.samples += samples
        innermost = None
        for frame in stack.split(";"):
            match = FRAME.match(frame)
            if match and match["line"] and _is_model_file(match["file"]):
                innermost = (match["file"], int(match["line"]))
        if innermost:
            profile.in_model_code += samples
            lines[innermost] += samples


def _short(path: str) -> str:
    """`classify/model.py` for `<repo>/classify/1/model.py`, `onnxruntime/model.py` for the
    Python-based backend's file."""
    file = Path(path)
    folder = file.parent.parent if file.parent.name.isdigit() else file.parent
    return f"{folder.name}/{file.name}"


def _source(path: str, line: int) -> str:
    try:
        return Path(path).read_text().splitlines()[line - 1].strip()
    except (OSError, IndexError):
        return ""


def profile_stubs(
    tree: ProcessTree,
    models: tuple[str, ...],
    seconds: float,
    workdir: Path,
    load: Callable[[float], None],
) -> dict[str, dict]:
    """Sample every stub of `models` for `seconds` while `load(seconds)` drives traffic.

    Returns {model: StubProfile as a dict}, or {"error": why} when py-spy cannot sample
    (missing, or no ptrace permission: containers need the SYS_PTRACE capability).
    """
    binary = py_spy_path()
    if binary is None:
        return {"error": "py-spy is not installed (the [bench] extra: `pip install -e '.[bench]'`)"}
    stubs = [(process_role(p), p.pid) for p in tree.processes() if p.pid != tree.root.pid]
    stubs = [(model, pid) for model, pid in stubs if model in models]
    workdir.mkdir(parents=True, exist_ok=True)
    duration = max(1, math.floor(seconds))
    recorders = []
    for model, pid in stubs:
        out = workdir / f"{model}-{pid}.txt"
        command = [binary, "record", "--native", "--full-filenames", f"--rate={RATE}"]
        command += [f"--duration={duration}", "--format=raw", f"--output={out}", f"--pid={pid}"]
        recorders.append(
            (
                model,
                out,
                subprocess.Popen(
                    command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
                ),
            )
        )
    load(duration + 1.0)  # keep the load on until every recorder has finished
    profiles = {model: StubProfile(model) for model in models}
    lines: dict[str, Counter] = {model: Counter() for model in models}
    for model, out, process in recorders:
        try:
            output, _ = process.communicate(timeout=duration + 30)
        except subprocess.TimeoutExpired:
            process.kill()
            return {"error": f"py-spy did not finish sampling {model} within {duration + 30} s"}
        if process.returncode != 0 or not out.is_file():
            last = (output or "").strip().splitlines()[-1:] or ["no output"]
            return {"error": f"py-spy could not sample {model}: {last[0]}"}
        profiles[model].processes += 1
        parse_raw(out.read_text(), profiles[model], lines[model])
    for model, profile in profiles.items():
        profile.top_lines = [
            (f"{_short(path)}:{line}", _source(path, line), n)
            for (path, line), n in lines[model].most_common(5)
        ]
    return {model: asdict(p) for model, p in profiles.items() if p.processes}
