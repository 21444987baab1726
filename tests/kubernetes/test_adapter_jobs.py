"""GPU reset and reboot as privileged Jobs pinned to the node, or an operator command.

Cases: ``reset_gpu`` creates one Job from the operator's template, named after the incident, pinned
to the node by ``nodeName``, tolerating pitcrew's taint and the cordon, with the PITCREW_* environment;
it waits for the Job and a retried call finds the same Job instead of creating another; Kubernetes
deletes it a week after it finished (``ttlSecondsAfterFinished``: ``kubernetes.jobs.keep_finished``);
the Job tolerates every ``NoExecute`` taint (the kubelet refuses a pod bound to a node with one it
does not tolerate; a node under repair may carry another tool's quarantine); a reset that hangs
is stopped by the Job controller at ``kubernetes.jobs.timeout``
(``activeDeadlineSeconds``) and fails the step with that verdict, while a reboot's and a
validation's Jobs get no deadline of pitcrew's (a slow boot, a long diagnostic), a template's own
kept; a failed Job
is a ``PermanentError`` carrying the container's exit code; ``reboot`` by command gets the node and
incident in its environment and fails on a non-zero exit; nothing configured is refused. A template's quantities written as YAML numbers (which the API
server takes, and the client's models do not) are sent as quantities; a template the client cannot
send otherwise is a misconfiguration, named, with nothing sent; so is one that no longer reads as a
Job (the configuration's load checked it: ``bot.config.read_job_template``), and the cluster's
other calls go on. A template whose ``restartPolicy`` is null gets pitcrew's ``Never``, which the
API server's Job validation takes (it refuses a Job's pod without one). After a
reboot the node counts as back only once it reports a new boot id (Ready before the reboot proves
nothing); the optional validation Job passes, fails with its exit code, or is not configured.
A Job in a namespace whose Pod Security level refuses its privileged pod is named at once (the Job
controller's FailedCreate event), not waited out. A Job is judged by its terminal conditions, so
with ``backoffLimit > 0`` a first failed pod is not the verdict. A reboot that takes its own Job's
pod down with the node (the Job fails) counts as done once the boot id changed.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from bot.domain.ownership import RUNG_ANNOTATION, TAINT_KEY
from bot.engine.errors import PermanentError
from bot.integrations.kubernetes import KubernetesCluster
from bot.integrations.kubernetes.jobs import job_name
from proving_ground.kubernetes.emulator import KubeEmulator

NODE = "gpu-node-02"
TEMPLATE = {
    "spec": {
        "template": {
            "spec": {
                "hostPID": True,
                "containers": [
                    {
                        "name": "reset",
                        "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                        "command": ["sh", "-c", "nvidia-smi --gpu-reset -i $PITCREW_GPUS"],
                        "securityContext": {"privileged": True},
                    }
                ],
            }
        }
    }
}


@pytest.fixture
def template(tmp_path: Path) -> Path:
    path = tmp_path / "reset-gpu-job.yaml"
    path.write_text(yaml.safe_dump(TEMPLATE))
    return path


async def test_reset_gpu_runs_one_pinned_job_and_waits_for_it(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator, template: Path
) -> None:
    cluster = make_cluster(jobs={"namespace": "pitcrew-jobs", "reset_gpu_template": template})
    await cluster.reset_gpu(NODE, ["3"], incident_id="pc-00042")
    job = k8s.get("jobs", job_name("reset_gpu", "pc-00042", NODE, ""), "pitcrew-jobs")
    assert job is not None and job["status"]["succeeded"] == 1
    assert [c["type"] for c in job["status"]["conditions"]] == ["SuccessCriteriaMet", "Complete"]
    assert job["spec"]["ttlSecondsAfterFinished"] == 7 * 24 * 3600  # kept a week for a post-mortem
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeName"] == NODE and pod["hostPID"] is True and pod["restartPolicy"] == "Never"
    assert {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env == {
        "PITCREW_NODE": NODE,
        "PITCREW_INCIDENT": "pc-00042",
        "PITCREW_ACTION": "reset_gpu",
        "PITCREW_GPUS": "3",
    }
    await cluster.reset_gpu(NODE, ["3"], incident_id="pc-00042")  # a retried step: the same Job
    creates = [e for e in k8s.log if e.resource == "jobs" and e.verb == "create"]
    assert [c.status for c in creates] == [201, 409]


async def test_a_failed_job_reports_its_exit_code(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator, template: Path
) -> None:
    cluster = make_cluster(jobs={"reboot_template": template})
    k8s.job_exit_codes[job_name("reboot", "pc-00042", NODE, "")] = 17
    with pytest.raises(PermanentError, match="exited 17") as err:
        await cluster.reboot(NODE, incident_id="pc-00042")
    assert err.value.reason == "job_failed"


async def test_reboot_by_command_and_nothing_configured(
    make_cluster: Callable[..., KubernetesCluster], tmp_path: Path
) -> None:
    out = tmp_path / "rebooted"
    script = (
        f"import os,sys; open({str(out)!r},'w').write(os.environ['PITCREW_NODE']); sys.exit(int(sys.argv[1]))"
    )
    await make_cluster(jobs={"reboot_command": [sys.executable, "-c", script, "0"]}).reboot(
        NODE, incident_id="pc-1"
    )
    assert out.read_text() == NODE
    with pytest.raises(PermanentError, match="exited 2"):
        await make_cluster(jobs={"reboot_command": [sys.executable, "-c", script, "2"]}).reboot(
            NODE, incident_id="pc-2"
        )
    with pytest.raises(PermanentError, match="reboot_template or reboot_command"):
        await make_cluster().reboot(NODE, incident_id="pc-3")


async def test_validation_is_optional_and_a_failure_is_reported(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator, template: Path
) -> None:
    assert await make_cluster().validate(NODE, incident_id="pc-00042") is None
    cluster = make_cluster(jobs={"validation_template": template})
    assert await cluster.validate(NODE, incident_id="pc-00042") is True
    k8s.job_exit_codes[job_name("validation", "pc-00043", NODE, "")] = 1
    with pytest.raises(PermanentError, match="exited 1") as err:
        await cluster.validate(NODE, incident_id="pc-00043")
    assert err.value.reason == "job_failed"


async def test_each_rung_of_an_incident_runs_its_own_job_and_a_retry_finds_its_own(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator, template: Path
) -> None:
    """A validation that failed in one rung (the node rebooted) is not the verdict of the next rung's
    (its replacement, or the same node after another repair): each runs its own Job, and a retried
    call of a rung finds that rung's Job, never another's."""
    cluster = make_cluster(jobs={"validation_template": template, "keep_finished": "2h"})
    first = job_name("validation", "pc-5", NODE, "reboot-then-replace")
    k8s.job_exit_codes[first] = 1
    with pytest.raises(PermanentError, match="exited 1"):
        await cluster.validate(NODE, incident_id="pc-5", rung="reboot-then-replace")
    assert await cluster.validate(NODE, incident_id="pc-5", rung="replace-node") is True
    assert await cluster.validate("gpu-node-09", incident_id="pc-5", rung="replace-node") is True
    with pytest.raises(PermanentError, match="exited 1"):  # a retry of the first rung: its own Job
        await cluster.validate(NODE, incident_id="pc-5", rung="reboot-then-replace")
    creates = [e for e in k8s.log if e.resource == "jobs" and e.verb == "create"]
    assert [e.status for e in creates] == [201, 201, 201, 409]  # the retry found its rung's Job
    jobs = [job for (kind, _, _), job in k8s.objects.items() if kind == "jobs"]
    runs = {
        (j["spec"]["template"]["spec"]["nodeName"], j["metadata"]["annotations"][RUNG_ANNOTATION])
        for j in jobs
    }
    assert runs == {(NODE, "reboot-then-replace"), (NODE, "replace-node"), ("gpu-node-09", "replace-node")}
    assert {j["spec"]["ttlSecondsAfterFinished"] for j in jobs} == {2 * 3600}
    # A validation runs as long as its diagnostic: no deadline but its template's own.
    assert not [j for j in jobs if "activeDeadlineSeconds" in j["spec"]]
    names = [j["metadata"]["name"] for j in jobs]
    assert len(names) == 3 and all(len(n) <= 63 and n.startswith("pitcrew-validation-pc-5-") for n in names)


async def test_a_template_s_quantities_written_as_yaml_numbers_are_sent_as_quantities(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator, tmp_path: Path
) -> None:
    # A DCGM diagnostic as a site writes it: `nvidia.com/gpu: 8`, `cpu: 2` are YAML numbers, which
    # the API server takes as quantities; the client's models take only strings.
    path = tmp_path / "validation.yaml"
    path.write_text(
        "spec:\n"
        "  template:\n"
        "    spec:\n"
        "      initContainers:\n"
        "        - {name: wait, image: x, resources: {requests: {cpu: 0.5}}}\n"
        "      containers:\n"
        "        - name: diag\n"
        "          image: nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04\n"
        "          command: [dcgmi, diag, -r, '2']\n"
        "          resources: {limits: {nvidia.com/gpu: 8, cpu: 2, memory: 1Gi}, requests: {cpu: 1}}\n"
    )
    assert await make_cluster(jobs={"validation_template": path}).validate(NODE, incident_id="pc-7") is True
    job = k8s.get("jobs", job_name("validation", "pc-7", NODE, ""), "pitcrew-jobs")
    assert job is not None
    pod = job["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"] == {
        "limits": {"nvidia.com/gpu": "8", "cpu": "2", "memory": "1Gi"},
        "requests": {"cpu": "1"},
    }
    assert pod["initContainers"][0]["resources"] == {"requests": {"cpu": "0.5"}}


async def test_a_template_the_client_cannot_send_is_misconfigured_not_a_defect(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator, tmp_path: Path
) -> None:
    path = tmp_path / "reset.yaml"  # an env value must be a string, for the API server too
    path.write_text(
        "spec: {template: {spec: {containers: [{name: reset, image: x, env: [{name: X, value: 1}]}]}}}\n"
    )
    with pytest.raises(PermanentError, match="reset_gpu_template is not a Job the client can send") as err:
        await make_cluster(jobs={"reset_gpu_template": path}).reset_gpu(NODE, ["0"], incident_id="pc-8")
    assert err.value.reason == "misconfigured"
    assert not [e for e in k8s.log if e.resource == "jobs"]  # refused before sending


async def test_a_reset_that_hangs_is_stopped_at_its_deadline_and_fails_its_step(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator, template: Path
) -> None:
    """``nvidia-smi --gpu-reset`` can hang on a GPU gone bad: the Job controller ends it at the
    deadline pitcrew gives it (``kubernetes.jobs.timeout``), its pod deleted, and the step fails
    on that verdict instead of timing out with the reset still holding the node."""
    cluster = make_cluster(jobs={"reset_gpu_template": template, "timeout": "2s"})
    name = job_name("reset_gpu", "pc-11", NODE, "reset-gpu")
    k8s.job_durations[name] = 60.0
    with pytest.raises(
        PermanentError, match="DeadlineExceeded: Job was active longer than specified deadline"
    ) as err:
        await cluster.reset_gpu(NODE, ["0"], incident_id="pc-11", rung="reset-gpu")
    assert err.value.reason == "job_failed"
    job = k8s.get("jobs", name, "pitcrew-jobs")
    assert job is not None and job["spec"]["activeDeadlineSeconds"] == 2
    assert not [n for (kind, _, n) in k8s.objects if kind == "pods" and n.startswith(f"{name}-")]


async def test_only_a_reset_gets_pitcrew_s_deadline_a_template_s_own_is_kept(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator, tmp_path: Path
) -> None:
    plain, bounded = tmp_path / "plain.yaml", tmp_path / "bounded.yaml"
    plain.write_text(yaml.safe_dump(TEMPLATE))
    bounded.write_text(yaml.safe_dump({"spec": {**TEMPLATE["spec"], "activeDeadlineSeconds": 3600}}))
    k8s.reboot_job_reports_success = True
    cluster = make_cluster(
        jobs={"reboot_template": plain, "validation_template": bounded, "reset_gpu_template": bounded}
    )
    await cluster.reset_gpu(NODE, ["0"], incident_id="pc-12", rung="reset-gpu")
    await cluster.reboot(NODE, incident_id="pc-12", rung="reboot-node")
    assert await cluster.validate(NODE, incident_id="pc-12", rung="reboot-node") is True
    deadlines = {
        action: (k8s.get("jobs", job_name(action, "pc-12", NODE, rung), "pitcrew-jobs") or {})["spec"].get(
            "activeDeadlineSeconds"
        )
        for action, rung in (
            ("reset_gpu", "reset-gpu"),
            ("reboot", "reboot-node"),
            ("validation", "reboot-node"),
        )
    }
    assert deadlines == {"reset_gpu": 3600, "reboot": None, "validation": 3600}


async def test_a_reset_runs_on_a_node_another_tool_quarantined_with_a_no_execute_taint(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator, template: Path
) -> None:
    """A node under repair may carry another tool's ``NoExecute`` taint (a health checker's
    quarantine). The kubelet refuses a pod bound to it that does not tolerate that taint
    (``nodeName`` skips only the scheduler): the repair Job tolerates every ``NoExecute`` taint."""
    node = k8s.get("nodes", NODE)
    assert node is not None
    node["spec"].setdefault("taints", []).append(
        {"key": "health.example.com/quarantine", "value": "gpu", "effect": "NoExecute"}
    )
    cluster = make_cluster(jobs={"reset_gpu_template": template})
    await cluster.reset_gpu(NODE, ["0"], incident_id="pc-13", rung="reset-gpu")
    job = k8s.get("jobs", job_name("reset_gpu", "pc-13", NODE, "reset-gpu"), "pitcrew-jobs")
    assert job is not None and job["status"]["succeeded"] == 1
    assert {"operator": "Exists", "effect": "NoExecute"} in job["spec"]["template"]["spec"]["tolerations"]


async def test_a_template_that_no_longer_reads_as_a_job_fails_its_action_only(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator, template: Path
) -> None:
    cluster = make_cluster(jobs={"reset_gpu_template": template})
    template.write_text("")  # emptied after the configuration was loaded
    with pytest.raises(PermanentError, match=r"kubernetes\.jobs\.reset_gpu_template: .* is empty") as err:
        await cluster.reset_gpu(NODE, ["0"], incident_id="pc-9")
    assert err.value.reason == "misconfigured"
    assert not [e for e in k8s.log if e.resource == "jobs"]  # nothing sent
    await cluster.cordon(NODE, incident_id="pc-9", reason="xid 79")  # the rest of the cluster works
    node = k8s.get("nodes", NODE)
    assert node is not None and node["spec"]["unschedulable"] is True


async def test_a_null_restart_policy_is_sent_as_never(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator, tmp_path: Path
) -> None:
    path = tmp_path / "reset.yaml"
    pod = {**TEMPLATE["spec"]["template"]["spec"], "restartPolicy": None}
    path.write_text(yaml.safe_dump({"spec": {"template": {"spec": pod}}}))
    cluster = make_cluster(jobs={"reset_gpu_template": path})
    await cluster.reset_gpu(NODE, ["0"], incident_id="pc-10")
    job = k8s.get("jobs", job_name("reset_gpu", "pc-10", NODE, ""), "pitcrew-jobs")
    assert (
        job is not None
        and job["status"]["succeeded"] == 1
        and job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    )


async def test_after_a_reboot_only_a_new_boot_counts_as_back(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator, template: Path
) -> None:
    k8s.reboot_job_reports_success = True  # leniency: a reboot scheduled after the Job's pod exits
    k8s.reboot_delay = 2.5  # after the Job is seen done (read every second)
    cluster = make_cluster(jobs={"reboot_template": template})
    before = k8s.get("nodes", NODE)["status"]["nodeInfo"]["bootID"]  # type: ignore[index]
    read_first = await cluster.replacement_handle(NODE, strategy="reboot")
    assert read_first is not None and f"boot={before}" in read_first
    handle = await cluster.reboot(NODE, incident_id="pc-00042")
    assert handle.startswith("reboot node/gpu-node-02 ") and f"boot={before}" in handle
    assert await cluster.successor(NODE, handle=handle) is None  # still Ready, but not rebooted yet
    deadline = asyncio.get_running_loop().time() + 30
    while (back := await cluster.successor(NODE, handle=handle)) is None:
        assert asyncio.get_running_loop().time() < deadline, "the rebooted node never came back"
        await asyncio.sleep(0.1)
    assert back.name == NODE
    assert k8s.get("nodes", NODE)["status"]["nodeInfo"]["bootID"] != before  # type: ignore[index]


async def test_a_job_pod_pod_security_refuses_is_named_not_waited_out(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator, template: Path
) -> None:
    # The Jobs' namespace enforces "restricted" (as pitcrew's own does, deploy/kubernetes/namespace.yaml):
    # the Job is created, its privileged hostPID pod never is. A budget of 30 s: the cause is named long before.
    k8s.set_pod_security("pitcrew-jobs", "restricted")
    cluster = make_cluster(jobs={"reset_gpu_template": template, "timeout": "30s"})
    with pytest.raises(PermanentError, match=r'violates PodSecurity "restricted:latest": privileged') as err:
        await cluster.reset_gpu(NODE, ["3"], incident_id="pc-00042")
    assert err.value.reason == "job_failed" and "host namespaces (hostPID=true)" in str(err.value)
    assert k8s.get("jobs", job_name("reset_gpu", "pc-00042", NODE, ""), "pitcrew-jobs") is not None
    assert not [k for k in k8s.objects if k[0] == "pods" and k[1] == "pitcrew-jobs"]


async def test_a_job_with_retries_is_judged_by_its_terminal_condition(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator, tmp_path: Path
) -> None:
    path = tmp_path / "retrying.yaml"
    path.write_text(yaml.safe_dump({**TEMPLATE, "spec": {**TEMPLATE["spec"], "backoffLimit": 2}}))
    cluster = make_cluster(jobs={"reset_gpu_template": path})
    retried = job_name("reset_gpu", "pc-1", NODE, "")
    k8s.job_exit_codes[retried] = [1, 0]  # the first pod fails, the second succeeds
    k8s.job_duration = 1.5  # each pod outlives a poll: the first failure is seen before the verdict
    await cluster.reset_gpu(NODE, ["3"], incident_id="pc-1")
    job = k8s.get("jobs", retried, "pitcrew-jobs")
    assert job is not None and job["status"]["failed"] == 1 and job["status"]["succeeded"] == 1
    k8s.job_exit_codes[job_name("reset_gpu", "pc-2", NODE, "")] = 4
    with pytest.raises(PermanentError, match=r"BackoffLimitExceeded.*exited 4"):
        await cluster.reset_gpu(NODE, ["3"], incident_id="pc-2")
    assert k8s.get("jobs", job_name("reset_gpu", "pc-2", NODE, ""), "pitcrew-jobs")["status"]["failed"] == 3  # type: ignore[index]


async def test_a_reboot_that_takes_its_own_job_down_counts_once_the_boot_id_changed(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator, template: Path
) -> None:
    cluster = make_cluster(jobs={"reboot_template": template})
    before = k8s.get("nodes", NODE)["status"]["nodeInfo"]["bootID"]  # type: ignore[index]
    handle = await cluster.reboot(NODE, incident_id="pc-00042")
    job = k8s.get("jobs", job_name("reboot", "pc-00042", NODE, ""), "pitcrew-jobs")
    assert job is not None and "Failed" in [c["type"] for c in job["status"]["conditions"]]
    back = await cluster.successor(NODE, handle=handle)
    assert back is not None and back.name == NODE
    assert k8s.get("nodes", NODE)["status"]["nodeInfo"]["bootID"] != before  # type: ignore[index]
