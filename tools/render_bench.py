"""Render the benchmark results into the docs: ``python tools/render_bench.py [--check]``.

``make bench`` runs it last and ``make bench-docs`` runs it alone. From ``bench/results/*.json``
(the last run of each benchmark; the format is in ``bench/_results.py``) it writes three places,
never edited by hand:

- the README's one benchmark table, between the ``<!-- bench-table:start -->`` and
  ``<!-- bench-table:end -->`` markers: the rows of ``README_ROWS``, each with its peer and the
  target its issue set;
- the section of docs/performance.md between ``<!-- bench-results:start -->`` and
  ``<!-- bench-results:end -->``: every benchmark's figures, and the plot;
- docs/scaling.png: time against size, log-log, one panel per kernel, ours against scipy and
  torch, from ``bench/results/scaling.json``.

``--check`` writes nothing and exits 1 naming a stale file; ``tests/deploy/test_deploy_bench_docs.py`` runs the
same check, so a table that no longer says what the results say fails the suite. The plot is not
checked: its bytes change with matplotlib's version.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
README = ROOT / "README.md"
PERFORMANCE = ROOT / "docs" / "performance.md"
PLOT = ROOT / "docs" / "scaling.png"
TABLE_MARKERS = ("<!-- bench-table:start -->", "<!-- bench-table:end -->")
SECTION_MARKERS = ("<!-- bench-results:start -->", "<!-- bench-results:end -->")

# Units where more is better (bench/_results.py's RATE_UNITS); every other unit is seconds.
_RATES = {"GB/s": "{:.2f} GB/s", "calls/s": "{:,.0f} calls/s"}


class ReadmeRow(NamedTuple):
    """A row of the README's table: a benchmark's case against one peer, and the ratio (peer's
    time / ours) its issue asked for, where it set one."""

    benchmark: str
    case: str
    peer: str
    target: float | None


_MEAN = 'torch.sparse.mm(csr, x, reduce="mean")'
_TORCH_COO = "torch.index_select on COO (2 threads)"
_AMG_FIRST = "cg + AMG, Poisson 1000^2, first solve (hierarchy built), c.cg(handle) over gRPC"
README_ROWS = [
    ReadmeRow("segment", "segment_sum, indices = arange", "tf.sparse.segment_sum", 2.0),
    ReadmeRow("segment", "segment_sum, indices = arange", "torch.segment_reduce (lengths given)", 2.0),
    ReadmeRow("segment", "segment_sum, indices = random permutation", "tf.sparse.segment_sum", 2.0),
    ReadmeRow("segment", "segment_sum, indices = random permutation", "torch index_select + segment_reduce", 2.0),
    ReadmeRow("aggregate", 'mm(reduce="mean"), int64, graph sent with the call', _MEAN, 1.5),
    ReadmeRow("aggregate", 'mm(reduce="mean"), int64, graph held by handle', _MEAN, 1.5),
    ReadmeRow("index_select", "index_select on COO, first call on the tensor", _TORCH_COO, 5.0),
    ReadmeRow("index_select", "index_select on COO, held tensor", _TORCH_COO, 5.0),
    ReadmeRow("index_select", "index_select on CSR (torch has none)", _TORCH_COO, None),
    ReadmeRow("solvers", _AMG_FIRST, "scipy cg + Jacobi", 10.0),
    ReadmeRow("solvers", _AMG_FIRST, "pyamg setup + solve", 1.5),
    ReadmeRow("solvers", "cg + AMG, Poisson 1000^2, later solve (hierarchy kept), c.cg(handle) over gRPC",
              "pyamg solve", 2.0),
    ReadmeRow("eigen", "eigsh(k=6) smallest, Poisson 300^2, first call (LOBPCG + AMG), handle over gRPC",
              "scipy eigsh(sigma=0)", 3.0),
    ReadmeRow("eigen", "eigsh(k=6) smallest, Poisson 300^2, later call (hierarchy kept), handle over gRPC",
              "scipy eigsh(sigma=0)", None),
]

# The order of docs/performance.md's tables; benchmarks not named here follow, by name.
_ORDER = ("kernels", "linalg", "solvers", "eigen", "segment", "aggregate", "index_select", "service", "batching", "shm",
          "distributed")
_SCALING = "scaling"
_COLOURS = {"sparseserve": "#1f77b4", "scipy": "#ff7f0e", "torch": "#2ca02c"}


def load(directory: Path) -> dict[str, dict[str, Any]]:
    """Every benchmark's results, by name."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(directory.glob("*.json"))}


