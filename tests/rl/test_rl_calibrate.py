"""λ calibration: the frontier, slopes with known answers, degenerate inputs and the plot."""

from __future__ import annotations

import json
import math
import random

import pytest

from flywheel.rl import calibrate, frontier, local_slope, plot_calibration


def parabola(c: float) -> float:
    return 2 * c - c * c  # concave, increasing on [0, 1], derivative 2 - 2c


def ladder(f, costs):
    return [(c, f(c)) for c in costs]


def test_frontier_drops_dominated_points_and_the_falling_tail():
    pts = [(1.0, 0.2), (2.0, 0.5), (2.0, 0.3), (3.0, 0.54), (2.5, 0.1), (4.0, 0.6), (5.0, 0.4)]
    assert frontier(pts) == [(1.0, 0.2), (2.0, 0.5), (4.0, 0.6)]  # (3, .54) lies under the chord


def test_frontier_keeps_no_collinear_corners():
    assert frontier([(0.0, 0.0), (1.0, 0.5), (2.0, 1.0)]) == [(0.0, 0.0), (2.0, 1.0)]
    # on the chord up to rounding: (2, .5) → (4, .6) passes through (3, .55)
    assert frontier([(2.0, 0.5), (3.0, 0.55), (4.0, 0.6)]) == [(2.0, 0.5), (4.0, 0.6)]


def test_frontier_stops_at_the_cheapest_point_of_peak_success():
    assert frontier([(1.0, 0.5), (2.0, 0.8), (3.0, 0.8)]) == [(1.0, 0.5), (2.0, 0.8)]


def test_slope_on_a_quadratic_is_the_derivative():
    """Uniform spacing on a parabola: averaging the two chord slopes is exact."""
    costs = [i / 10 for i in range(11)]
    points = {
        "medium": ladder(parabola, costs[:4]),
        "high": ladder(parabola, costs[4:7]),
        "max": ladder(parabola, costs[7:]),
    }
    operating = {"medium": (0.2, parabola(0.2)), "high": (0.5, parabola(0.5)), "max": (0.8, parabola(0.8))}
    result = calibrate(points, operating)
    assert len(result.hull) == 11
    for effort, (c, _) in operating.items():
        assert result.lambdas[effort] == pytest.approx(2 - 2 * c, abs=1e-9)
        assert result.position[effort] == "vertex"


def test_slope_on_a_smooth_curve_matches_the_derivative():
    costs = [0.05 * 1.15**i for i in range(30)]  # non-uniform ladder
    points = {"all": ladder(math.sqrt, costs)}
    for c in (costs[5], costs[12], costs[20]):
        lam = calibrate(points, {"op": (c, math.sqrt(c))}).lambdas["op"]
        assert lam == pytest.approx(0.5 / math.sqrt(c), rel=0.02)


def test_endpoints_use_their_one_segment():
    points = {"e": [(1.0, 0.2), (2.0, 0.6), (4.0, 0.7)]}
    result = calibrate(points, {"cheap": (1.0, 0.2), "dear": (4.0, 0.7)})
    assert result.lambdas["cheap"] == pytest.approx(0.4)
    assert result.lambdas["dear"] == pytest.approx(0.05)


def test_point_on_an_edge_uses_that_edge():
    result = calibrate({"e": [(0.0, 0.0), (2.0, 1.0), (4.0, 1.2)]}, {"mid": (1.0, 0.5)})
    assert result.position["mid"] == "edge"
    assert result.lambdas["mid"] == pytest.approx(0.5)


def test_point_below_the_hull_uses_the_segment_spanning_its_cost():
    result = calibrate({"e": [(0.0, 0.0), (2.0, 1.0), (4.0, 1.2)]}, {"low": (3.0, 0.4)})
    assert result.position["low"] == "below"
    assert result.lambdas["low"] == pytest.approx(0.1)


def test_point_costlier_than_peak_success_gets_zero():
    result = calibrate({"e": [(1.0, 0.3), (2.0, 0.6)]}, {"max": (5.0, 0.5)})
    assert result.position["max"] == "beyond"
    assert result.lambdas["max"] == 0.0


def test_single_point_gives_zero():
    result = calibrate({"medium": []}, {"medium": (3.0, 0.4)})
    assert result.hull == [(3.0, 0.4)]
    assert result.lambdas == {"medium": 0.0}


def test_all_points_at_one_cost_give_zero():
    result = calibrate(
        {"medium": [(2.0, 0.1), (2.0, 0.5)], "high": [(2.0, 0.3)]}, {"medium": (2.0, 0.1), "high": (2.0, 0.3)}
    )
    assert result.hull == [(2.0, 0.5)]
    assert result.lambdas == {"medium": 0.0, "high": 0.0}
    assert result.position == {"medium": "below", "high": "below"}


def test_success_falling_with_cost_gives_zero_everywhere():
    pts = [(1.0, 0.6), (2.0, 0.5), (3.0, 0.2)]
    result = calibrate({"e": pts}, {"medium": pts[0], "high": pts[1], "max": pts[2]})
    assert result.hull == [(1.0, 0.6)]
    assert result.lambdas == {"medium": 0.0, "high": 0.0, "max": 0.0}


def test_operating_point_joins_the_frontier():
    result = calibrate({"e": [(1.0, 0.2), (4.0, 0.5)]}, {"e": (2.0, 0.45)})
    assert (2.0, 0.45) in result.hull
    assert result.lambdas["e"] == pytest.approx((0.25 + 0.025) / 2)


def test_lambdas_are_supporting_slopes_on_random_clouds():
    """At a corner, S - λC is maximal along the whole frontier: the iso-reward line is tangent."""
    rng = random.Random(0)
    for _ in range(50):
        pts = [(rng.uniform(0, 10), rng.uniform(0, 1)) for _ in range(12)]
        hull = frontier(pts)
        ops = {f"v{i}": p for i, p in enumerate(hull)}
        result = calibrate({"cloud": pts}, ops)
        for name, (c, s) in ops.items():
            lam = result.lambdas[name]
            assert lam >= 0
            assert all(s - lam * c >= hs - lam * hc - 1e-9 for hc, hs in hull)


def test_bad_points_are_refused():
    with pytest.raises(ValueError, match="finite"):
        calibrate({"e": [(1.0, math.nan)]}, {"e": (1.0, 0.5)})
    with pytest.raises(ValueError, match="at least one effort"):
        calibrate({"e": [(1.0, 0.5)]}, {})
    with pytest.raises(ValueError, match="cheaper than the frontier"):
        local_slope([(1.0, 0.5), (2.0, 0.6)], (0.5, 0.1))


def test_result_serialises_to_json():
    result = calibrate({"e": [(1.0, 0.2), (2.0, 0.6)]}, {"e": (2.0, 0.6)})
    back = json.loads(json.dumps(result.to_json()))
    assert back["lambdas"] == {"e": pytest.approx(0.4)} and back["hull"] == [[1.0, 0.2], [2.0, 0.6]]


def test_plot_writes_a_png(tmp_path):
    from matplotlib.image import imread

    costs = [i / 10 for i in range(11)]
    result = calibrate(
        {"medium": ladder(parabola, costs[:5]), "high": ladder(parabola, costs[5:])},
        {"medium": (0.2, parabola(0.2)), "high": (0.7, parabola(0.7))},
    )
    out = plot_calibration(result, tmp_path / "calibration.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert imread(out).shape[:2] == (500, 700)
    assert [p.name for p in tmp_path.iterdir()] == ["calibration.png"]
