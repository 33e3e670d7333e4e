"""`tritonstack loadtest`: a headless Locust run with pass/fail gates, and the same as an API.

Locust runs as a subprocess (`python -m locust -f loadtest/locustfile.py`): it monkey-patches the
standard library with gevent on import, which must not happen inside the caller (the CLI, pytest,
`python -m bench`). The run writes into its results folder:

    locust_stats.csv, locust_failures.csv, locust_exceptions.csv, locust_stats_history.csv
    report.html        Locust's HTML report
    verdict.json       Locust's totals when it quit, and the failed gates (loadtest/gates.py)
    exporter.prom      the Prometheus exporter's final metrics (loadtest/exporter.py)
    locust.log         Locust's own output

The gates are evaluated inside Locust by a `quitting` listener (loadtest/gates.py explains why);
this module passes them through, and reads the verdict to print one line per outcome. Triton is
never started here: point --host at `tritonstack serve` or the compose stack. `--llm` streams
generations from the LLM instead (`tritonstack serve --llm`), and gates on its time to first
token and inter-token latency as well.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tritonstack.clients.streaming import DEFAULT_MAX_TOKENS as LLM_DEFAULT_MAX_TOKENS
from tritonstack.core.contract import GRPC_PORT, HTTP_PORT, LLM_MODEL, LOOPBACK
from tritonstack.core.errors import UserError
from tritonstack.core.project import project_dir

LOADTEST_DIR = project_dir() / "loadtest"
LOCUSTFILE = LOADTEST_DIR / "locustfile.py"
LOCUST_CONF = LOADTEST_DIR / "locust.conf"
USER_TYPES = ("http_json", "http_binary", "grpc")
#: The Locust user type that streams generations from the LLM (loadtest/users.py).
LLM_USER_TYPE = "llm_stream"
SHAPES = ("step", "spike", "soak")
#: Exit code of Locust when a gate failed (loadtest/gates.py GATE_FAILED_EXIT_CODE).
GATE_FAILED_EXIT_CODE = 3


@dataclass
class LoadtestResult:
    """Locust's totals at the end of a run (percentiles in ms, as Locust rounds them)."""

    requests: int
    failures: int
    fail_ratio: float
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    rps: float
    exit_code: int
    results_dir: Path
    gate_failures: list[str] = field(default_factory=list)
    #: The LLM user's timings: {"count", "p50_ms", "p95_ms", "p99_ms"}; None for the classifier.
    ttft: dict | None = None
    itl: dict | None = None

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    def summary(self) -> str:
        def ms(value: float | None) -> str:
            return "n/a" if value is None else f"{value:g} ms"

        timings = "".join(
            f"; {name} p50 {ms(timing['p50_ms'])}, p99 {ms(timing['p99_ms'])} "
            f"({timing['count']} {what})"
            for name, timing, what in (
                ("time to first token", self.ttft, "answers"),
                ("inter-token latency", self.itl, "gaps"),
            )
            if timing
        )
        return (
            f"{self.requests} requests, {self.failures} failed ({self.fail_ratio:.2%}), "
            f"{self.rps:.1f} req/s, p50 {ms(self.p50_ms)}, p95 {ms(self.p95_ms)}, "
            f"p99 {ms(self.p99_ms)}{timings}; results in {self.results_dir}"
        )


