"""A Slack far side for tests: Web API, signed interactivity requests and Socket Mode.

Shapes, errors and limits follow ``../shared/fixtures/slack/`` (README.md, limits.md). Nothing here is
imported by ``bot/``; the issue's tests reach it only through slack_sdk's ``base_url`` and the wire.
"""
