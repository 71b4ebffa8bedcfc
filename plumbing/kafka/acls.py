"""ACLs and SCRAM credentials through the Kafka admin protocol (aiokafka has the wire types, not the calls).

    create_acls(admin, bindings)                   CreateAcls v1, every binding in one request
    upsert_scram_user(admin, name, password)       AlterUserScramCredentials v0 (SCRAM-SHA-256)

Both go to any broker, which forwards them to the KRaft controller; both are idempotent (an ACL that exists is
not added twice; an upsert replaces the user's credential). The password never leaves this process: the
request carries a random salt and the salted password (RFC 5802 `Hi`, PBKDF2-HMAC-SHA-256), as the broker's
own `kafka-configs --alter --add-config SCRAM-SHA-256=...` does.
"""
from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Literal

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import for_code
from aiokafka.protocol.admin import CreateAclsRequest_v1, CreateAclsResponse_v1
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    CompactArray, CompactBytes, CompactString, Int8, Int16, Int32, Schema, TaggedFields,
)

ResourceType = Literal["topic", "group", "cluster", "transactional_id"]
PatternType = Literal["literal", "prefixed"]
Operation = Literal["all", "read", "write", "create", "delete", "alter", "describe", "cluster_action",
                    "describe_configs", "alter_configs", "idempotent_write"]
Permission = Literal["allow", "deny"]

RESOURCE_CODES = {"topic": 2, "group": 3, "cluster": 4, "transactional_id": 5}
PATTERN_CODES = {"literal": 3, "prefixed": 4}
OPERATION_CODES = {"all": 2, "read": 3, "write": 4, "create": 5, "delete": 6, "alter": 7, "describe": 8,
                   "cluster_action": 9, "describe_configs": 10, "alter_configs": 11, "idempotent_write": 12}
PERMISSION_CODES = {"deny": 2, "allow": 3}
SCRAM_SHA_256 = 1  # the ScramMechanism code of AlterUserScramCredentials
SCRAM_ITERATIONS = 8192
CLUSTER = "kafka-cluster"  # the one name of the cluster resource


class KafkaSecurityError(RuntimeError):
    """The broker refused an ACL or credential change; `error` is Kafka's error class name."""

    def __init__(self, error: str, message: str) -> None:
        super().__init__(f"{error}: {message}")
        self.error = error


@dataclass(frozen=True)
class AclBinding:
    """`principal` may do (or is denied) `operation` on the resource `name` (a prefix when `pattern` says so)."""

    principal: str  # "User:acme"
    resource: ResourceType
    name: str
    operation: Operation
    pattern: PatternType = "literal"
    permission: Permission = "allow"

    def describe(self) -> str:
        pattern = f"{self.name}*" if self.pattern == "prefixed" else self.name
        return f"{self.permission.upper()} {self.principal} {self.operation.upper()} {self.resource} {pattern}"

    def as_creation(self) -> tuple:
        return (RESOURCE_CODES[self.resource], self.name, PATTERN_CODES[self.pattern], self.principal, "*",
                OPERATION_CODES[self.operation], PERMISSION_CODES[self.permission])


class _CreateAcls(Request[CreateAclsRequest_v1]):
    API_KEY = 30

    def __init__(self, bindings: list[AclBinding]) -> None:
        self.bindings = bindings

    def build(self, request_struct_class: type[CreateAclsRequest_v1]) -> CreateAclsRequest_v1:
        return request_struct_class([b.as_creation() for b in self.bindings])


class _AlterScramResponse(Response):
    API_KEY = 51
    API_VERSION = 0
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("results", CompactArray(("user", CompactString("utf-8")), ("error_code", Int16),
                                 ("error_message", CompactString("utf-8")), ("tags", TaggedFields))),
        ("tags", TaggedFields),
    )


class _AlterScramStruct(RequestStruct):
    FLEXIBLE_VERSION = True
    API_KEY = 51
    API_VERSION = 0
    RESPONSE_TYPE = _AlterScramResponse
    SCHEMA = Schema(
        ("deletions", CompactArray(("name", CompactString("utf-8")), ("mechanism", Int8), ("tags", TaggedFields))),
        ("upsertions", CompactArray(("name", CompactString("utf-8")), ("mechanism", Int8), ("iterations", Int32),
                                    ("salt", CompactBytes), ("salted_password", CompactBytes),
                                    ("tags", TaggedFields))),
        ("tags", TaggedFields),
    )


class _AlterScram(Request[_AlterScramStruct]):
    API_KEY = 51

    def __init__(self, name: str, salt: bytes, salted: bytes, iterations: int) -> None:
        self.upsertion = (name, SCRAM_SHA_256, iterations, salt, salted, {})

    def build(self, request_struct_class: type[_AlterScramStruct]) -> _AlterScramStruct:
        return request_struct_class([], [self.upsertion], {})


def salted_password(password: str, salt: bytes, iterations: int) -> bytes:
    """SCRAM's Hi(password, salt, i) for SHA-256: PBKDF2-HMAC-SHA-256 with a 32-byte output."""
    return hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations, 32)


def _raise_for(code: int, message: str | None, what: str) -> None:
    if code:
        error = for_code(code)
        raise KafkaSecurityError(error.__name__, f"{what}: {message or error.description}")


async def create_acls(admin: AIOKafkaAdminClient, bindings: list[AclBinding]) -> None:
    """Add every binding (those that exist stay as they are); KafkaSecurityError names the first refused one
    (`SecurityDisabled`: the broker has no authorizer)."""
    if not bindings:
        return
    response: CreateAclsResponse_v1 = await admin._send_request(_CreateAcls(bindings))  # noqa: SLF001
    for binding, (code, message) in zip(bindings, response.creation_responses, strict=True):
        _raise_for(code, message, binding.describe())


async def upsert_scram_user(admin: AIOKafkaAdminClient, name: str, password: str,
                            iterations: int = SCRAM_ITERATIONS) -> None:
    """Create or replace the SCRAM-SHA-256 credential of user `name`."""
    salt = secrets.token_bytes(32)
    request = _AlterScram(name, salt, salted_password(password, salt, iterations), iterations)
    response = await admin._send_request(request)  # noqa: SLF001
    for _user, code, message, _tags in response.results:
        _raise_for(code, message, f"SCRAM credential of {name}")