# ------------------------------------------------------------------------------------- formatting
def _time_unit(seconds: float) -> tuple[float, str]:
    return next(((scale, name) for scale, name in ((1.0, "s"), (1e-3, "ms")) if seconds >= scale), (1e-6, "µs"))


def quantity(value: float, unit: str) -> str:
    """A figure with its unit, three significant digits: 50.2 ms, 1.19 GB/s, 1,246 calls/s."""
    if unit in _RATES:
        return _RATES[unit].format(value)
    scale, name = _time_unit(value)
    shown = value / scale
    return f"{shown:.{2 if shown < 10 else 1 if shown < 100 else 0}f} {name}"


def count(value: Any) -> str:
    """A size as short as it reads: 10M, 100k, 1.2G, 9,833, 64."""
    if isinstance(value, int) and value >= 10_000:
        shown = float(f"{value:.3g}")  # 999,999,984 reads 1G, not 1e+03M
        scale, suffix = next(step for step in ((10**9, "G"), (10**6, "M"), (10**3, "k")) if shown >= step[0])
        return f"{shown / scale:g}{suffix}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def sizes(row: dict[str, Any]) -> str:
    return ", ".join(f"{name} {count(value)}" for name, value in row.get("sizes", {}).items())


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|")


def _peer_cells(row: dict[str, Any]) -> list[str]:
    """Peer, its figure and the ratio; dashes where the row compares with nothing."""
    if "peer" not in row:
        return ["-", "-", "-"]
    return [_cell(row["peer"]), quantity(row["peer_value"], row["unit"]), f"{row['ratio']:.2f}x"]


def target(goal: float | None, ratio: float) -> str:
    if goal is None:
        return ""
    return f"≥ {goal:g}x" + ("" if ratio >= goal else ": **not met**")


