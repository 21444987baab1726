"""The REST backend against a wire-level slurmrestd stand-in (aiohttp on loopback).

The real 22.05 server is exercised in the other ``test_slurm_*`` files; this one covers what
22.05 cannot show. Cases:
* a v0.0.38 server (its real OpenAPI document): node updates go to the scontrol fallback,
  nothing is POSTed; requeue always goes to the fallback;
* a v0.0.40 server: node updates are POSTed as ``update_node_msg`` (state list + reason);
  state lists and time structs are read;
* the JWT is re-read when its file changes, also when it is rotated during a request; a
  refused token is permanent, answered 401, 500 with Slurm's authentication error (23.11) or
  511 (24.05.5+); the token never appears in errors or logs;
* HTTP 500 / connection refused are transient; unknown node is permanent (23.11+: a query that
  found nothing), unknown job None; a RESUME of a node no longer DOWN or DRAIN, refused by
  Slurm, is done, by one rule whether the refusal is read (24.11) or lost (26.05.5);
* with the leader's fence, no change leaves once the lease may have lapsed; reads still go;
* a v0.0.45 server (26.05) requeues over REST (a ``GET`` that changes, fenced as a change); a
  requeue asked again is done, an unknown job permanent; a job Slurm will not requeue
  (``--no-requeue``, ``srun``) is refused as ``not_requeueable``, its answer lost and the job read
  back;
* 26.05.5 follows every error answer with a second one on the same connection, which aiohttp
  cannot read (the stand-in frames them byte for byte as the captures show): a change whose
  answer is lost is read back (a RESUME of a node in service is done, an update of an unknown node
  permanent, a DOWN that did not hold transient, never a node someone else downed taken for
  pitcrew's), a job Slurm forgot is looked up in its jobs list (``None``), and a request whose
  refused token's answer is lost goes again at once if the token file changed meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from bot.engine.errors import PermanentError, Reason, TransientError
from bot.integrations.slurm import RestScheduler, ScontrolScheduler
from bot.store.base import Deposed
from bot.store.lease import Fence
from proving_ground.proc import free_port
from tests.harness.slurmrestd import (
    SECRET,
    V38_DOC,
    V40_DOC,
    V45_DOC,
    WIRE,
    FakeSlurmrestd,
    framed_2605,
    unframe_2605,
)


class RecordingFallback(ScontrolScheduler):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, ...]] = []

    async def down(self, name: str, reason: str) -> None:
        self.calls.append(("down", name, reason))

    async def drain(self, name: str, reason: str) -> None:
        self.calls.append(("drain", name, reason))

    async def resume(self, name: str) -> None:
        self.calls.append(("resume", name))

    async def requeue(self, job_id: str) -> None:
        self.calls.append(("requeue", job_id))


async def _serve(fake: FakeSlurmrestd) -> AsyncIterator[TestServer]:
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    yield server
    await server.close()


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(f"SLURM_JWT={SECRET}\n")
    return path


def _rest(
    server: TestServer,
    token_file: Path,
    fallback: ScontrolScheduler | None = None,
    fence: Fence | None = None,
) -> RestScheduler:
    url = str(server.make_url("/")).rstrip("/")
    return RestScheduler(
        url=url, user="root", token_file=token_file, fallback=fallback or RecordingFallback(), fence=fence
    )


def _fence(now: list[float]) -> Fence:
    """A leader's fence on the clock ``now[0]``: held until 10 s."""
    fence = Fence("leader-a", monotonic=lambda: now[0])
    fence.grant(1, valid_until=10.0)
    return fence


async def test_v0038_server_falls_back_to_scontrol_for_node_updates(token_file: Path) -> None:
    fake, fallback = FakeSlurmrestd(V38_DOC), RecordingFallback()
    async for server in _serve(fake):
        rest = _rest(server, token_file, fallback)
        try:
            assert await rest.node_update_path() == "scontrol"
            await rest.down("gpu-001", "pitcrew: inc-1 XID 79")
            await rest.resume("gpu-001")
            await rest.requeue("1")
            assert [j.job_id for j in await rest.jobs_on_node("gpu-001")] == ["1"]
        finally:
            await rest.aclose()
    assert fake.posts == []
    assert fallback.calls == [
        ("down", "gpu-001", "pitcrew: inc-1 XID 79"),
        ("drain", "gpu-001", "pitcrew: inc-1 XID 79"),  # the DOWN's DRAIN (ReturnToService=2)
        ("resume", "gpu-001"),
        ("requeue", "1"),
    ]


