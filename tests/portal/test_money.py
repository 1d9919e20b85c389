"""portal.money: GPU-seconds → GPU-hours → cost, counted exactly, stored to six places half up (holds
and estimates: up), shown in cents half up — each rounded once, from the exact figure."""

from __future__ import annotations

import ast
import re
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path

import pytest

from portal import money
from portal.fields import DecimalStringField

EIGHT = Decimal(8)  # CNY per GPU-hour


def test_an_hour_is_3600_seconds_and_gpu_hours_are_not_rounded():
    assert money.HOUR == 3600
    assert money.gpu_hours(7200) == 2
    assert money.gpu_hours(1) == Decimal(1) / Decimal(3600)  # 0.000277…, all of it
    assert money.gpu_hours(1) != money.stored(money.gpu_hours(1))


def test_one_gpu_second_at_8_per_hour_is_stored_to_six_places_and_shown_as_zero():
    exact = money.cost(gpu_seconds=1, price=EIGHT)
    assert exact == EIGHT / 3600  # 0.002222…
    assert exact > Decimal("0.002222")
    assert money.stored(exact) == Decimal("0.002222")
    assert money.stored(exact).as_tuple().exponent == -6
    assert money.stored(exact, up=True) == Decimal("0.002223")  # a hold: never below the charge
    assert money.display(exact) == Decimal("0.00")
    assert str(money.display(exact)) == "0.00"


def test_cost_multiplies_before_it_divides():
    # 1 GPU × 2 min × 4 tasks at 8/GPU-h: 480 GPU-s → 1.0666… → 1.07; from the shown 0.13 h it would be 1.04
    assert money.display(money.cost(gpu_seconds=480, price=EIGHT)) == Decimal("1.07")
    assert money.display(money.cost(gpu_hours=money.display(money.gpu_hours(480)), price=EIGHT)) == Decimal("1.04")
    assert money.cost(gpu_seconds=3600 * 3, price=Decimal("8.1234")) == Decimal("24.3702")  # exact when it can be
    assert money.cost(gpu_hours=Decimal("1.5"), price=EIGHT) == 12
    with pytest.raises(TypeError):
        money.cost(price=EIGHT)
    with pytest.raises(TypeError):
        money.cost(gpu_seconds=1, gpu_hours=Decimal(1), price=EIGHT)


def test_storing_and_showing_round_half_up_not_half_even():
    tie_stored = money.cost(gpu_seconds=9, price=Decimal("0.0002"))  # 0.0000005 exactly
    assert tie_stored == Decimal("0.0000005")
    assert money.stored(tie_stored) == Decimal("0.000001")
    assert tie_stored.quantize(money.STORED_QUANTUM, ROUND_HALF_EVEN) == 0  # what half-even would store
    tie_shown = money.gpu_hours(18)  # 0.005 GPU-hours exactly
    assert money.display(tie_shown) == Decimal("0.01")
    assert money.display(Decimal("0.125")) == Decimal("0.13")
    assert money.display(Decimal("-0.125")) == Decimal("-0.13")  # half up: away from zero
    assert money.display(Decimal("0.05"), places=1) == Decimal("0.1")


def test_the_api_field_rounds_by_the_same_rule():
    field = DecimalStringField()
    assert field.to_representation(money.gpu_hours(18)) == "0.01"
    assert field.to_representation(money.cost(gpu_seconds=1, price=EIGHT)) == "0.00"


def test_a_total_is_the_exact_sum_rounded_once_not_a_sum_of_rounded_figures():
    pieces = [(1, EIGHT)] * 100_000  # 100 000 jobs of one GPU-second at 8/GPU-h
    exact = money.total_cost(pieces)
    assert exact == Decimal(800_000) / 3600  # 222.222…
    assert money.display(exact) == Decimal("222.22")
    sum_of_stored = sum((money.stored(money.cost(gpu_seconds=s, price=p)) for s, p in pieces), Decimal(0))
    assert sum_of_stored == Decimal("222.200000")
    assert money.display(sum_of_stored) == Decimal("222.20")  # two cents lost by rounding first
    sum_of_shown = sum((money.display(money.cost(gpu_seconds=s, price=p)) for s, p in pieces), Decimal(0))
    assert sum_of_shown == 0  # every line shows 0.00
    # a job cut in three slices of 20 min at 1/GPU-h: the exact sum is one, the rounded thirds are not
    thirds = [(1200, Decimal(1))] * 3
    assert money.total_cost(thirds) == 1
    assert sum((money.stored(money.cost(gpu_seconds=s, price=p)) for s, p in thirds), Decimal(0)) == Decimal("0.999999")
    assert money.total_cost([]) == 0


def test_stored_gpu_hours_convert_back_to_the_same_whole_seconds():
    # six places of an hour are 3.6 ms: every whole number of seconds survives the round trip
    for seconds in [*range(0, 20_000), 86_400 * 31 * 8, 10**9 + 7]:
        assert money.gpu_seconds(money.stored(money.gpu_hours(seconds))) == seconds


