"""Making and adding models: `add-model` (add_model: plan, check, load in the real
tritonserver, then write) and the demo classifier's export (export, the [export] extra).

Imports every layer before it.
"""
