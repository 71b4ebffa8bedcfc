"""`ledgerlm up --gateways N --workers N --controllers N --projectors N`: names, ports and ids of the processes."""
from __future__ import annotations

import itertools

import pytest

from ledgerlm.stack_roles import PortPicker, RoleCounts, kind_of, plan_roles, stop_order
from plumbing.settings import Settings


def make_picker(taken: set[int] = frozenset()) -> PortPicker:
    ephemeral = itertools.count(40000)
    return PortPicker(is_free=lambda port: port not in taken, any_port=lambda: next(ephemeral))


def test_two_of_each_role_get_distinct_names_ports_and_worker_ids_and_the_first_gateway_keeps_8080():
    roles = plan_roles(Settings(gateway_port=8080), RoleCounts(2, 2, 2, 2), "m@1", make_picker())

    assert [(r.name, r.port) for r in roles] == [
        ("controller-1", 9100), ("controller-2", 9101), ("worker-1", 9200), ("worker-2", 9201),
        ("projector-1", 9300), ("projector-2", 9301), ("gateway-1", 8080), ("gateway-2", 8081), ("intake-1", 9400)]
    assert [r.args for r in roles if r.kind == "worker"] == [
        ("worker", "--model-version", "m@1", "--worker-id", "local-worker-1"),
        ("worker", "--model-version", "m@1", "--worker-id", "local-worker-2")]
    assert [r.args for r in roles if r.kind == "gateway"] == [("gateway", "--port", "8080"),
                                                              ("gateway", "--port", "8081")]
    assert roles[1].env == {"LEDGERLM_CONTROLLER_METRICS_PORT": "9101"}
    assert roles[-1].args == ("intake", "--index", "0") and roles[-1].env == {"LEDGERLM_INTAKE_METRICS_PORT": "9400"}
    assert [r.ready_log for r in roles[::2]] == ["controller owns partitions", "worker ready", None, None,
                                                 "intake started"]
    assert [r.name for r in plan_roles(Settings(), RoleCounts(intakes=0), "m@1", make_picker())] == [
        "controller-1", "worker-1", "projector-1", "gateway-1"]


def test_a_taken_preferred_port_is_replaced_by_a_free_one_never_used_twice():
    picker = make_picker(taken={8081, 9100})
    roles = plan_roles(Settings(gateway_port=8080, projector_metrics_port=8080), RoleCounts(2, 1, 1, 2), "m@1",
                       picker)

    ports = {r.name: r.port for r in roles}
    assert ports == {"controller-1": 40000, "worker-1": 9200, "projector-1": 8080, "projector-2": 40001,
                     "gateway-1": 40002, "gateway-2": 40003, "intake-1": 9400}
    assert len(set(ports.values())) == len(ports)


@pytest.mark.parametrize("counts, least", [(dict(gateways=0), 1), (dict(workers=17), 1), (dict(controllers=-1), 1),
                                           (dict(intakes=-1), 0)])
def test_a_count_outside_its_range_is_an_error_naming_the_option(counts, least):
    with pytest.raises(ValueError, match=f"--{next(iter(counts))} must be between {least} and 16"):
        RoleCounts(**counts)


def test_down_stops_gateways_first_and_controllers_last_and_reads_names_of_older_stack_files():
    names = ["controller-1", "worker-2", "gateway-1", "projector-1", "controller-2", "gateway-2", "worker-1",
             "intake-1"]
    assert stop_order(names) == ["intake-1", "gateway-1", "gateway-2", "projector-1", "worker-1", "worker-2",
                                 "controller-1", "controller-2"]
    assert [kind_of(name) for name in ("gateway", "gateway-12", "worker-3")] == ["gateway", "gateway", "worker"]


def test_exporters_run_only_when_asked_one_per_sink_last_to_start_and_first_to_stop():
    assert "export" not in {r.kind for r in plan_roles(Settings(), RoleCounts(), "m@1", make_picker())}
    roles = plan_roles(Settings(), RoleCounts(exports=("kafka", "stripe")), "m@1", make_picker(taken={9500}))
    exporters = [(r.name, r.args, r.port, r.env, r.ready_log) for r in roles if r.kind == "export"]
    assert exporters == [
        ("export-kafka", ("export", "--sink", "kafka"), 40000, {"LEDGERLM_EXPORT_METRICS_PORT": "40000"},
         "metrics listening"),
        ("export-stripe", ("export", "--sink", "stripe"), 9501, {"LEDGERLM_EXPORT_METRICS_PORT": "9501"},
         "metrics listening")]
    assert [r.kind for r in roles][-2:] == ["export", "export"]
    assert kind_of("export-openmeter") == "export"
    assert stop_order(["gateway-1", "export-kafka", "controller-1"]) == ["export-kafka", "gateway-1", "controller-1"]
    for exports in (("kafka", "kafka"), ("ledger",)):
        with pytest.raises(ValueError, match="--export takes each of kafka, openmeter, stripe, lago at most once"):
            RoleCounts(exports=exports)
