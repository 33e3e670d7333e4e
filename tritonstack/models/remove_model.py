"""`tritonstack remove-model NAME`: stop serving a model, undoing what `add-model` wrote.

NAME/ leaves model_repository/ with its TensorRT variant NAME_trt/ (a `_trt` name alone removes
that variant only), NAME leaves stack.env's PUBLIC_MODELS, and the files derived from the
repository are written again (gateway/models.map and limits.env, the deep probe's, the Kubernetes
copies), so `tritonstack serve` and `docker compose up -d --build` serve the rest with no other
edit. A model another one still calls (an ensemble's step, a BLS model's parameter) is refused,
naming the caller, and nothing changes; so is a name the repository does not hold.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from tritonstack.core.errors import UserError
from tritonstack.models.add_model import TRT_SUFFIX, regenerate


def remove_model(name: str, root: Path | None = None) -> list[Path]:
    """Remove the model `name` from the project at `root` (default: the project folder);
    returns what was removed or written again. Checked before anything changes."""
    from tritonstack.check.repository import check_repository
    from tritonstack.core import settings
    from tritonstack.core.project import project_dir
    from tritonstack.core.repository import iter_models

    root = project_dir() if root is None else Path(root)
    repository = root / "model_repository"
    models = {m.name: m for m in iter_models(repository)}
    if name not in models:
        raise UserError(
            f"{name}: no such model in {repository} (its models: {', '.join(sorted(models))})"
        )
    folders = [name]
    if not name.endswith(TRT_SUFFIX) and f"{name}{TRT_SUFFIX}" in models:
        folders.append(f"{name}{TRT_SUFFIX}")
    stack_path = root / settings.FILE_NAME
    stack_text = stack_path.read_text()
    new_stack = settings.without_public_model(stack_text, name)
    if settings.parse(stack_text, str(stack_path)).public_models == (name,):
        raise UserError(
            f"{name}: the only public model in {stack_path.name}'s PUBLIC_MODELS; the gateway "
            "needs one: add another model first (`tritonstack add-model`). Nothing was removed"
        )
    settings.parse(new_stack, str(stack_path))

    with tempfile.TemporaryDirectory(prefix=f".remove-model-{name}-", dir=root) as staging:
        staging = Path(staging)
        # The repository as it will be, checked as `tritonstack check` checks one: a problem it
        # has that the repository has not now is a model still calling what goes.
        view = staging / "view"
        view.mkdir()
        for model in models.values():
            if model.name not in folders:
                (view / model.name).symlink_to(model.directory.resolve())
        before = {p.replace(f"{repository}/", "") for p in check_repository(repository)}
        after = [p.replace(f"{view}/", "") for p in check_repository(view)]
        broken = [p for p in after if p not in before]
        if broken:
            callers = sorted({p.split("/", 1)[0] for p in broken})
            raise UserError(
                f"{name}: {', '.join(callers)} still call{'s' if len(callers) == 1 else ''} "
                f"it ({broken[0]}); remove or change {'it' if len(callers) == 1 else 'them'} "
                "first. Nothing was removed"
            )
        removed = staging / "removed"
        removed.mkdir()
        for folder in folders:
            os.rename(repository / folder, removed / folder)
        try:
            written = []
            if new_stack != stack_text:
                stack_path.write_text(new_stack)
                written.append(stack_path)
            written += regenerate(root)
        except BaseException:
            for folder in folders:
                os.rename(removed / folder, repository / folder)
            stack_path.write_text(stack_text)
            raise
        shutil.rmtree(removed)
    return [repository / folder for folder in folders] + written


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the model's name in the repository")


def run(args: argparse.Namespace) -> int:
    from tritonstack.core.project import project_dir

    root = project_dir()
    changed = remove_model(args.name, root)
    for path in changed:
        verb = "wrote" if path.exists() else "removed"
        print(f"{verb} {path.relative_to(root)}")
    print(
        f"removed {args.name}. A running `tritonstack serve` keeps serving it until restarted; "
        "compose: `docker compose up -d --build`"
    )
    return 0
