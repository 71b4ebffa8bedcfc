"""docker-compose.yml starts the whole platform. No Docker engine here: the file is parsed, and what it names
(commands, settings, the model version, ports) is checked against the code, so a rename breaks this test."""
from __future__ import annotations

import yaml

from ledgerlm.cli.main import build_parser
from ledgerlm.model_pull import KNOWN_MODELS
from plumbing.settings import REPO_ROOT, Settings

ROLE_SERVICES = {"controller-1", "controller-2", "worker-1", "projector-1", "projector-2", "gateway-1", "gateway-2",
                 "intake-1"}


def compose() -> dict:
    return yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())


def test_every_role_runs_two_of_each_stateless_one_after_the_setup_completed():
    services = compose()["services"]

    assert set(services) == {"kafka", "postgres", "setup"} | ROLE_SERVICES
    for name in ROLE_SERVICES:
        assert services[name]["depends_on"] == {"setup": {"condition": "service_completed_successfully"}}, name
        assert services[name]["command"][0] == {"controller": "controller", "worker": "worker", "intake": "intake",
                                                "projector": "project", "gateway": "gateway"}[name.split("-")[0]]
    assert services["setup"]["depends_on"] == {"kafka": {"condition": "service_healthy"},
                                               "postgres": {"condition": "service_healthy"}}
    assert sorted(services[g]["ports"][0] for g in ("gateway-1", "gateway-2")) == ["8080:8080", "8081:8080"]


def test_role_commands_parse_and_name_the_model_the_setup_pulls():
    services = compose()["services"]
    parser = build_parser()
    for name in ROLE_SERVICES:
        parser.parse_args(services[name]["command"])  # SystemExit on an unknown option or command
    worker = parser.parse_args(services["worker-1"]["command"])
    assert worker.model_version == KNOWN_MODELS["smollm2-135m-instruct"].version
    assert "models pull smollm2-135m-instruct" in services["setup"]["command"][0]


def test_every_setting_in_the_environment_is_one_the_roles_read_and_the_id_secret_is_required():
    env = compose()["services"]["gateway-1"]["environment"]
    fields = {f"LEDGERLM_{name.upper()}" for name in Settings.model_fields}

    assert {name for name in env if name.startswith("LEDGERLM_")} - fields == set()
    assert env["LEDGERLM_GENERATION_ID_SECRET"].startswith("${LEDGERLM_GENERATION_ID_SECRET:?")
    assert env["LEDGERLM_KAFKA_BOOTSTRAP"] == "kafka:19092"
    assert "DOCKER://kafka:19092" in compose()["services"]["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