def locust_command(
    *,
    http_url: str,
    grpc_url: str,
    model: str,
    user_type: str,
    users: int,
    spawn_rate: float,
    duration_s: float,
    rows: str,
    results_dir: Path,
    shape: str | None,
    max_p99_ms: float | None,
    max_fail_ratio: float | None,
    api_key_file: Path | None = None,
    input_file: Path | None = None,
    max_tokens: int = LLM_DEFAULT_MAX_TOKENS,
    stop_at_eos: bool = False,
    max_ttft_p99_ms: float | None = None,
    max_itl_p99_ms: float | None = None,
) -> list[str]:
    """The Locust command line; with `user_type` LLM_USER_TYPE, `model`, `rows` and `grpc_url`
    do not apply and `max_tokens`, `stop_at_eos` and the TTFT / ITL gates do."""
    if user_type == LLM_USER_TYPE:
        target = ["--user-type", user_type, "--max-tokens", str(max_tokens)]
        target += ["--stop-at-eos"] if stop_at_eos else []
    else:
        target = ["--grpc-host", grpc_url, "--model", model, "--user-type", user_type]
        target += ["--rows", str(rows)]
        if input_file is not None:
            target += ["--input-file", str(Path(input_file).resolve())]
    command = [
        sys.executable, "-m", "locust",
        "-f", str(LOCUSTFILE), "--config", str(LOCUST_CONF),
        "--headless", "--only-summary", "--loglevel", "INFO",
        "--host", f"http://{http_url.removeprefix('http://')}",
        *target,
        f"--shape={shape or ''}",
        "--users", str(users), "--spawn-rate", f"{spawn_rate:g}",
        "--run-time", f"{max(1, round(duration_s))}s",
        "--csv", str(results_dir / "locust"),
        "--html", str(results_dir / "report.html"),
        "--verdict-file", str(results_dir / "verdict.json"),
        "--metrics-snapshot", str(results_dir / "exporter.prom"),
    ]  # fmt: skip
    if api_key_file is not None:
        command += ["--api-key-file", str(Path(api_key_file).resolve())]
    if max_p99_ms is not None:
        command += ["--max-p99-ms", f"{max_p99_ms:g}"]
    if max_fail_ratio is not None:
        command += ["--max-fail-ratio", f"{max_fail_ratio:g}"]
    if max_ttft_p99_ms is not None:
        command += ["--max-ttft-p99-ms", f"{max_ttft_p99_ms:g}"]
    if max_itl_p99_ms is not None:
        command += ["--max-itl-p99-ms", f"{max_itl_p99_ms:g}"]
    return command


