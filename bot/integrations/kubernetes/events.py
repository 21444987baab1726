"""Kubernetes Events on the node for what pitcrew did to it, so ``kubectl describe node`` shows it.

An audit copy for the people who live in kubectl: the incident's own timeline (the store) is the
record. Posting one is best effort: a refusal or an outage is logged and never fails the step
that acted (its action already happened and is already recorded). The event names the node's
``uid``: ``kubectl describe node`` lists events by ``involvedObject.uid`` (with kind, name and an
empty namespace), so an event without it is never shown there.
"""

from __future__ import annotations

from datetime import UTC, datetime

from kubernetes.aio import client

from bot import logger
from bot.domain.ownership import OWNER_ANNOTATION
from bot.engine.errors import PitcrewError
from bot.integrations.kubernetes.client import call

log = logger(__name__)
#: Node events live in the default namespace (as the kubelet's and the node controller's do).
NAMESPACE = "default"
COMPONENT = "pitcrew"


class Events:
    def __init__(self, api: client.ApiClient, *, timeout: float) -> None:
        self._core = client.CoreV1Api(api)
        self._timeout = timeout

    async def on_node(self, node: str, reason: str, message: str, incident_id: str) -> None:
        now = datetime.now(UTC)
        try:
            found = await call(
                f"read node {node}", self._core.read_node(node, _request_timeout=self._timeout)
            )
            uid = found.metadata.uid
        except PitcrewError:  # gone (a replacement) or unreadable: the event still says which node
            uid = None
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(
                generate_name=f"{node}.pitcrew.",
                namespace=NAMESPACE,
                annotations={OWNER_ANNOTATION: incident_id},
            ),
            involved_object=client.V1ObjectReference(api_version="v1", kind="Node", name=node, uid=uid),
            reason=reason,
            message=message[:1024],
            type="Normal",
            source=client.V1EventSource(component=COMPONENT),
            reporting_component=COMPONENT,
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        try:
            await call(
                f"post event {reason} on {node}",
                self._core.create_namespaced_event(NAMESPACE, event, _request_timeout=self._timeout),
            )
        except PitcrewError as exc:
            log.warning(
                "kubernetes event not posted", extra={"node": node, "reason": reason, "error": str(exc)}
            )
