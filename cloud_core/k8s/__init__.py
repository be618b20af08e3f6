"""Kubernetes actuator: node registry, pod watch/batch/bind, pool placement, leader election.

Only ``endpoint.py`` imports the kubernetes client; the rest works on the API's JSON.
"""