def run_headless(
    *,
    http_url: str,
    grpc_url: str,
    model: str | None = None,
    user_type: str = "http_json",
    users: int = 16,
    spawn_rate: float = 16,
    duration_s: float = 15,
    rows: str = "1",
    metrics_port: int | None = None,
    results_dir: Path,
    shape: str | None = None,
    max_p99_ms: float | None = None,
    max_fail_ratio: float | None = None,
    api_key_file: Path | None = None,
    input_file: Path | None = None,
    max_tokens: int = LLM_DEFAULT_MAX_TOKENS,
    stop_at_eos: bool = False,
    max_ttft_p99_ms: float | None = None,
    max_itl_p99_ms: float | None = None,
) -> LoadtestResult:
    """Run Locust headless against a running Triton and return its totals.

    `http_url` / `grpc_url` are "host:port" (the style of EmbeddedTriton.http_url); `model`
    defaults to the first public model (stack.env), `input_file` to random inputs. With
    `user_type` LLM_USER_TYPE the users stream generations of `max_tokens` tokens from the LLM
    (exactly that many unless `stop_at_eos`), and the result has its TTFT and ITL. With
    `metrics_port`, the exporter serves http://127.0.0.1:<metrics_port>/metrics while the run
    lasts; without it, nothing listens. LOCUST_* variables of the caller are not passed on, so a
    run depends on its arguments only. Raises UserError when Locust stops without a verdict.
    """
    results_dir = Path(results_dir).resolve()
    results_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("verdict.json", "exporter.prom"):
        (results_dir / stale).unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCUST_")}
    env["LOCUST_METRICS_PORT"] = str(metrics_port or 0)
    env["LOCUST_METRICS_ADDR"] = LOOPBACK
    if model is None:
        from tritonstack.core.settings import load

        model = load().default_model
    command = locust_command(
        http_url=http_url,
        grpc_url=grpc_url,
        model=model,
        user_type=user_type,
        users=users,
        spawn_rate=spawn_rate,
        duration_s=duration_s,
        rows=rows,
        results_dir=results_dir,
        shape=shape,
        max_p99_ms=max_p99_ms,
        max_fail_ratio=max_fail_ratio,
        api_key_file=api_key_file,
        input_file=input_file,
        max_tokens=max_tokens,
        stop_at_eos=stop_at_eos,
        max_ttft_p99_ms=max_ttft_p99_ms,
        max_itl_p99_ms=max_itl_p99_ms,
    )
    log = results_dir / "locust.log"
    with open(log, "wb") as output:
        # cwd: Locust also reads ./locust.conf and ./pyproject.toml; the results folder has none.
        process = subprocess.Popen(
            command, cwd=results_dir, env=env, stdout=output, stderr=subprocess.STDOUT
        )
        try:
            exit_code = process.wait(timeout=duration_s + 60)
        except subprocess.TimeoutExpired:
            process.terminate()  # Locust's SIGTERM handler still writes its results
            try:
                exit_code = process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                exit_code = process.wait()
        except BaseException:
            process.terminate()
            process.wait()
            raise
    verdict_file = results_dir / "verdict.json"
    if not verdict_file.is_file():
        lines = log.read_text(errors="replace").strip().splitlines()
        errors = [line for line in lines if "error" in line.lower()]
        reason = (errors or lines or ["no output"])[-1].strip()
        raise UserError(
            f"locust exited with code {exit_code} before the end of the run: {reason} "
            f"(full output: {log})"
        )
    verdict = json.loads(verdict_file.read_text())
    return LoadtestResult(
        requests=verdict["requests"],
        failures=verdict["failures"],
        fail_ratio=verdict["fail_ratio"],
        p50_ms=verdict["p50_ms"],
        p95_ms=verdict["p95_ms"],
        p99_ms=verdict["p99_ms"],
        rps=verdict["rps"],
        exit_code=exit_code,
        results_dir=results_dir,
        gate_failures=list(verdict["failed"]),
        ttft=verdict.get("ttft"),
        itl=verdict.get("itl"),
    )


def parse_duration(text: str) -> float:
    """Seconds from "90", "30s", "5m", "1h30m" (Locust's --run-time syntax)."""
    text = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        seconds = float(text)
    else:
        match = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text)
        if not text or match is None:
            raise UserError(f"--duration {text!r}: use seconds or e.g. 30s, 5m, 1h30m")
        hours, minutes, secs = (int(g or 0) for g in match.groups())
        seconds = hours * 3600 + minutes * 60 + secs
    if seconds < 1:
        raise UserError(f"--duration {text!r}: at least 1 second")
    return seconds


def check_rows(value: str, max_rows: int) -> str:
    """`--rows` against the model's max_batch_size (1 for a model without batching)."""
    if value != "mix" and not (value.isdigit() and 1 <= int(value) <= max_rows):
        raise UserError(f"--rows {value!r}: use an integer from 1 to {max_rows}, or mix")
    return value


def read_api_key(path: Path | None) -> str | None:
    """The key in an API key file (one line), checked before the run rather than per request."""
    if path is None:
        return None
    try:
        key = Path(path).read_text().strip()
    except OSError as exc:
        raise UserError(f"--api-key-file {path}: {exc.strerror}") from None
    if not key or len(key.split()) != 1:
        raise UserError(f"--api-key-file {path}: expected one API key on one line")
    return key


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def explain_unauthorized(http_url: str, api_key: str | None, exc: Exception) -> None:
    """One line for a gateway that wants a key, instead of a run where every request fails."""
    if "HTTP 401" in str(exc):
        raise UserError(
            f"the gateway at {http_url} wants an API key: pass --api-key-file FILE"
            + (" (this one was refused)" if api_key else "")
        ) from None


