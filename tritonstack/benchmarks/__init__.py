"""The pieces of `tritonstack bench`, one job per module.

scenarios (what is measured), variants (model-repository copies), loadgen (wrk and the gRPC
client), servers (Triton, FastAPI and MLServer processes, their CPU and memory), stats (medians,
spread, saturation, targets), report (Markdown and plots). `tritonstack.bench` runs them.
"""
