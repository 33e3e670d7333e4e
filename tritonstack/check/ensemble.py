"""An ensemble's wiring, checked as Triton checks it when it loads the ensemble after all of its
steps loaded: every step's model and tensor names, one writer per tensor, data flow without
cycles, and equal data types and dims at both ends of every connection."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2

from tritonstack.check.messages import Say, did_you_mean, format_dims, quoted_names
from tritonstack.core.repository import Model

DataType = model_config_pb2.DataType


@dataclass(frozen=True)
class _Tensor:
    """What an ensemble tensor is, and which end of the wiring said so (for the message)."""

    origin: str
    data_type: int
    dims: tuple[int, ...]
    batching: bool

    @property
    def full_dims(self) -> tuple[int, ...]:
        return ((-1,) if self.batching else ()) + self.dims


def check_ensemble(model: Model, models: dict[str, Model], broken: set[str], say: Say) -> None:
    """The checks Triton runs when it loads an ensemble, after all its step models loaded."""
    config = model.config
    steps = config.ensemble_scheduling.step
    if config.instance_group:
        say("instance_group", "is set on an ensemble", "remove it (ensembles have no instances)")
    if not steps:
        say(
            "ensemble_scheduling.step",
            "is empty",
            "add one step per model, with input_map and output_map",
        )
        return
    batching = config.max_batch_size > 0
    tensors: dict[str, _Tensor] = {}
    for io in config.input:
        dims = io.reshape.shape if io.HasField("reshape") else io.dims
        origin = f'ensemble input "{io.name}"'
        tensors.setdefault(io.name, _Tensor(origin, io.data_type, tuple(dims), batching))

    producers: dict[str, int] = {}
    for index, step in enumerate(steps):
        for key, value in sorted(step.output_map.items()):
            if value in producers:
                say(
                    f'ensemble_scheduling.step[{index}].output_map "{key}"',
                    f'writes tensor "{value}", which step[{producers[value]}] already writes',
                    "give each step output its own ensemble tensor name (Triton allows one "
                    "writer per tensor)",
                )
            producers.setdefault(value, index)
    ensemble_inputs = [io.name for io in config.input]

    for index, step in enumerate(steps):
        field = f"ensemble_scheduling.step[{index}]"
        if not step.input_map:
            say(f"{field}.input_map", "is empty", "map each input of the step's model")
        if not step.output_map:
            say(f"{field}.output_map", "is empty", "map the outputs the ensemble uses")
        target = models.get(step.model_name)
        if target is None:
            if step.model_name not in broken:
                say(
                    f'{field}.model_name "{step.model_name}"',
                    "is not a model in the repository",
                    "use one of " + quoted_names(models) + did_you_mean(step.model_name, models),
                )
            continue
        _check_step(model, index, step, target, tensors, say)

    # Data flow, as Triton resolves it: a step runs once all its input tensors exist.
    ready = set(ensemble_inputs)
    pending = list(range(len(steps)))
    progress = True
    while progress:
        progress = False
        for index in list(pending):
            if all(value in ready for value in steps[index].input_map.values()):
                ready.update(steps[index].output_map.values())
                pending.remove(index)
                progress = True
    produced_names = ", ".join(f'"{n}"' for n in [*ensemble_inputs, *producers]) or "none"
    for index in pending:
        for key, value in sorted(steps[index].input_map.items()):
            if value in ready:
                continue
            field = f'ensemble_scheduling.step[{index}].input_map "{key}"'
            if value in producers:
                say(
                    field,
                    f'reads "{value}", which step[{producers[value]}] can only produce after '
                    "this step ran (circular wiring)",
                    "break the cycle",
                )
            else:
                say(
                    field,
                    f'reads "{value}", which neither an ensemble input nor any step\'s '
                    f"output_map produces (available: {produced_names})",
                    "map it from one of those"
                    + did_you_mean(value, [*ensemble_inputs, *producers]),
                )
    consumed = {value for step in steps for value in step.input_map.values()}
    for index, io in enumerate(config.output):
        field = f'output[{index}] "{io.name}"'
        if io.name not in producers:
            say(
                field,
                "is not produced by any step",
                f'add output_map {{ key: "<model output>" value: "{io.name}" }} to the step '
                "that computes it",
            )
            continue
        # Compared after the steps, so a mismatch names the step that produces the tensor.
        dims = io.reshape.shape if io.HasField("reshape") else io.dims
        mine = _Tensor(f'ensemble output "{io.name}"', io.data_type, tuple(dims), batching)
        _connect(tensors, io.name, mine, field, say)
    readers = {}
    for index, step in reversed(list(enumerate(steps))):
        readers.update(dict.fromkeys(step.input_map.values(), index))
    for index, io in enumerate(config.output):
        if io.name in readers and io.name in producers:
            say(
                f'output[{index}] "{io.name}"',
                f"is also read by step[{readers[io.name]}]: Triton then fails requests that ask "
                'for only some of the outputs with "unexpected deadlock" '
                "(triton-inference-server/server#7482)",
                "feed the step from an internal tensor of another name and return a pass-through "
                "copy of it (a step output) as this ensemble output",
            )
    for index, io in enumerate(config.input):
        if io.name not in consumed:
            say(
                f'input[{index}] "{io.name}"',
                "is not read by any step (Triton rejects unused ensemble inputs)",
                "map it in a step's input_map or remove it",
            )
    outputs = {io.name for io in config.output}
    for value, index in sorted(producers.items()):
        if value not in consumed and value not in outputs:
            say(
                f"ensemble_scheduling.step[{index}].output_map",
                f'produces "{value}", which no step reads and is not an ensemble output '
                "(Triton rejects unused ensemble tensors)",
                "declare it as an ensemble output or remove the mapping",
            )


def _check_step(
    ensemble: Model,
    index: int,
    step: model_config_pb2.ModelEnsembling.Step,
    target: Model,
    tensors: dict[str, _Tensor],
    say: Say,
) -> None:
    """One step against its model's config; records/compares every tensor it touches."""
    field = f"ensemble_scheduling.step[{index}]"
    step_config = target.config
    if 0 < step_config.max_batch_size < ensemble.config.max_batch_size:
        say(
            f'{field}.model_name "{target.name}"',
            f"allows max_batch_size {step_config.max_batch_size}, less than the ensemble's "
            f"{ensemble.config.max_batch_size}",
            f"lower the ensemble's max_batch_size to {step_config.max_batch_size} or raise "
            f"{target.name}'s",
        )
    batching = step_config.max_batch_size > 0
    for section, mapping, declared in (
        ("input", step.input_map, step_config.input),
        ("output", step.output_map, step_config.output),
    ):
        by_name = {io.name: io for io in declared}
        map_field = f"{field}.{section}_map"
        for key, value in sorted(mapping.items()):
            io = by_name.get(key)
            if io is None:
                say(
                    f'{map_field} key "{key}"',
                    f"is not an {section} of {target.name} "
                    f"(its {section}s: {quoted_names(by_name)})",
                    f"use the name {target.name}'s config.pbtxt declares"
                    + did_you_mean(key, by_name),
                )
                continue
            origin = f'{section} "{key}" of {target.name} (step[{index}])'
            mine = _Tensor(origin, io.data_type, tuple(io.dims), batching)
            _connect(tensors, value, mine, f'{map_field} "{key}"', say)
        if section == "input":
            for io in declared:
                if io.name not in mapping and not io.optional:
                    say(
                        map_field,
                        f'does not map input "{io.name}" of {target.name}, which is required',
                        f'add input_map {{ key: "{io.name}" value: "<ensemble tensor>" }}',
                    )


