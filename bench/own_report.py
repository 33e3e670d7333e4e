"""The `own` family's part of docs/benchmarks.md: its targets, its table, how it was measured.

Pure functions of results.json's `own` section (bench/own.py writes it), so they are unit-tested.
"""

from __future__ import annotations

from bench.own import FLOOR, MODELS, SERVERS
from bench.stats import Target

HEADING = "## Your own models: add-model's configs vs onnxruntime in-process and FastAPI"


def target_name(model: str, rows: int) -> str:
    return f"`{model}` served by Triton ≥ {FLOOR}x onnxruntime in-process ({rows}-row batches)"


def row_counts(own: dict) -> list[int]:
    """The batches measured, smallest first."""
    return sorted({p["rows"] for p in own["points"]})


def rows_per_s(point: dict | None) -> float | None:
    if point is None or not point["summary"]["rps"]["median"]:
        return None
    return point["summary"]["rps"]["median"] * point["summary"]["rows_per_request"]


def _point(own: dict, model: str, rows: int, server: str, protocol: str = "") -> dict | None:
    return next(
        (
            p
            for p in own["points"]
            if (p["model"], p["rows"], p["server"], p["protocol"])
            == (model, rows, server, protocol)
        ),
        None,
    )


def ceiling(own: dict, model: str, rows: int) -> dict | None:
    """The faster of onnxruntime's in-process layouts for `model` at `rows`-row batches."""
    found = [
        p
        for p in own["points"]
        if (p["model"], p["rows"], p["server"]) == (model, rows, "onnxruntime") and rows_per_s(p)
    ]
    return max(found, key=rows_per_s) if found else None


def best_triton(own: dict, model: str, rows: int) -> tuple[str, float] | None:
    """Triton's better protocol for `model` at `rows`-row batches, and its rows/s."""
    found = [
        (protocol, rows_per_s(_point(own, model, rows, "triton", protocol)))
        for protocol in ("http-binary", "http-json")
    ]
    found = [(protocol, value) for protocol, value in found if value]
    return max(found, key=lambda item: item[1]) if found else None


def targets(own: dict | None) -> list[Target]:
    if not own:
        return []
    found = []
    for model in MODELS:
        for rows in row_counts(own):
            name = target_name(model, rows)
            reference = rows_per_s(ceiling(own, model, rows))
            best = best_triton(own, model, rows)
            if reference is None or best is None:
                found.append(Target(name, None, "a point it needs was not measured"))
                continue
            protocol, served = best
            ratio = served / reference
            detail = (
                f"{served:,.0f} ({protocol}) vs {reference:,.0f} rows/s = {ratio:.2f}x (≥ {FLOOR}x)"
            )
            found.append(Target(name, ratio >= FLOOR, detail))
    return found


def cpu_us_per_row(point: dict | None) -> float | None:
    """The server's (or, in-process, onnxruntime's) CPU per row served, in microseconds."""
    rate = rows_per_s(point)
    return None if not rate else point["summary"]["server_cores"] / rate * 1e6


