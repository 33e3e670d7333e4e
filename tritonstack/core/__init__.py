"""The core: the facts every other layer reads, with the core install's dependencies only.

Ports and names (contract, ports), stack.env (settings), where the files are (project), the one
error type and the extras (errors), model configs through Triton's own schema (repository,
config_text), a model's tensors as the server states them (signature), what the gateway lets
through (limits), the health check (health: standard library only, copied into the images),
what Triton's C++ onnxruntime backend does with a config and a graph (onnxruntime_rules: standard
library only, copied beside the embedded backend and run by the launcher), and the small helpers
for generated and YAML files (generated_files, yamlfiles, mounts).

Imports nothing of tritonstack outside this folder.
"""
