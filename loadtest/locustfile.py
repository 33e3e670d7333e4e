"""Locust entry point for load tests against Triton: options, the selected shape, and wiring.

    locust -f loadtest/locustfile.py --config loadtest/locust.conf --host http://127.0.0.1:8000

Options (command line, locust.conf, LOCUST_<NAME> variables, and the web UI's form):
`--model` any model the target serves (default: the first of $PUBLIC_MODELS), `--user-type`
http_json | http_binary | grpc | llm_stream (the LLM's generate_stream; --model and --rows do
not apply to it), `--rows` 1 to the model's max_batch_size | mix, `--input-file` (a .npy or .npz
of inputs to draw rows from; default: random values), `--shape` step | spike | soak (empty:
constant load), `--grpc-host` (default: the --host's name on `--grpc-port`, 8001),
`--api-key-file` (the gateway's key, for a gateway published beyond loopback), and for
llm_stream `--max-tokens` and `--stop-at-eos`.
Gates (`--max-p99-ms`, `--max-fail-ratio`, `--max-ttft-p99-ms`, `--max-itl-p99-ms`) are in
gates.py, the Prometheus exporter in exporter.py.

The user type and the shape are options rather than Locust's user-class arguments and one
LoadTestShape class per shape, because Locust always runs the first shape class a locustfile
defines: one `SelectedShape` reads `--shape` and `--user-type` on every tick, so both can be
changed from the web UI like any other option, on a master as well as in a single process.
"""

from __future__ import annotations

import exporter
import gates
from locust import LoadTestShape, events
from shapes import SHAPES
from users import (
    USER_TYPES,
    GrpcUser,
    HttpBinaryUser,
    HttpJsonUser,
    LlmStreamUser,
    default_model,
    parse_rows,
    read_api_key,
)

from tritonstack.clients import streaming
from tritonstack.core.contract import GRPC_PORT

# Locust runs the User classes it finds in this module; SelectedShape picks one per --user-type.
__all__ = ["GrpcUser", "HttpBinaryUser", "HttpJsonUser", "LlmStreamUser", "SelectedShape"]

exporter.register(events)
gates.register(events)


@events.init_command_line_parser.add_listener
def add_arguments(parser) -> None:
    parser.add_argument(
        "--model", default=default_model(), env_var="LOCUST_MODEL",
        help="the model to call (through the gateway: a public one, stack.env's PUBLIC_MODELS)",
    )  # fmt: skip
    parser.add_argument(
        "--user-type", choices=sorted(USER_TYPES), default="http_json",
        env_var="LOCUST_USER_TYPE",
        help="KServe JSON, binary tensors or gRPC; llm_stream: the LLM's generate_stream",
    )  # fmt: skip
    parser.add_argument(
        "--rows", default="1", env_var="LOCUST_ROWS",
        help="rows per request: 1 to the model's max_batch_size, or 'mix' (mostly 1, sometimes "
        "4, 16, 64)",
    )  # fmt: skip
    parser.add_argument(
        "--input-file", default="", env_var="LOCUST_INPUT_FILE", include_in_web_ui=False,
        help="a .npy (one input) or .npz (an array per input name) to draw rows from; "
        "empty: random values",
    )  # fmt: skip
    parser.add_argument(
        "--shape", choices=sorted(SHAPES), default="", env_var="LOCUST_SHAPE",
        help="load shape: step, spike or soak; empty for constant load",
    )  # fmt: skip
    parser.add_argument(
        "--grpc-host", default="", env_var="LOCUST_GRPC_HOST",
        help="Triton gRPC host:port (default: the --host's name and --grpc-port)",
    )  # fmt: skip
    parser.add_argument(
        "--grpc-port", type=int, default=GRPC_PORT, env_var="LOCUST_GRPC_PORT",
        help="Triton gRPC port on the --host's machine, when --grpc-host is empty",
    )  # fmt: skip
    parser.add_argument(
        "--max-tokens", type=int, default=streaming.DEFAULT_MAX_TOKENS,
        env_var="LOCUST_MAX_TOKENS",
        help="llm_stream: tokens per answer (at most, with --stop-at-eos); the gateway allows "
        "up to stack.env's GATEWAY_LLM_MAX_TOKENS",
    )  # fmt: skip
    parser.add_argument(
        "--stop-at-eos", action="store_true", default=False, env_var="LOCUST_STOP_AT_EOS",
        help="llm_stream: let answers end at the model's end-of-sequence token (default: ignore "
        "it, so every answer is --max-tokens long and runs compare)",
    )  # fmt: skip
    parser.add_argument(
        "--api-key-file", default="", env_var="LOCUST_API_KEY_FILE", include_in_web_ui=False,
        help="file with the gateway's API key, sent as Authorization: Bearer (empty: none)",
    )  # fmt: skip


@events.init.add_listener
def check_options(environment, **_kwargs) -> None:
    """Fail at start, with one message, on an option the users would trip on later."""
    options = environment.parsed_options
    if options is None:
        return
    try:
        if options.max_tokens < 1:
            raise ValueError(f"--max-tokens must be at least 1, got {options.max_tokens}")
        parse_rows(options.rows)
        read_api_key(options.api_key_file)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None  # one line, exit code 1, no traceback


class SelectedShape(LoadTestShape):
    """The shape named by `--shape`, running the user class named by `--user-type`."""

    use_common_options = True  # --users, --spawn-rate and --run-time still apply

    def tick(self):
        options = self.runner.environment.parsed_options
        stage = SHAPES[options.shape or ""](
            self.get_run_time(), options.num_users or 1, options.spawn_rate or 1, options.run_time
        )
        if stage is None:
            return None
        users, spawn_rate = stage
        return users, spawn_rate, [USER_TYPES[options.user_type]]
