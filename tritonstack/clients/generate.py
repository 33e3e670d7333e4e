"""`tritonstack generate "prompt"`: stream an answer from the LLM through Triton's generate API.

It posts to /v2/models/llm/generate_stream (server-sent events, one per step) and prints the text
as it arrives; the time to first token and the rate follow on stderr, so stdout is the answer
alone. `--no-stream` uses /generate (one JSON answer). Standard library only: what a user's
own client needs is one HTTP POST and a line reader.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from tritonstack.clients.streaming import DEFAULT_MAX_TOKENS, AnswerError, parse_event
from tritonstack.core.contract import HTTP_PORT, LLM_MODEL, LOOPBACK
from tritonstack.core.errors import UserError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="the text to continue (sent as text_input)")
    parser.add_argument(
        "--url",
        default=f"http://{LOOPBACK}:{HTTP_PORT}",
        help=f"the gateway or Triton (default: http://{LOOPBACK}:{HTTP_PORT})",
    )
    parser.add_argument("--model", default=LLM_MODEL, help=f"default: {LLM_MODEL}")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        help=f"most tokens to generate (default: {DEFAULT_MAX_TOKENS}; the gateway allows up to "
        "stack.env's GATEWAY_LLM_MAX_TOKENS)",
    )
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed")
    parser.add_argument(
        "--no-stream", dest="stream", action="store_false", help="one answer at the end"
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("TRITONSTACK_API_KEY") or None,
        help="the gateway's API key, if it has keys (default: $TRITONSTACK_API_KEY)",
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds (default: 300)")


@dataclass
class Generation:
    """What one generation produced, and how fast."""

    text: str = ""
    events: int = 0
    first_token_s: float | None = None
    total_s: float = 0.0
    finish_reason: str | None = None
    output_tokens: int = 0
    chunks: list[str] = field(default_factory=list)


def request_body(args: argparse.Namespace) -> dict:
    body: dict = {
        "text_input": args.prompt,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "exclude_input_in_output": True,
        "return_finish_reason": True,
        "return_num_output_tokens": True,
    }
    if args.seed is not None:
        body["seed"] = args.seed
    if args.stream:
        body["stream"] = True
    return body


def iter_events(response: http.client.HTTPResponse) -> Iterator[dict]:
    """The JSON payload of each server-sent event (`data: {...}` lines, blank-line separated)."""
    for number, raw in enumerate(response, 1):
        try:
            event = parse_event(raw, number)
        except AnswerError as exc:
            raise UserError(str(exc)) from None
        if event is not None:
            yield event


def _error_message(status: int, body: bytes) -> str:
    try:
        return f"{status}: {json.loads(body)['error']}"
    except (ValueError, KeyError, TypeError):
        return f"{status}: {body[:300].decode('utf-8', errors='replace')}"


def generate(args: argparse.Namespace, on_text=None) -> Generation:
    """Run one generation; `on_text(delta)` is called with each piece of text as it arrives."""
    url = urlsplit(args.url if "://" in args.url else f"http://{args.url}")
    if url.scheme not in ("http", "https") or not url.hostname:
        raise UserError(f"--url {args.url}: give http://host:port (the gateway or Triton)")
    route = "generate_stream" if args.stream else "generate"
    path = f"{url.path.rstrip('/')}/v2/models/{args.model}/{route}"
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"
    connection_class = (
        http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    )
    connection = connection_class(url.hostname, url.port, timeout=args.timeout)
    result = Generation()
    start = time.perf_counter()
    try:
        connection.request("POST", path, json.dumps(request_body(args)), headers)
        response = connection.getresponse()
        if response.status != 200:
            raise UserError(
                f"{args.url}{path} answered {_error_message(response.status, response.read())}"
            )
        events = iter_events(response) if args.stream else iter([json.loads(response.read())])
        for event in events:
            delta = event.get("text_output", "")
            if result.first_token_s is None and delta:
                result.first_token_s = time.perf_counter() - start
            result.events += 1
            result.text += delta
            result.output_tokens += int(event.get("num_output_tokens", 0) or 0)
            result.finish_reason = event.get("finish_reason") or result.finish_reason
            if on_text is not None and delta:
                on_text(delta)
    except (ConnectionError, OSError) as exc:
        raise UserError(
            f"cannot reach {args.url} ({exc}): is `tritonstack serve --llm` running?"
        ) from None
    finally:
        connection.close()
    result.total_s = time.perf_counter() - start
    return result


def run(args: argparse.Namespace) -> int:
    if args.max_tokens < 1:
        raise UserError(f"--max-tokens {args.max_tokens}: give at least 1")

    def show(delta: str) -> None:
        sys.stdout.write(delta)
        sys.stdout.flush()

    result = generate(args, on_text=show)
    sys.stdout.write("\n")
    rate = result.output_tokens / result.total_s if result.total_s else 0.0
    first = f"{result.first_token_s * 1000:.0f} ms" if result.first_token_s is not None else "-"
    print(
        f"[{result.output_tokens} tokens, finish_reason {result.finish_reason}, first token "
        f"{first}, {rate:.1f} tokens/s]",
        file=sys.stderr,
    )
    return 0
