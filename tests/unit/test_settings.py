"""Settings are the domain's models: one mode normaliser, no copy step, errors that name the key.

Cases: every spelling of a mode in ``mode``, ``playbook_modes``, ``PITCREW_MODE`` and
``PITCREW_PLAYBOOK_MODES`` (and the cross-check that reads the normalised value); an unknown
mode listing the valid ones; ``Settings`` is a ``Policy``, ``labels`` a ``LabelRules`` and
``slurm`` a ``NodeMapping`` — the objects the engine reads are the validated settings
themselves, and every field those models declare is a configuration key; the node-mapping
keys by their configured names (YAML and env), the attribute names refused as keys;
invalid values rejected with the dotted key in the message; unauthenticated reads only on a
loopback listen; an unreadable read token file named by its key.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.config import ConfigError, Settings, SlurmSettings, load_config
from bot.domain.labels import LabelRules
from bot.domain.nodemap import NodeMapping
from bot.domain.playbooks import Playbook, PlaybookOverride
from bot.domain.policy import (
    ApprovalPolicy,
    BreakerPolicy,
    EscalationPolicy,
    GuardPolicy,
    LemonPolicy,
    Mode,
    Policy,
)

SPELLINGS = [
    ("observe", Mode.OBSERVE),
    ("OBSERVE", Mode.OBSERVE),
    ("approve", Mode.APPROVE),
    ("APPROVE", Mode.APPROVE),
    ("Approve", Mode.APPROVE),
    ("auto", Mode.AUTO),
    ("Auto", Mode.AUTO),
    ("aUtO", Mode.AUTO),
]
VALID_MODES = "Input should be 'observe', 'approve' or 'auto'"


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("PITCREW_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PITCREW_STORE__PATH", str(tmp_path / "none.db"))


def from_yaml(tmp_path: Path, text: str) -> Settings:
    path = tmp_path / "pitcrew.yaml"
    path.write_text(text)
    return load_config(path).settings


def refusal(tmp_path: Path, text: str) -> str:
    path = tmp_path / "pitcrew.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    return str(caught.value)


# -- one normaliser for modes ------------------------------------------------------------


@pytest.mark.parametrize(("spelling", "mode"), SPELLINGS)
def test_mode_accepts_any_case(spelling: str, mode: Mode) -> None:
    assert Mode(spelling) is mode


@pytest.mark.parametrize(("spelling", "mode"), SPELLINGS)
def test_mode_key_in_yaml(tmp_path: Path, spelling: str, mode: Mode) -> None:
    settings = from_yaml(tmp_path, f"mode: {spelling}\napprovals: {{approvers: [alice]}}\n")
    assert settings.mode is mode


@pytest.mark.parametrize(("spelling", "mode"), SPELLINGS)
def test_playbook_modes_in_yaml(tmp_path: Path, spelling: str, mode: Mode) -> None:
    settings = from_yaml(
        tmp_path, f"playbook_modes: {{replace-node: {spelling}}}\napprovals: {{approvers: [a]}}\n"
    )
    assert settings.playbook_modes == {"replace-node": mode}
    assert settings.mode_for("replace-node") is mode
    assert settings.mode_for("reset-gpu") is Mode.OBSERVE


@pytest.mark.parametrize(("spelling", "mode"), SPELLINGS)
def test_mode_from_the_environment(monkeypatch: pytest.MonkeyPatch, spelling: str, mode: Mode) -> None:
    monkeypatch.setenv("PITCREW_MODE", spelling)
    monkeypatch.setenv("PITCREW_PLAYBOOK_MODES", f'{{"reset-gpu": "{spelling}"}}')
    monkeypatch.setenv("PITCREW_APPROVALS__APPROVERS", '["alice"]')
    policy = load_config().policy
    assert policy.mode is mode
    assert policy.mode_for("reset-gpu") is mode


def test_the_domain_model_normalises_too() -> None:
    policy = Policy.model_validate({"mode": "AUTO", "playbook_modes": {"replace-node": "APPROVE"}})
    assert (policy.mode, policy.mode_for("replace-node")) == (Mode.AUTO, Mode.APPROVE)


def test_an_upper_case_approve_still_needs_approvers(tmp_path: Path) -> None:
    # The cross-check sees the normalised mode, whichever key it came from.
    assert "approvals.approvers: mode approve needs" in refusal(tmp_path, "mode: APPROVE\n")
    assert "approvals.approvers: mode approve needs" in refusal(
        tmp_path, "playbook_modes: {replace-node: Approve}\n"
    )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("mode: sometimes\n", f"mode: {VALID_MODES}"),
        ("mode: 3\n", f"mode: {VALID_MODES}"),
        ("playbook_modes: {replace-node: often}\n", f"playbook_modes.replace-node: {VALID_MODES}"),
    ],
)
def test_an_unknown_mode_lists_the_valid_ones(tmp_path: Path, text: str, says: str) -> None:
    assert says in refusal(tmp_path, text)


def test_an_unknown_mode_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PITCREW_MODE", "sometimes")
    with pytest.raises(ConfigError, match=f"^mode: {VALID_MODES}$"):
        load_config()
    with pytest.raises(ValueError, match="'sometimes' is not a valid Mode"):
        Mode("sometimes")


# -- the settings are the domain's models -------------------------------------------------


def test_the_engine_reads_the_validated_settings_themselves() -> None:
    config = load_config()
    assert isinstance(config.settings, Policy) and config.policy is config.settings
    assert config.labels is config.settings.labels
    assert isinstance(config.settings.slurm, NodeMapping)
    assert config.settings.slurm.mapping() is config.settings.slurm


def test_the_settings_fields_are_the_domain_classes() -> None:
    # A field added to one of these domain models is configurable without touching bot.config.
    assert issubclass(Settings, Policy)
    assert Settings.model_fields["labels"].annotation is LabelRules
    assert issubclass(SlurmSettings, NodeMapping)
    for model, settings in ((Policy, Settings), (NodeMapping, SlurmSettings)):
        for name, field in model.model_fields.items():
            assert settings.model_fields[name].annotation == field.annotation, name
            assert settings.model_fields[name].alias == field.alias, name


#: One non-default value per field each domain model declares, as written in YAML.
POLICY_KEYS = {
    "mode": ("auto", Mode.AUTO),
    "playbook_modes": ("{reset-gpu: OBSERVE}", {"reset-gpu": Mode.OBSERVE}),
    "escalation": (
        "{window: 2h, ladder: [reboot-node]}",
        EscalationPolicy(window=timedelta(hours=2), ladder=("reboot-node",)),
    ),
    "lemon": ("{incidents: 4, window: 3d}", LemonPolicy(incidents=4, window=timedelta(days=3))),
    "guards": ("{breaker: {max_nodes: 9}}", GuardPolicy(breaker=BreakerPolicy(max_nodes=9))),
    "approvals": (
        "{approvers: [bob], timeout: 5m}",
        ApprovalPolicy(approvers=("bob",), timeout=timedelta(minutes=5)),
    ),
}
LABEL_KEYS = {
    "node": ("[host, node]", ("host", "node")),
    "gpu": ("[minor]", ("minor",)),
    "xid": ("[code]", ("code",)),
    "xid_annotations": ("[]", ()),
}
MAPPING_KEYS = {
    "node_mapping": ("annotation", "annotation"),
    "node_mapping_key": ("slurm.example/nodes", "slurm.example/nodes"),
    "slinky_pod_selector": (
        "{app.kubernetes.io/name: slurmd, tier: gpu}",
        {"app.kubernetes.io/name": "slurmd", "tier": "gpu"},
    ),
}


def test_every_domain_field_is_a_configuration_key(tmp_path: Path) -> None:
    assert set(POLICY_KEYS) == set(Policy.model_fields)
    assert set(LABEL_KEYS) == set(LabelRules.model_fields)
    assert set(MAPPING_KEYS) == {f.alias or n for n, f in NodeMapping.model_fields.items()}
    text = "".join(f"{key}: {value}\n" for key, (value, _) in POLICY_KEYS.items())
    text += "labels:\n" + "".join(f"  {key}: {value}\n" for key, (value, _) in LABEL_KEYS.items())
    text += "slurm:\n" + "".join(f"  {key}: {value}\n" for key, (value, _) in MAPPING_KEYS.items())
    path = tmp_path / "pitcrew.yaml"
    path.write_text(text)
    config = load_config(path)
    assert {k: getattr(config.policy, k) for k in POLICY_KEYS} == {k: v for k, (_, v) in POLICY_KEYS.items()}
    assert config.labels == LabelRules(**{k: v for k, (_, v) in LABEL_KEYS.items()})
    mapping = config.settings.slurm.mapping()
    assert (mapping.mode, mapping.key, mapping.slinky_selector) == tuple(v for _, v in MAPPING_KEYS.values())
    assert (config.policy.breaker.max_nodes, config.policy.node) == (9, config.policy.guards.node)


def test_node_mapping_keys_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PITCREW_SLURM__NODE_MAPPING", "label")
    monkeypatch.setenv("PITCREW_SLURM__NODE_MAPPING_KEY", "slurm/node")
    monkeypatch.setenv("PITCREW_SLURM__SLINKY_NAMESPACE", "hpc")
    slurm = load_config().settings.slurm
    assert (slurm.mode, slurm.key, slurm.node_mapping, slurm.slinky_namespace) == (
        "label",
        "slurm/node",
        "label",
        "hpc",
    )


def test_label_rules_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PITCREW_LABELS__NODE", '["Hostname"]')
    assert load_config().labels == LabelRules(node=("Hostname",))


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("slurm: {node_mapping: label}\n", "slurm: node_mapping label needs node_mapping_key"),
        ("slurm: {node_mapping: nodeset}\n", "slurm.node_mapping: Input should be 'identity', 'label'"),
        (
            "slurm: {slinky_pod_selector: [a]}\n",
            "slurm.slinky_pod_selector: Input should be a valid dictionary",
        ),
        ("slurm: {mode: label}\n", "slurm.mode: unknown key"),  # attribute names are not keys
        ("slurm: {key: x}\n", "slurm.key: unknown key"),
        ("slurm: {backend: rest}\n", "slurm: backend rest needs rest_token_file"),
        ("labels: {node: host}\n", "labels.node: Input should be a valid tuple"),
        ("labels: {nodes: [host]}\n", "labels.nodes: unknown key"),
        (
            "guards: {node: {max_attempts: 0}}\n",
            "guards.node.max_attempts: Input should be greater than or equal to 1",
        ),
        ("guards: {breaker: {window: soon}}\n", "guards.breaker.window: 'soon' is not a duration"),
        ("breaker: {max_nodes: 1}\n", "breaker: unknown key"),  # only under guards
        ("approvals: {approver: [a]}\n", "approvals.approver: unknown key"),
        ("playbook_modes: {nonsense: auto}\n", "playbook_modes: no playbook named 'nonsense'"),
    ],
)
def test_errors_name_the_key(tmp_path: Path, text: str, says: str) -> None:
    assert says in refusal(tmp_path, text)


@pytest.mark.parametrize(
    ("listen", "refused"),
    [("127.0.0.1:9095", False), ("localhost:9095", False), ("[::1]:9095", False), ("0.0.0.0:9095", True)],
)
def test_unauthenticated_reads_only_on_loopback(tmp_path: Path, listen: str, refused: bool) -> None:
    (tmp_path / "token").write_text("t\n")
    text = (
        f"server: {{listen: '{listen}', auth: {{bearer_token_file: {tmp_path / 'token'}, "
        "allow_unauthenticated_reads: true}}\n"
    )
    if refused:
        assert "server.auth.allow_unauthenticated_reads: only on a loopback" in refusal(tmp_path, text)
    else:
        (tmp_path / "pitcrew.yaml").write_text(text)
        assert load_config(tmp_path / "pitcrew.yaml").settings.server.auth.allow_unauthenticated_reads


def test_an_unreadable_read_token_file_names_its_key(tmp_path: Path) -> None:
    text = f"server: {{auth: {{read_token_file: {tmp_path / 'missing'}}}}}\n"
    assert "server.auth.read_token_file: cannot read" in refusal(tmp_path, text)


# -- playbooks: additions whole, changes to a shipped one by the fields given ----------------


def playbooks_of(tmp_path: Path, text: str) -> dict[str, Any]:
    path = tmp_path / "pitcrew.yaml"
    path.write_text(text)
    return {name: p.model_dump() for name, p in load_config(path).playbooks.playbooks.items()}


def test_a_shipped_playbook_changed_by_one_field_keeps_its_steps(tmp_path: Path) -> None:
    shipped = playbooks_of(tmp_path, "mode: observe\n")
    changed = playbooks_of(tmp_path, "playbooks: {replace-node: {slurm_action: down}}\n")
    assert changed["replace-node"] == {**shipped["replace-node"], "slurm_action": "down"}
    assert shipped["replace-node"]["slurm_action"] == "auto" and shipped["replace-node"]["steps"]
    assert {k: v for k, v in changed.items() if k != "replace-node"} == {
        k: v for k, v in shipped.items() if k != "replace-node"
    }


def test_steps_given_replace_the_shipped_ones(tmp_path: Path) -> None:
    changed = playbooks_of(tmp_path, "playbooks: {replace-node: {steps: [notify, close]}}\n")
    assert [s["step"] for s in changed["replace-node"]["steps"]] == ["notify", "close"]
    assert changed["replace-node"]["slurm_action"] == "auto"


def test_a_new_playbook_needs_its_steps(tmp_path: Path) -> None:
    said = refusal(tmp_path, "playbooks: {site-reset: {slurm_action: down}}\n")
    assert said == "playbooks.site-reset: a new playbook needs its steps"
    added = playbooks_of(tmp_path, "playbooks: {site-reset: {steps: [notify, close]}}\n")
    assert [s["step"] for s in added["site-reset"]["steps"]] == ["notify", "close"]


def test_a_change_that_breaks_a_shipped_playbook_is_named(tmp_path: Path) -> None:
    said = refusal(tmp_path, "playbooks: {replace-node: {steps: [notify]}}\n")
    assert "playbooks.replace-node.steps" in said and "a playbook ends with 'close'" in said
    said = refusal(tmp_path, "playbooks: {replace-node: {slurm_action: sometimes}}\n")
    assert "playbooks.replace-node.slurm_action" in said


def test_a_playbook_change_takes_every_field_a_playbook_has() -> None:
    """What a change may give is what a playbook has: a field added to one (``next``, the repair
    ladder's rung) is a field a change can set."""
    assert set(PlaybookOverride.model_fields) == set(Playbook.model_fields)


def test_a_shipped_playbook_given_a_next_rung_keeps_its_steps(tmp_path: Path) -> None:
    shipped = playbooks_of(tmp_path, "mode: observe\n")
    changed = playbooks_of(tmp_path, "playbooks: {reboot-node: {next: replace-node}}\n")
    assert changed["reboot-node"] == {**shipped["reboot-node"], "next": "replace-node"}


# -- the store's URL carries no secret -----------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app:s3cret@db/app",
        "postgresql://app:@db/app",
        # libpq takes any connection keyword as a query parameter, its name percent-decoded too
        "postgresql://app@db/app?password=s3cret",
        "postgresql://app@db/app?sslmode=require&%70assword=s3cret",
        "postgres://app@db:5432,db2:5432/app?target_session_attrs=read-write&password=s3cret",
        "postgresql://app@db/app?sslpassword=key-passphrase",  # the client key's passphrase
    ],
)
def test_a_store_url_with_a_secret_is_refused(tmp_path: Path, url: str) -> None:
    says = refusal(tmp_path, f"store: {{url: '{url}'}}\n")
    assert "store.url must not carry a password: put it in store.password_file" in says
    assert "s3cret" not in says and "key-passphrase" not in says


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app@cluster-rw.db:5432/app",
        "postgres://app@db:5432,db2:5432/app?target_session_attrs=read-write",
        "postgresql://app@[::1]:5432/app?sslmode=verify-full&sslrootcert=/etc/pitcrew/ca.crt",
        "postgresql://app@db/app?passfile=/etc/pitcrew/pgpass",  # a file, as password_file is
        "postgresql:///app?host=/var/run/postgresql",
    ],
)
def test_a_store_url_without_a_secret_is_taken(tmp_path: Path, url: str) -> None:
    (tmp_path / "pitcrew.yaml").write_text(f"store: {{url: '{url}'}}\n")
    assert load_config(tmp_path / "pitcrew.yaml").settings.store.url == url