async def test_v0040_server_takes_node_updates(token_file: Path) -> None:
    fake = FakeSlurmrestd(V40_DOC)
    async for server in _serve(fake):
        rest = _rest(server, token_file)
        try:
            assert (await rest.api()).version == "v0.0.40"
            await rest.drain("gpu-001", "pitcrew: inc-2\nXID 48")
            assert (await rest.node("gpu-001")).states == {"IDLE", "DRAIN"}  # drained, as slurmctld says
            await rest.resume("gpu-001")
            # Again, the node in service: Slurm refuses the RESUME (2028, HTTP 500), the wanted state.
            await rest.resume("gpu-001")
        finally:
            await rest.aclose()
    assert fake.posts == [
        ("/slurm/v0.0.40/node/gpu-001", {"state": ["DRAIN"], "reason": "pitcrew: inc-2 XID 48"}),
        ("/slurm/v0.0.40/node/gpu-001", {"state": ["RESUME"]}),
        ("/slurm/v0.0.40/node/gpu-001", {"state": ["RESUME"]}),
    ]


async def test_a_fenced_client_sends_no_change_once_the_lease_may_have_lapsed(token_file: Path) -> None:
    """``pitcrew serve`` fences its REST client (``bot.integrations.fenced``): a change asks the
    leader's fence once its connection is held. While the lease holds a drain is POSTed; once it
    may have lapsed by the process's clock the resume raises ``Deposed`` unsent, and so does a
    requeue, though v0.0.45's is a ``GET`` (fenced as the change it is); reads still go."""
    now = [0.0]
    fence = _fence(now)
    fake = FakeSlurmrestd(V45_DOC)
    async for server in _serve(fake):
        rest = _rest(server, token_file, fence=fence)
        try:
            await rest.drain("gpu-001", "pitcrew: inc-2 XID 48")
            now[0] = 11.0
            with pytest.raises(Deposed, match="may have lapsed"):
                await rest.resume("gpu-001")
            with pytest.raises(Deposed, match="may have lapsed"):
                await rest.requeue("1")
            fence.revoke()
            assert (await rest.node("gpu-001")).states == {"IDLE", "DRAIN"}  # drained, as slurmctld says
        finally:
            await rest.aclose()
    assert fake.posts == [
        ("/slurm/v0.0.45/node/gpu-001", {"state": ["DRAIN"], "reason": "pitcrew: inc-2 XID 48"}),
    ]
    assert fake.requeues == []


async def test_v0045_server_requeues_over_rest_and_a_requeue_asked_again_is_done(token_file: Path) -> None:
    """26.05's v0.0.45 requeues a job (a ``GET``): the running job is requeued there, not through
    scontrol; asked again while it waits requeued (422, "Job is pending execution") it is done; a
    job Slurm does not know is a permanent error naming it so."""
    fake, fallback = FakeSlurmrestd(V45_DOC), RecordingFallback()
    async for server in _serve(fake):
        rest = _rest(server, token_file, fallback)
        try:
            assert (await rest.api()).job_requeue
            await rest.requeue("1")
            await rest.requeue("1")
            with pytest.raises(PermanentError) as unknown:
                await rest.requeue("999999")
            assert unknown.value.reason == "unknown_job"
        finally:
            await rest.aclose()
    assert fake.requeues == ["1", "1", "999999"] and fallback.calls == []


@pytest.mark.parametrize(("job", "meaning"), [("no-requeue", "--no-requeue"), ("srun", "not a batch job")])
async def test_v0045_server_refuses_to_requeue_a_job_it_will_not_requeue(
    token_file: Path, job: str, meaning: str
) -> None:
    fake, fallback = FakeSlurmrestd(V45_DOC, job=job), RecordingFallback()
    async for server in _serve(fake):
        rest = _rest(server, token_file, fallback)
        try:
            with pytest.raises(PermanentError) as refused:
                await rest.requeue("1")
            assert refused.value.reason == Reason.NOT_REQUEUEABLE
            assert "job 1" in str(refused.value) and meaning in str(refused.value), refused.value
            running = await rest.job("1")
            assert running is not None and running.running and running.not_requeueable
        finally:
            await rest.aclose()
    assert fake.requeues == ["1"] and fallback.calls == []


