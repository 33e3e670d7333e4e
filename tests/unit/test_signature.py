"""What the clients send for a model's inputs (tritonstack.core.signature), up to the bytes
tritonclient puts on the wire: string arrays as numpy writes them ("S", "U" and object arrays)
and `--input` files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tritonclient.utils import serialize_byte_tensor

from tritonstack.core.errors import UserError
from tritonstack.core.signature import Signature, Tensor, load_arrays

TEXT = Signature(
    model="text",
    inputs=(Tensor("text", "BYTES", (1,), max_bytes=8), Tensor("count", "FP32", (1,))),
    outputs=(Tensor("label", "INT64", (1,)),),
    max_batch_size=4,
)
WORDS = ["cat", "dog", "größer"]  # one value of 7 UTF-8 bytes


def on_the_wire(array: np.ndarray) -> bytes:
    """What tritonclient sends for a BYTES tensor (both protocols serialize it this way)."""
    return serialize_byte_tensor(array).item()


@pytest.mark.parametrize(
    "form",
    [
        np.array([[w] for w in WORDS]),  # "U": np.str_ items
        np.array([[w.encode()] for w in WORDS]),  # "S": np.bytes_ items
        np.array([[w] for w in WORDS], dtype=object),  # str objects
        np.array([[w.encode()] for w in WORDS], dtype=object),  # bytes objects
    ],
    ids=["unicode", "bytes_", "object-str", "object-bytes"],
)
def test_every_numpy_form_of_strings_is_sent_as_the_strings_themselves(form) -> None:
    """numpy's bytes_ is a bytes subclass, and tritonclient serializes anything not exactly
    bytes as its str(): an "S" array's b'cat' went out as the six characters "b'cat'"."""
    count = np.ones((len(WORDS), 1), np.float32)
    checked = TEXT.inputs_from_arrays({"text": form, "count": count}, "test")
    sent = checked["text"]
    assert sent.dtype == np.object_
    assert all(type(value) is bytes for value in sent.reshape(-1))
    expected = np.array([[w.encode()] for w in WORDS], dtype=object)
    assert on_the_wire(sent) == on_the_wire(expected)


@pytest.mark.parametrize("kind", [str, bytes, object])
def test_the_per_value_bound_holds_for_every_numpy_form_of_strings(kind) -> None:
    words = np.array([["a" * 9]]) if kind is not bytes else np.array([[b"a" * 9]])
    arrays = {"text": words.astype(object) if kind is object else words,
              "count": np.ones((1, 1), np.float32)}  # fmt: skip
    with pytest.raises(UserError, match="holds a value of 9 bytes; text takes at most 8"):
        TEXT.inputs_from_arrays(arrays, "test")


def test_an_npz_of_strings_as_numpy_string_arrays_is_read(tmp_path: Path) -> None:
    path = tmp_path / "rows.npz"
    np.savez(path, text=np.array([[w.encode()] for w in WORDS]),
             count=np.ones((3, 1), np.float32))  # fmt: skip
    arrays = load_arrays(path, TEXT)
    assert [v for v in arrays["text"].reshape(-1)] == [w.encode() for w in WORDS]


def test_an_npz_of_python_objects_is_refused_with_the_fix_not_a_traceback(tmp_path: Path) -> None:
    """numpy's usual array of str is an object array, saved pickled: an .npz reads it only when
    asked, after the file has opened, so the refusal must cover reading each array too."""
    path = tmp_path / "rows.npz"
    np.savez(path, text=np.array([[w] for w in WORDS], dtype=object),
             count=np.ones((3, 1), np.float32))  # fmt: skip
    with pytest.raises(UserError, match=r"never unpickles; save strings as .*astype\(str\)"):
        load_arrays(path, TEXT)
    single = tmp_path / "text.npy"
    np.save(single, np.array([["cat"]], dtype=object))
    with pytest.raises(UserError, match=r"astype\(str\)"):
        load_arrays(single, TEXT)


ENCODER = Signature(
    model="encoder",
    inputs=tuple(
        Tensor(name, "INT64", (-1,), bounds=((1,), (12,), (64,)), dim_names=("tokens",))
        for name in ("ids", "attention_mask")
    ),
    outputs=(Tensor("mean", "FP32", (6,)),),
    max_batch_size=4,
)


def test_inputs_the_graph_names_alike_must_agree_in_that_dim() -> None:
    """A text encoder's mask as long as its ids: an --input file whose two differ is refused
    before it is sent, naming both sizes, rather than failing inside the model."""
    assert ENCODER.shared_dims == {"tokens": (("ids", 0), ("attention_mask", 0))}
    ids = np.ones((2, 5), np.int64)
    assert ENCODER.inputs_from_arrays({"ids": ids, "attention_mask": ids}, "x.npz")
    with pytest.raises(UserError) as raised:
        ENCODER.inputs_from_arrays({"ids": ids, "attention_mask": ids[:, :4]}, "x.npz")
    assert str(raised.value) == (
        "x.npz: the inputs' dim 'tokens' differs (ids 5, attention_mask 4); encoder takes them "
        "equal (the graph names them alike)"
    )
