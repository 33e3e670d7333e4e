"""Static checks of a Triton model repository, run before any server starts (`tritonstack check`).

Triton reports a broken repository one model at a time, in a long startup log, after it has
spent seconds loading everything else; an ensemble whose wiring is wrong only fails once all of
its steps have loaded. `check_repository` finds the same mistakes in well under a second, all at
once, and says each in one line: the file, the field (in Triton's naming), what is wrong, and the
fix. Configs are parsed with Triton's own schema (see tritonstack.core.repository) and ONNX models
are read with `onnx`, so nothing here hand-parses protobuf text.

One module per topic: repository (which checks each model gets), model_config (Triton's rules
for one config), onnx_graph, ensemble, tensorrt, python_models, labels, vllm_model, and
schema_skew (fields the embedded Triton lacks); messages holds the one message format. What an
ONNX graph needs to be served lives here too: onnx_serving (add-model's plan, by the C++
onnxruntime backend's rules: tritonstack.core.onnxruntime_rules). The folder imports nothing at
import time, so `tritonstack.check.onnx_serving` loads without reading a repository's checks.
"""
