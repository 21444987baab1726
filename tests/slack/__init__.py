"""Slack tests: the stand-in itself lives in ``proving_ground.slack`` (``scripts/demo`` runs it too); the
modules here of the same names re-export it, and the fixtures, the in-process pitcrew and the
scenario tests stay here. The issue's tests reach it only through slack_sdk's ``base_url`` and the wire.
"""
