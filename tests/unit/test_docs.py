"""The docs cannot rot: every shell command shown in README.md and docs/ is run here, or listed
below with the test that runs it or the reason it cannot run on this machine, and every relative
link in them resolves to a file and, with a `#fragment`, to a heading of that file.

A command added to the docs fails `test_every_shown_command_is_classified` until it is added to
one of the lists; a command the docs dropped fails `test_no_list_names_a_command_the_docs_dropped`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from tests.support import ROOT, require_tool

DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")))
#: Fenced blocks whose lines are commands; `console` blocks mark commands with `$ ` and show
#: the output under them.
SHELL_BLOCKS = frozenset({"bash", "sh", "shell", "console"})
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
BIN = str(Path(sys.executable).parent)

#: How the benchmark is started; the only line to change when the benchmark's entry point moves.
BENCH = "python -m bench"
#: Benchmark commands the docs show: command -> the test that runs it, or why none can.
BENCH_COMMANDS = {
    BENCH: "a full run takes about 20 minutes of a quiet machine; its quick form runs below and "
    "tests/unit/test_bench.py::test_committed_docs_are_a_full_run_or_the_pending_page checks the "
    "committed page is a full run's output",
    f"{BENCH} --quick --out /tmp/bench": (
        "tests/functional/test_bench.py::test_quick_bench_end_to_end"
    ),
    f"{BENCH} --scenarios own --merge": (
        "tests/functional/test_bench_own.py::test_quick_own_family_compares_triton_with_"
        "onnxruntime_in_process runs the family (--quick, into a folder of its own); "
        "tests/unit/test_bench.py::test_own_results_merge_into_a_full_run_and_render the merge"
    ),
    f"{BENCH} --scenarios llm --merge": (
        "tests/functional/test_bench_llm.py::test_quick_llm_family_compares_triton_with_vllm_"
        "serve runs the family (--quick, into a folder of its own); "
        "tests/unit/test_bench.py::test_llm_results_merge_into_a_full_run_and_render the merge"
    ),
}

#: Commands this module runs, and against what: "repo" (the checkout, no server) or "gateway"
#: (the session's real Triton behind the real HAProxy; the default ports are rewritten to the
#: free ones the fixture took).
RUN_HERE = {
    "tritonstack check": "repo",
    "tritonstack infer --rows 4": "gateway",
    "promtool check rules prometheus/rules/*.yml": "repo",
    "kubectl kustomize deploy/kubernetes/overlays/gpu": "repo",
}

STACK_TEST = "tests/functional/test_compose_stack.py"
ZOO_TEST = (
    "tests/functional/test_model_zoo.py (the project fixture adds each model of tests/"
    "model_zoo.py with these options; tests/unit/test_model_docs.py holds the two equal)"
)
#: docs/models.md's add-model commands: each zoo model it shows, and its options.
ZOO_COMMANDS = {
    "image": " --shape images=1x3x8x8:2x3x16x24:4x3x32x32",
    "sequence": " --shape ids=1x1:4x12:16x64",
    "fixed_export": "",
    "scalar_and_rows": " --shape rows=1x3:4x3:8x3",
    "text": " --max-string-bytes 64",
    "every_type": " --max-batch-size 8",
    "stateful": "",
    "recurrent": " --server-state",
    "xgboost": "",
    "lightgbm": "",
    "sklearn_forest": "",
}
UP_TEST = (
    "tests/functional/test_up.py::test_up_serves_triton_prometheus_and_locust_and_sigint_stops_all"
)
#: Commands other tests run (`path::test`), so running them here again would only cost time.
RUN_ELSEWHERE = {
    "python3 -m venv .venv && pip install -e '.[all]'": "Makefile's venv target, run by .ci/run "
    "on a fresh machine, installs `.[test]`, which includes `[all]`; the core alone: "
    "tests/functional/test_package.py::test_the_wheel_holds_the_product_and_no_benchmark_code",
    "make test": ".ci/run",
    "python -m tests.gpu.prepare": (
        "tests/functional/test_gpu_check.py::test_the_default_carry_fits_what_a_device_run_carries"
    ),
    "tests/gpu/run.sh": (
        "tests/functional/test_gpu_check.py::test_the_check_passes_on_a_cpu_instance_installed_"
        "offline (with --device cpu; a GPU machine runs it as shown)"
    ),
    "(cd prometheus/tests && promtool test rules *.yml)": (
        "tests/unit/test_prometheus.py::test_promtool_test_rules"
    ),
    "pip install -e '.[bench]'": "Makefile's venv target installs `.[test]`, which includes "
    "`[bench]`; tests/unit/test_cli.py checks the extras named in errors exist",
    "make test-unit": (
        "tests/unit/test_kinds.py::test_make_test_runs_everything_and_test_unit_only_the_unit_folder"
    ),
    "tritonstack serve": "tests/functional/test_serve.py::test_signal_stops_triton_and_every_stub",
    "make llm": "`make test` depends on it (.ci/run, on a fresh machine); "
    "tests/unit/test_llm.py::test_make_llm_installs_the_lock_without_resolving_and_make_test_needs_it",
    "tritonstack serve --llm": (
        "tests/functional/test_llm_cli.py::test_serve_llm_serves_it_through_the_gateway_and_stops_"
        "with_nothing_left"
    ),
    "tritonstack up --llm": (
        "tests/functional/test_up.py::test_up_llm_serves_the_llm_to_locust_and_prometheus_and_"
        "sigint_stops_all"
    ),
    'tritonstack generate "What does Triton add to vLLM?" --max-tokens 64': (
        "tests/functional/test_llm_cli.py::test_generate_streams_the_greedy_answer_to_stdout_and_"
        "its_numbers_to_stderr (with --url of the test's server)"
    ),
    "tritonstack --project-dir ~/tritonstack check": (
        "tests/unit/test_package.py::test_project_dir_option_wins_over_the_variable_and_the_current_"
        "directory (an installed copy, a project elsewhere)"
    ),
    "python examples/client.py": (
        "tests/functional/test_inference.py::test_seed_client_example_prints_labels"
    ),
    "kubectl kustomize deploy/kubernetes/overlays/gpu | grep -E '^kind:' | sort -u": (
        "tests/unit/test_kubernetes.py::test_scaling_doc_command_prints_what_the_doc_shows"
    ),
    "python -m tritonstack.render.k8s": (
        "tests/unit/test_kubernetes.py::test_generated_copies_match_their_sources"
    ),
    "python deploy/kubernetes/simulate.py": (
        "tests/unit/test_scaling_doc.py::test_simulator_output_matches_the_committed_tables_plot_and_doc"
    ),
    "tritonstack dashboards": "tests/unit/test_dashboards.py::test_cli_regenerates_identically",
    "tritonstack up": UP_TEST,
    "tritonstack top": "tests/functional/test_top.py::test_top_once_under_load",
    "tritonstack loadtest --model pipeline --users 16 --duration 10s --max-p99-ms 50 "
    "--max-fail-ratio 0.001": (
        "tests/functional/test_loadtest.py::test_cli_gate_fails_with_one_line_naming_the_gate"
    ),
    "tritonstack loadtest --llm --users 4 --duration 6s --max-tokens 16 --max-ttft-p99-ms 2000 "
    "--max-itl-p99-ms 500 --max-fail-ratio 0": (
        "tests/functional/test_loadtest_llm.py::test_documented_llm_run_streams_valid_answers_and_"
        "passes_its_gates (with --host of the session's LLM Triton)"
    ),
    "locust -f loadtest/locustfile.py --config loadtest/locust.conf --host http://127.0.0.1:8000 "
    "--web-host 127.0.0.1": f"{UP_TEST}, which starts this web UI with the same files",
    "docker compose run --rm secrets show": (
        f"{STACK_TEST}::test_generated_secrets_are_readable_by_exactly_their_readers, and "
        "tests/unit/test_compose.py::test_secrets_are_generated_once_private_and_printed_by_one_command"
    ),
    "docker compose -f docker-compose.yml -f compose.cpu.yml up -d --build": (
        f"{STACK_TEST}::test_first_up_builds_each_image_once_and_every_service_is_healthy, with "
        "--wait, a project name of its own and every service but Grafana, on stand-in images"
    ),
    "docker compose ps": f"{STACK_TEST} (its Compose.containers: `ps -a -q`, then inspect)",
    "docker compose down": (
        f"{STACK_TEST}::test_stop_under_load_loses_nothing_in_flight_and_start_keeps_the_secrets"
    ),
    "docker compose down -v": f"{STACK_TEST} (the stack fixture's teardown: `down --volumes`)",
    "docker compose --profile llm config --services": (
        "tests/unit/test_compose.py::test_the_llm_never_starts_without_its_profile (with and "
        "without the profile, on the GPU file and with the CPU overlay)"
    ),
    "tritonstack add-model ranker.onnx --name ranker --labels labels.txt": (
        "tests/functional/test_own_models.py::test_add_model_writes_the_model_and_everything_"
        "derived_from_it (the test's own ranker.onnx and labels.txt, on a copy of the checkout)"
    ),
    "tritonstack remove-model ranker": (
        "tests/functional/test_own_models.py::test_remove_model_undoes_add_model_to_the_byte "
        "(the test's own model, added then removed on a copy of the checkout)"
    ),
    "tritonstack infer --model ranker --rows 4": (
        "tests/functional/test_own_models.py::test_infer_prints_the_labels_and_reads_an_npz "
        "(with --url of the test's gateway)"
    ),
    "tritonstack loadtest --model ranker --rows mix --max-fail-ratio 0": (
        "tests/functional/test_own_models.py::test_a_gated_loadtest_of_the_model_passes "
        "(with --host of the test's gateway)"
    ),
    **{
        f"tritonstack add-model {name}.onnx --name {name}{options}": ZOO_TEST
        for name, options in ZOO_COMMANDS.items()
    },
    "tritonstack infer --model stateful --steps 3": (
        "tests/functional/test_model_zoo.py::test_infer_steps_carry_the_state_the_model_returns "
        "(with --url of the test's gateway)"
    ),
    "tritonstack infer --model recurrent --steps 3": (
        "tests/functional/test_server_state.py::test_the_health_probe_and_infer_steps_send_a_"
        "sequence (with --url of the test's gateway)"
    ),
    "make standin-images": (
        "tests/unit/test_standins.py::test_make_standin_images_runs_the_builder; the compose "
        "stack's session fixture (tests/functional/conftest.py) runs the same builder"
    ),
}

#: Commands nothing here can run, and why. What can be checked without them is checked by the
#: tests named in the reason.
CANNOT_RUN_HERE = {
    "docker compose up -d --build": "needs a GPU; tests/unit/test_compose.py validates the GPU "
    "file offline, and its CPU variant runs for real in tests/functional/test_compose_stack.py",
    "docker compose logs -f triton": "follows the log until interrupted; the log lines shown come "
    "from tritonstack/launcher, run with fakes by tests/unit/test_entrypoint.py",
    "docker image rm tritonstack/triton:26.08 tritonstack/locust:2.47.0": "not run: the tests' "
    "private engine is removed with every image in it; "
    "tests/unit/test_compose.py::test_images_match_the_pinned_releases pins these tags",
    "docker compose --profile bench run --rm perf-analyzer": "needs a Docker engine and a GPU; "
    "tests/unit/test_compose.py::test_gpu_bench_profile_is_the_one_the_benchmark_docs_describe",
    "docker compose --profile llm up -d --build": "needs a GPU and NVIDIA's vLLM image (no "
    "registry here); tests/unit/test_compose.py validates the service offline and runs its command "
    "with a fake tritonserver, tests/functional/test_compose.py::test_llm_healthcheck_passes_once_"
    "llm_is_ready_and_not_before runs its healthcheck against the embedded runtime's vLLM backend",
    "apt-get install wrk": "installs a system package (root); .ci/run installs it in CI",
}


@dataclass(frozen=True)
class Shown:
    """One command in a fenced block, and the output shown under it (`console` blocks only)."""

    command: str
    output: str | None
    where: str


def strip_comment(line: str) -> str:
    """The line without its shell comment: a `#` at the start or after a blank, outside quotes."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def normalise(command: str) -> str:
    """One spelling per command: single spaces, and `.venv/bin/x` as the `x` it is."""
    return re.sub(r"(^|[\s;&|(])\.venv/bin/", r"\1", " ".join(command.split()))


