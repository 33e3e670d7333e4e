"""An ONNX graph's inputs and outputs as its file declares them, read with the standard library.

The Triton image has no `onnx` or protobuf package of ours, yet the launcher must see a graph's
ranks to leave out a model Triton's onnxruntime backend would load and then crash on
(tritonstack.core.onnxruntime_rules.serving_errors). This reads just enough of the protobuf wire
format and seeks past everything else, so a graph with gigabytes of weights costs a few reads.
Field numbers are onnx.proto's: ModelProto.graph = 7; GraphProto.initializer = 5, input = 11,
output = 12; TensorProto.name = 8; ValueInfoProto.name = 1, type = 2; TypeProto.tensor_type = 1,
sequence_type = 4, map_type = 5, sparse_tensor_type = 8, optional_type = 9;
TypeProto.Tensor.elem_type = 1, shape = 2; TensorShapeProto.dim = 1.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tritonstack.core.onnxruntime_rules import WILDCARD, Graph, GraphTensor

_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5
_KINDS = {1: "tensor", 4: "sequence", 5: "map", 7: "opaque", 8: "sparse_tensor", 9: "optional"}


class WireError(ValueError):
    """The file is not an ONNX model this reader can follow."""


@dataclass(frozen=True)
class _Field:
    number: int
    #: a varint's value; 0 for a length-delimited field
    value: int = 0
    #: a length-delimited field's payload, [start, end) in the file; both 0 for a varint
    start: int = 0
    end: int = 0


def _varint(stream: BinaryIO) -> int:
    value, shift = 0, 0
    while True:
        byte = stream.read(1)
        if not byte:
            raise WireError("the file ends inside a field")
        value |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return value
        shift += 7
        if shift > 63:
            raise WireError("a varint longer than 64 bits")


def _fields(stream: BinaryIO, start: int, end: int) -> Iterator[_Field]:
    """The message's fields in [start, end). After each length-delimited one the stream is put
    past it, whatever the caller read of it meanwhile; fixed-size fields are skipped."""
    stream.seek(start)
    while stream.tell() < end:
        key = _varint(stream)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            yield _Field(number, value=_varint(stream))
        elif wire in (_FIXED64, _FIXED32):
            stream.seek(8 if wire == _FIXED64 else 4, io.SEEK_CUR)
        elif wire == _BYTES:
            length = _varint(stream)
            payload = stream.tell()
            if payload + length > end:
                raise WireError("a field runs past the message holding it")
            yield _Field(number, start=payload, end=payload + length)
            stream.seek(payload + length)
        else:
            raise WireError(f"wire type {wire}, which ONNX never writes")
    if stream.tell() != end:
        raise WireError("a field runs past the message holding it")


def _string(stream: BinaryIO, field: _Field) -> str:
    stream.seek(field.start)
    return stream.read(field.end - field.start).decode("utf-8", "replace")


def _value_info(stream: BinaryIO, info: _Field) -> tuple[GraphTensor, bool]:
    """A ValueInfoProto as a GraphTensor, and whether the file gives its rank (a tensor without
    a shape reads as rank 0 here)."""
    name, kind, elem_type, rank = "", "unknown", 0, None
    for field in _fields(stream, info.start, info.end):
        if field.number == 1 and field.end:
            name = _string(stream, field)
        elif field.number == 2 and field.end:
            for type_field in _fields(stream, field.start, field.end):
                kind = _KINDS.get(type_field.number, kind)
                if type_field.number != 1 or not type_field.end:
                    continue
                for tensor_field in _fields(stream, type_field.start, type_field.end):
                    if tensor_field.number == 1 and not tensor_field.end:
                        elem_type = tensor_field.value
                    elif tensor_field.number == 2 and tensor_field.end:
                        dims = _fields(stream, tensor_field.start, tensor_field.end)
                        rank = sum(1 for d in dims if d.number == 1)
    if kind != "tensor":
        return GraphTensor(name, kind), True
    return GraphTensor(name, "tensor", elem_type, (WILDCARD,) * (rank or 0)), rank is not None


def read_graph(stream: BinaryIO) -> Graph:
    """The graph's inputs (initializers listed among them aside) and outputs, their dims all
    WILDCARD: this reads ranks, not sizes. An input whose shape the file leaves out reads as
    rank 0, as ONNX Runtime (and so Triton's backend) reads it; such an output is left out, as
    ONNX Runtime infers its shape when it loads the graph, which this reader cannot."""
    stream.seek(0, io.SEEK_END)
    size = stream.tell()
    graph = next((f for f in _fields(stream, 0, size) if f.number == 7 and f.end), None)
    if graph is None:
        raise WireError("no graph in the file")
    initializers: set[str] = set()
    inputs: list[tuple[GraphTensor, bool]] = []
    outputs: list[tuple[GraphTensor, bool]] = []
    for field in _fields(stream, graph.start, graph.end):
        if not field.end:
            continue
        if field.number == 5:
            name = next((f for f in _fields(stream, field.start, field.end) if f.number == 8), None)
            if name is not None and name.end:
                initializers.add(_string(stream, name))
        elif field.number in (11, 12):
            (inputs if field.number == 11 else outputs).append(_value_info(stream, field))
    return Graph(
        tuple(tensor for tensor, _ in inputs if tensor.name not in initializers),
        tuple(tensor for tensor, ranked in outputs if ranked),
    )


def graph_of(path: Path) -> Graph:
    """read_graph of an ONNX file (or of the model.onnx inside a directory, where Triton's
    backend looks when the model's file is a directory of a graph and its external data)."""
    if path.is_dir():
        path = path / "model.onnx"
    with path.open("rb") as stream:
        return read_graph(stream)
