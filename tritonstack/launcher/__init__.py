"""How tritonserver starts: its flags, the admin key, and the container's start.

`python3 -m tritonstack.launcher` is the Triton image's entrypoint (Dockerfile.triton): it picks
GPU or CPU, builds TensorRT plans on a GPU host, prepares a servable view of the read-only model
repository, then replaces itself with tritonserver (`exec`). `... launcher prepare` does
everything but the exec (Kubernetes' init container: plans built before the server container
starts); `... launcher llm` starts the vLLM model's Triton the same way, without a view.

This subpackage imports the standard library and tritonstack's core modules only (contract,
errors, health): the images run it from a copy of the package, with no third-party package of
ours installed. The embedded runtime (tritonstack.serve.runtime) builds its flags here too, so both
runtimes start Triton alike.
"""
