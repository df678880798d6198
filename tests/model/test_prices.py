"""The price table covers what the accelerator table knows (issue 59: ten hours of p4de.24xlarge, a type the
accelerator table knew and the price table lacked, cost nothing), and the rules that price a spec's offers."""

from __future__ import annotations

import pytest

from jobplane.model import accelerators, prices
from jobplane.model.policy import Policy, check_against_policy, parse_policy
from jobplane.model.spec import parse_spec
from jobplane.views.cost import usd


def test_every_gpu_family_and_size_the_accelerator_table_knows_has_a_price() -> None:
    for family, (_, counts) in accelerators._EC2.items():
        sizes = [t for t in prices.AWS if t.split(".")[0] == family]
        assert sizes, f"EC2 {family}: no price"
        for size in counts:
            assert f"{family}.{size}" in prices.AWS, f"EC2 {family}.{size}"
    for family in accelerators._GCE_BUILT_IN:
        assert any(t.startswith(f"{family}-") for t in prices.GCP), f"GCE {family}"
    for gpu in accelerators.GPUS.values():
        if gpu.n1_counts:
            assert gpu.gce in prices.GCE_GPUS, gpu


@pytest.mark.parametrize("family", ["t3", "m5", "m6i", "m7i", "c5", "c6i", "c7i", "r6i"])
def test_the_common_cpu_families_are_priced(family: str) -> None:
    assert f"{family}.large" in prices.AWS and f"{family}.xlarge" in prices.AWS
    assert prices.AWS[f"{family}.xlarge"] == pytest.approx(2 * prices.AWS[f"{family}.large"])


def test_the_dearest_offer_is_the_most_expensive_type_and_market_a_spec_may_get() -> None:
    both = parse_spec("run: x\ninstance_type: [t3.micro, p4d.24xlarge]\n")
    assert prices.dearest(both, Policy()) == prices.AWS["p4d.24xlarge"]
    spot = parse_spec("run: x\ninstance_type: g5.xlarge\nspot: true\n")
    assert [(str(o), o.price, o.source) for o in prices.offers(spot, Policy())] == [
        ("g5.xlarge spot", 1.006, prices.SPOT_CEILING)], "an EC2 Spot price unknown before launch: its ceiling"
    fallback = parse_spec("run: x\ncloud: gcp\ninstance_type: g2-standard-8\nspot: {fallback: on_demand, after: 20m}\n")
    assert [o.market for o in prices.offers(fallback, Policy())] == ["spot", "on-demand"]
    assert prices.dearest(fallback, Policy()) == prices.GCP["g2-standard-8"]
    unpriced = parse_spec("run: x\ninstance_type: x9.48xlarge\n")
    assert prices.dearest(unpriced, Policy()) is None
    assert prices.dearest(unpriced, Policy(prices={"x9.48xlarge": 3.5})) == 3.5


def test_an_n1_type_is_priced_with_the_gpus_it_takes() -> None:
    n1 = parse_spec("run: x\ncloud: gcp\ninstance_type: n1-standard-8\naccelerators: T4:2\n")
    assert prices.dearest(n1, Policy()) == pytest.approx(prices.GCP["n1-standard-8"] + 2 * prices.GCE_GPUS[
        "nvidia-tesla-t4"])


def test_a_budgeted_owner_or_a_max_cost_needs_a_price_naming_prices() -> None:
    unpriced = parse_spec("run: x\ninstance_type: x9.48xlarge\nowner: team-a\n")
    assert check_against_policy(unpriced, Policy()) == [], "nothing limits its cost: no price needed"
    budgeted = parse_policy("budgets: {monthly_usd: {team-a: 10}}\n")
    (error,) = check_against_policy(unpriced, budgeted)
    assert error.path == "prices" and "x9.48xlarge on-demand" in error.message
    capped = parse_spec("run: x\ninstance_type: x9.48xlarge\nmax_cost: 5\n")
    assert [e.path for e in check_against_policy(capped, Policy())] == ["prices"]


def test_max_cost_and_max_price_are_bounded_naming_the_field() -> None:
    from jobplane.model.errors import SpecError

    for text, field in (("max_cost: 0\n", "max_cost"), ("max_cost: 2e6\n", "max_cost"),
                        ("max_price: -1\n", "max_price"), ("max_price: lots\n", "max_price")):
        with pytest.raises(SpecError, match=field):
            parse_spec("run: x\ninstance_type: t3.micro\n" + text)


def test_dollars_under_ten_show_three_significant_digits() -> None:
    assert [usd(x) for x in (0, 0.0104, 0.052, 0.5, 5, 9.5, 283, 1234.5)] == [
        "$0.00", "$0.0104", "$0.0520", "$0.500", "$5.00", "$9.50", "$283.00", "$1,234.50"]
