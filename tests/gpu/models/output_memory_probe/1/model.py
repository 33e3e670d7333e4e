"""Answers whether `classifier`'s `class` output reached this BLS caller in GPU memory.

Like `classify`, but the sub-request names no preferred memory: Triton then hands over the
outputs where the called model produced them.
"""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            features = pb_utils.get_input_tensor_by_name(request, "features").as_numpy()
            sub_request = pb_utils.InferenceRequest(
                model_name="classifier",
                requested_output_names=["class"],
                inputs=[pb_utils.Tensor("features", np.ascontiguousarray(features))],
            )
            answer = await sub_request.async_exec()
            if answer.has_error():
                error = pb_utils.TritonError(f"classifier: {answer.error().message()}")
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            output = pb_utils.get_output_tensor_by_name(answer, "class")
            on_gpu = np.full((len(features), 1), not output.is_cpu(), dtype=bool)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("on_gpu", on_gpu)]))
        return responses
