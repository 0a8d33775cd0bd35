"""Where the money goes, as tables: per rung of the ladder, the share of questions on which a
policy paid for its call and on which it returned its reply, and the spend on replies never
returned (:mod:`ccpo.evaluation.money`, whose ``money`` JSON objects these read).

- :func:`rung_table`: one policy (``ccpo check``), a row per rung and a row for all (a
  verify step's rung says which rung's reply it gives a verdict on);
- :func:`money_table`: many policies (``compare``, the report), a row per policy, a column
  per rung ("paid · returned") and the spend never returned per test split and as a share;
  :func:`print_money` draws it on the terminal (``compare``, ``evaluate``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console

from ccpo.evaluation.harness import ResultRow
from ccpo.report.tables import TableData, render_rich

TITLE = "Where the money goes"
MONEY_NOTE = (
    "**Where the money goes:** per rung of the ladder (each distinct paid call, cheapest "
    "first), the share of test questions on which the policy paid for that call · on which "
    "it returned that call's reply (for a set: the reply is a member); then the spend on "
    "replies paid for and never returned."
)


def _table(title: str, headers: list[str], cells: list[list[str]]) -> TableData:
    blank = [[False] * len(headers) for _ in cells]
    return TableData(title, headers, cells, blank, [list(r) for r in blank])


def _rung(r: dict[str, Any]) -> str:
    """A rung's model, marked when it is a verify step's verifier (its call buys a verdict)."""
    return f"{r['model']} (verifier)" if r.get("verifies") else r["model"]


def _rung_step(rungs: list[dict[str, Any]], i: int) -> str:
    """Rung ``i``'s (0-based) step: "round 4 guide"; a verify step's verifier "round 2
    verifies 1", with the number of the rung whose reply it verifies (the latest before it
    of that model that answers)."""
    r = rungs[i]
    what = r.get("verifies")
    if not what:
        return r["step"]
    on = [k for k in range(i) if rungs[k]["model"] == what and not rungs[k].get("verifies")]
    where = r["step"].rsplit(" ", 1)[0]  # "round t"
    return f"{where} verifies {on[-1] + 1}" if on else f"{where} verifies {what}"


def rung_table(money: dict[str, Any], title: str = TITLE) -> TableData:
    """One policy's rungs: model and step, share of questions paid and returned, USD per
    question spent and spent on a reply not returned; a last row for all rungs."""
    headers = ["Rung", "Paid", "Returned", "$ per question", "Never returned ($ per q.)"]
    cells = [
        [f"{i + 1}. {r['model']} ({_rung_step(money['rungs'], i)})",
         f"{r['paid']:.1%}", f"{r['returned']:.1%}", f"{r['usd_per_question']:.6f}",
         f"{r['unreturned_usd_per_question']:.6f}"]
        for i, r in enumerate(money["rungs"])
    ]  # fmt: skip
    cells.append(
        ["all rungs", "", "", f"{money['usd_per_question']:.6f}",
         f"{money['unreturned_usd_per_question']:.6f} ({money['unreturned_share']:.1%})"]
    )  # fmt: skip
    return _table(title, headers, cells)


def money_table(
    rows: Sequence[ResultRow], n_test: int | None, title: str = f"{TITLE}: paid · returned"
) -> TableData:
    """The rows that say where their money goes: per rung "paid · returned" (shares of
    questions), then the spend on replies never returned per test split (cents) and as a
    share of the row's cost. Empty (no rows) when none says."""
    said = [r for r in rows if r.money]
    if not said:
        return _table(title, [], [])
    rungs = said[0].money["rungs"]  # type: ignore[index]
    headers = ["Policy"] + [f"{i}. {_rung(r)}" for i, r in enumerate(rungs, start=1)]
    unit = f"¢ per test split of {n_test} q." if n_test else "¢ per question"
    headers += [f"Never returned ({unit})", "Never returned / cost"]
    cells = []
    for r in said:
        m = r.money
        assert m is not None
        row = [r.policy] + [f"{x['paid']:.0%} · {x['returned']:.0%}" for x in m["rungs"]]
        cents = m["unreturned_usd_per_question"] * 100 * (n_test or 1)
        row += [f"{cents:.3f}", f"{m['unreturned_share']:.0%}"]
        cells.append(row)
    return _table(title, headers, cells)


def print_money(console: Console, rows: Sequence[ResultRow], n_test: int | None) -> None:
    """:func:`money_table` on the terminal, when some row says where its money goes."""
    table = money_table(rows, n_test)
    if table.rows:
        console.print(render_rich(table))
