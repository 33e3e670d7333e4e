"""Train the demo classifier and export it to ONNX for Triton's `classifier` model.

The task is synthetic so that the repository needs no data set: a 128-dim FP32 embedding is
"relevant" when it leans towards a fixed topic direction, with a small non-linear term so that the
hidden layer earns its keep. Samples close to the decision boundary are dropped, which makes the
task learnable to well above 95% by a 128-64-2 MLP in about a second on one core.

Everything is seeded, and training runs in a child process pinned to one set of BLAS kernels
on one thread (TRAINING_ENV), so an export on any x86-64 CPU writes the committed model.onnx
byte for byte (tests/unit/test_export.py).
"""

from __future__ import annotations

import json
import os
import pickle
import platform
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path

import numpy as np

#: The demo classifier this trainer makes, as model_repository/classifier/config.pbtxt declares
#: it (tests/unit/test_export.py holds the two equal): a 128-dim FP32 embedding in, two class
#: probabilities out.
INPUT_NAME = "features"
FEATURES = 128
OUTPUT_NAME = "class"
CLASSES = 2
HIDDEN = 64
OPSET = 17
SEED = 20261202
MIN_ACCURACY = 0.95
#: The share of the data set trained on; the rest is held out for the accuracy check.
TRAIN_FRACTION = 0.8
METADATA_NAME = "model.metadata.json"

#: What training pins so that every x86-64 CPU computes the same weights. numpy's and scipy's
#: OpenBLAS pick their kernels by CPU and split a product by thread count, and each choice sums
#: in another order; 42 epochs of Adam turn the last bits into visible differences. Measured
#: with the pinned libraries on a 2-core AMD EPYC (Zen 4, where OpenBLAS picks its SkylakeX and
#: Cooperlake kernels), the exported probabilities on 256 rows moved by up to 4.8e-5 between 1
#: and 2 threads of those kernels and by 4.2e-7 to Haswell's; an Intel Xeon's default moved them
#: by 1.9e-4. The Haswell kernels (AVX2 and FMA, which every x86-64 server CPU of the last decade
#: has) on one thread, with numpy's own loops held to the same instructions (its AVX-512 variants
#: off), are the same instructions in the same order on every such CPU, and IEEE arithmetic
#: makes them give the same bits: the pinned training's weights hashed the same natively on that
#: EPYC (AVX-512) and under `qemu-x86_64 -cpu Haswell-v4` (an Intel CPU without AVX-512). The
#: variables take effect only when the libraries load, hence the child process.
TRAINING_ENV = {
    "OPENBLAS_CORETYPE": "Haswell",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "NPY_DISABLE_CPU_FEATURES": (
        "AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL AVX512_SPR"
    ),
}
#: The CPU flags the Haswell kernels execute.
TRAINING_CPU_FLAGS = frozenset({"avx2", "fma"})


@dataclass(frozen=True)
class ExportResult:
    """What `tritonstack export` wrote, as recorded next to the model."""

    model_path: str
    seed: int
    opset: int
    train_samples: int
    heldout_samples: int
    heldout_accuracy: float
    libraries: dict[str, str]
    regenerate: str = "tritonstack export"


def make_dataset(seed: int = SEED, samples: int = 16000) -> tuple[np.ndarray, np.ndarray]:
    """Return (features float32 [n, 128], labels int64 [n]) for the relevance task."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, FEATURES)).astype(np.float32)
    topic = rng.standard_normal(FEATURES)
    topic /= np.linalg.norm(topic)
    score = x @ topic + 0.5 * np.tanh(x[:, :8].sum(axis=1) / 2)
    keep = np.abs(score) > 0.25  # a margin keeps the task learnable rather than noisy
    return x[keep], (score[keep] > 0).astype(np.int64)


def train(seed: int = SEED):
    """Fit the MLP; returns (model, held-out features, held-out labels)."""
    from sklearn.neural_network import MLPClassifier

    x, y = make_dataset(seed)
    split = int(len(y) * TRAIN_FRACTION)
    model = MLPClassifier(hidden_layer_sizes=(HIDDEN,), max_iter=200, random_state=seed)
    model.fit(x[:split], y[:split])
    return model, x[split:], y[split:], split


def cpu_runs_pinned_kernels(cpuinfo: str | None = None) -> bool:
    """Whether this CPU executes TRAINING_ENV's kernels (x86-64 with AVX2 and FMA)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines()
                  if line.startswith("flags")), [])  # fmt: skip
    return set(flags) >= TRAINING_CPU_FLAGS