def shown_commands() -> list[Shown]:
    shown = []
    for path in DOCS:
        text = path.read_text()
        for block in FENCE.finditer(text):
            if block[1] not in SHELL_BLOCKS:
                continue
            line_no = text.count("\n", 0, block.start(2)) + 1
            where = f"{path.relative_to(ROOT)}:{line_no}"
            lines = block[2].replace("\\\n", " ").splitlines()
            if block[1] == "console":
                shown += console_commands(lines, where)
                continue
            for line in lines:
                command = normalise(strip_comment(line))
                if command:
                    shown.append(Shown(command, None, where))
    return shown


def console_commands(lines: list[str], where: str) -> list[Shown]:
    shown: list[Shown] = []
    for line in lines:
        if line.startswith("$ "):
            shown.append(Shown(normalise(strip_comment(line[2:])), "", where))
        elif shown:
            last = shown.pop()
            shown.append(Shown(last.command, f"{last.output}{line}\n", last.where))
    return shown


SHOWN = shown_commands()
CLASSIFIED = {**RUN_HERE, **RUN_ELSEWHERE, **CANNOT_RUN_HERE, **BENCH_COMMANDS}


def test_the_docs_show_commands():
    assert len({s.command for s in SHOWN}) >= 20, SHOWN  # the extraction found the blocks


