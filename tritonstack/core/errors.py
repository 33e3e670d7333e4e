"""The one exception type the CLI turns into a single readable line instead of a traceback, and
the check that an optional extra is installed before a command needs it."""


class UserError(Exception):
    """Something the user can fix: the message says what was wrong, where, and how to fix it."""


#: Top-level modules an optional feature imports -> the extra of pyproject.toml that installs
#: them (tests/unit/test_cli.py checks the two agree).
EXTRAS: dict[str, str] = {
    "geventhttpclient": "clients",  # tritonclient.http's transport (tritonclient[http])
    "onnx": "check",
    "onnxruntime": "check",
    "pytriton": "serve",
    "locust": "load",
    "matplotlib": "render",
    "grafana_foundation_sdk": "render",
    "sklearn": "export",
    "skl2onnx": "export",
    "vllm": "llm",
}
#: Extras that include others (pyproject.toml's `tritonstack[...]` lines).
INCLUDES: dict[str, tuple[str, ...]] = {
    "serve": ("check", "clients"),
    "load": ("clients",),
    "export": ("check",),
}
#: Extras not installed through pip's extras syntax, and the command that installs them.
INSTALL: dict[str, str] = {
    "llm": "`make llm` (the CPU vLLM runtime, pinned in requirements/llm-cpu.txt, ~3.5 GB)",
}


def missing_extra(extra: str) -> UserError | None:
    """The error to raise when a module of `extra` is not importable, else None."""
    from importlib.util import find_spec

    missing = []
    for module, wanted in EXTRAS.items():
        if wanted not in (extra, *INCLUDES.get(extra, ())):
            continue
        try:
            found = find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(module)
    if not missing:
        return None
    how = INSTALL.get(extra, f"pip install 'tritonstack[{extra}]'")
    return UserError(f"needs the [{extra}] extra ({', '.join(missing)} not installed): {how}")


def require_extra(extra: str) -> None:
    """Fail with one line naming the extra before a command starts work it cannot finish."""
    error = missing_extra(extra)
    if error is not None:
        raise error
