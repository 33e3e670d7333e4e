"""The guide's "Calling your Model" client with its mistakes fixed.

Run `tritonstack serve` (or `docker compose up`) first, then `python examples/client.py`.
Fixed: the package is `tritonclient[http]` (not `tritoncleint`); `client` is created; the input
shape has the batch dimension ([rows, width], not [width]); `arr` is defined as FP32; and the
labels come from `pipeline`, which runs classifier -> postprocess inside Triton. The input's name
and width are asked of the server (the model's metadata), not written here.
"""

import os

import numpy
import tritonclient.http as httpclient

client = httpclient.InferenceServerClient(url=os.environ.get("TRITON_URL", "localhost:8000"))

# pipeline's one input, as the server describes it: name, datatype, shape [-1 (rows), width]
(tensor,) = client.get_model_metadata("pipeline")["inputs"]
width = int(tensor["shape"][1])

arr = numpy.random.default_rng(0).standard_normal((4, width)).astype(numpy.float32)
inp = httpclient.InferInput(tensor["name"], list(arr.shape), tensor["datatype"])
inp.set_data_from_numpy(arr)

out = httpclient.InferRequestedOutput("label")

response = client.infer(model_name="pipeline", inputs=[inp], outputs=[out])

for row, label in enumerate(response.as_numpy("label")[:, 0]):
    print(row, label.decode())
client.close()
