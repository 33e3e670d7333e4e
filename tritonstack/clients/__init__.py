"""Calling a running server: `infer` (client), the LLM's `generate` and its streams (streaming),
Triton's metrics (metrics) and `tritonstack top`.

Imports the core and the launcher's flags; calling a model needs the [clients] extra.
"""
