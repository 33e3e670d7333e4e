"""The benchmark: a tool run from a checkout (`python -m bench`), not part of the installed package.

runner (the command line and the run), scenarios (what is measured), variants (model-repository
copies), loadgen (wrk and the gRPC client), servers (Triton, FastAPI and MLServer processes,
their CPU and memory), stats (medians, spread, saturation, targets), explain and profile (where
each request's CPU goes: per process, and py-spy on the stubs), report (Markdown and plots).
The baselines' own files sit beside them: fastapi_app.py, mlserver_runtime.py,
requirements-baselines.txt, and perf_analyzer.sh for the compose `bench` profile.
"""