def test_every_shown_command_is_classified():
    unclassified = [f"{s.where}: {s.command}" for s in SHOWN if s.command not in CLASSIFIED]
    assert not unclassified, (
        "commands shown in the docs that nothing runs: add each to RUN_HERE, RUN_ELSEWHERE "
        "(with the test that runs it) or CANNOT_RUN_HERE (with the reason) in "
        "tests/unit/test_docs.py:\n" + "\n".join(unclassified)
    )


def test_no_list_names_a_command_the_docs_dropped():
    assert set(CLASSIFIED) <= {s.command for s in SHOWN}


def test_the_lists_do_not_overlap():
    lists = (RUN_HERE, RUN_ELSEWHERE, CANNOT_RUN_HERE, BENCH_COMMANDS)
    assert sum(len(entries) for entries in lists) == len(CLASSIFIED)


@pytest.mark.parametrize(
    "command, reason", sorted({**RUN_ELSEWHERE, **CANNOT_RUN_HERE, **BENCH_COMMANDS}.items())
)
def test_every_named_test_exists(command, reason):
    for path, name in re.findall(r"(tests/[\w/]+\.py)::(\w+)", reason):
        assert re.search(rf"^(async )?def {name}\(", (ROOT / path).read_text(), re.M), (
            f"{command!r} points at {path}::{name}, which does not exist"
        )
    for path in re.findall(r"(?<![\w/])((?:\.ci/|tests/)[\w./]+|Makefile)", reason):
        assert (ROOT / path.split("::")[0]).exists(), f"{command!r} points at missing {path}"