def _models():
    from accounting.models import BudgetHold, BudgetTotal, UsageRecord, UsageSlice
    from jobs.models import Job

    return {"UsageRecord": UsageRecord, "UsageSlice": UsageSlice, "BudgetHold": BudgetHold,
            "BudgetTotal": BudgetTotal, "Job": Job}  # fmt: skip


@pytest.mark.parametrize(
    ("model", "field"),
    [
        ("UsageRecord", "gpu_hours"),
        ("UsageRecord", "requested_gpu_hours"),
        ("UsageRecord", "gpu_busy_fraction"),
        ("UsageSlice", "cost"),
        ("BudgetHold", "estimated_gpu_hours"),
        ("BudgetHold", "estimated_cost"),
        ("BudgetHold", "held_gpu_hours"),
        ("BudgetTotal", "used_gpu_hours"),
        ("Job", "estimated_gpu_hours"),
        ("Job", "estimated_cost"),
    ],
)
def test_the_storage_quantum_is_the_columns_scale(model, field):
    column = _models()[model]._meta.get_field(field)  # Django's documented Model _meta API
    assert column.decimal_places == money.STORED_PLACES
    assert money.STORED_QUANTUM == Decimal("0.000001")


# --- one owner: no second HOUR, quantum or rounding rule in the apps' source ---------------------------

ROOT = Path(__file__).resolve().parents[2]
OWNER = ROOT / "portal" / "money.py"
UNIT_NAMES = re.compile(r"^_?(HOUR|SECONDS_PER_HOUR|SIX|SIX_PLACES|CENT|CENTS|\w*QUANTUM|\w*_PLACES)$")
UNIT_CONSTANTS = {Decimal(3600), Decimal("0.000001"), Decimal("0.01")}
# quantize calls that are neither money nor units: ratios shown as floats (cost report efficiencies)
OTHER_QUANTIZE = {"accounting/selectors/usage.py": 2}


def _sources() -> list[Path]:
    files = [p for app in ("portal", "jobs", "accounting") for p in (ROOT / app).rglob("*.py")]
    return [p for p in files if "migrations" not in p.parts and p != OWNER]  # migrations: frozen history


def _decimal_constant(node: ast.AST) -> Decimal | None:
    """The value of ``Decimal(<literal>)``, or None."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Decimal"
            and len(node.args) == 1 and isinstance(node.args[0], ast.Constant)):  # fmt: skip
        try:
            return Decimal(node.args[0].value)
        except (TypeError, ArithmeticError):
            return None
    return None


def _offences(text: str, rel: str) -> list[str]:
    """What in one file's source (``rel``: its path under the checkout) defines a unit, a quantum or a
    rounding rule of its own."""
    found, quantize = [], 0
    for node in ast.walk(ast.parse(text, filename=rel)):
        where = f"{rel}:{getattr(node, 'lineno', '?')}"
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        found += [f"{where} defines {t.id}" for t in targets if isinstance(t, ast.Name) and UNIT_NAMES.match(t.id)]
        if (value := _decimal_constant(node)) is not None and value in UNIT_CONSTANTS:
            found.append(f"{where} writes Decimal({value}) (portal.money owns it)")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant) \
                and node.right.value == 3600:  # fmt: skip
            found.append(f"{where} divides by 3600 (portal.money.HOUR, gpu_hours)")
        if isinstance(node, ast.ImportFrom) and node.module == "decimal":
            found += [f"{where} imports {a.name} (portal.money.ROUNDING)" for a in node.names if a.name.startswith("ROUND_")]
        if isinstance(node, ast.Attribute) and node.attr == "quantize":
            quantize += 1
    if quantize > OTHER_QUANTIZE.get(rel, 0):
        found.append(f"{rel} rounds with .quantize {quantize} time(s) (portal.money.stored / display)")
    return found


def test_hour_the_quantum_and_the_rounding_rule_are_defined_once():
    offences = [o for path in _sources() for o in _offences(path.read_text(), str(path.relative_to(ROOT)))]
    assert offences == []


def test_the_one_owner_check_sees_a_second_definition():
    """The check above could pass by seeing nothing: a file with each kind of second definition fails it."""
    probe = (
        "from decimal import ROUND_HALF_EVEN, Decimal\n"
        "HOUR = Decimal(3600)\n"
        "_SIX = Decimal('0.000001')\n"
        "x = Decimal(7) / 3600\n"
        "y = x.quantize(Decimal('0.01'))\n"
    )
    offences = _offences(probe, "accounting/probe.py")
    assert len(_sources()) > 50 and ROOT / "accounting" / "invoices.py" in _sources()
    assert any("defines HOUR" in o for o in _offences(OWNER.read_text(), "portal/money.py"))  # the owner is left out
    assert any("defines HOUR" in o for o in offences)
    assert any("defines _SIX" in o for o in offences)
    assert any("Decimal(3600)" in o for o in offences)
    assert any("Decimal(0.000001)" in o for o in offences)
    assert any("Decimal(0.01)" in o for o in offences)
    assert any("divides by 3600" in o for o in offences)
    assert any("ROUND_HALF_EVEN" in o for o in offences)
    assert any(".quantize" in o for o in offences)

