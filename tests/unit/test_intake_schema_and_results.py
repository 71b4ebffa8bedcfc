"""Intake records and results derived from the log, without Kafka."""
from __future__ import annotations

import json

from producers.intake.records import Refusal, parse_request
from projections.results import ResultsDeriver
from schemas.asyncapi import asyncapi_document
from schemas.lifecycle import Admitted, AttemptStarted, Completed, Interrupted, UsageReported
from schemas.stream import StreamFinished, TokensEmitted
from schemas.values import Usage

GEN = {"tenant_id": "t", "generation_id": "gen_1"}


def admitted(**fields) -> Admitted:
    return Admitted(**GEN, request_id="r1", model_version="m@1", input_tokens=3, max_output_tokens=4,
                    reserved_tokens=7, payload_hash="0" * 64, **fields)


def tokens(seq: int, text: str, epoch: int = 1) -> TokensEmitted:
    return TokensEmitted(**GEN, epoch=epoch, seq=seq, token_ids=(seq,), text_delta=text, token_count=seq)


def test_a_request_is_validated_with_the_http_bounds_and_batch_is_the_default_tier():
    parsed = parse_request(b'{"requestId":"r","model":"m@1","input":"hi","maxOutputTokens":8}')
    assert (parsed.body.request_id, parsed.body.tier, parsed.body.max_output_tokens) == ("r", "batch", 8)
    assert not parsed.include_tokens
    assert parse_request(b'{"requestId":"r","model":"m@1","input":"hi","maxOutputTokens":8,'
                         b'"includeTokens":true}').include_tokens
    assert parse_request(b'{"requestId":"r","model":"m@1","input":"hi","maxOutputTokens":8,"topP":0}') == \
        Refusal("r", "invalid_request", "topP: Input should be greater than 0", "topP")
    assert parse_request(b'{"requestId":"r","schemaVersion":2}').error_code == "unsupported_schema_version"
    assert parse_request(b'[1]').request_id is None


def test_one_result_per_generation_from_its_stream_end_even_when_tokens_overtake_admitted():
    deriver = ResultsDeriver()
    assert deriver.observe(tokens(1, "The")) is None
    assert deriver.observe(tokens(2, " sea")) is None
    final = StreamFinished(**GEN, epoch=1, seq=3, reason="output-limit",
                           usage=Usage(processed_input_tokens=3, generated_output_tokens=2))
    assert deriver.observe(final) is None  # no requestId yet
    result = deriver.observe(admitted())
    assert (result.request_id, result.status, result.text, result.usage.output_tokens) == ("r1", "completed",
                                                                                          "The sea", 2)
    assert deriver.observe(Completed(**GEN, epoch=1, finish_reason="length", usage=Usage())) is None
    assert deriver.observe(final) is None and not deriver.open


def test_an_interrupted_generation_is_billed_at_its_last_watermark_and_labelled():
    deriver = ResultsDeriver()
    deriver.observe(admitted())
    deriver.observe(AttemptStarted(**GEN, epoch=1, worker_id="w"))
    deriver.observe(tokens(1, "a"))
    deriver.observe(UsageReported(**GEN, epoch=1, report_seq=1, usage=Usage(generated_output_tokens=1)))
    result = deriver.observe(Interrupted(**GEN, epoch=1, worker_id="w"))
    assert (result.status, result.usage_label, result.usage.output_tokens, result.text) == (
        "interrupted", "interrupted", 1, "a")
    late = StreamFinished(**GEN, epoch=1, seq=2, reason="completed", usage=Usage(generated_output_tokens=2))
    assert deriver.observe(late) is None


def test_a_request_that_asked_for_tokens_gets_the_token_events_of_its_final_attempt():
    deriver = ResultsDeriver()
    deriver.observe(tokens(1, "stale", epoch=1))  # before Admitted: kept until it says whether they are wanted
    deriver.observe(admitted(result_tokens=True))
    deriver.observe(AttemptStarted(**GEN, epoch=2, worker_id="w"))
    deriver.observe(tokens(1, "The", epoch=2))
    deriver.observe(tokens(2, " sea", epoch=2))
    final = StreamFinished(**GEN, epoch=2, seq=3, reason="output-limit", usage=Usage(generated_output_tokens=2))
    result = deriver.observe(final)
    assert [(t.seq, t.token_ids, t.text) for t in result.tokens] == [(1, (1,), "The"), (2, (2,), " sea")]
    wire = json.loads(result.encode())
    assert wire["tokens"] == [{"seq": 1, "tokenIds": [1], "text": "The", "choice": 0},
                              {"seq": 2, "tokenIds": [2], "text": " sea", "choice": 0}]


def test_a_request_that_did_not_ask_for_tokens_gets_none_and_keeps_none():
    deriver = ResultsDeriver()
    deriver.observe(admitted())
    deriver.observe(tokens(1, "The"))
    assert not deriver.open["gen_1"].tokens
    final = StreamFinished(**GEN, epoch=1, seq=2, reason="output-limit", usage=Usage(generated_output_tokens=1))
    result = deriver.observe(final)
    assert result.tokens is None and "tokens" not in json.loads(result.encode())


def test_the_asyncapi_document_has_both_tenant_topics():
    from plumbing.kafka.clients import make_broker

    channels = asyncapi_document(make_broker("127.0.0.1:9"))["channels"]
    assert {"llm.requests.{tenant}:GenerationRequested", "llm.results.{tenant}:GenerationResult"} <= set(channels)


def replayed_owner(through: dict) -> "ResultsPublisher":
    from plumbing.settings import Settings
    from projections.results_publisher import ResultsPublisher

    owner = ResultsPublisher(Settings(), "127.0.0.1:1")  # never started: only its record rule is used
    owner.through = dict(through)
    return owner


def test_a_restarted_publisher_writes_the_result_its_predecessor_held_for_a_later_admitted():
    from aiokafka import TopicPartition

    gens, toks = TopicPartition("llm.generations", 0), TopicPartition("llm.tokens", 0)
    final = StreamFinished(**GEN, epoch=1, seq=2, reason="output-limit", usage=Usage(generated_output_tokens=1))
    # the predecessor read the tokens' partition through the end (offset 12) but not the Admitted (offset 5):
    # it held the end, made no result, and committed through tokens 13, generations 5; this time the
    # Admitted comes first, and the end, below the committed position, completes a result never written
    owner = replayed_owner({toks: 13, gens: 5})
    assert owner.observe(gens, 5, admitted()) is None
    assert owner.observe(toks, 11, tokens(1, "Hi")) is None
    result = owner.observe(toks, 12, final)
    assert (result.request_id, result.text) == ("r1", "Hi")
    assert not owner.closing and not owner.first_offsets

    # the predecessor read both (Admitted 5, end 12) and so wrote the result with its offsets: not again
    again = replayed_owner({toks: 13, gens: 6})
    assert again.observe(gens, 5, admitted()) is None
    assert again.observe(toks, 11, tokens(1, "Hi")) is None
    assert again.observe(toks, 12, final) is None
    # the same with the end read first, the Admitted completing it
    held = replayed_owner({toks: 13, gens: 6})
    assert held.observe(toks, 12, final) is None
    assert held.observe(gens, 5, admitted()) is None
    unread = replayed_owner({toks: 12, gens: 6})  # the end was past what the predecessor had read
    assert unread.observe(toks, 12, final) is None
    assert unread.observe(gens, 5, admitted()).request_id == "r1"
