"""The emulator refuses request bodies that are not valid objects of the client's own models.

Cases (each a 422 ``Invalid`` Status naming the model, nothing stored): a Job whose container has
no name (``V1Container.name`` is required), an Eviction whose ``deleteOptions`` is not an object,
a SelfSubjectAccessReview without its spec, an Event without its involved object; a valid Job
is created (201) and run by the emulator's Job controller. A Job the API server's own Job
validation refuses, whatever the client's models take (a 422 naming the field, nothing stored):
no container; ``restartPolicy`` unset or ``Always`` (a pod template's default, which a Job never
takes), or neither ``OnFailure`` nor ``Never``; ``OnFailure`` beside a ``podFailurePolicy``; a
negative ``ttlSecondsAfterFinished``. A finished Job with ``ttlSecondsAfterFinished`` is deleted
that long after it finished, its pods with it (the TTL-after-finished controller and the garbage
collector); one without is kept. A Job still running ``activeDeadlineSeconds`` after it started is
failed (``DeadlineExceeded``), its running pod deleted and a Warning event recorded. The kubelet
refuses a Job's pod bound to a node with a ``NoExecute`` taint it does not tolerate (Failed,
``TaintToleration``, no container run, a Warning event), and the Job fails; a ``NoSchedule``
taint does not stop it (only the scheduler reads those).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from proving_ground.kubernetes.emulator import AUTH_HEADER, KubeEmulator


async def _post(host: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """A raw POST over HTTP (the typed client would not build these bodies itself)."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(host + path, json=body, headers=AUTH_HEADER) as response,
    ):
        return response.status, await response.json()


@pytest.mark.parametrize(
    ("path", "body", "model"),
    [
        (
            "/apis/batch/v1/namespaces/pitcrew/jobs",
            {
                "metadata": {"name": "j"},
                "spec": {"template": {"spec": {"containers": [{"image": "x"}], "restartPolicy": "Never"}}},
            },
            "V1Job",
        ),
        (
            "/api/v1/namespaces/training/pods/llama-pretrain-worker-2/eviction",
            {"metadata": {"name": "llama-pretrain-worker-2"}, "deleteOptions": "now"},
            "V1Eviction",
        ),
        (
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            {"metadata": {}},
            "V1SelfSubjectAccessReview",
        ),
        ("/api/v1/namespaces/default/events", {"metadata": {"name": "e"}}, "CoreV1Event"),
    ],
)
async def test_invalid_bodies_are_refused(
    k8s: KubeEmulator, path: str, body: dict[str, Any], model: str
) -> None:
    before = set(k8s.objects)
    status, answer = await _post(k8s.host, path, body)
    assert status == 422 and answer["reason"] == "Invalid" and f"not a valid {model}" in answer["message"]
    assert set(k8s.objects) == before


def _job(pod: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "j"}, "spec": {**spec, "template": {"spec": pod}}}


_CONTAINERS = [{"name": "c", "image": "x"}]


async def _finished(k8s: KubeEmulator, name: str, namespace: str = "pitcrew-jobs") -> dict[str, Any]:
    """The Job once its controller has written a condition (a verdict), within three seconds."""
    for _ in range(60):
        job = k8s.get("jobs", name, namespace)
        if job and (job.get("status") or {}).get("conditions"):
            return job
        await asyncio.sleep(0.05)
    raise AssertionError(
        f"Job {namespace}/{name} has no verdict after 3s: {k8s.get('jobs', name, namespace)}"
    )


@pytest.mark.parametrize(
    ("body", "cause", "message"),
    [
        (_job({"containers": [], "restartPolicy": "Never"}), "FieldValueRequired", "Required value"),
        (
            _job({"containers": _CONTAINERS}),
            "FieldValueRequired",
            'Required value: valid values: "OnFailure", "Never"',
        ),
        (
            _job({"containers": _CONTAINERS, "restartPolicy": "Always"}),
            "FieldValueRequired",
            'Required value: valid values: "OnFailure", "Never"',
        ),
        (
            _job({"containers": _CONTAINERS, "restartPolicy": "Sometimes"}),
            "FieldValueNotSupported",
            'Unsupported value: "Sometimes": supported values: "OnFailure", "Never"',
        ),
        (
            _job({"containers": _CONTAINERS, "restartPolicy": "Never"}, ttlSecondsAfterFinished=-1),
            "FieldValueInvalid",
            "Invalid value: -1: must be greater than or equal to 0",
        ),
        (
            _job({"containers": _CONTAINERS, "restartPolicy": "OnFailure"}, podFailurePolicy={"rules": []}),
            "FieldValueInvalid",
            'only "Never" is supported when podFailurePolicy is specified',
        ),
    ],
)
async def test_a_job_the_api_server_s_job_validation_refuses(
    k8s: KubeEmulator, body: dict[str, Any], cause: str, message: str
) -> None:
    before = set(k8s.objects)
    status, answer = await _post(k8s.host, "/apis/batch/v1/namespaces/pitcrew/jobs", body)
    assert status == 422 and answer["reason"] == "Invalid", answer
    [found] = answer["details"]["causes"]
    assert found["reason"] == cause and found["field"].startswith("spec.")
    assert message in found["message"] and message in answer["message"]
    assert set(k8s.objects) == before


