"""`python -m bench`: Triton variants, protocols and baselines measured side by side.

Every server is started fresh for its scenarios and stopped before the next one starts; each
point gets a check request, a warm-up, then several timed repetitions whose medians and spread
go into the report. The full run writes docs/benchmarks.md and docs/benchmarks/*.png; `--quick`
(smoke numbers, every scenario family, under 3 minutes on a quiet 2-core machine) writes to
results/bench-quick/ or --out, never over the committed docs. The `llm` family runs only when
named (`--scenarios llm`: it needs `make llm`), and `--merge` adds the families a run measured
to the results already in --out instead of replacing them, so one family can be measured again
without the other twenty minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from bench.results import command_line, merge, run_meta
from tritonstack import DEFAULT_MODEL_REPOSITORY
from tritonstack.core.errors import UserError

DOCS = Path(__file__).resolve().parent.parent / "docs"
QUICK_OUT = Path("results") / "bench-quick"
#: Per-model Triton counters read before and after each point (deltas go into results.json).
TRITON_COUNTERS = {
    "inferences": "nv_inference_count",
    "executions": "nv_inference_exec_count",
    "requests": "nv_inference_request_success",
    "queue_us": "nv_inference_queue_duration_us",
    "compute_us": "nv_inference_compute_infer_duration_us",
    "request_us": "nv_inference_request_duration_us",
}
TRITON_MODELS = ("classifier", "postprocess", "pipeline", "classify")
#: Model a request is sent to -> the stubs py-spy samples meanwhile (the models family's points).
PROFILED = {
    "classifier": ("classifier",),
    "pipeline": ("classifier", "postprocess"),
    "classify": ("classify", "classifier"),
}
PROFILE_CLIENTS = 16


def build_parser() -> argparse.ArgumentParser:
    from bench.scenarios import FAMILIES, OPT_IN_FAMILIES

    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Triton variants, protocols and baselines measured side by side.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: every scenario family, short runs, fewer points (< 3 min)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"report folder (default: docs/ for a full run, {QUICK_OUT}/ for --quick)",
    )
    parser.add_argument(
        "--scenarios",
        default=",".join(FAMILIES),
        help=f"comma-separated families (default: all but {', '.join(OPT_IN_FAMILIES)}): "
        f"{', '.join([*FAMILIES, *OPT_IN_FAMILIES])}",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep OUT/benchmarks/results.json and replace only what this run measures (its "
        "families' points, memory, profiles, llm), then render the report again",
    )
    parser.add_argument(
        "--grpc-processes", type=int, default=2, help="gRPC load processes (default 2)"
    )
    parser.add_argument(
        "--render",
        action="store_true",
        help="measure nothing: render docs/benchmarks.md again from docs/benchmarks/"
        "results.json and the GPU check's report (docs/benchmarks/gpu-check.json)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """`python -m bench`: a problem the user can fix ends as one line on stderr, exit 1."""
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except UserError as exc:
        print(f"python -m bench: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def run(args: argparse.Namespace) -> int:
    from bench import report
    from bench.scenarios import FAMILIES, FULL, OPT_IN_FAMILIES, QUICK

    if args.render:
        print(f"wrote {report.rerender(args.out or DOCS)}")
        return 0
    families = [f.strip() for f in args.scenarios.split(",") if f.strip()]
    known = [*FAMILIES, *OPT_IN_FAMILIES]
    unknown = sorted(set(families) - set(known))
    if unknown or not families:
        raise UserError(f"unknown scenario family {unknown}; choose from {', '.join(known)}")
    settings = QUICK if args.quick else FULL
    out = args.out or (QUICK_OUT if args.quick else DOCS)
    if args.quick and out.resolve() == DOCS.resolve():
        raise UserError(
            "--quick numbers are smoke only and must not replace docs/benchmarks.md; "
            "pass another --out"
        )
    base = report.read_results(out) if args.merge else None
    if base is not None and base["meta"]["quick"] != settings.quick:
        raise UserError(
            f"{out}/benchmarks/results.json holds a {base['meta']['mode']} run: merge "
            f"{'--quick' if settings.quick else 'full'} results into one of their own kind"
        )
    classic = [f for f in families if f in FAMILIES]
    started, load_before = datetime.now(timezone.utc), os.getloadavg()
    if classic:
        results = Bench(settings, classic, out, args.grpc_processes).run()
    else:
        results = {"points": [], "memory": None, "profiles": {}}
    if "llm" in families:
        results["llm"] = run_llm(settings.quick)
    if "own" in families:
        from bench import own

        results["own"] = own.run(settings.quick, lambda text: print(text, flush=True))
    results["meta"] = run_meta(
        settings, families, started, load_before, results.pop("venv", None), bool(classic)
    )
    results["meta"]["command"] = command_line(args.quick, families, args.merge)
    if base is not None:
        results = merge(base, results)
    out.mkdir(parents=True, exist_ok=True)
    for path in report.write(results, out, plots=bool(classic)):
        print(f"wrote {path}", flush=True)
    return 0


def run_llm(quick: bool) -> dict:
    """The llm family (bench/llm.py), with its own servers and settings."""
    from bench import llm

    settings = llm.QUICK if quick else llm.FULL
    workdir = Path(tempfile.mkdtemp(prefix="tritonstack-bench-llm-"))
    print(
        f"python -m bench: llm family, {len(settings.concurrencies)} concurrencies x 3 servers; "
        f"logs in {workdir}",
        flush=True,
    )
    try:
        found = llm.run_family(settings, workdir, lambda text: print(text, flush=True))
    except BaseException:
        print(f"server logs kept in {workdir}", flush=True)
        raise
    shutil.rmtree(workdir, ignore_errors=True)
    return found


def model_signatures() -> dict:
    """The Triton models the bench loads, as the repository declares them (the variants change
    batching and instances, never a model's tensors)."""
    from tritonstack.core.repository import iter_models
    from tritonstack.core.signature import Signature

    return {
        m.name: Signature.from_model(m)
        for m in iter_models(DEFAULT_MODEL_REPOSITORY)
        if m.name in TRITON_MODELS
    }


class Progress:
    """One line per step: step count, elapsed time, and an ETA from the planned step times."""

    def __init__(self, estimates: list[float]):
        self.estimates = estimates
        self.done = 0
        self.start = time.monotonic()

    def step(self, text: str) -> None:
        """Report a finished step; the ETA scales the plan by the pace so far."""
        self.done += 1
        elapsed = time.monotonic() - self.start
        planned_done = sum(self.estimates[: self.done])
        # the plan's own estimate until enough has run to judge the pace
        pace = elapsed / planned_done if planned_done >= 20 else 1.0
        remaining = sum(self.estimates[self.done :]) * pace
        print(
            f"[{self.done:>3}/{len(self.estimates)} {_clock(elapsed)} elapsed, "
            f"ETA {_clock(remaining)}] {text}",
            flush=True,
        )


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}"


