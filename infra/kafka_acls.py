"""What the local node's PLAINTEXT listener may do once it has an authorizer (`kafka_node.AUTHORIZER`).

PLAINTEXT clients are `User:ANONYMOUS`, and so is the node itself on its inter-broker and controller
listeners. Local development and the platform's roles keep working there: ANONYMOUS may use every topic,
consumer group and transactional id, and do what the node needs on the cluster, except

    * anything on a tenant's topics (`llm.requests.*`, `llm.results.*`): DENY, which beats every ALLOW,
      so only the tenant's own SCRAM principal (and the service principals, super users) reaches them;
    * ALTER on the cluster: it would let an anonymous client change ACLs and SCRAM credentials.

Every resource then has an ACL, so a tenant principal is refused everything its own ACLs do not grant
(`producers/tenant_kafka.py`).
"""
from __future__ import annotations

from plumbing.kafka.access import KafkaAccess
from plumbing.kafka.acls import AclBinding, KafkaSecurityError, create_acls
from plumbing.kafka.clients import make_admin
from schemas.intake import INTAKE_PREFIX, RESULTS_PREFIX

ANONYMOUS = "User:ANONYMOUS"
CLUSTER_OPERATIONS = ("cluster_action", "create", "describe", "describe_configs", "idempotent_write")


def development_acls() -> list[AclBinding]:
    return [
        *(AclBinding(ANONYMOUS, "cluster", "kafka-cluster", op) for op in CLUSTER_OPERATIONS),
        *(AclBinding(ANONYMOUS, kind, "*", "all") for kind in ("topic", "group", "transactional_id")),
        *(AclBinding(ANONYMOUS, "topic", prefix, "all", pattern="prefixed", permission="deny")
          for prefix in (INTAKE_PREFIX, RESULTS_PREFIX)),
    ]


async def ensure_development_acls(admin_access: KafkaAccess) -> bool:
    """Add the ACLs above (idempotent), as a super user over the SASL listener; False when the node has no
    authorizer (nothing to add them to)."""
    admin = make_admin(admin_access)
    await admin.start()
    try:
        await create_acls(admin, development_acls())
    except KafkaSecurityError as exc:
        if exc.error != "SecurityDisabled":
            raise
        return False
    finally:
        await admin.close()
    return True