async def test_a_valid_job_is_created_and_run(k8s: KubeEmulator) -> None:
    body = _job({"containers": _CONTAINERS, "restartPolicy": "Never"})
    status, _ = await _post(k8s.host, "/apis/batch/v1/namespaces/pitcrew/jobs", body)
    assert status == 201
    assert k8s.get("jobs", "j", "pitcrew") is not None


async def test_a_finished_job_with_a_ttl_is_deleted_with_its_pods_one_without_is_kept(
    k8s: KubeEmulator,
) -> None:
    k8s.job_duration = 0.1
    kept = _job({"containers": _CONTAINERS, "restartPolicy": "Never"})
    kept["metadata"]["name"] = "kept"
    for body in (
        _job({"containers": _CONTAINERS, "restartPolicy": "Never"}, ttlSecondsAfterFinished=1),
        kept,
    ):
        status, _ = await _post(k8s.host, "/apis/batch/v1/namespaces/pitcrew-jobs/jobs", body)
        assert status == 201

    def pods_of(job: str) -> list[str]:
        return [n for (kind, _, n), pod in k8s.objects.items() if kind == "pods" and n.startswith(f"{job}-")]

    for name in ("j", "kept"):  # both finished, the TTL not yet passed
        assert (await _finished(k8s, name))["status"]["succeeded"] == 1
    assert pods_of("j") and pods_of("kept")
    await asyncio.sleep(1.3)
    assert k8s.get("jobs", "j", "pitcrew-jobs") is None and not pods_of("j")
    assert k8s.get("jobs", "kept", "pitcrew-jobs") is not None and pods_of("kept")


async def test_a_job_past_its_deadline_is_failed_and_its_pod_deleted(k8s: KubeEmulator) -> None:
    k8s.job_durations["slow"] = 60.0
    body = _job(
        {"containers": _CONTAINERS, "restartPolicy": "Never", "nodeName": "gpu-node-02"},
        activeDeadlineSeconds=1,
    )
    body["metadata"]["name"] = "slow"
    status, _ = await _post(k8s.host, "/apis/batch/v1/namespaces/pitcrew-jobs/jobs", body)
    assert status == 201
    job = await _finished(k8s, "slow")
    conditions = [(c["type"], c["reason"], c["message"]) for c in job["status"]["conditions"]]
    message = "Job was active longer than specified deadline"
    assert conditions == [
        ("FailureTarget", "DeadlineExceeded", message),
        ("Failed", "DeadlineExceeded", message),
    ]
    assert job["status"]["failed"] == 1 and "active" not in job["status"]
    assert not [n for (kind, _, n) in k8s.objects if kind == "pods" and n.startswith("slow-")]
    warned = [
        e
        for (kind, _, _), e in k8s.objects.items()
        if kind == "events" and e.get("reason") == "DeadlineExceeded"
    ]
    assert [e["involvedObject"]["name"] for e in warned] == ["slow"]


@pytest.mark.parametrize(("effect", "runs"), [("NoExecute", False), ("NoSchedule", True)])
async def test_the_kubelet_refuses_a_job_pod_that_does_not_tolerate_a_no_execute_taint(
    k8s: KubeEmulator, effect: str, runs: bool
) -> None:
    node = k8s.get("nodes", "gpu-node-02")
    assert node is not None
    node["spec"].setdefault("taints", []).append({"key": "health.example.com/quarantine", "effect": effect})
    body = _job(
        {"containers": _CONTAINERS, "restartPolicy": "Never", "nodeName": "gpu-node-02"}, backoffLimit=0
    )
    status, _ = await _post(k8s.host, "/apis/batch/v1/namespaces/pitcrew-jobs/jobs", body)
    assert status == 201
    job = await _finished(k8s, "j")
    assert [c["type"] for c in job["status"]["conditions"]][-1] == ("Complete" if runs else "Failed")
    [pod] = [p for (kind, _, n), p in k8s.objects.items() if kind == "pods" and n.startswith("j-")]
    if runs:
        assert pod["status"]["phase"] == "Succeeded"
        return
    assert pod["status"]["phase"] == "Failed" and pod["status"]["reason"] == "TaintToleration"
    assert pod["status"]["message"].startswith("Pod was rejected: Predicate TaintToleration failed")
    assert "containerStatuses" not in pod["status"]
    warned = [
        e
        for (kind, _, _), e in k8s.objects.items()
        if kind == "events" and e.get("reason") == "TaintToleration"
    ]
    assert [e["involvedObject"]["kind"] for e in warned] == ["Pod"]
