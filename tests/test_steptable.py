"""Inside the measured range the measured table decides; outside, the fit; each step says which."""

import numpy as np
import pandas as pd
import pytest

from roofline.analysis.steptable import RatioGrid, StepModel

# a "fit" that is smooth in q: 10 ms + 1 ms per token; the "measurement" has a kernel switch:
# T(2) = 2 T(1) and T(4) < T(3), as float32 GEMV -> GEMM on a CPU
FIT = lambda q, B, L: 1e-2 + 1e-3 * q * B + 1e-6 * L * B  # noqa: E731
MEASURED = {1: 0.011, 2: 0.022, 3: 0.024, 4: 0.020, 8: 0.025}


def model():
    qs, Bs, Ls = [], [], []
    for q in MEASURED:
        for B in (1, 2):
            for L in (100, 1000):
                qs.append(q), Bs.append(B), Ls.append(L)
    t = [MEASURED[q] * B + 1e-6 * L * B for q, B, L in zip(qs, Bs, Ls)]
    table = dict(q=qs, B=Bs, L=Ls, t_s=t, t_fit_s=[FIT(q, B, L) for q, B, L in zip(qs, Bs, Ls)])
    rows = lambda q, B, L: pd.DataFrame(dict(q=q, B=B, L=L))  # noqa: E731
    terms = lambda r: np.column_stack([FIT(r["q"].to_numpy(), r["B"].to_numpy(), r["L"].to_numpy()),  # noqa: E731
                                       *[np.zeros(len(r))] * 4])
    return StepModel(dict(table=table), rows, terms)


@pytest.mark.parametrize("q", list(MEASURED))
def test_a_measured_point_is_predicted_as_measured(q):
    m = model()
    assert m.seconds(q, 2, 1000) == pytest.approx(MEASURED[q] * 2 + 2e-3, rel=1e-12)
    assert m.source(q, 2, 1000) == "table"


def test_the_kernel_switch_survives_prediction():
    m = model()
    assert m.seconds(2, 1, 100) > 1.9 * m.seconds(1, 1, 100)
    assert m.seconds(4, 1, 100) < m.seconds(3, 1, 100)


def test_between_measured_points_the_ratio_is_interpolated():
    m = model()
    # q=6 lies halfway between q=4 and q=8 in the grid: log-ratio halfway between theirs
    r4, r8 = (np.log((MEASURED[q] + 1e-4) / FIT(q, 1, 100)) for q in (4, 8))
    expect = FIT(6, 1, 100) * np.exp(0.5 * (r4 + r8))
    assert m.seconds(6, 1, 100) == pytest.approx(expect, rel=1e-12)
    assert m.source(6, 1, 100) == "table"


@pytest.mark.parametrize("point", [(16, 1, 100), (2, 4, 100), (16, 1, 4000)])
def test_outside_the_measured_tokens_the_fit_alone(point):
    m = model()
    assert m.source(*point) == "fit"
    assert m.seconds(*point) == pytest.approx(FIT(*point), rel=1e-12)


@pytest.mark.parametrize("L, edge", [(4000, 1000), (50, 100)])
def test_beyond_the_measured_contexts_the_kernel_factor_of_the_nearest_one(L, edge):
    """Which kernel runs depends on the token count, not on L: past the measured contexts the
    measured/fitted ratio at the same (q, B) and the nearest L is kept, the fit moves the L."""
    m = model()
    ratio = (MEASURED[2] + 1e-6 * edge) / FIT(2, 1, edge)
    assert m.source(2, 1, L) == "table(q,B)+fit(L)"
    assert m.seconds(2, 1, L) == pytest.approx(FIT(2, 1, L) * ratio, rel=1e-12)


def test_a_hole_in_the_grid_falls_back_to_the_fit_next_to_it():
    g = RatioGrid(dict(q=[1, 2, 1], B=[1, 1, 2], L=[0, 0, 0], t_s=[1.0, 2.0, 3.0], t_fit_s=[1.0, 1.0, 1.0]))
    assert np.isnan(g(np.array([2]), np.array([2]), np.array([0])))[0]  # (q=2, B=2) never measured
    assert g(np.array([1]), np.array([2]), np.array([0]))[0] == pytest.approx(np.log(3.0))


def test_vectorised_prediction_equals_one_at_a_time():
    m = model()
    q, B, L = np.array([1, 3, 6, 16]), np.array([1, 2, 1, 2]), np.array([100, 550, 1000, 100])
    many = m.predict(q, B, L)
    one = [model().seconds(*p) for p in zip(q, B, L)]
    np.testing.assert_allclose(many["seconds"], one, rtol=1e-12)


