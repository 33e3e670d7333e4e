"""Baseline: the classifier on MLServer 1.7.1 as a custom runtime, with adaptive batching.

MLServer has no ONNX runtime of its own, so this is the custom `MLModel` its docs describe:
`load` opens the ONNX session, `predict` runs one batch. With `max_batch_size` and
`max_batch_time` in model-settings.json (written by `python -m bench`: 64 rows and 100 us, as
Triton's dynamic batcher is configured), MLServer merges concurrent requests into one `predict`.
Rows per `predict` are recorded in the custom histogram `tritonstack_batch_rows` on MLServer's
metrics port, so the bench reports the average batch size as it does for Triton.

Same work as Triton's `pipeline`: probabilities and a label per row; one intra-op thread.
"""

import numpy as np
import onnxruntime as ort
from mlserver import MLModel, log, register
from mlserver.codecs import NumpyCodec, StringCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OnnxClassifier(MLModel):
    async def load(self) -> bool:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(
            self.settings.parameters.uri, options, providers=["CPUExecutionProvider"]
        )
        labels_path = self.settings.parameters.extra["labels"]
        with open(labels_path, encoding="utf-8") as labels:
            self.labels = np.array([line.strip() for line in labels if line.strip()])
        register("tritonstack_batch_rows", "Rows per predict() call (adaptive batching)")
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        features = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32, copy=False)
        probabilities = self.session.run(["class"], {"features": features})[0]
        log(tritonstack_batch_rows=len(features))
        labels = self.labels[probabilities.argmax(axis=1)].tolist()
        return InferenceResponse(
            model_name=self.name,
            outputs=[
                StringCodec.encode_output("label", labels),
                NumpyCodec.encode_output("class", probabilities),
            ],
        )
