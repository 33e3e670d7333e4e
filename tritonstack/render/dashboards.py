"""Grafana dashboards as code: `tritonstack dashboards` writes grafana/dashboards/*.json.

Built with grafana-foundation-sdk (pinned in pyproject.toml), Grafana's own typed builders
generated from the same schemas Grafana uses for its dashboards, rather than grafanalib: the
builders follow Grafana's current dashboard model (grafanalib is community-maintained and lags
behind it), and a misspelt option is an AttributeError when this module runs, not a silently
ignored JSON key.

Every panel's queries are defined once, in `DASHBOARDS`, as plain data (`PanelSpec`, `Query`):
the builder turns them into JSON, and the tests enumerate the same objects, so the drift test
(tests/unit/test_dashboards.py) and the live test (tests/functional/test_observability_live.py,
which runs every query against a real Prometheus scraping a real Triton) cannot miss a panel.
Panels query the recording rules of prometheus/rules/*.yml where one exists, so Grafana and the
alerts agree.

The JSON is written with sorted keys and fixed uids, so a regeneration that changes nothing
changes no byte, and a diff shows exactly what moved.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tritonstack.core.project import project_dir

DASHBOARDS_DIR = project_dir() / "grafana" / "dashboards"
#: The provisioned Prometheus datasource (grafana/provisioning/datasources/prometheus.yml).
DATASOURCE_UID = "prometheus"
#: Every panel filters on this variable: `model=~"$model"`.
MODEL = 'model=~"$model"'


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class PanelSpec:
    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    #: Why this panel may be empty on the CPU runtime, or None when it must show data there.
    exempt_on_cpu: str | None = None
    #: Series that only exist while the load generator runs (Locust's exporter).
    needs_load_generator: bool = False
    #: Series that only exist while the LLM is served (its vllm:* metrics): proven by
    #: tests/functional/test_observability_llm.py on the LLM's server, not by the classifier's.
    needs_llm: bool = False
    stacked: bool = False
    width: int = 12


@dataclass(frozen=True)
class RowSpec:
    title: str
    panels: tuple[PanelSpec, ...]


@dataclass(frozen=True)
class DashboardSpec:
    uid: str
    title: str
    description: str
    rows: tuple[RowSpec, ...]
    tags: tuple[str, ...] = ("tritonstack", "triton")
    file_name: str = field(default="")

    @property
    def path(self) -> Path:
        return DASHBOARDS_DIR / (self.file_name or f"{self.uid}.json")


GPU_ONLY = "GPU metrics: the CPU runtime has no GPU (--allow-gpu-metrics=false)"

TRAFFIC = RowSpec(
    "Traffic",
    (
        PanelSpec(
            "Requests/s",
            "Requests answered per second, successful or not.",
            "reqps",
            (Query(f"model:nv_inference_requests:rate1m{{{MODEL}}}", "{{model}}"),),
        ),
        PanelSpec(
            "Failures/s by reason",
            "Failed requests per second. REJECTED: a queue policy's limit (none is configured: "
            "the gateway refuses overload, see the Gateway row); "
            "BACKEND: the model failed; CANCELED: the client cancelled.",
            "reqps",
            (
                Query(
                    f"model_reason:nv_inference_request_failure:rate1m{{{MODEL}}}",
                    "{{model}} {{reason}}",
                ),
            ),
        ),
        PanelSpec(
            "Inferences/s",
            "Rows inferred per second: a request of 8 rows counts 8.",
            "ops",
            (Query(f"model:nv_inference_count:rate1m{{{MODEL}}}", "{{model}}"),),
        ),
        PanelSpec(
            "Average batch size",
            "Rows per model execution: rate(nv_inference_count) / rate(nv_inference_exec_count)."
            " Near 1 under load means dynamic batching does not form batches.",
            "short",
            (Query(f"model:nv_inference_count:per_exec_rate1m{{{MODEL}}}", "{{model}}"),),
        ),
        PanelSpec(
            "Error ratio (5 min)",
            "Failed / all requests over 5 minutes; the error budget is 0.1 %.",
            "percentunit",
            (Query(f"model:nv_inference_request_failure:ratio_rate5m{{{MODEL}}}", "{{model}}"),),
        ),
        PanelSpec(
            "Pending requests",
            "Requests queued or executing in Triton right now.",
            "short",
            (
                Query(
                    f"sum by (model) (nv_inference_pending_request_count{{{MODEL}}})",
                    "{{model}}",
                ),
            ),
        ),
    ),
)

LATENCY = RowSpec(
    "Latency",
    (
        PanelSpec(
            "Queue vs compute time per request",
            "Average µs per successful request spent waiting in Triton's queue and computing. "
            "A growing queue with a flat compute time means more load than the instances take.",
            "µs",
            (
                Query(
                    f"model:nv_inference_queue_duration_us:per_request_rate1m{{{MODEL}}}",
                    "{{model}} queue",
                ),
                Query(
                    f"model:nv_inference_compute_infer_duration_us:per_request_rate1m{{{MODEL}}}",
                    "{{model}} compute",
                ),
            ),
        ),
        PanelSpec(
            "End-to-end server latency per request",
            "Average µs from Triton receiving a request to sending its response. Triton exports "
            "no latency histogram: percentiles are the client-side panel's.",
            "µs",
            (
                Query(
                    f"model:nv_inference_request_duration_us:per_request_rate1m{{{MODEL}}}",
                    "{{model}}",
                ),
            ),
        ),
        PanelSpec(
            "Client-side latency p50 / p95 / p99",
            "Percentiles of the load generator's request duration histogram (Locust exporter), "
            "network and client included.",
            "s",
            tuple(
                Query(
                    "model_user_type:tritonstack_client_request_duration_seconds:"
                    f"{quantile}_rate1m{{{MODEL}}}",
                    f"{{{{model}}}} {{{{user_type}}}} {quantile}",
                )
                for quantile in ("p50", "p95", "p99")
            ),
            needs_load_generator=True,
        ),
        PanelSpec(
            "Client-side requests/s",
            "Requests per second the load generator sent, failed or not.",
            "reqps",
            (
                Query(
                    f"model_user_type:tritonstack_client_requests:rate1m{{{MODEL}}}",
                    "{{model}} {{user_type}}",
                ),
            ),
            needs_load_generator=True,
        ),
        PanelSpec(
            "Client-side failure ratio",
            "Share of the load generator's requests that failed over 1 minute; above 50 % for "
            "1 minute fires TritonClientRequestsFailing.",
            "percentunit",
            (
                Query(
                    f"model_user_type:tritonstack_client_failures:ratio_rate1m{{{MODEL}}}",
                    "{{model}} {{user_type}}",
                ),
            ),
            needs_load_generator=True,
        ),
    ),
)

MODELS = RowSpec(
    "Models",
    (
        PanelSpec(
            "Predicted label distribution",
            "Rows per second by predicted label (postprocess serves pipeline; classify its own).",
            "ops",
            (
                Query(
                    f"model_label:tritonstack_predictions:rate1m{{{MODEL}}}", "{{model}} {{label}}"
                ),
            ),
            stacked=True,
        ),
        PanelSpec(
            "BLS routing: TensorRT vs ONNX",
            "Rows per second classify sends to classifier_trt (TensorRT) or classifier (ONNX).",
            "ops",
            (
                Query(
                    f"model_target_runtime:tritonstack_classify_routed_rows:rate1m{{{MODEL}}}",
                    "{{runtime}} ({{target}})",
                ),
            ),
            stacked=True,
        ),
        PanelSpec(
            "BLS sub-request latency p95",
            "95th percentile of classify's one sub-request per execution, by routed-to model.",
            "s",
            (
                Query(
                    "model_target:tritonstack_classify_subrequest_duration_seconds:p95_rate1m"
                    f"{{{MODEL}}}",
                    "{{target}}",
                ),
            ),
        ),
    ),
)

RESOURCES = RowSpec(
    "Resources",
    (
        PanelSpec(
            "CPU utilisation",
            "Host CPU utilisation seen by Triton (0-100 %).",
            "percentunit",
            (Query("nv_cpu_utilization", "{{instance}}"),),
        ),
        PanelSpec(
            "CPU memory",
            "Host memory used, and the total.",
            "bytes",
            (
                Query("nv_cpu_memory_used_bytes", "{{instance}} used"),
                Query("nv_cpu_memory_total_bytes", "{{instance}} total"),
            ),
        ),
        PanelSpec(
            "GPU utilisation",
            "Per GPU (0-100 %).",
            "percentunit",
            (Query("nv_gpu_utilization", "{{instance}} {{gpu_uuid}}"),),
            exempt_on_cpu=GPU_ONLY,
            width=8,
        ),
        PanelSpec(
            "GPU memory",
            "Per GPU: used, and the total.",
            "bytes",
            (
                Query("nv_gpu_memory_used_bytes", "{{instance}} {{gpu_uuid}} used"),
                Query("nv_gpu_memory_total_bytes", "{{instance}} {{gpu_uuid}} total"),
            ),
            exempt_on_cpu=GPU_ONLY,
            width=8,
        ),
        PanelSpec(
            "GPU power",
            "Per GPU power draw.",
            "watt",
            (Query("nv_gpu_power_usage", "{{instance}} {{gpu_uuid}}"),),
            exempt_on_cpu=GPU_ONLY,
            width=8,
        ),
    ),
)

#: Gateway panels show HAProxy's metrics (job `gateway`), per frontend or backend (`proxy`);
#: they have no `model` label: one gateway serves every model.
GATEWAY_JOB = 'job="gateway"'

GATEWAY = RowSpec(
    "Gateway",
    (
        PanelSpec(
            "Gateway requests/s by status",
            "Answers per second of the gateway's frontends (http, grpc), by HTTP status class. "
            "4xx: requests the gateway or Triton refused as invalid; 5xx: see refusals.",
            "reqps",
            (Query("proxy_code:haproxy_frontend_http_responses:rate1m", "{{proxy}} {{code}}"),),
            stacked=True,
        ),
        PanelSpec(
            "Gateway refusals/s (at capacity)",
            "5xx the gateway answered itself, with Retry-After, instead of passing the request "
            "to Triton: the per-replica queue was full or the wait timed out (or no replica was "
            "ready). Triton has no metric for refusals of its own; these are the count.",
            "reqps",
            (Query("proxy:haproxy_gateway_refusals:rate1m", "{{proxy}}"),),
        ),
        PanelSpec(
            "Gateway in flight and queue",
            "Requests in flight to Triton (capped per replica by the gateway's maxconn), the "
            "cap, and requests waiting at the gateway for a free slot.",
            "short",
            (
                Query(
                    f"sum by (proxy) (haproxy_server_current_sessions{{{GATEWAY_JOB}}})",
                    "{{proxy}} in flight",
                ),
                Query(
                    f"sum by (proxy) (haproxy_server_limit_sessions{{{GATEWAY_JOB}}})",
                    "{{proxy}} in-flight cap",
                ),
                Query(
                    f"sum by (proxy) (haproxy_backend_current_queue{{{GATEWAY_JOB}}})",
                    "{{proxy}} waiting",
                ),
            ),
        ),
        PanelSpec(
            "Gateway latency (average of the last 1024 requests)",
            "Per backend: total time through the gateway, of which waiting at the gateway "
            "for a slot, and Triton's response time. HAProxy exports averages, not "
            "percentiles: the client-side panel has those.",
            "s",
            (
                Query(
                    f"haproxy_backend_total_time_average_seconds{{{GATEWAY_JOB}}}",
                    "{{proxy}} total",
                ),
                Query(
                    f"haproxy_backend_queue_time_average_seconds{{{GATEWAY_JOB}}}",
                    "{{proxy}} waiting at the gateway",
                ),
                Query(
                    f"haproxy_backend_response_time_average_seconds{{{GATEWAY_JOB}}}",
                    "{{proxy}} Triton response",
                ),
            ),
        ),
        PanelSpec(
            "Gateway 5xx and refusal ratios (5 min)",
            "Share of answers that were 5xx, and share the gateway refused; above 5 % and 1 % "
            "for 5 minutes fire GatewayHighErrorRatio and GatewayRejectingRequests.",
            "percentunit",
            (
                Query("proxy:haproxy_frontend_http_responses_5xx:ratio_rate5m", "{{proxy}} 5xx"),
                Query("proxy:haproxy_gateway_refusals:ratio_rate5m", "{{proxy}} refused"),
            ),
        ),
        PanelSpec(
            "Triton replicas ready behind the gateway",
            "Servers of each backend passing the gateway's readiness check; 0 for 1 minute "
            "fires GatewayBackendDown.",
            "short",
            (Query(f"haproxy_backend_active_servers{{{GATEWAY_JOB}}}", "{{proxy}}"),),
        ),
    ),
)

#: What a first token, a token and a whole answer take, from the vllm:* histograms through the
#: recording rules of prometheus/rules/llm.yml. Triton's own nv_* series count the LLM's requests
#: (rows "Traffic" and "Latency") but neither its errors nor its generation time: a decoupled
#: model's request counts as a success, in well under a millisecond, when execute() hands it to
#: the engine.
LLM = RowSpec(
    "LLM",
    (
        PanelSpec(
            "LLM time to first token p50 / p90 / p99",
            "From a request's arrival in vLLM to its first token: queueing and prefill, what a "
            "streaming user waits before any text. p99 above 1 s for 5 minutes fires "
            "LLMTimeToFirstTokenHigh.",
            "s",
            tuple(
                Query(
                    f"model:vllm_time_to_first_token_seconds:{quantile}_rate1m{{{MODEL}}}",
                    f"{{{{model}}}} {quantile}",
                )
                for quantile in ("p50", "p90", "p99")
            ),
            needs_llm=True,
            width=8,
        ),
        PanelSpec(
            "LLM time per output token p50 / p99",
            "Between two tokens of one answer (inter-token latency): the streaming speed.",
            "s",
            tuple(
                Query(
                    f"model:vllm_time_per_output_token_seconds:{quantile}_rate1m{{{MODEL}}}",
                    f"{{{{model}}}} {quantile}",
                )
                for quantile in ("p50", "p99")
            ),
            needs_llm=True,
            width=8,
        ),
        PanelSpec(
            "LLM end-to-end generation p99",
            "A whole generation in vLLM, from arrival to the last token.",
            "s",
            (
                Query(
                    f"model:vllm_e2e_request_latency_seconds:p99_rate1m{{{MODEL}}}",
                    "{{model}} p99",
                ),
            ),
            needs_llm=True,
            width=8,
        ),
        PanelSpec(
            "LLM tokens/s",
            "Tokens generated per second, and prompt tokens prefilled per second.",
            "suffix:tokens/s",
            (
                Query(f"model:vllm_generation_tokens:rate1m{{{MODEL}}}", "{{model}} generated"),
                Query(f"model:vllm_prompt_tokens:rate1m{{{MODEL}}}", "{{model}} prompt"),
            ),
            needs_llm=True,
            width=8,
        ),
        PanelSpec(
            "LLM requests/s: received and finished",
            "Requests Triton handed to the model, and requests vLLM generated to the end; the "
            "gap is requests refused, failed or cancelled.",
            "reqps",
            (
                Query(
                    f"model:nv_inference_requests:rate1m{{{MODEL}}}"
                    " and on (model) model:vllm_requests_finished:rate1m",
                    "{{model}} received",
                ),
                Query(f"model:vllm_requests_finished:rate1m{{{MODEL}}}", "{{model}} finished"),
            ),
            needs_llm=True,
            width=8,
        ),
        PanelSpec(
            "LLM requests not finished (5 min)",
            "Share of the requests Triton handed to the model that vLLM did not generate to the "
            "end: refused as invalid (4xx), failed, or cancelled by the client. The LLM's error "
            "ratio: Triton's failure counter stays 0 for it. Above 10 % for 10 minutes fires "
            "LLMRequestsUnfinished.",
            "percentunit",
            (Query(f"model:vllm_requests_unfinished:ratio_rate5m{{{MODEL}}}", "{{model}}"),),
            needs_llm=True,
            width=8,
        ),
        PanelSpec(
            "LLM prompt and answer length p50 / p99",
            "Tokens per prompt and per generated answer, of finished requests.",
            "suffix:tokens",
            tuple(
                Query(
                    f"model:vllm_request_{kind}_tokens:{quantile}_rate1m{{{MODEL}}}",
                    f"{{{{model}}}} {name} {quantile}",
                )
                for kind, name in (("prompt", "prompt"), ("generation", "answer"))
                for quantile in ("p50", "p99")
            ),
            needs_llm=True,
            width=24,
        ),
    ),
)

DASHBOARDS: tuple[DashboardSpec, ...] = (
    DashboardSpec(
        uid="tritonstack-triton",
        title="Triton: serving",
        description="The gateway's traffic and refusals, Triton's traffic, batching, latency, "
        "the models' own metrics, resources and the LLM's tokens and latencies. "
        "Generated by tritonstack/render/dashboards.py: edit the code, "
        "then `tritonstack dashboards`.",
        rows=(TRAFFIC, LATENCY, MODELS, RESOURCES, GATEWAY, LLM),  # appended: panel ids stay
    ),
)


def panels() -> Iterator[tuple[DashboardSpec, PanelSpec]]:
    """Every panel of every dashboard."""
    for spec in DASHBOARDS:
        for row in spec.rows:
            for panel in row.panels:
                yield spec, panel


def model_variable():
    from grafana_foundation_sdk.builders import dashboard as db
    from grafana_foundation_sdk.models import dashboard as model

    return (
        db.QueryVariable("model")
        .label("Model")
        .description("Triton models; every panel filters on them.")
        .datasource(model.DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID))
        .query(MODEL_VARIABLE_QUERY)
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".+")
        .current(model.VariableOption(text="All", value="$__all", selected=True))
    )


#: The `model` variable's values: every model Triton reports.
MODEL_VARIABLE_QUERY = "label_values(nv_inference_request_success, model)"


def build_panel(panel: PanelSpec, panel_id: int):
    from grafana_foundation_sdk.builders import common, prometheus, timeseries
    from grafana_foundation_sdk.models import common as common_model
    from grafana_foundation_sdk.models import dashboard as model

    builder = (
        timeseries.Panel()
        .id(panel_id)
        .title(panel.title)
        .description(panel.description)
        .unit(panel.unit)
        .datasource(model.DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID))
        .height(8)
        .span(panel.width)
        .min(0)
        .fill_opacity(10)
        .legend(
            common.VizLegendOptions()
            .display_mode(common_model.LegendDisplayMode.TABLE)
            .placement(common_model.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["mean", "max", "lastNotNull"])
        )
        .tooltip(common.VizTooltipOptions().mode(common_model.TooltipDisplayMode.MULTI))
    )
    if panel.stacked:
        builder = builder.stacking(
            common.StackingConfig().mode(common_model.StackingMode.NORMAL)
        ).fill_opacity(60)
    for index, query in enumerate(panel.queries):
        builder = builder.with_target(
            prometheus.Dataquery()
            .expr(query.expr)
            .legend_format(query.legend)
            .ref_id(chr(ord("A") + index))
            .datasource(model.DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID))
            .range()
        )
    return builder


def build(spec: DashboardSpec) -> dict:
    """One dashboard as the JSON-ready dict Grafana provisions."""
    from grafana_foundation_sdk.builders import dashboard as db
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models import dashboard as model

    builder = (
        db.Dashboard(spec.title)
        .uid(spec.uid)
        .description(spec.description)
        .tags(list(spec.tags))
        .editable()
        .refresh("10s")
        .time("now-30m", "now")
        .timezone("browser")
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .with_variable(model_variable())
    )
    panel_id = 0  # fixed ids, so links to a panel (viewPanel=N) survive regeneration
    for row in spec.rows:
        panel_id += 1
        builder = builder.with_row(db.Row(row.title).id(panel_id))
        for panel in row.panels:
            panel_id += 1
            builder = builder.with_panel(build_panel(panel, panel_id))
    # Round-trip through the SDK's encoder: plain dicts, so callers can compare and sort keys.
    return json.loads(json.dumps(builder.build(), cls=JSONEncoder))


def render(spec: DashboardSpec) -> str:
    """The committed file's exact text: sorted keys, two-space indent, final newline."""
    return json.dumps(build(spec), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_all(directory: Path = DASHBOARDS_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for spec in DASHBOARDS:
        path = directory / spec.path.name
        path.write_text(render(spec), encoding="utf-8")
        written.append(path)
    return written


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output",
        type=Path,
        default=DASHBOARDS_DIR,
        help="directory to write the dashboards to (default: this checkout's grafana/dashboards)",
    )


def run(args: argparse.Namespace) -> int:
    for path in write_all(args.output):
        print(f"wrote {path}")
    return 0