def test_a_q_step_faster_than_the_one_token_step_is_listed_as_a_kernel_effect():
    from roofline.analysis.steptable import kernel_effects
    pts = pd.DataFrame(dict(kind="forward", dtype="bfloat16", mode="eager", B=1, L=128, q=[1, 2, 4, 8],
                            t_median_s=[0.020, 0.016, 0.0199, 0.030]))
    k = kernel_effects(pts)
    assert k["q"].tolist() == [2]  # 4 is within the 2% margin; 8 is slower
    assert k["Tq_over_T1"].iloc[0] == pytest.approx(0.8)


def test_a_noisy_point_leaves_a_hole_and_the_fit_answers_there():
    """A point the sweep timed on a busy machine (10x slow) must not become the device's profile:
    the table leaves it out, that step and its neighbours come from the fit, and clean measured
    points still come from the table."""
    from roofline.analysis.steptable import measured_table
    qs = [1, 2, 4, 8]
    t_fit = [FIT(q, 1, 100) for q in qs]
    t_meas = [1.05 * t for t in t_fit]
    t_meas[1] *= 10  # q=2 timed while another process held the cores
    pts = pd.DataFrame(dict(q=qs, B=1, L=100, t_median_s=t_meas, t_pred_s=t_fit,
                            noisy=[False, True, False, False]))
    rows = lambda q, B, L: pd.DataFrame(dict(q=q, B=B, L=L))  # noqa: E731
    terms = lambda r: np.column_stack([FIT(r["q"].to_numpy(), r["B"].to_numpy(), r["L"].to_numpy()),  # noqa: E731
                                       *[np.zeros(len(r))] * 4])
    kept = StepModel(dict(table=measured_table(pts)), rows, terms)
    trusted = StepModel(dict(table=measured_table(pts, ~pts["noisy"])), rows, terms)
    assert kept.seconds(2, 1, 100) > 5 * FIT(2, 1, 100)  # what the old table did
    # q=2 is no longer a grid point: its step comes from the clean neighbours' kernel factor
    assert trusted.seconds(2, 1, 100) == pytest.approx(1.05 * FIT(2, 1, 100), rel=1e-12)
    assert trusted.source(8, 1, 100) == "table"
    assert trusted.seconds(8, 1, 100) == pytest.approx(t_meas[3], rel=1e-12)
    # on a 2-D grid the noisy point is a hole: next to it the fit answers
    two = pd.concat([pts, pts.assign(B=2, noisy=False)], ignore_index=True)
    holed = StepModel(dict(table=measured_table(two, ~two["noisy"])), rows, terms)
    assert holed.source(2, 1, 100) == "fit"
    assert holed.seconds(2, 1, 100) == pytest.approx(FIT(2, 1, 100), rel=1e-12)
    assert holed.source(3, 1, 100) == "fit"  # between the hole and a clean point


def test_a_hole_in_one_context_takes_its_kernel_factor_from_the_other_contexts():
    """The (q, B) of a noisy point were measured at other contexts: their measured/fitted ratio,
    interpolated along L, prices the hole (the kernel depends on q·B, not on L)."""
    from roofline.analysis.steptable import measured_table
    Ls, factor = [100, 400, 1000], {100: 1.10, 400: 9.0, 1000: 1.40}  # L=400 timed on a busy machine
    pts = pd.DataFrame([dict(q=q, B=1, L=L, t_pred_s=FIT(q, 1, L), t_median_s=factor[L] * FIT(q, 1, L) if q == 2
                             else FIT(q, 1, L), noisy=(q == 2 and L == 400)) for q in (1, 2, 4) for L in Ls])
    rows = lambda q, B, L: pd.DataFrame(dict(q=q, B=B, L=L))  # noqa: E731
    terms = lambda r: np.column_stack([FIT(r["q"].to_numpy(), r["B"].to_numpy(), r["L"].to_numpy()),  # noqa: E731
                                       *[np.zeros(len(r))] * 4])
    m = StepModel(dict(table=measured_table(pts, ~pts["noisy"])), rows, terms)
    # log-ratio at L=400 interpolated between L=100 (log 1.1) and L=1000 (log 1.4), a third of the way
    expect = FIT(2, 1, 400) * np.exp(np.log(1.10) + (400 - 100) / (1000 - 100) * (np.log(1.40) - np.log(1.10)))
    assert m.seconds(2, 1, 400) == pytest.approx(expect, rel=1e-12)
    assert m.source(2, 1, 400) == "table(q,B)+fit(L)"
    assert m.source(2, 1, 100) == "table" and m.source(1, 1, 400) == "table"
    assert m.source(3, 1, 300) == "table(q,B)+fit(L)"  # a neighbour of the hole: filled, not the fit alone
