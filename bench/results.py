"""results.json's run-level parts: a run's meta (machine, versions, settings), the command that
made it, and merging a run of some families into an earlier run's results (`--merge`)."""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path


def run_meta(
    settings, families: list[str], started: datetime, load_before, venv: Path | None, wrk: bool
) -> dict:
    """The run's machine, versions and settings (results.json's meta)."""
    from importlib.metadata import version

    import psutil

    cpu_model = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {
        name: version(name) for name in ("nvidia-pytriton", "tritonclient", "onnxruntime", "numpy")
    }
    versions["tritonserver"] = "2.51.0"
    if venv is not None:
        from bench.servers import REQUIREMENTS

        for line in REQUIREMENTS.read_text().splitlines():
            name = line.split("==")[0].split("[")[0].lower()
            if name in ("mlserver", "fastapi", "uvicorn", "uvloop"):
                versions[name] = line.split("==")[1]
    finished = datetime.now(timezone.utc)
    return {
        "mode": settings.label,
        "quick": settings.quick,
        "families": families,
        "started": started.isoformat(timespec="seconds"),
        "duration_s": round((finished - started).total_seconds()),
        "command": "python -m bench" + (" --quick" if settings.quick else ""),
        "cpu": cpu_model,
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "versions": versions,
        "settings": asdict(settings),
        "wrk": _wrk_version() if wrk else "",
    }


def _wrk_version() -> str:
    from bench.loadgen import wrk_path

    done = subprocess.run([wrk_path(), "--version"], capture_output=True, text=True)
    return (
        (done.stdout or done.stderr).splitlines()[0].strip() if (done.stdout or done.stderr) else ""
    )


def command_line(quick: bool, families: list[str], merged: bool) -> str:
    """The command as a user would type it again (results.json records it)."""
    from bench.scenarios import FAMILIES

    command = "python -m bench" + (" --quick" if quick else "")
    if families != list(FAMILIES):
        command += f" --scenarios {','.join(families)}"
    return command + (" --merge" if merged else "")


def merge(base: dict, new: dict) -> dict:
    """`new` measured into `base`: its points replace those with the same key, its memory,
    profiles and llm sections replace base's, its families join base's; meta stays base's, with
    a line per merged run (what ran, when, on which CPU, how busy the machine was); an earlier
    merged run of no other families is dropped, as the new one measured all it had."""
    measured = {p["key"] for p in new["points"]}
    meta = dict(base["meta"])
    new_meta = new["meta"]
    meta["families"] = [*meta["families"]] + [
        f for f in new_meta["families"] if f not in meta["families"]
    ]
    meta["merged"] = [
        *(
            earlier
            for earlier in meta.get("merged", [])
            if not set(earlier["families"]) <= set(new_meta["families"])
        ),
        {
            key: new_meta[key]
            for key in ("families", "command", "started", "duration_s", "load_before", "cpu")
            if key in new_meta
        },
    ]
    merged = {
        **base,
        "meta": meta,
        "points": [p for p in base["points"] if p["key"] not in measured] + new["points"],
        "profiles": {**(base.get("profiles") or {}), **(new.get("profiles") or {})},
    }
    for section in ("memory", "llm", "own"):
        if new.get(section):
            merged[section] = new[section]
    return merged