def _table(header: list[str], lines: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + \
           ["| " + " | ".join(line) + " |" for line in lines]


# --------------------------------------------------------------------------------- the README
def _find(results: dict[str, dict[str, Any]], want: ReadmeRow) -> dict[str, Any]:
    rows = results.get(want.benchmark, {}).get("rows", [])
    found = [r for r in rows if r["case"] == want.case and r.get("peer") == want.peer]
    if len(found) != 1:
        raise SystemExit(f"bench/results/{want.benchmark}.json has {len(found)} rows of {want.case!r} "
                         f"against {want.peer!r}, not one: run `python -m bench.{want.benchmark}`")
    return found[0]


def readme_table(results: dict[str, dict[str, Any]]) -> str:
    """The README's table, with a line saying when and how it was measured."""
    lines, dates = [], set()
    for want in README_ROWS:
        row = _find(results, want)
        dates.add(results[want.benchmark]["date"])
        lines.append([_cell(row["case"]), sizes(row), quantity(row["ours"], row["unit"]), *_peer_cells(row),
                      target(want.target, row["ratio"])])
    ordered = sorted(dates)
    when = ordered[0] if len(ordered) == 1 else f"{ordered[0]} to {ordered[-1]}"
    cores = results[README_ROWS[0].benchmark]["machine"]["cpus"]
    intro = (f"`make bench` measures and `make bench-docs` renders this table from `bench/results/`: "
             f"{when}, {cores} cores, in process, peers on 2 threads, "
             "best of several runs taking turns, answers checked equal first; peer / ours above 1: sparseserve "
             "is faster.")
    header = ["case", "data", "sparseserve", "peer", "peer's time", "peer / ours", "target"]
    return "\n".join([intro, "", *_table(header, lines)])


# ----------------------------------------------------------------------- docs/performance.md
def _setting(body: dict[str, Any]) -> str:
    """Where and how a benchmark ran, in one sentence."""
    m = body["machine"]
    libraries = ", ".join(f"{name} {version}" for name, version in m.get("libraries", {}).items())
    params = ", ".join(f"{name} {value:,}" if isinstance(value, int) and not isinstance(value, bool)
                       else f"{name} {value}" for name, value in body.get("params", {}).items())
    load = f", load average {m['load'][0]:g} as it ended" if "load" in m else ""
    return (f"{body['date']}, {m.get('cpu', m['machine'])}, {m['cpus']} cores{load}, Python {m['python']}"
            + (f"; {libraries}" if libraries else "") + (f". Ran with {params}" if params else "") + ".")


def benchmark_table(body: dict[str, Any]) -> list[str]:
    """Every row of one benchmark."""
    rows = body["rows"]
    notes = any(r.get("note") for r in rows)
    header = ["case", "sparseserve", "peer", "peer's figure", "ratio", "sizes"] + (["note"] if notes else [])
    lines = [[_cell(r["case"]), quantity(r["ours"], r["unit"]), *_peer_cells(r), sizes(r)]
             + ([_cell(r.get("note", ""))] if notes else []) for r in rows]
    return _table(header, lines)


def scaling_table(body: dict[str, Any]) -> list[str]:
    """The scaling results, one line per kernel and size, every peer beside ours."""
    peers = sorted({r["peer"] for r in body["rows"] if "peer" in r})
    by_point: dict[tuple[str, int], dict[str, Any]] = {}
    for r in body["rows"]:
        point = by_point.setdefault((r["case"], r["sizes"]["entries"]), {"ours": r["ours"]})
        if "peer" in r:
            point[r["peer"]] = r
    header = ["kernel", "entries", "sparseserve", *peers, *(f"{p} / ours" for p in peers)]
    lines = [[_cell(case), f"{size:,}", quantity(point["ours"], "s"),
              *(quantity(point[p]["peer_value"], "s") if p in point else "-" for p in peers),
              *(f"{point[p]['ratio']:.2f}x" if p in point else "-" for p in peers)]
             for (case, size), point in by_point.items()]
    return _table(header, lines)


def _command(body: dict[str, Any]) -> str:
    return body.get("command") or f"python -m bench.{body['benchmark']}"


def performance_section(results: dict[str, dict[str, Any]]) -> str:
    """docs/performance.md's generated section: the plot, then every benchmark's figures."""
    out = ["Generated by `make bench-docs` (`tools/render_bench.py`) from `bench/results/*.json`, the last run "
           "of each benchmark; do not edit by hand. Each figure has its peer measured on the same data in the "
           "same run; the ratio is how many times faster sparseserve is (the peer's time over ours, or our "
           "rate over the peer's): above 1, sparseserve is faster."]
    if _SCALING in results:
        body = results[_SCALING]
        out += ["", f"### How cost grows with size (`{_command(body)}`)", "", " ".join(body["about"].split()), "",
                _setting(body), "", f"![Time against size, log-log, for each kernel against scipy and torch]"
                f"({PLOT.name})", "", *scaling_table(body)]
    order = [name for name in _ORDER if name in results]
    order += sorted(set(results) - set(order) - {_SCALING})
    for name in order:
        body = results[name]
        out += ["", f"### {name} (`{_command(body)}`)", "", " ".join(body.get("about", "").split()), "",
                _setting(body), "", *benchmark_table(body)]
    return "\n".join(out)


# ------------------------------------------------------------------------------------ the plot
def _tick(seconds: float, _position: int) -> str:
    scale, name = _time_unit(seconds)
    return f"{seconds / scale:g} {name}"


def plot_scaling(body: dict[str, Any], path: Path) -> None:
    """Time against size, log-log, one panel per kernel; a dotted line of slope 1 through our
    largest point shows where the cost grows as the work does."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    kernels = list(dict.fromkeys(r["case"] for r in body["rows"]))
    columns = math.ceil(len(kernels) / 2)
    fig, axes = plt.subplots(2, columns, figsize=(4.2 * columns, 8.2), squeeze=False)
    for ax, kernel in zip(axes.flat, kernels, strict=False):  # spare panels stay blank
        rows = [r for r in body["rows"] if r["case"] == kernel]
        ours = dict(sorted({r["sizes"]["entries"]: r["ours"] for r in rows}.items()))
        lines = {"sparseserve": ours}
        for peer in sorted({r["peer"] for r in rows if "peer" in r}):
            lines[peer] = dict(sorted((r["sizes"]["entries"], r["peer_value"]) for r in rows if r.get("peer") == peer))
        for name, points in lines.items():
            ax.loglog(list(points), list(points.values()), "o-" if name == "sparseserve" else "s--",
                      color=_COLOURS.get(name), lw=2.4 if name == "sparseserve" else 1.5, ms=4, label=name)
        largest, seconds = max(ours.items())
        smallest = min(ours)
        ax.loglog([smallest, largest], [seconds * smallest / largest, seconds], ":", color="grey", lw=1,
                  label="time ∝ size")
        ax.set_title(kernel, fontsize=11)
        ax.grid(True, which="major", alpha=0.35)
        ax.yaxis.set_major_formatter(FuncFormatter(_tick))
        ax.tick_params(labelsize=9)
    for ax in axes.flat[len(kernels):]:
        ax.axis("off")
    handles = {label: handle for ax in axes.flat for handle, label in zip(*ax.get_legend_handles_labels(), strict=True)}
    fig.legend(handles.values(), handles.keys(), loc="upper center", ncol=len(handles), fontsize=11,
               bbox_to_anchor=(0.5, 0.955), frameon=False)
    fig.suptitle(f"Time against size (entries of the sparse operand), log-log; best of several runs, "
                 f"{body['date']}, {body['machine']['cpus']} cores, torch on 2 threads", fontsize=13)
    fig.supxlabel("entries", fontsize=11)
    fig.supylabel("time per call", fontsize=11)
    fig.tight_layout(rect=(0.01, 0, 1, 0.93))
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


# --------------------------------------------------------------------------------- the files
def _between(text: str, markers: tuple[str, str], generated: str, name: str) -> str:
    head, begin, rest = text.partition(markers[0])
    _, end, tail = rest.partition(markers[1])
    if not (begin and end):
        raise SystemExit(f"{name} lacks the {markers[0]} ... {markers[1]} markers")
    return f"{head}{begin}\n{generated}\n{end}{tail}"


def expected(results: dict[str, dict[str, Any]]) -> dict[Path, str]:
    """The README and docs/performance.md as the results say they should read."""
    return {README: _between(README.read_text(), TABLE_MARKERS, readme_table(results), "README.md"),
            PERFORMANCE: _between(PERFORMANCE.read_text(), SECTION_MARKERS, performance_section(results),
                                  "docs/performance.md")}


def stale(results: dict[str, dict[str, Any]]) -> list[Path]:
    return [path for path, text in expected(results).items() if path.read_text() != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is stale")
    args = parser.parse_args(argv)
    results = load(RESULTS)
    if args.check:
        old = stale(results)
        for path in old:
            print(f"{path} is stale: run `make bench-docs`", file=sys.stderr)
        return 1 if old else 0
    for path, text in expected(results).items():
        path.write_text(text)
    if _SCALING in results:
        plot_scaling(results[_SCALING], PLOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
