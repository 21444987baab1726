"""Errors that cross the port boundary, and the one closed vocabulary of why a call failed.

Every integration translates its library's exceptions into one of these two, chaining the
original as ``__cause__``, so the engine decides retry-or-escalate without knowing which
library failed. ``reason`` is a member of ``Reason`` and nothing else: it becomes a log field
and the ``reason`` label of ``pitcrew_integration_errors_total``, whose series are made for
every member at start. A far side's own code (Slack's ``error``, a Kubernetes Status reason,
Slurm's message) is mapped onto a member by its adapter and stays in the message, never in the
reason. A new failure either fits a member or adds one here, on purpose.
"""

from __future__ import annotations

from enum import StrEnum, unique


@unique
class Reason(StrEnum):
    """Why a call to a far side (or a step over it) did not succeed; the value is the label."""

    # The far side did not answer.
    TIMEOUT = "timeout"
    """No answer in time (a request, a command, a Job, the step's deadline)."""
    UNREACHABLE = "unreachable"
    """No connection: refused, reset, DNS, the controller behind it not contacted."""

    # It answered "not now".
    UNAVAILABLE = "unavailable"
    """A 5xx, busy, an internal error: may work later."""
    RATE_LIMITED = "rate_limited"
    """429 or its equivalent; ``retry_after`` says when, if the far side said."""
    CONFLICT = "conflict"
    """409: the object changed under us, or already exists."""
    PDB = "pdb"
    """An eviction a PodDisruptionBudget refused (429 from the Eviction API)."""

    # It answered "no".
    NOT_FOUND = "not_found"
    """The object is not there (404, ``channel_not_found``, ``message_not_found``, no Machine)."""
    UNKNOWN_NODE = "unknown_node"
    """Slurm does not know the node."""
    UNKNOWN_JOB = "unknown_job"
    """Slurm does not know the job."""
    NOT_REQUEUEABLE = "not_requeueable"
    """Slurm will not requeue the job: submitted ``--no-requeue`` (``ESLURM_DISABLED``) or not a
    batch job (``ESLURM_BATCH_ONLY``)."""
    UNAUTHORIZED = "unauthorized"
    """The credential pitcrew presented was refused (401, ``invalid_auth``, ``token_revoked``)."""
    FORBIDDEN = "forbidden"
    """Authenticated, not permitted (403, ``missing_scope``, ``not_in_channel``, Slurm permission)."""
    INVALID_REQUEST = "invalid_request"
    """The request itself is wrong (400, 422, ``invalid_blocks``, bad PromQL, not one node name)."""
    UNSUPPORTED = "unsupported"
    """The far side does not offer what pitcrew needs (no usable API version, 405)."""
    REFUSED = "refused"
    """Refused for a reason pitcrew has no name for: the far side's own code is in the message."""
    BAD_RESPONSE = "bad_response"
    """An answer pitcrew cannot read (unexpected shape or status)."""

    # pitcrew cannot or must not make the call.
    NO_CREDENTIALS = "no_credentials"
    """No credential to present: a token file missing, unreadable or empty."""
    MISCONFIGURED = "misconfigured"
    """The configuration or installation lacks what the call needs (no cluster, no command, a
    Slurm program not on PATH, an unknown strategy)."""
    NOT_ALLOWED = "not_allowed"
    """pitcrew's own policy forbids it (a protected namespace, a force delete not enabled,
    replacement handed to humans)."""
    DRY_RUN = "dry_run"
    """The dry-run journal stands behind the port: it knows nothing to read."""

    # The far side answered, but the world is not (yet) as the step needs.
    NOT_APPLIED = "not_applied"
    """A write was taken but does not show yet."""
    WORKLOAD_REMAINS = "workload_remains"
    """The node still runs jobs or pods the step must not cut off."""
    JOB_FAILED = "job_failed"
    """A Kubernetes Job pitcrew ran on the node failed."""
    COMMAND_FAILED = "command_failed"
    """An operator's command exited non-zero."""
    VALIDATION_FAILED = "validation_failed"
    """The node failed its validation, so it is not returned to Slurm."""


class PitcrewError(Exception):
    """Root of pitcrew's own errors."""

    def __init__(self, message: str, *, reason: Reason) -> None:
        super().__init__(message)
        # Closed at run time too (as Alertmanager's Reason.String() panics on an unknown value):
        # a stray string fails here, where it was raised, not as a new metric series.
        self.reason = Reason(reason)


class TransientError(PitcrewError):
    """The far side may succeed later (timeout, 5xx, 429, connection refused).

    ``retry_after`` is the far side's hint in seconds, when it gave one: the backoff
    (``bot.engine.backoff``) waits at least that long.
    """

    def __init__(self, message: str, *, reason: Reason, retry_after: float | None = None) -> None:
        super().__init__(message, reason=reason)
        self.retry_after = retry_after


class PermanentError(PitcrewError):
    """Retrying will not help (4xx other than 409/429, a refused precondition, bad data)."""