def check_llm_reachable(http_url: str, api_key: str | None = None) -> None:
    """One clear line instead of a run where every request fails to connect."""
    url = f"http://{http_url.removeprefix('http://')}/v2/models/{LLM_MODEL}/ready"
    try:
        request = urllib.request.Request(url, headers=auth_headers(api_key))
        with urllib.request.urlopen(request, timeout=5):
            return
    except urllib.error.HTTPError as exc:
        explain_unauthorized(http_url, api_key, Exception(f"HTTP {exc.code}"))
        raise UserError(f"{LLM_MODEL} is not ready at {http_url} (HTTP {exc.code})") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UserError(
            f"cannot reach Triton at {http_url} ({reason}); "
            "start it with `tritonstack serve --llm` or `docker compose --profile llm up`"
        ) from None


def model_signature(http_url: str, model: str, api_key: str | None):
    """The model's signature, asked of the server before Locust starts: a model the server
    does not serve, a gateway that wants a key or a server that is down is one line here."""
    from tritonstack.core.signature import fetch

    try:
        return fetch(http_url.removeprefix("http://"), model, auth_headers(api_key))
    except UserError as exc:
        explain_unauthorized(http_url, api_key, exc)
        raise


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=None,
        help="the model to call (default: the first of stack.env's PUBLIC_MODELS)",
    )
    parser.add_argument("--user-type", choices=USER_TYPES, default="http_json")
    parser.add_argument("--users", type=int, default=32, help="peak concurrent users (default 32)")
    parser.add_argument(
        "--spawn-rate", type=float, default=None, help="users started per second (default: all)"
    )
    parser.add_argument("--duration", default="30s", help="e.g. 30s, 5m (default 30s)")
    parser.add_argument(
        "--rows", default="1", help="rows per request: 1 to the model's max_batch_size, or mix"
    )
    parser.add_argument(
        "--input",
        type=Path,
        default=None,
        help="a .npy (one-input models) or .npz (an array per input name) to draw rows from, "
        "strings as numpy string arrays (default: random values: floats in [-1, 1], "
        "integers 0-9)",
    )
    parser.add_argument("--shape", choices=SHAPES, default=None, help="default: constant load")
    parser.add_argument("--host", default=f"{LOOPBACK}:{HTTP_PORT}", help="Triton HTTP host:port")
    parser.add_argument(
        "--grpc-host",
        default=None,
        help=f"Triton gRPC host:port (default: --host's name, :{GRPC_PORT})",
    )
    parser.add_argument(
        "--api-key-file",
        type=Path,
        default=None,
        help="the gateway's API key (one line), for a gateway published beyond loopback",
    )
    parser.add_argument("--max-p99-ms", type=float, default=None, help="gate: p99 latency")
    parser.add_argument(
        "--max-fail-ratio", type=float, default=None, help="gate: failed/all requests (0-1)"
    )
    llm = parser.add_argument_group("the LLM (serve --llm): streaming generation")
    llm.add_argument(
        "--llm",
        action="store_true",
        help=f"stream generations from /v2/models/{LLM_MODEL}/generate_stream instead of "
        "classifying (--model, --user-type, --rows and --grpc-host do not apply)",
    )
    llm.add_argument(
        "--max-tokens",
        type=int,
        default=LLM_DEFAULT_MAX_TOKENS,
        help=f"tokens per answer (default {LLM_DEFAULT_MAX_TOKENS}; the gateway allows up to "
        "stack.env's GATEWAY_LLM_MAX_TOKENS)",
    )
    llm.add_argument(
        "--stop-at-eos",
        action="store_true",
        help="let answers end at the model's end-of-sequence token (default: every answer is "
        "--max-tokens long, so runs compare)",
    )
    llm.add_argument(
        "--max-ttft-p99-ms", type=float, default=None, help="gate: p99 time to first token"
    )
    llm.add_argument(
        "--max-itl-p99-ms", type=float, default=None, help="gate: p99 inter-token latency"
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        help="results folder (default: results/loadtest-<date>-<time>)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help=f"serve the client metrics on {LOOPBACK}:PORT during the run (default: off)",
    )