def run_shell(command: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", f"set -o pipefail; {command}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", **(env or {})},
    )


def check_output(shown: list[Shown], result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, f"{shown[0].command}: exit {result.returncode}\n{result.stderr}"
    for s in shown:
        if s.output is not None:
            assert result.stdout == s.output, f"{s.where}: the docs show other output"


def tool_for(command: str) -> None:
    """Debian's promtool is installed by .ci/run; kubectl comes with the test extras."""
    if "promtool" in command.split():
        require_tool("promtool")


REPO_COMMANDS = sorted(c for c, how in RUN_HERE.items() if how == "repo")


@pytest.mark.parametrize("command", REPO_COMMANDS)
def test_command_runs_as_shown(command):
    tool_for(command)
    check_output([s for s in SHOWN if s.command == command], run_shell(command))


def github_anchor(heading: str) -> str:
    """The `#fragment` GitHub gives a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} (.+?)#*$", text, re.M):
        anchor = github_anchor(heading)
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found


def relative_links(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans hold no links
    return [
        target
        for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text)
        if not urlsplit(target).scheme and not target.startswith("mailto:")
    ]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    broken = []
    for target in relative_links(path):
        file_part, _, fragment = target.partition("#")
        destination = (path.parent / unquote(file_part)).resolve() if file_part else path
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif fragment and destination.suffix == ".md" and fragment not in anchors(destination):
            broken.append(f"{target}: no heading #{fragment} in {destination.relative_to(ROOT)}")
    assert not broken, f"{path.relative_to(ROOT)}:\n" + "\n".join(broken)


def test_the_anchor_rule_matches_github():
    assert github_anchor("Embedded 2.51 vs container 26.08") == "embedded-251-vs-container-2608"
    assert github_anchor("What it costs, and how `maxconn` was sized") == (
        "what-it-costs-and-how-maxconn-was-sized"
    )
    assert github_anchor("Triton: 2.51 embedded, 2.72 in the container") == (
        "triton-251-embedded-272-in-the-container"
    )
