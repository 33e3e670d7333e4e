"""tests/prefetch.py: each step is the tests' own download code, and a failed step neither stops
the others nor `make test` (the tests then fetch what they need themselves)."""

from __future__ import annotations

from tests import prefetch


def test_a_failed_step_is_reported_and_the_rest_still_run(monkeypatch, capsys):
    ran = []

    def fails() -> None:
        raise SystemExit("standins: `debootstrap ...` failed (1):\nno network")

    monkeypatch.setattr(prefetch, "STEPS", {"first": fails, "second": lambda: ran.append(1)})
    assert prefetch.main() == 1
    assert ran == [1]
    out = capsys.readouterr().out
    assert "prefetch: first: failed (standins: `debootstrap ...` failed (1):)" in out
    assert "prefetch: second: 0 s" in out


def test_each_step_fills_the_cache_its_test_reads():
    """The steps call the builders the tests call (not copies), so a cache they leave is one the
    tests take: the stand-ins' root filesystem and wheelhouses, the baselines' virtualenv, the
    GPU carry's wheels, the Locust image's virtualenv."""
    import inspect

    sources = "".join(inspect.getsource(step) for step in prefetch.STEPS.values())
    for call in (
        "build.rootfs_tarball(",
        "build.wheelhouse(",
        "baseline_venv(",
        "download_wheels(",
        "image_venv(",
    ):
        assert call in sources, call