def _connect(tensors: dict[str, _Tensor], name: str, mine: _Tensor, field: str, say: Say) -> None:
    """Record what one end says tensor `name` is, or compare it with what an earlier end said.

    Same rule as Triton: equal data types, and dims equal up to -1, either as declared or with
    the batch dimension added (a batching and a non-batching model may share a tensor).
    """
    known = tensors.setdefault(name, mine)
    if known is mine:
        return
    if known.data_type != mine.data_type:
        say(
            field,
            f'connects tensor "{name}" of {DataType.Name(known.data_type)} '
            f"({known.origin}) to {DataType.Name(mine.data_type)} ({mine.origin})",
            "declare the same data_type on both ends",
        )
    elif not _wildcard_equal(known.dims, mine.dims) and not _wildcard_equal(
        known.full_dims, mine.full_dims
    ):
        say(
            field,
            f'connects tensor "{name}" of shape {format_dims(known.full_dims)} '
            f"({known.origin}) to shape {format_dims(mine.full_dims)} ({mine.origin})",
            "declare the same dims on both ends (-1 for a variable dimension)",
        )


def _wildcard_equal(left: Sequence[int], right: Sequence[int]) -> bool:
    return len(left) == len(right) and all(
        a == b or -1 in (a, b) for a, b in zip(left, right, strict=True)
    )
