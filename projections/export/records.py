"""What an exporter sends: a sealed bill as the projection wrote it, and the tenant's billing ids.

The exporter never derives usage itself: a seal is the lifecycle projection's row (`billing_ledger`), fixed
by the first terminal event of its generation and never changed, so every sink exports exactly the figures
the invoice, the usage API and the statements show.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

import psycopg

from schemas.usage_export import SealedUsage, UsageSealed, usage_id
from schemas.values import BillingIds


@dataclass(frozen=True)
class Seal:
    """One row of `billing_ledger`."""

    generation_id: str
    tenant_id: str
    epoch: int  # 0: sealed before any attempt started
    model_version: str
    end_reason: str
    usage_label: str
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int
    sealed_at: datetime

    @property
    def record_id(self) -> str:
        return usage_id(self.generation_id, self.epoch)

    def cloudevent(self, source: str) -> UsageSealed:
        return UsageSealed(id=self.record_id, source=source, subject=self.tenant_id, time=self.sealed_at,
                           data=SealedUsage(generation_id=self.generation_id, epoch=self.epoch,
                                            model=self.model_version, label=self.usage_label,
                                            end_reason=self.end_reason, input_tokens=self.input_tokens,
                                            cached_input_tokens=self.cached_input_tokens,
                                            output_tokens=self.output_tokens))


@dataclass(frozen=True)
class Export:
    """A seal on its way to a sink, with what the sink needs to know of its tenant."""

    seal: Seal
    billing: BillingIds


SEAL_COLUMNS = ("generation_id, tenant_id, COALESCE(epoch, 0), model_version, end_reason, usage_label, "
                "billed_input_tokens, billed_cached_input_tokens, billed_output_tokens, sealed_at")


def read_seals(conn: psycopg.Connection, generation_ids: Iterable[str]) -> dict[str, Seal]:
    rows = conn.execute(f"SELECT {SEAL_COLUMNS} FROM billing_ledger WHERE generation_id = ANY(%s)",
                        (sorted(set(generation_ids)),)).fetchall()
    return {row[0]: Seal(*row) for row in rows}


def read_billing_ids(conn: psycopg.Connection, tenant_ids: Iterable[str]) -> dict[str, BillingIds]:
    """Each tenant's billing ids as the tenants projection holds them now (a tenant not there has none)."""
    rows = conn.execute("SELECT tenant_id, billing FROM tenants WHERE tenant_id = ANY(%s)",
                        (sorted(set(tenant_ids)),)).fetchall()
    found = {tenant_id: BillingIds.model_validate(billing) for tenant_id, billing in rows}
    return {tenant_id: found.get(tenant_id, BillingIds()) for tenant_id in tenant_ids}
