"""`rackserve validate [POINTS] --out D`: the twin against public measured points (and `--fit`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from rackserve.validate.points import DEFAULT_POINTS

ROOT = Path(__file__).resolve().parents[2]
FIT_RESULT = ROOT / "bench/results/validate_fit.json"
DOCS_PAGE = ROOT / "docs/validation.md"
console = Console()


def validate(
    points: Annotated[Path, typer.Argument(help="points JSONL (data/public-points/README.md's format)")] = DEFAULT_POINTS,
    out: Annotated[Path, typer.Option(help="folder for validation.json and the plot")] = Path("out/validate"),
    layouts: Annotated[Path | None, typer.Option(help="readings of prose rows (default: data/public-points/layouts.yaml)")] = None,
    fit: Annotated[bool, typer.Option(help="first fit the system parameters across the points' decode steps, "
                                      "write them into the spec files and bench/results/validate_fit.json")] = False,
    docs: Annotated[Path | None, typer.Option(help="also write the generated docs page here (e.g. docs/validation.md)")] = None,
    batch_caps: Annotated[bool, typer.Option(help="cap each decode rank's batch at the running batch a row's own "
                                             "figures imply (its config's max_batch_size, which the points lack)")] = True,
) -> None:
    """Map every row of POINTS onto the twin, run it, compare with what was measured."""
    from rackserve.validate import fit as fit_mod
    from rackserve.validate.report import markdown, plot, write_json
    from rackserve.validate.run import validate as run_validation

    try:
        if fit:
            record = fit_mod.fit(points)
            changed = fit_mod.write_params(record["params"])
            record["written_to"] = [str(Path(c).relative_to(ROOT)) if Path(c).is_relative_to(ROOT) else c for c in changed]
            write_json(record, FIT_RESULT)
            console.print(f"fitted {record['params']}; decode-step median |error| {record['median_abs_error_before']:.0%} "
                          f"-> {record['median_abs_error_after']:.0%} (left out: {record['loo_median_abs_error']:.0%}); "
                          f"wrote {FIT_RESULT}")
        doc = run_validation(points, layouts, progress=lambda i: console.print(f"  {i}", end=""), batch_caps=batch_caps)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="POINTS") from None
    console.print()
    write_json(doc, out / "validation.json")
    plot(doc, out / "validation.png")
    console.print(_table(doc))
    if docs is not None:
        record = json.loads(FIT_RESULT.read_text()) if FIT_RESULT.is_file() else None
        page = markdown(doc, record, _relative(out / "validation.png", docs.parent),
                        f"rackserve validate --out {out} --docs {docs}" + ("" if batch_caps else " --no-batch-caps"))
        docs.parent.mkdir(parents=True, exist_ok=True)
        docs.write_text(page)
    console.print(f"wrote {out / 'validation.json'}, {out / 'validation.png'}" + (f", {docs}" if docs else ""))


def _relative(path: Path, base: Path) -> str:
    import os

    return os.path.relpath(path.resolve(), base.resolve())


def _table(doc: dict) -> Table:
    t = Table(title=f"twin / measured ({len(doc['rows'])} rows, {doc['cpu_s']:.0f} CPU s)")
    for col in ("id", "hardware", "kind", "tput/GPU", "tok/s/user", "TTFT"):
        t.add_column(col)
    for r in doc["rows"]:
        t.add_row(r["id"], r["hardware"][:18], r["kind"],
                  *(f"{r['ratio'][f]:.2f}" if r["ratio"].get(f) else "-" for f in ("tput_per_gpu", "tps_user", "ttft_s")))
    mae = doc["median_abs_error"]
    t.add_row("median |err|", "", "", *(f"{mae[f]:.0%}" if mae[f] is not None else "-"
                                        for f in ("tput_per_gpu", "tps_user", "ttft_s")))
    return t


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)
