"""Load: Locust's runs and their gates (loadtest), and the long soak (soak).

Imports the layers before it (core, launcher, clients, check, serve); needs the [load] extra.
"""
