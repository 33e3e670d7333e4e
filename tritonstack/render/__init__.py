"""Files written from the model repository and stack.env for other tools: the gateway's and
the deep probe's files (derived), Prometheus' config (promconfig), Grafana's dashboards
(dashboards, with the [render] extra) and the Kubernetes copies (k8s).

Imports the core only.
"""
