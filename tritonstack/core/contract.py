"""The stack's own ports and names: what every part of it agrees on, whatever models it serves.

What Triton knows about a model (its tensors, shapes, max_batch_size, labels) is read from the
model repository or asked of the server (tritonstack.core.signature), never written here; what the
repository does not say (which models are public, admission, the LLM's limits) is stack.env's
(tritonstack.core.settings). Python code imports these (the container launcher too); haproxy.cfg's
defaults spell out the ports, held to this module by tests/unit/test_contract.py.
"""

from __future__ import annotations

#: Where servers and load bind: the loopback only, unless a user asks otherwise.
LOOPBACK = "127.0.0.1"

#: Triton's (and, in front of it, the gateway's) client ports; Triton's Prometheus metrics.
HTTP_PORT = 8000
GRPC_PORT = 8001
METRICS_PORT = 8002
#: Where `tritonstack serve` puts Triton's own ports, behind the gateway on the ports above.
TRITON_HTTP_PORT = 18000
TRITON_GRPC_PORT = 18001
#: HAProxy's Prometheus exporter (GET /metrics, /healthz).
GATEWAY_METRICS_PORT = 8404
#: Locust's web UI and its client-side Prometheus exporter (loadtest/exporter.py).
LOCUST_WEB_PORT = 8089
LOCUST_METRICS_PORT = 9646

#: Header that unlocks the restricted APIs, and the API groups Triton restricts (its names).
ADMIN_HEADER = "tritonstack-admin-key"
RESTRICTED_APIS = "model-repository,shared-memory,statistics,trace,logging"
#: The groups the admin key opens: what the stack's own tools call (the embedded runtime's
#: readiness, the health check and `top`: the repository index; `top` and perf-analyzer:
#: statistics), and any $ADMIN_APIS_ENV asks for besides. Every other group is shut: restricted
#: under SHUT_HEADER with a key drawn at each start and kept nowhere but the server's command line.
ADMIN_APIS = "model-repository,statistics"
ADMIN_APIS_ENV = "TRITONSTACK_ADMIN_APIS"
SHUT_HEADER = "tritonstack-shut-key"

#: The LLM beside the models: its model name, and the model repository folder that holds it
#: (its own, so the models' repository never needs vLLM).
LLM_MODEL = "llm"
LLM_REPOSITORY = "llm_repository"
