"""ReservationBook: priority order, no churn, moves and unbooking, its invariants, its notices."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agents.policy.fleetmind.capacity import DcCapacity
from agents.policy.fleetmind.reservations import ReservationBook
from agents.policy.fleetmind.rules import Reservation, parse_rules
from tests.unit.policy.fleetmind.helpers import Inst, capacity, fleet_view, fleetmind, request

A_FIRST = Reservation("a", "m", 2, ("A", "B"))
B_SECOND = Reservation("b", "m", 2, ("A", "B"))


def caps(**ready: int) -> dict[str, DcCapacity]:
    return {dc: capacity(dc, n) for dc, n in ready.items()}


def moves(book: ReservationBook, now_s: float = 0.0, **ready: int) -> list[tuple[str, str]]:
    return [(n.tenant, n.dc) for n in book.rebook("m", "v1", caps(**ready), now_s)]


def test_booked_in_priority_order_the_first_dc_that_holds_them() -> None:
    book = ReservationBook((A_FIRST, B_SECOND))
    assert moves(book, A=3, B=2) == [("a", "A"), ("b", "B")]  # A keeps only 1 after a's 2
    assert (book.home_of("a"), book.home_of("b")) == ("A", "B")
    assert (book.booked_in("A", "m"), book.booked_in("B", "m"), book.booked_in("A", "n")) == (2, 2, 0)
    book = ReservationBook((A_FIRST, B_SECOND))
    assert moves(book, A=4, B=2) == [("a", "A"), ("b", "A")]
    assert book.booked_in("A", "m") == 4


def test_a_booking_stays_put_while_its_dc_can_hold_it() -> None:
    book = ReservationBook((A_FIRST,))
    assert moves(book, A=1, B=3) == [("a", "B")]
    assert moves(book, A=5, B=3) == []  # A (first choice) could hold it now: no churn
    assert moves(book, A=5, B=2) == []
    assert book.home_of("a") == "B"


def test_a_booking_moves_when_its_dc_goes_down_and_is_unbooked_when_nowhere_fits() -> None:
    book = ReservationBook((A_FIRST,))
    moves(book, A=2, B=2)
    (notice,) = book.rebook("m", "v1", caps(A=0, B=2), 3.0)
    assert (notice.kind, notice.tenant, notice.dc, notice.time_s) == ("reservation_moved", "a", "B", 3.0)
    assert "was A" in notice.detail
    assert moves(book, A=0, B=1) == [("a", "")]  # shrunk below 2: nowhere can hold it
    assert book.home_of("a") == "" and book.booked_in("B", "m") == 0
    assert moves(book, B=1) == []  # still nowhere: no second notice
    assert moves(book, A=2, B=1) == [("a", "A")]


def test_an_earlier_reservation_comes_first_when_both_need_the_same_dc() -> None:
    book = ReservationBook((A_FIRST, B_SECOND))
    assert moves(book, A=2, B=2) == [("a", "A"), ("b", "B")]
    assert moves(book, A=2, B=0) == [("b", "")]  # b cannot take a's instances
    assert moves(book, A=0, B=2) == [("a", "B")]  # a moves to B; b stays unbooked: no notice
    assert (book.home_of("a"), book.home_of("b")) == ("B", "")


def test_reservations_of_other_models_are_untouched() -> None:
    book = ReservationBook((A_FIRST, Reservation("n-owner", "n", 1, ("A",))))
    assert [(n.tenant, n.dc) for n in book.rebook("m", "v1", caps(A=3), 0.0)] == [("a", "A")]
    assert book.home_of("n-owner") == ""


DCS = ("A", "B", "C")


@st.composite
def reservation_sets(draw: st.DrawFn) -> tuple[Reservation, ...]:
    n = draw(st.integers(1, 4))
    return tuple(
        Reservation(
            f"t{k}",
            "m",
            draw(st.integers(1, 3)),
            tuple(draw(st.lists(st.sampled_from(DCS), min_size=1, max_size=3, unique=True))),
        )
        for k in range(n)
    )


capacity_changes = st.lists(
    st.fixed_dictionaries({dc: st.integers(0, 6) for dc in DCS}), min_size=1, max_size=12
)


def room(dc: str, ready: dict[str, int], earlier: tuple[Reservation, ...], booked: dict[str, str]) -> int:
    """Ready instances of ``dc`` the ``earlier`` reservations do not take."""
    return ready[dc] - sum(e.instances for e in earlier if booked[e.tenant] == dc)


@settings(max_examples=300, deadline=None, database=None)
@given(reservations=reservation_sets(), changes=capacity_changes, absent=st.sets(st.sampled_from(DCS)))
def test_invariants_under_random_capacity_changes(
    reservations: tuple[Reservation, ...], changes: list[dict[str, int]], absent: set[str]
) -> None:
    book = ReservationBook(reservations)
    for step, ready in enumerate(changes):
        # A DC may also be absent from the capacities (no row of the model there at all).
        present = {dc: capacity(dc, n) for dc, n in ready.items() if not (step % 2 and dc in absent)}
        before = {r.tenant: book.home_of(r.tenant) for r in reservations}
        notices = book.rebook("m", "v1", present, float(step))
        after = {r.tenant: book.home_of(r.tenant) for r in reservations}
        ready = {dc: present[dc].ready if dc in present else 0 for dc in DCS}
        # Each tenant in at most one DC, and only one of its own DCs.
        for r in reservations:
            assert after[r.tenant] in (*r.dcs, "")
        booked_total = sum(r.instances for r in reservations if after[r.tenant])
        assert sum(book.booked_in(dc, "m") for dc in DCS) == booked_total
        # Booked instances per DC never exceed its ready instances.
        for dc in DCS:
            assert book.booked_in(dc, "m") <= ready[dc]
        # No churn: a booking left its DC (or stayed unbooked) only when that DC could not hold
        # it beside the reservations listed before it.
        for k, r in enumerate(reservations):
            if before[r.tenant] and after[r.tenant] != before[r.tenant]:
                assert room(before[r.tenant], ready, reservations[:k], after) < r.instances
            if not after[r.tenant]:
                assert all(room(dc, ready, reservations[:k], after) < r.instances for dc in r.dcs)
        # One notice per tenant whose booking changed, naming where it is now.
        changed = {(t, after[t]) for t in after if after[t] != before[t]}
        assert sorted((n.tenant, n.dc) for n in notices) == sorted(changed)
        assert all(n.kind == "reservation_moved" for n in notices)


def test_a_reservation_does_not_churn_between_versions_of_its_model() -> None:
    """Nothing in the fleet changes; requests of other tenants merely name the two versions of
    the reserved model that are deployed (A runs v1, B runs v2). The booking must not move."""
    rules = parse_rules(
        {
            "data_centres": [{"name": "A"}, {"name": "B"}],
            "reservations": [{"tenant": "owner", "model": "m", "instances": 1, "dcs": ["A", "B"]}],
        }
    )
    sched = fleetmind(rules)
    view = fleet_view([Inst("A", version="v1"), Inst("A", version="v1"), Inst("B", version="v2")])
    sched.submit([request("r1", "x", version="v1", home="A")], view, 0.1)
    first = sched.notices()
    assert [(n.kind, n.tenant, n.dc) for n in first] == [("reservation_moved", "owner", "A")]
    for k in range(4):
        version = ("v2", "v1")[k % 2]
        sched.submit([request(f"r{k + 2}", "x", version=version)], view, 0.1 + 0.01 * k)
    moved = [(n.tenant, n.dc) for n in sched.notices() if n.kind == "reservation_moved"]
    assert moved == []