async def test_token_rotation_and_secrecy(token_file: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    fake = FakeSlurmrestd(V40_DOC)
    async for server in _serve(fake):
        rest = _rest(server, token_file)
        try:
            await rest.node("gpu-001")
            fake.rotate_to = (token_file, "rotated-token")  # rotated while the request is in flight
            assert (await rest.node("gpu-001")).name == "gpu-001"
            fake.token = "someone-else's"  # slurmctld refuses it: 500 on 23.11, 511 from 24.05.5
            with pytest.raises(PermanentError) as refused:
                await rest.node("gpu-001")
            assert refused.value.reason == "unauthorized"
            fake.refusal_status = 511
            with pytest.raises(PermanentError) as refused:
                await rest.node("gpu-001")
            assert refused.value.reason == "unauthorized"
            token_file.write_text("someone-else's\n")  # a new file is read on the next call
            assert (await rest.node("gpu-001")).name == "gpu-001"
            fake.rotate_to = (token_file, "rotated-again")  # rotated while a 511 is answered
            assert (await rest.node("gpu-001")).name == "gpu-001"
        finally:
            await rest.aclose()
    assert SECRET not in str(refused.value)
    assert "rotated-token" not in str(refused.value)
    assert all(SECRET not in r.getMessage() and "rotated" not in r.getMessage() for r in caplog.records)


async def test_errors_map_to_transient_or_permanent(token_file: Path) -> None:
    fake = FakeSlurmrestd(V40_DOC)
    async for server in _serve(fake):
        rest = _rest(server, token_file)
        try:
            assert await rest.job("999") is None
            with pytest.raises(PermanentError) as unknown:
                await rest.node("gpu-404")
            assert unknown.value.reason == "unknown_node"
            fake.fail_with_500 = True  # what 22.05 answers while slurmctld is down
            with pytest.raises(TransientError) as down:
                await rest.node("gpu-001")
            assert down.value.reason == Reason.UNAVAILABLE
        finally:
            await rest.aclose()
    nowhere = RestScheduler(
        url=f"http://127.0.0.1:{free_port()}",
        user="root",
        token_file=token_file,
        fallback=RecordingFallback(),
    )
    try:
        with pytest.raises(TransientError) as refused:
            await nowhere.node("gpu-001")
        assert refused.value.reason == Reason.UNREACHABLE
    finally:
        await nowhere.aclose()


@pytest.mark.parametrize("status", [500, 422])
async def test_a_controller_in_standby_is_waited_for(token_file: Path, status: int) -> None:
    """During slurmctld's HA takeover the backup answers every request with "backup controller in
    standby mode" (2027): 24.11 as HTTP 500, 26.05 as 422 like every slurmctld error. Either is the
    controller not there yet, for the step to try again, never a refusal a human must read."""
    fake = FakeSlurmrestd(V40_DOC, standby_status=status)
    async for server in _serve(fake):
        rest = _rest(server, token_file)
        try:
            with pytest.raises(TransientError) as read:
                await rest.node("gpu-001")
            with pytest.raises(TransientError) as down:
                await rest.down("gpu-001", "pitcrew: inc-1 XID 79")
            assert read.value.reason == down.value.reason == Reason.UNAVAILABLE
        finally:
            await rest.aclose()


@pytest.mark.parametrize("case", sorted(path.stem for path in WIRE.glob("*.http")))
def test_the_stand_in_frames_an_error_as_2605_does(case: str) -> None:
    """Each captured error answer of the real 26.05.5 (``wire/<case>.http``) is its JSON answer and
    a second answer after it; ``framed_2605`` writes exactly those bytes from the status, the JSON
    and the text of the second."""
    captured = (WIRE / f"{case}.http").read_bytes()
    answer = unframe_2605(captured)
    assert captured.count(b"HTTP/1.1 ") == 2
    assert framed_2605(answer.status, answer.body, answer.text.decode()) == captured


async def test_2605_error_answers_lost_are_read_back(token_file: Path) -> None:
    fake = FakeSlurmrestd(V45_DOC)
    async for server in _serve(fake):
        rest = _rest(server, token_file)
        try:
            await rest.down("gpu-001", "pitcrew: inc-3 XID 79")
            await rest.resume("gpu-001")
            await rest.resume("gpu-001")  # in service: 422 (2180), its answer lost, read back: done
            with pytest.raises(PermanentError) as unknown:
                await rest.down("gpu-404", "pitcrew: inc-3 XID 79")
            assert unknown.value.reason == "unknown_node"
            assert await rest.job("999999") is None  # 404 lost: not among the jobs listed
            # Downed by someone else, then pitcrew's DOWN refused with its answer lost: the node
            # reads DOWN, but not with pitcrew's reason, so the step has not happened.
            fake.node_state, fake.node_reason = ["DOWN"], "disk swap (alice)"
            fake.fail_updates = True
            with pytest.raises(TransientError) as lost:
                await rest.down("gpu-001", "pitcrew: inc-4 XID 79")
            assert lost.value.reason == Reason.BAD_RESPONSE
            assert (await rest.node("gpu-001")).reason == "disk swap (alice)"
        finally:
            await rest.aclose()
    posts = [body["state"] for _, body in fake.posts]
    assert posts == [["DOWN"], ["DRAIN"], ["RESUME"], ["RESUME"], ["DOWN"], ["DOWN"]]


async def test_2605_a_token_slurmctld_refuses_is_named_by_the_probe(token_file: Path) -> None:
    """26.05.5 answers a refused token with 511 and a second answer (``wire/token-refused.http``):
    unreadable, so which error it was is lost, and ``check-config --live`` names what to check."""
    fake = FakeSlurmrestd(V45_DOC, token="a-token-slurmctld-issued")
    async for server in _serve(fake):
        rest = _rest(server, token_file)
        try:
            probe = await rest.probe()
        finally:
            await rest.aclose()
    assert not probe.ok
    assert probe.missing == (
        "slurmctld reachable through slurmrestd, with a token it accepts (slurm.rest_token_file)",
    )
    assert SECRET not in probe.detail


@pytest.mark.parametrize("doc", [V40_DOC, V45_DOC], ids=["v0.0.40", "v0.0.45"])
async def test_a_refused_resume_takes_one_rule_whatever_the_answer(
    token_file: Path, doc: dict[str, object]
) -> None:
    """A RESUME is done once the node is no longer DOWN or DRAIN (``SlurmNodeState.taken_out``),
    whether Slurm's refusal is read (24.11: 500, 2028) or lost (26.05.5: read back): a node whose
    slurmd does not answer (IDLE+NOT_RESPONDING) has nothing of pitcrew's left to undo, and the
    return step waits for it in service; a node still DRAIN is not resumed."""
    fake = FakeSlurmrestd(doc)
    async for server in _serve(fake):
        rest = _rest(server, token_file)
        try:
            fake.node_state = ["IDLE", "NOT_RESPONDING"]
            await rest.resume("gpu-001")
            fake.node_state, fake.node_reason = ["IDLE", "DRAIN"], "pitcrew: inc-5 XID 79"
            fake.fail_updates = True
            with pytest.raises(TransientError):  # Slurm's failure: the step tries again
                await rest.resume("gpu-001")
        finally:
            await rest.aclose()
    assert [body["state"] for _, body in fake.posts] == [["RESUME"], ["RESUME"]]


async def test_2605_a_token_rotated_while_its_refusal_is_lost_is_tried_at_once(
    token_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """26.05.5's answer to a refused token is unreadable (``wire/token-refused.http``), so the
    refusal cannot be told from any other lost error: when the token file changed meanwhile, the
    request goes again at once with the new token, as a readable refusal's does (24.05.5+: 511),
    instead of failing the step's attempt. A change sent again this way was refused the first
    time: nothing was done twice."""
    caplog.set_level(logging.DEBUG)
    fake = FakeSlurmrestd(V45_DOC)
    async for server in _serve(fake):
        rest = _rest(server, token_file)
        try:
            fake.rotate_to = (token_file, "rotated-token")  # rotated while the request is in flight
            assert (await rest.node("gpu-001")).name == "gpu-001"
            fake.rotate_to = (token_file, "rotated-again")
            await rest.down("gpu-001", "pitcrew: inc-6 XID 79")
            assert fake.node_state == ["DOWN", "DRAIN"]
            fake.token = "someone-else's"  # refused, the file unchanged: the attempt fails
            with pytest.raises(TransientError) as lost:
                await rest.node("gpu-001")
            assert lost.value.reason == Reason.BAD_RESPONSE
        finally:
            await rest.aclose()
    posts = [body["state"] for _, body in fake.posts]
    assert posts == [["DOWN"], ["DRAIN"]]  # the refused one never reached it
    assert len(fake.connections) == 6  # two requests, each twice; the DOWN's DRAIN and the last once
    assert all("rotated" not in r.getMessage() and SECRET not in r.getMessage() for r in caplog.records)