def run(args: argparse.Namespace) -> int:
    duration_s = parse_duration(args.duration)
    if args.users < 1:
        raise UserError(f"--users {args.users}: at least 1")
    if args.max_fail_ratio is not None and not 0 <= args.max_fail_ratio <= 1:
        raise UserError(f"--max-fail-ratio {args.max_fail_ratio:g}: a ratio from 0 to 1")
    if args.llm:
        from tritonstack.core.settings import load

        highest = load().GATEWAY_LLM_MAX_TOKENS
        if not 1 <= args.max_tokens <= highest:
            raise UserError(
                f"--max-tokens {args.max_tokens}: from 1 to {highest} (stack.env's "
                "GATEWAY_LLM_MAX_TOKENS, what the gateway allows)"
            )
    llm_only = {"--max-ttft-p99-ms": args.max_ttft_p99_ms, "--max-itl-p99-ms": args.max_itl_p99_ms}
    if not args.llm and any(value is not None for value in llm_only.values()):
        named = ", ".join(name for name, value in llm_only.items() if value is not None)
        raise UserError(f"{named}: the LLM's gates; add --llm")
    host = args.host.removeprefix("http://")
    grpc_host = args.grpc_host or f"{host.rsplit(':', 1)[0]}:{GRPC_PORT}"
    results = args.results or Path("results") / time.strftime("loadtest-%Y%m%d-%H%M%S")
    api_key = read_api_key(args.api_key_file)
    rows = args.rows
    if args.llm:
        check_llm_reachable(host, api_key)
        what = (
            f"{LLM_MODEL} generate_stream, {args.users} users, {args.max_tokens} tokens per answer"
        )
    else:
        from tritonstack.core.settings import load
        from tritonstack.core.signature import load_arrays

        args.model = args.model or load().default_model
        signature = model_signature(host, args.model, api_key)
        rows = check_rows(args.rows, signature.max_rows)
        if args.input is not None:
            load_arrays(args.input, signature)  # a bad file is one line here, not a failed run
        what = f"{args.model}, {args.user_type}, {args.users} users, rows {rows}"
    print(
        f"loadtest: {what}, {args.shape or 'constant'} for {duration_s:g} s against "
        f"{grpc_host if args.user_type == 'grpc' else host}",
        flush=True,
    )
    result = run_headless(
        http_url=host,
        grpc_url=grpc_host,
        model=args.model,
        user_type=LLM_USER_TYPE if args.llm else args.user_type,
        users=args.users,
        spawn_rate=args.spawn_rate or args.users,
        duration_s=duration_s,
        rows=rows,
        metrics_port=args.metrics_port,
        results_dir=results,
        shape=args.shape,
        max_p99_ms=args.max_p99_ms,
        max_fail_ratio=args.max_fail_ratio,
        api_key_file=args.api_key_file,
        input_file=args.input,
        max_tokens=args.max_tokens,
        stop_at_eos=args.stop_at_eos,
        max_ttft_p99_ms=args.max_ttft_p99_ms,
        max_itl_p99_ms=args.max_itl_p99_ms,
    )
    print(result.summary(), flush=True)
    if result.gate_failures:
        print(f"gate failed: {'; '.join(result.gate_failures)}", file=sys.stderr)
        return result.exit_code or GATE_FAILED_EXIT_CODE
    if result.exit_code != 0:
        detail = (
            f"{result.failures} of {result.requests} requests failed, see "
            f"{result.results_dir / 'locust_failures.csv'}"
            if result.failures
            else f"see {result.results_dir / 'locust.log'}"
        )
        print(f"locust exited with code {result.exit_code}: {detail}", file=sys.stderr)
    return result.exit_code
