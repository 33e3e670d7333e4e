"""Baseline for the `own` family: any ONNX model behind FastAPI + onnxruntime, as a user would
write one service for a model of their own (bench/fastapi_app.py is the classifier's).

It answers KServe v2 JSON at /v2/models/<name>/infer for each model of BENCH_MODELS (JSON:
name -> model.onnx), with the request's inputs by name, typed by their `datatype`, reshaped as
the graph takes them (a [rows, 1] per-row scalar as [rows]), one intra-op thread per session (as
the model's config gives Triton's instances), the path operation a plain `def` (FastAPI runs
it in its thread pool, since `InferenceSession.run` blocks). Runs in the baselines' virtualenv.
"""

import json
import os
from contextlib import asynccontextmanager

import numpy as np
import onnxruntime as ort
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

NUMPY = {
    "BOOL": np.bool_,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "UINT8": np.uint8,
    "FP32": np.float32,
    "FP64": np.float64,
}
state = {}


class InferInput(BaseModel):
    name: str
    shape: list[int]
    datatype: str
    data: list


class InferRequest(BaseModel):
    inputs: list[InferInput]


@asynccontextmanager
async def lifespan(_app: FastAPI):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    for name, path in json.loads(os.environ["BENCH_MODELS"]).items():
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        ranks = {i.name: len(i.shape) for i in session.get_inputs()}
        state[name] = (session, ranks, [o.name for o in session.get_outputs()])
    yield
    state.clear()


app = FastAPI(lifespan=lifespan)


@app.get("/v2/health/ready")
def ready() -> dict:
    return {"ready": True}


@app.post("/v2/models/{model}/infer")
def infer(model: str, request: InferRequest) -> dict:
    if model not in state:
        raise HTTPException(status_code=404, detail=f"unknown model {model}")
    session, ranks, names = state[model]
    feeds = {}
    for tensor in request.inputs:
        if tensor.name not in ranks or tensor.datatype not in NUMPY:
            raise HTTPException(status_code=400, detail=f"unexpected input {tensor.name}")
        array = np.asarray(tensor.data, dtype=NUMPY[tensor.datatype]).reshape(tensor.shape)
        feeds[tensor.name] = array.reshape(array.shape[: ranks[tensor.name]])
    results = session.run(names, feeds)
    return {
        "model_name": model,
        "outputs": [
            {
                "name": name,
                "shape": list(value.shape),
                "datatype": "FP32" if value.dtype == np.float32 else "INT64",
                "data": value.ravel().tolist(),
            }
            for name, value in zip(names, results, strict=True)
        ],
    }
