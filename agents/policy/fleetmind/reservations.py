"""Capacity reservations: a tenant that owns capacity has it booked in exactly one DC.

Each ``Reservation`` (tenant, model, instances, dcs in priority order) is booked, in the order
the rules list them, in the first DC of its list whose ready instances of the model not yet
booked by an earlier reservation number at least ``instances``. A booking stays where it is
while its DC can still hold it (no churn); when its DC cannot (down, or shrunk), it moves to the
next DC that can, or is unbooked until one can. Invariants (tested): a tenant is booked in at
most one DC, and the instances booked in a DC never exceed its ready instances.

What a booking does: the owner's requests treat the booked DC as their home; other tenants'
diverted requests see that DC's capacity without the booked instances (they are never
pre-empted — a booking only stops others from being diverted into capacity someone owns).
"""

from __future__ import annotations

from agents.policy.fleetmind.capacity import DcCapacity
from agents.policy.fleetmind.notices import FleetNotice
from agents.policy.fleetmind.rules import Reservation


class ReservationBook:
    def __init__(self, reservations: tuple[Reservation, ...]) -> None:
        self.reservations = reservations
        self.booked: dict[str, str] = {}  # tenant -> DC

    def rebook(
        self, model: str, version: str, capacities: dict[str, DcCapacity], now_s: float
    ) -> list[FleetNotice]:
        """Re-check every reservation of ``model`` against ``capacities``; notices for moves."""
        used: dict[str, int] = {}
        notices = []
        for r in (r for r in self.reservations if r.model == model):
            current = self.booked.get(r.tenant, "")
            order = ([current] if current else []) + [dc for dc in r.dcs if dc != current]
            chosen = next(
                (
                    dc
                    for dc in order
                    if dc in capacities and capacities[dc].ready - used.get(dc, 0) >= r.instances
                ),
                "",
            )
            if chosen:
                used[chosen] = used.get(chosen, 0) + r.instances
                self.booked[r.tenant] = chosen
            else:
                self.booked.pop(r.tenant, None)
            if chosen != current:
                where = chosen or "no DC (none can hold it)"
                notices.append(
                    FleetNotice(
                        "reservation_moved", chosen, model, version, now_s,
                        f"{r.instances} instances for {r.tenant} booked in {where}"
                        + (f", was {current}" if current else ""),
                        tenant=r.tenant,
                    )
                )  # fmt: skip
        return notices

    def home_of(self, tenant: str) -> str:
        """The DC the tenant's reservation is booked in ("" = none)."""
        return self.booked.get(tenant, "")

    def booked_in(self, dc: str, model: str) -> int:
        """Instances of ``model`` booked in ``dc``."""
        return sum(
            r.instances for r in self.reservations if r.model == model and self.booked.get(r.tenant) == dc
        )
