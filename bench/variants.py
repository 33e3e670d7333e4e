"""Model-repository variants: copies of the repository with edited config.pbtxt files.

Each variant changes one thing against the committed repository, so a difference in the numbers
has one cause. Configs are parsed and written with Triton's own schema (model_config_pb2), as
tritonstack.core.repository does; comments are not kept in the copies.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from google.protobuf import text_format

from tritonstack.core.errors import UserError
from tritonstack.core.repository import ModelConfig, iter_models

#: Models that run in a Python stub, whose instance count the python-x1 variant lowers.
PYTHON_MODELS = ("postprocess", "classify")
QUEUE_DELAYS_US = (0, 100, 500, 2000)
#: The classification variant's labels: postprocess's file, copied next to classifier's config.
CLASSIFICATION_LABELS = "labels.txt"


def _no_batching(config: ModelConfig) -> None:
    config.ClearField("dynamic_batching")


def _queue_delay(microseconds: int) -> Callable[[ModelConfig], None]:
    def edit(config: ModelConfig) -> None:
        if config.HasField("dynamic_batching"):
            config.dynamic_batching.max_queue_delay_microseconds = microseconds

    return edit


def _instances(count: int, models: tuple[str, ...]) -> Callable[[ModelConfig], None]:
    def edit(config: ModelConfig) -> None:
        if config.name in models:
            for group in config.instance_group:
                group.count = count

    return edit


#: A queue policy (Triton's own overload protection): a variant, not the committed config,
#: because it stalls the batcher on 2.51; the variant keeps that stall measurable.
QUEUE_POLICY = {
    "max_queue_size": 256,
    "timeout_action": "REJECT",
    "default_timeout_microseconds": 1_000_000,
    "allow_timeout_override": False,
}


def _queue_policy(config: ModelConfig) -> None:
    if config.HasField("dynamic_batching"):
        policy = config.dynamic_batching.default_queue_policy
        policy.max_queue_size = QUEUE_POLICY["max_queue_size"]
        policy.timeout_action = type(policy).TimeoutAction.Value(QUEUE_POLICY["timeout_action"])
        policy.default_timeout_microseconds = QUEUE_POLICY["default_timeout_microseconds"]
        policy.allow_timeout_override = QUEUE_POLICY["allow_timeout_override"]


def _both(*edits: Callable[[ModelConfig], None]) -> Callable[[ModelConfig], None]:
    def edit(config: ModelConfig) -> None:
        for one in edits:
            one(config)

    return edit


def _classification(config: ModelConfig) -> None:
    if config.name == "classifier":
        config.output[0].label_filename = CLASSIFICATION_LABELS


def _unchanged(config: ModelConfig) -> None:
    return None


#: name -> (what differs from the committed repository, edit applied to every config.pbtxt)
VARIANTS: dict[str, tuple[str, Callable[[ModelConfig], None]]] = {
    "default": (
        "as committed: dynamic batching, 100 us queue delay, no queue policy, 2 instances each",
        _unchanged,
    ),
    "batching-off": ("no dynamic_batching on any model", _no_batching),
    **{
        f"delay-{us}": (
            f"max_queue_delay_microseconds: {us} on every batching model",
            _queue_delay(us),
        )
        for us in QUEUE_DELAYS_US
        if us != 100
    },
    "python-x1": (
        "instance_group count 1 for postprocess and classify",
        _instances(1, PYTHON_MODELS),
    ),
    # Triton 2.51's dynamic batcher can miss the wake-up when its only instance frees up and then
    # sleeps its 500 ms idle wait; the committed second instance is the design change against it,
    # and these variants measure what one instance costs.
    "classifier-x1": ("instance_group count 1 for classifier", _instances(1, ("classifier",))),
    "classification": (
        "label_filename on classifier's output: Triton's classification extension, no Python",
        _classification,
    ),
    "all-x1": (
        "instance_group count 1 for classifier, postprocess and classify",
        _instances(1, ("classifier", *PYTHON_MODELS)),
    ),
    # A queue policy (max_queue_size, a default timeout) turns off the dynamic batcher's payload
    # prefetching (core's PriorityQueue::SupportPrefetching); on that path Triton 2.51 is not
    # woken when a busy instance frees up and sleeps its 500 ms idle wait. The committed configs
    # have none (the gateway refuses overload); these variants keep the evidence measurable.
    "queue-policy": (
        "default_queue_policy (max_queue_size 256, REJECT, 1 s timeout) on every batching model",
        _queue_policy,
    ),
    "queue-policy-x1": (
        "default_queue_policy as queue-policy, and instance_group count 1 for every model",
        _both(_queue_policy, _instances(1, ("classifier", *PYTHON_MODELS))),
    ),
}


def write_variant(source: Path, target: Path, variant: str) -> Path:
    """Copy the repository `source` to `target` with `variant`'s edit applied; return `target`."""
    if variant not in VARIANTS:
        raise UserError(f"unknown repository variant {variant!r}; known: {sorted(VARIANTS)}")
    _, edit = VARIANTS[variant]
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    for model in iter_models(target):
        edit(model.config)
        (model.directory / "config.pbtxt").write_text(text_format.MessageToString(model.config))
    if variant == "classification":
        shutil.copy2(
            target / "postprocess" / "labels.txt", target / "classifier" / CLASSIFICATION_LABELS
        )
    return target