def table(own: dict) -> str:
    lines = [
        "| model | rows per request | server | protocol | rows/s | vs in-process | p99 ms | "
        "server cores | CPU µs/row |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for model in MODELS:
        for rows in row_counts(own):
            reference = rows_per_s(ceiling(own, model, rows))
            for point in (p for p in own["points"] if (p["model"], p["rows"]) == (model, rows)):
                s = point["summary"]
                rate = rows_per_s(point) or 0.0
                ratio = f"{rate / reference:.2f}x" if reference else "n/a"
                p99 = "" if point["server"] == "onnxruntime" else f"{s['p99_ms']['median']:.1f}"
                lines.append(
                    f"| `{model}` | {rows} | {SERVERS[point['server']]} | "
                    f"{point['protocol'] or '-'} | {rate:,.0f} | {ratio} | {p99} | "
                    f"{s['server_cores']:.2f} | {cpu_us_per_row(point) or 0:,.0f} |"
                )
    return "\n".join(lines)


def findings(own: dict) -> list[str]:
    """Where Triton's rows go, per model: its CPU per request beyond onnxruntime's own, and which
    of its processes spent it."""
    out = []
    for model in MODELS:
        parts = []
        for rows in row_counts(own):
            reference = cpu_us_per_row(ceiling(own, model, rows))
            best = best_triton(own, model, rows)
            point = _point(own, model, rows, "triton", best[0]) if best else None
            served = cpu_us_per_row(point)
            if reference is None or served is None:
                continue
            extra = (served - reference) * rows
            part = (
                f"at {rows}-row batches Triton spends {served:,.0f} µs of CPU per row ({best[0]}) "
                f"where onnxruntime alone spends {reference:,.0f}, about {extra:,.0f} µs per "
                "request"
            )
            split = point.get("cpu_us_per_row")
            if split:
                batch = point["summary"].get("avg_batch")
                ran = f", run in batches of {batch:.1f} rows on average" if batch else ""
                part += (
                    f": tritonserver {split['tritonserver']:,.0f} (HTTP, the dynamic batcher, "
                    f"moving the tensors), the model's stubs {split['stubs']:,.0f} (onnxruntime "
                    f"and the Python backend around it{ran}), other processes "
                    f"{split['other']:,.0f}"
                )
            parts.append(part)
        if parts:
            out.append(
                f"`{model}`: {'; '.join(parts)}. Each process's CPU is its own counters' over the "
                "measured windows; the container's C++ onnxruntime backend runs the model inside "
                "tritonserver, with no stub and no hop to it. The load generator shares the cores."
            )
    return out


def section(own: dict | None) -> list[str]:
    """The family's section of docs/benchmarks.md."""
    out = [HEADING, ""]
    if not own:
        return [*out, "Not run: `python -m bench --scenarios own`.", ""]
    meta, s = own["meta"], own["meta"]["settings"]
    minutes, seconds = divmod(meta["duration_s"], 60)
    out += [
        f"Measured on {meta['started']} in {minutes} min {seconds} s (load average before: "
        f"{meta['load_before'][0]}).",
        "",
        "| target | verdict | numbers |",
        "|---|---|---|",
        *(f"| {t.name} | {t.verdict} | {t.detail} |" for t in targets(own)),
        "",
        table(own),
        "",
        *(f"{finding}\n" for finding in findings(own)),
        "Two models as `tritonstack add-model` serves them (`bench/own.py` builds them): `image`, "
        "a small CNN (3x3 convolutions of 16, 32 and 64 channels, pooling, a linear head) taking "
        "any height and width within its `--shape` bounds, every request at its opt size, "
        "3x64x64; and `lightgbm`, a LightGBM classifier of 400 trees over 20 features converted "
        "by onnxmltools (`ai.onnx.ml` trees, its label output corrected). Requests hold "
        f"{' or '.join(str(n) for n in meta['rows'])} rows, each batch measured apart; the "
        f"servers get {meta['clients']} closed-loop clients (wrk, "
        f"one connection each) for {s['warmup_s']} s of warm-up and {s['reps']} window(s) of "
        f"{s['seconds']} s (median, min-max in brackets). Every server and onnxruntime "
        f"in-process cycle through the same {meta['variety']} distinct batches: a tree "
        "ensemble fed one batch over and over runs with every branch predicted, which no real "
        "traffic gives. onnxruntime in-process runs them "
        "back to back in the bench's own process, as one session with its default threads "
        "(every core) and as one single-threaded session per core, each with a caller thread "
        "of its own; the faster is the ceiling of what a server adds nothing to, and every ratio "
        "is to it. Triton serves add-model's config "
        "(dynamic batching, two instances of one intra-op thread); FastAPI + onnxruntime "
        "(`bench/fastapi_onnx_app.py`, one uvicorn worker, one intra-op thread) takes the same "
        "JSON requests. CPU is in cores (2.0 = the whole machine): the server's process tree.",
        "",
    ]
    return out
