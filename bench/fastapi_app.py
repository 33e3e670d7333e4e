"""Baseline: the classifier behind FastAPI + onnxruntime, written the way FastAPI's docs suggest.

Pydantic models declare the request body, the model is loaded once in the `lifespan` handler, and
the path operation is a plain `def` because `InferenceSession.run` blocks (FastAPI runs such
functions in its thread pool). Served by `uvicorn fastapi_app:app` from bench/ with ONE worker,
the default of `uvicorn` and `fastapi run`. It answers the same KServe v2 JSON request as Triton
at the same path, and does what `pipeline` does: probabilities and a label per row. It runs in
its own virtualenv (FastAPI, uvicorn, onnxruntime), as a standalone service would, so it spells
out the request's `features` [rows, 128] rather than importing tritonstack's contract.

The ONNX session uses one intra-op thread, as `classifier`'s config.pbtxt does on Triton.
Environment: BENCH_MODEL_ONNX (path of model.onnx), BENCH_LABELS (labels.txt).
"""

import os
from contextlib import asynccontextmanager

import numpy as np
import onnxruntime as ort
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

state = {}


class InferInput(BaseModel):
    name: str
    shape: list[int]
    datatype: str
    data: list[float]


class InferRequest(BaseModel):
    inputs: list[InferInput]


@asynccontextmanager
async def lifespan(_app: FastAPI):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    state["session"] = ort.InferenceSession(
        os.environ["BENCH_MODEL_ONNX"], options, providers=["CPUExecutionProvider"]
    )
    with open(os.environ["BENCH_LABELS"], encoding="utf-8") as labels:
        state["labels"] = [line.strip() for line in labels if line.strip()]
    yield
    state.clear()


app = FastAPI(lifespan=lifespan)


@app.get("/v2/health/ready")
def ready() -> dict:
    return {"ready": True}


@app.post("/v2/models/classifier/infer")
def infer(request: InferRequest) -> dict:
    tensor = request.inputs[0]
    if tensor.name != "features" or len(tensor.shape) != 2 or tensor.shape[1] != 128:
        raise HTTPException(400, "expected input 'features' of shape [rows, 128]")
    features = np.asarray(tensor.data, dtype=np.float32).reshape(tensor.shape)
    probabilities = state["session"].run(["class"], {"features": features})[0]
    labels = [state["labels"][i] for i in probabilities.argmax(axis=1)]
    return {
        "model_name": "classifier",
        "outputs": [
            {"name": "label", "datatype": "BYTES", "shape": [len(labels), 1], "data": labels},
            {
                "name": "class",
                "datatype": "FP32",
                "shape": list(probabilities.shape),
                "data": probabilities.ravel().tolist(),
            },
        ],
    }
