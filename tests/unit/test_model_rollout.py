"""The rules of `llm.models` (ModelBook) and of alias records, in memory."""
from __future__ import annotations

from datetime import UTC, datetime

import pytest

from producers.model_rollout import RolloutError, alias_record
from schemas.model_book import ModelBook
from schemas.model_rollout import ModelAliasSet, ModelQualified
from tests.factories import make_event

NOW = datetime(2026, 11, 29, tzinfo=UTC)


def make_version(name: str, tokenizer: str = "t", template: str = "c", content: str = "a"):
    return make_event("ModelVersionRegistered").model_copy(update={
        "model_version": name, "tokenizer_sha256": tokenizer * 64, "chat_template_sha256": template * 64,
        "content_sha256": content * 64})


def make_book(*versions) -> ModelBook:
    book = ModelBook()
    for version in versions or (make_version("chat@1"), make_version("chat@2", content="b")):
        book.observe(version)
    return book


def qualified(version: str, passed: bool, content: str = "a") -> ModelQualified:
    return ModelQualified(model_version=version, passed=passed, prompts=1, content_sha256=content * 64,
                          qualified_at=NOW)


def test_the_first_registration_wins_and_the_latest_qualification_and_alias_win():
    book = make_book()
    book.observe(make_version("chat@1", content="z"))
    assert book.versions["chat@1"].content_sha256 == "a" * 64
    book.observe(qualified("chat@1", passed=True))
    assert book.is_qualified("chat@1") and not book.is_qualified("chat@2")
    book.observe(qualified("chat@1", passed=False))
    assert not book.is_qualified("chat@1")
    book.observe(qualified("chat@2", passed=True, content="a"))  # passed, but on content not registered as chat@2
    assert not book.is_qualified("chat@2")
    book.observe(ModelAliasSet(alias="chat", weights={"chat@1": 1, "chat@2": 0}, set_at=NOW))
    book.observe(ModelAliasSet(alias="chat", weights={"chat@1": 0, "chat@2": 5, "ghost@1": 3}, set_at=NOW))
    assert book.members("chat") == {"chat@2": 5}
    assert book.names() == ["chat@1", "chat@2", "chat"]


def test_a_registered_version_is_never_shadowed_by_an_alias_of_the_same_name():
    book = make_book(make_version("plain"), make_version("chat@1"))
    book.observe(ModelAliasSet(alias="plain", weights={"chat@1": 1}, set_at=NOW))
    assert book.alias("plain") is None and book.members("plain") == {} and book.names() == ["chat@1", "plain"]


def test_an_alias_record_lists_registered_versions_sharing_tokenizer_and_template():
    event = alias_record(make_book(), "chat", {"chat@2": 10, "chat@1": 90}, NOW)
    assert (event.alias, event.weights, event.set_at) == ("chat", {"chat@1": 90, "chat@2": 10}, NOW)
    assert list(event.weights) == ["chat@1", "chat@2"]


@pytest.mark.parametrize(("book", "alias", "weights", "fragment"), [
    (make_book(), "chat@9", {"chat@1": 1}, "a name without '@'"),
    (make_book(), "my chat", {"chat@1": 1}, "a name without '@'"),
    (make_book(make_version("plain"), make_version("chat@1")), "plain", {"chat@1": 1}, "is a registered model version"),
    (make_book(), "chat", {}, "name at least one VERSION=WEIGHT"),
    (make_book(), "chat", {"chat@1": 1, "chat@7": 1}, "'chat@7' is not a registered model version"),
    (make_book(), "chat", {"chat@1": 0, "chat@2": 0}, "at least one weight must be positive"),
    (make_book(), "chat", {"chat@1": -1, "chat@2": 1}, "chat@1: weight -1 is negative"),
    (make_book(make_version("chat@1"), make_version("chat@2", tokenizer="u")), "chat", {"chat@1": 1, "chat@2": 0},
     "versions differ in tokenizer_sha256"),
    (make_book(make_version("chat@1"), make_version("chat@2", template="d")), "chat", {"chat@1": 1, "chat@2": 1},
     "versions differ in chat_template_sha256"),
])
def test_an_alias_the_registry_cannot_honour_is_refused_naming_why(book, alias, weights, fragment):
    with pytest.raises(RolloutError) as caught:
        alias_record(book, alias, weights, NOW)
    assert fragment in str(caught.value)
