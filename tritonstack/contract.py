"""The facts every part of the stack agrees on: ports, the loopback address, the model contract.

Python code imports these. What cannot import tritonstack (scripts/entrypoint.sh and
scripts/healthcheck.py inside the Triton image, loadtest/ inside the Locust image, the compose
file, the gateway's haproxy.cfg defaults) spells them out and is held to this module by
tests/unit/test_contract.py, so a change here that is not made there fails a test.
"""

from __future__ import annotations

#: Where servers and load bind: the loopback only, unless a user asks otherwise.
LOOPBACK = "127.0.0.1"

#: Triton's (and, in front of it, the gateway's) client ports; Triton's Prometheus metrics.
HTTP_PORT = 8000
GRPC_PORT = 8001
METRICS_PORT = 8002
#: HAProxy's Prometheus exporter (GET /metrics, /healthz).
GATEWAY_METRICS_PORT = 8404
#: Locust's web UI and its client-side Prometheus exporter (loadtest/exporter.py).
LOCUST_WEB_PORT = 8089
LOCUST_METRICS_PORT = 9646

#: The one input every public model takes: `features` FP32 [rows, FEATURES].
INPUT_NAME = "features"
INPUT_DATATYPE = "FP32"
FEATURES = 128
#: Rows per request (and per dynamic batch) every model accepts: config.pbtxt's max_batch_size.
MAX_BATCH_SIZE = 64
#: What each public model returns.
MODEL_OUTPUTS: dict[str, tuple[str, ...]] = {
    "classifier": ("class",),
    "pipeline": ("label", "class"),
    "classify": ("label", "score"),
}
PUBLIC_MODELS = tuple(MODEL_OUTPUTS)
#: The class labels, one per line in class order, relative to the model repository.
LABELS_FILE = "postprocess/labels.txt"

#: Header that unlocks the restricted APIs, and the API groups it guards (Triton's names).
ADMIN_HEADER = "tritonstack-admin-key"
RESTRICTED_APIS = "model-repository,shared-memory,statistics,trace,logging"

#: The LLM beside the classifier: its model name, and the model repository folder that holds it
#: (its own, so the classifier's repository never needs vLLM).
LLM_MODEL = "llm"
LLM_REPOSITORY = "llm_repository"
#: What the gateway lets through to it: the longest prompt in bytes, the most tokens one request
#: may ask for (max_tokens, which every request must send: vLLM's own default is 16, which cuts
#: answers short), and the generations in flight per replica before requests wait, then get 503.
LLM_MAX_PROMPT_BYTES = 16384
LLM_MAX_TOKENS = 1024
LLM_STREAMS_PER_REPLICA = 16
#: What this project's clients (tritonstack generate, Locust) ask for when told nothing.
LLM_DEFAULT_MAX_TOKENS = 256
