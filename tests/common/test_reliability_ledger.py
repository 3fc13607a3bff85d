"""The reliability ledger adds up pytest-xdist workers' counts as one process would have counted them."""

from __future__ import annotations

from reliability_ledger import Ledger, Violation


def test_two_workers_states_absorbed_equal_one_ledger_that_saw_everything():
    seen = [("flags", Violation("flags", "traceback", "error: --limit 3 broke", "draftsmith eval --limit 3")),
            ("flags", Violation("flags", "traceback", "error: --limit 12 broke", "eval --limit 12")),
            ("data", Violation("data", "hang", "still running after 120 s", "draftsmith data generate"))]
    whole, workers = Ledger(), [Ledger(), Ledger()]
    for i, (area, violation) in enumerate(seen):
        for ledger in (whole, workers[i % 2]):
            ledger.inputs[area] += 1
            ledger.outcomes["2"] += 1
            ledger.seconds[area] += 1.5 * (i + 1)
            ledger.note_time(area, 1.5 * (i + 1), violation.reproducer)
            ledger.rows_lost += i
            ledger.record(violation)
    controller = Ledger()
    for worker in workers:
        controller.absorb(worker.state())
    assert controller.to_dict() == whole.to_dict() and controller.slowest == whole.slowest
    assert controller.to_dict()["classes"][1]["reproducer"] == "eval --limit 12"  # one class, its shortest reproducer