def train_pinned(seed: int = SEED, log=print):
    """train() in a child process with TRAINING_ENV, so the weights are the same on any x86-64
    CPU; on a CPU without those kernels, train() here, and say the weights will differ."""
    if not cpu_runs_pinned_kernels():
        log("      this CPU lacks AVX2/FMA: training with its own kernels, so the weights differ "
            "from the committed model's in the last digits")  # fmt: skip
        return train(seed)
    with tempfile.TemporaryDirectory(prefix="tritonstack-train-") as folder:
        result = Path(folder) / "trained.pickle"
        subprocess.run(
            [sys.executable, "-m", "tritonstack.models.export", str(seed), str(result)],
            env={**os.environ, **TRAINING_ENV},
            check=True,
        )
        with result.open("rb") as handle:
            return pickle.load(handle)  # written just now by our own child


def to_onnx(model) -> bytes:
    """Convert with skl2onnx and keep only `features` -> `class` (FP32 probabilities).

    skl2onnx also emits an int64 `label` output; Triton's contract is the probabilities alone
    under the name `class`, so the graph is cut at the probabilities and renamed.
    """
    import onnx
    from onnx.utils import Extractor
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    onx = convert_sklearn(
        model,
        initial_types=[(INPUT_NAME, FloatTensorType([None, FEATURES]))],
        options={id(model): {"zipmap": False}},
        target_opset={"": OPSET, "ai.onnx.ml": 3},
    )
    extracted = Extractor(onx).extract_model([INPUT_NAME], ["probabilities"])
    for node in extracted.graph.node:
        node.output[:] = [OUTPUT_NAME if o == "probabilities" else o for o in node.output]
    extracted.graph.output[0].name = OUTPUT_NAME
    for value in (*extracted.graph.input, *extracted.graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    # skl2onnx fills opset_import from a set, so its order follows the process's string hashing
    # (PYTHONHASHSEED): sorted, every export writes the same bytes.
    opsets = sorted((o.domain, o.version) for o in extracted.opset_import)
    del extracted.opset_import[:]
    for domain, opset in opsets:
        extracted.opset_import.add(domain=domain, version=opset)
    extracted.graph.name = "tritonstack_classifier"
    extracted.doc_string = "Generated by `tritonstack export`; do not edit."
    onnx.checker.check_model(extracted, full_check=True)
    return extracted.SerializeToString()


def onnx_opset(blob: bytes) -> int:
    """The default-domain opset the written model really declares (the extractor may lower it)."""
    import onnx

    model = onnx.load_from_string(blob)
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def export(model_repository: Path, seed: int = SEED, log=print) -> ExportResult:
    """Train, convert, verify with onnxruntime and write model.onnx plus its metadata."""
    import onnxruntime as ort

    from tritonstack.core.errors import UserError

    log(f"[1/4] training {FEATURES}-{HIDDEN}-{CLASSES} MLP (seed {seed})")
    model, x_test, y_test, n_train = train_pinned(seed, log)
    log("[2/4] converting to ONNX with skl2onnx")
    blob = to_onnx(model)
    log("[3/4] checking the ONNX model with onnxruntime on the held-out set")
    session = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    probs = session.run([OUTPUT_NAME], {INPUT_NAME: x_test})[0]
    accuracy = float((probs.argmax(axis=1) == y_test).mean())
    if accuracy < MIN_ACCURACY:
        raise UserError(
            f"held-out accuracy {accuracy:.3f} is below {MIN_ACCURACY}: "
            "the model was not written; check the seed and the dataset parameters"
        )
    target = Path(model_repository) / "classifier" / "1"
    target.mkdir(parents=True, exist_ok=True)
    model_path = target / "model.onnx"
    model_path.write_bytes(blob)
    result = ExportResult(
        model_path=str(model_path.relative_to(model_repository)),
        seed=seed,
        opset=onnx_opset(blob),
        train_samples=n_train,
        heldout_samples=len(y_test),
        heldout_accuracy=round(accuracy, 6),
        libraries={
            name: version(name) for name in ("scikit-learn", "skl2onnx", "onnx", "onnxruntime")
        },
    )
    (target / METADATA_NAME).write_text(json.dumps(asdict(result), indent=2, sort_keys=True) + "\n")
    log(f"[4/4] wrote {model_path} (held-out accuracy {accuracy:.4f})")
    return result


if __name__ == "__main__":
    # The child of train_pinned: `python -m tritonstack.models.export SEED OUT`, under TRAINING_ENV.
    with open(sys.argv[2], "wb") as out:
        pickle.dump(train(int(sys.argv[1])), out)
