import json

import pytest

from schemas import codec
from schemas.codec import (
    TYPE_REGISTRY, InvalidEvent, MalformedRecord, UnknownEventType, UnsupportedSchemaVersion, decode, encode,
)
from schemas.topics import COMMANDS, GENERATIONS, MODELS, TOPICS, TOKENS
from tests.factories import make_event

EVERY_TYPE = [(topic.name, model.model_fields["type"].default) for topic in TOPICS for model in topic.carries]


def test_registry_holds_every_declared_type_once():
    assert len(TYPE_REGISTRY) == len(EVERY_TYPE) == 32


@pytest.mark.parametrize(("topic", "type_name"), EVERY_TYPE)
def test_every_type_round_trips_through_bytes(topic, type_name):
    event = make_event(type_name)
    decoded = decode(topic, encode(event))
    assert decoded == event
    assert type(decoded) is type(event)


def test_events_are_frozen():
    event = make_event("Completed")
    with pytest.raises(Exception):
        event.epoch = 2  # type: ignore[misc]


def test_key_is_the_topic_key_field_and_headers_carry_epoch():
    event = make_event("TokensEmitted")
    assert codec.record_key(TOKENS, event) == event.generation_id.encode()
    assert dict(codec.record_headers(event)) == {
        "type": b"TokensEmitted", "generation-id": event.generation_id.encode(), "epoch": b"1"}
    assert codec.record_key(COMMANDS, make_event("SubmitGeneration", tenant_id="acme")) == b"acme"


def test_a_period_marker_on_the_generations_topic_is_keyed_by_its_period_and_names_no_generation():
    marker = make_event("PeriodClosed")
    assert codec.record_key(GENERATIONS, marker) == b"period:2026-11"
    assert dict(codec.record_headers(marker)) == {"type": b"PeriodClosed"}


@pytest.mark.parametrize(("field", "value"), [("period", "2026-13"), ("period", "2026-1"), ("period", "26-11"),
                                              ("partition", 6), ("partition", -1), ("partitions", 0)])
def test_a_period_marker_needs_a_month_and_a_partition_of_its_topic(field, value):
    raw = json.loads(encode(make_event("PeriodClosed")))
    with pytest.raises(InvalidEvent):
        decode(GENERATIONS, json.dumps({**raw, field: value}).encode())


def test_models_records_of_one_version_have_distinct_keys_so_compaction_keeps_each():
    registered, qualified, alias = (make_event(t) for t in ("ModelVersionRegistered", "ModelQualified",
                                                            "ModelAliasSet"))
    qualified = qualified.model_copy(update={"model_version": registered.model_version})
    assert codec.record_key(MODELS, registered) == registered.model_version.encode()
    assert codec.record_key(MODELS, qualified) == f"qualified:{registered.model_version}".encode()
    assert codec.record_key(MODELS, alias) == f"alias:{alias.alias}".encode()


@pytest.mark.parametrize(("weights", "alias"), [({}, "canary"), ({"a@1": 0}, "canary"), ({"a@1": -1, "b@1": 2}, "c"),
                                                ({"a@1": 1}, "has@at"), ({"a@1": 1}, "has space")])
def test_an_alias_needs_a_positive_weight_and_a_name_without_at(weights, alias):
    raw = json.loads(encode(make_event("ModelAliasSet")))
    with pytest.raises(InvalidEvent):
        decode(MODELS, json.dumps({**raw, "weights": weights, "alias": alias}).encode())


@pytest.mark.parametrize(("payload", "error", "fragment"), [
    (b"\xff\xfe", MalformedRecord, "not UTF-8 JSON"),
    (b"{not json", MalformedRecord, "not UTF-8 JSON"),
    (b"[1, 2]", MalformedRecord, "expected a JSON object, got list"),
    (b'{"epoch": 1}', UnknownEventType, "missing string field 'type'"),
    (b'{"type": "Teleported"}', UnknownEventType, "'Teleported' (unknown)"),
    (b'{"type": "SubmitGeneration"}', UnknownEventType, "(known elsewhere) does not belong on llm.generations"),
    (b'{"type": "Completed", "schema_version": 9}', UnsupportedSchemaVersion, "schema_version 9"),
    (None, MalformedRecord, "tombstone"),
])
def test_decode_errors_are_typed_with_a_reason(payload, error, fragment):
    with pytest.raises(error) as caught:
        decode(GENERATIONS, payload)
    assert fragment in caught.value.reason
    assert caught.value.topic == GENERATIONS


def test_strict_validation_refuses_coercion_and_unknown_fields():
    raw = json.loads(encode(make_event("UsageReported")))
    raw["report_seq"] = "3"  # a string where an int belongs is not silently coerced
    with pytest.raises(InvalidEvent) as caught:
        decode(GENERATIONS, json.dumps(raw).encode())
    assert "report_seq" in caught.value.reason
    raw["report_seq"] = 3
    raw["surprise"] = True
    with pytest.raises(InvalidEvent) as caught:
        decode(GENERATIONS, json.dumps(raw).encode())
    assert "surprise" in caught.value.reason


def test_field_constraints_are_enforced_on_decode():
    raw = json.loads(encode(make_event("Completed")))
    raw["epoch"] = 0
    with pytest.raises(InvalidEvent) as caught:
        decode(GENERATIONS, json.dumps(raw).encode())
    assert "epoch" in caught.value.reason
