"""The Slack far side of the proving ground: Web API, signed interactivity requests and Socket Mode.

Used by ``scripts/demo`` (the real Slack adapter talks to it through ``slack.base_url``) and by the
tests (``tests/slack`` re-exports it). Shapes, errors and limits follow ``../shared/fixtures/slack/``
(README.md, limits.md); each behaviour's source is in ``README.md`` here. Strict by default:
a test relaxes a rule only by name (``WebApi.allow``). It models Slack, never pitcrew: it knows nothing of incidents, and nothing
in the service imports it (import-linter: only the CLI reaches ``proving_ground``).
"""
