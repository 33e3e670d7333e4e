"""Running servers natively: the embedded tritonserver (runtime) and its supervisor, HAProxy as
the gateway (gateway), child processes (processes), and the LLM (llm, tinyllm).

Imports the core, the launcher, clients and check; `serve` needs the [serve] extra.
"""