class Bench:
    def __init__(self, settings, families: list[str], out: Path, grpc_processes: int):
        from bench.loadgen import wrk_path

        wrk_path()  # fail before starting anything when wrk is missing
        self.settings = settings
        self.families = families
        self.out = Path(out)
        self.workdir = Path(tempfile.mkdtemp(prefix="tritonstack-bench-"))
        self.grpc_processes = grpc_processes
        self.points: dict[str, dict] = {}
        self.memory: dict | None = None
        self.profiles: dict[str, dict] = {}

    def run(self) -> dict:
        """Measure every planned point: results.json's points, memory and profiles."""
        from bench.loadgen import Generator
        from bench.scenarios import SERVERS, estimate_seconds, plan

        the_plan = plan(self.families, self.settings)
        estimates = []  # one per progress line: a server start, a point, the memory soak
        for server, points in the_plan:
            start = estimate_seconds(server, [], self.settings)
            spec = SERVERS[server]
            if spec.memory_soak:
                estimates += [spec.start_seconds, start - spec.start_seconds]
                continue
            per_point = estimate_seconds(server, points, self.settings) - start
            estimates += [start] + [per_point / len(points)] * len(points)
            if self._profiling(server):
                estimates += [self.settings.warmup_s + self.settings.seconds + 3] * len(PROFILED)
        total = sum(estimates)
        print(
            f"python -m bench ({self.settings.label}): {len(the_plan)} servers, "
            f"{sum(len(p) for _, p in the_plan)} points, about {_clock(total)} "
            f"(min:s) plus first-time installs; logs in {self.workdir}",
            flush=True,
        )
        self.progress = Progress(estimates)
        self.generator = Generator(
            self.workdir / "load", model_signatures(), grpc_processes=self.grpc_processes
        )
        venv = None
        if any(SERVERS[server].baseline for server, _ in the_plan):
            from bench.servers import baseline_venv

            venv = baseline_venv(progress=lambda text: print(text, flush=True))
        clean = False
        try:
            for server_key, points in the_plan:
                self._run_server(server_key, points, venv)
            clean = True
        finally:
            if clean:
                shutil.rmtree(self.workdir, ignore_errors=True)
            else:
                print(f"server logs kept in {self.workdir}", flush=True)
        return {
            "points": list(self.points.values()),
            "memory": self.memory,
            "profiles": self.profiles,
            "venv": venv,  # run() reads the baselines' versions from it
        }

    # -- servers -------------------------------------------------------------------------------

    def _start(self, server_key: str, venv: Path | None):
        from bench import servers
        from bench.scenarios import SERVERS
        from bench.variants import write_variant

        spec = SERVERS[server_key]
        log = self.workdir / f"{server_key.replace(':', '-')}.log"
        if spec.kind == "fastapi":
            return servers.start_fastapi(venv, log, spec.key, workers=spec.workers)
        if spec.kind == "mlserver":
            return servers.start_mlserver(venv, log)
        repository = self.workdir / "repositories" / server_key.replace(":", "-")
        write_variant(DEFAULT_MODEL_REPOSITORY, repository, spec.variant)
        if spec.kind == "gateway":
            return servers.start_gateway(repository, log, spec.key, spec.gateway_config)
        return servers.start_triton(repository, log, spec.key)

    def _run_server(self, server_key: str, points, venv: Path | None) -> None:
        from bench.scenarios import SERVERS

        started = time.monotonic()
        server = self._start(server_key, venv)
        self.progress.step(f"started {server_key} in {time.monotonic() - started:.1f} s")
        try:
            if SERVERS[server_key].memory_soak:
                self._memory(server)
            for point in points:
                self._measure(server, point)
            if self._profiling(server_key):
                self._profile(server)
        finally:
            server.stop()

    # -- one point -----------------------------------------------------------------------------

    def _measure(self, server, point) -> None:
        from bench.loadgen import Target
        from bench.servers import cpu_delta
        from bench.stats import (
            Rep,
            queue_stall_note,
            saturation_notes,
            summarize,
        )

        s = self.settings
        target = Target(point.protocol, server.url(point.protocol, point.model), point.model)
        if point.protocol != "grpc":  # the gRPC workers check their first answer themselves
            self._check_answer(target.url, point.model, point.protocol)
        self.generator.run(target, point.concurrency, s.warmup_s)
        counters_before = self._counters(server)
        tree = server.tree()
        reps = []
        roles_before = tree.cpu_seconds_by_role()
        for _ in range(s.reps):
            cpu_before, wall_before = tree.cpu_seconds(), time.monotonic()
            result = self.generator.run(target, point.concurrency, s.seconds)
            wall = time.monotonic() - wall_before
            server_cpu = cpu_delta(cpu_before, tree.cpu_seconds())
            reps.append(
                Rep(
                    requests=result.requests,
                    errors=result.errors,
                    seconds=result.seconds,
                    mean_ms=result.mean_ms,
                    p50_ms=result.p50_ms,
                    p95_ms=result.p95_ms,
                    p99_ms=result.p99_ms,
                    server_cores=server_cpu / wall,
                    generator_cores=result.generator_cpu_s / result.seconds,
                )
            )
        counters = self._delta(counters_before, self._counters(server))
        answered = sum(r.requests for r in reps)
        roles_after = tree.cpu_seconds_by_role()
        # Which process the server CPU goes to, per answered request: tritonserver vs each stub.
        cpu_by_process_us = {
            role: (roles_after[role] - roles_before[role]) / answered * 1e6
            for role in roles_before.keys() & roles_after.keys()
            if answered and roles_after[role] > roles_before[role]
        }
        summary = summarize(reps)
        summary.avg_batch = self._avg_batch(server, point, counters)
        summary.notes = saturation_notes(summary, os.cpu_count() or 1, point.concurrency)
        stall = queue_stall_note(counters, summary.server_cores, os.cpu_count() or 1)
        if stall and point.spec.kind == "triton":
            summary.notes.append(stall)
        self.points[point.key] = {
            **asdict(point),
            "key": point.key,
            "summary": asdict(summary),
            "reps": [asdict(r) for r in reps],
            "counters": counters,
            "cpu_by_process_us": cpu_by_process_us,
        }
        self.progress.step(
            f"{point.server}: {point.model} {point.protocol} c={point.concurrency}: "
            f"{summary.rps.median:,.0f} req/s, p99 {summary.p99_ms.median:.1f} ms, "
            f"server {summary.server_cores:.2f} cores, generator {summary.generator_cores:.2f}"
            + (f" [{'; '.join(summary.notes)}]" if summary.notes else "")
        )

    def _check_answer(self, url: str, model: str, protocol: str = "http-json") -> None:
        """One request before the point: the answer holds every output of the model."""
        body = self.generator.check_body(model, protocol)
        request = urllib.request.Request(
            url, data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                outputs = json.loads(answer.read())["outputs"]
        except Exception as exc:
            raise UserError(f"check request to {url} failed: {exc}") from None
        names = {o["name"] for o in outputs}
        wanted = {t.name for t in self.generator.signatures[model].outputs}
        if not wanted <= names:
            raise UserError(f"{url} answered without {sorted(wanted - names)}: {sorted(names)}")
        if protocol == "http-classification":
            top = outputs[0]["data"][0]  # "score:index:label"
            if not (isinstance(top, str) and top.count(":") >= 2):
                raise UserError(f"{url}: classification answer is not score:index:label: {top!r}")

    def _counters(self, server) -> dict:
        from bench.scenarios import SERVERS
        from tritonstack.clients.metrics import model_value, scrape

        if server.metrics is None:
            return {}
        samples = scrape(server.metrics)
        if SERVERS[server.name].kind == "mlserver":
            return {
                "classifier": {
                    "inferences": sum(
                        v for (n, _), v in samples.items() if n == "tritonstack_batch_rows_sum"
                    ),
                    "executions": sum(
                        v for (n, _), v in samples.items() if n == "tritonstack_batch_rows_count"
                    ),
                }
            }
        return {
            model: {key: model_value(samples, name, model) for key, name in TRITON_COUNTERS.items()}
            for model in TRITON_MODELS
        }

    @staticmethod
    def _delta(before: dict, after: dict) -> dict:
        return {
            model: {key: after[model][key] - value for key, value in values.items()}
            for model, values in before.items()
        }

    @staticmethod
    def _avg_batch(server, point, counters: dict) -> float | None:
        from bench.stats import average_batch

        if point.spec.kind == "fastapi":
            return 1.0  # one request, one session.run
        model = counters.get("classifier")
        if not model:
            return None
        return average_batch({"inferences": 0, "executions": 0}, model)

    # -- profiles ------------------------------------------------------------------------------

    def _profiling(self, server_key: str) -> bool:
        from bench.scenarios import TRITON

        return server_key == TRITON and "models" in self.families

    def _profile(self, server) -> None:
        """py-spy on the stubs while each model of the models family runs at 16 clients."""
        from bench.loadgen import Target
        from bench.profile import profile_stubs

        for sent, stubs in PROFILED.items():
            target = Target("http-json", server.url("http-json", sent), sent)
            self.generator.run(target, PROFILE_CLIENTS, self.settings.warmup_s)
            found = profile_stubs(
                server.tree(),
                stubs,
                self.settings.seconds,
                self.workdir / "profiles" / sent,
                lambda seconds, target=target: self.generator.run(target, PROFILE_CLIENTS, seconds),
            )
            self.profiles[sent] = found
            summary = found.get("error") or ", ".join(
                f"{p['model']} {p['in_model_code'] / max(p['samples'], 1):.0%} in model code"
                for p in found.values()
            )
            self.progress.step(f"profiled stubs under {sent} (py-spy): {summary}")

    # -- memory --------------------------------------------------------------------------------

    def _memory(self, server) -> None:
        from bench.loadgen import Target

        s = self.settings
        targets = [
            Target("http-json", server.url("http-json", m), m) for m in ("pipeline", "classify")
        ]
        for target in targets:
            self._check_answer(target.url, target.model)
            self.generator.run(target, 16, s.warmup_s)
        tree = server.tree()
        rss_warm = tree.rss_bytes()
        sent = errors = 0
        chunk = 0
        while sent < s.memory_requests:
            result = self.generator.run(targets[chunk % 2], 16, s.memory_chunk_s)
            sent += result.requests
            errors += result.errors
            chunk += 1
        rss_after = tree.rss_bytes()
        self.memory = {
            "requests": sent,
            "errors": errors,
            "target_requests": s.memory_requests,
            "rss_warm_bytes": rss_warm,
            "rss_after_bytes": rss_after,
            "growth": (rss_after - rss_warm) / rss_warm,
            "processes": len(tree.processes()),
        }
        self.progress.step(
            f"memory: RSS {rss_warm / 2**20:.0f} MiB after warm-up, {rss_after / 2**20:.0f} MiB "
            f"after {sent:,} requests ({self.memory['growth']:+.1%})"
        )
