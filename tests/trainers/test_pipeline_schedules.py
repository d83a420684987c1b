"""Pipeline schedules at unit pass costs: every micro batch's passes run exactly once, no schedule
deadlocks, the bubbles are the textbook ones (zero-bubble's a third of 1F1B's idle time), and the
zero-bubble schedule stays within 1F1B's peak of micro batches in flight."""

import pytest

from trainers.pipeline.schedules import Action, analytic_bubble, schedule_orders, simulate

LAYOUTS = [(name, pp, v, m) for name, v in (("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("looped_bfs", 2),
                                            ("zero_bubble", 1))
           for pp in (2, 4) for m in (4, 8, 16)]


@pytest.mark.parametrize("name,pp,v,m", LAYOUTS)
def test_every_pass_runs_once_on_its_stage_rank(name, pp, v, m):
    orders = schedule_orders(name, pp, v, m)
    kinds = ("F", "I", "W") if name == "zero_bubble" else ("F", "B")
    expected = {Action(kind, stage, micro) for kind in kinds for stage in range(pp * v) for micro in range(m)}
    ran = [action for order in orders for action in order]
    assert len(ran) == len(expected) and set(ran) == expected
    for rank, order in enumerate(orders):
        assert all(action.stage % pp == rank for action in order)


@pytest.mark.parametrize("name,pp,v,m", LAYOUTS)
def test_bubbles_are_the_textbook_ones(name, pp, v, m):
    timeline = simulate(schedule_orders(name, pp, v, m), v)
    assert timeline.bubble() == pytest.approx(analytic_bubble(name, pp, v, m), abs=1e-12)


@pytest.mark.parametrize("pp,m", [(2, 4), (2, 8), (4, 8), (4, 16), (8, 16)])
def test_zero_bubble_idles_a_third_of_1f1b_within_its_memory(pp, m):
    orders = schedule_orders("zero_bubble", pp, 1, m)
    zero_bubble, one_f_one_b = simulate(orders, 1), simulate(schedule_orders("1f1b", pp, 1, m), 1)
    assert zero_bubble.makespan - 3 * m == pytest.approx((one_f_one_b.makespan - 3 * m) / 3)
    for order in orders:
        in_flight = peak = 0
        for action in order:
            in_flight += {"F": 1, "W": -1}.get(action.kind, 0)
            peak = max(peak, in_flight)
        assert peak <= pp


def test_simulate_finds_a_deadlock():
    backward_first = [[Action("B", 0, 0), Action("F", 0, 0)], [Action("F", 1, 0), Action("B", 1, 0)]]
    with pytest.raises(ValueError, match="deadlocks"):
        simulate(backward_first, 1)


def test_interleaved_needs_rounds_of_pp_micro_batches():
    with pytest.raises(ValueError, match="Strategy.microbatches must be a multiple of 4; got 6"):
        schedule_orders("interleaved_1f1b", 4, 2, 6)
