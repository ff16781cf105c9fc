"""The provisioned Grafana dashboards query only what the code exports.

Every PromQL expression in ``deploy/grafana/dashboards/*.json`` (panel targets, annotations, template
variables) is taken apart by a small PromQL scanner; each metric name it uses must be in
``schemas.metrics.PROMETHEUS_METRIC_NAMES`` (the series the worker and the connector can export), and
each label it filters, groups or labels a legend by must be one the code attaches (the ``ATTR_*``
attribute keys as Prometheus writes them) or one Prometheus adds. A renamed metric or attribute then
fails here instead of leaving an empty panel. The negative tests feed broken dashboards to the same
check and assert that the problem is reported.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from schemas import metrics
from schemas.metrics import PROMETHEUS_METRIC_NAMES

REPO_ROOT = Path(__file__).resolve().parents[3]
GRAFANA = REPO_ROOT / "deploy" / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
DATASOURCES = GRAFANA / "provisioning" / "datasources" / "prometheus.yml"

EXPORTED_LABELS = frozenset(
    str(getattr(metrics, name)).replace(".", "_") for name in dir(metrics) if name.startswith("ATTR_")
)
"""Labels the code attaches: OpenTelemetry attribute keys, with dots as Prometheus writes them."""
ADDED_LABELS = frozenset(
    {"le", "job", "instance", "otel_scope_name", "otel_scope_version", "otel_scope_schema_url"}
)
"""Labels the exporter (histogram buckets, instrumentation scope) or the Prometheus scrape adds."""

Problems = list[str]


# --- a PromQL scanner: enough of the grammar to tell metric names from functions, labels and keywords ---

_KEYWORDS = frozenset({"bool", "and", "or", "unless", "offset", "atan2", "inf", "nan"})
_GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_NUMBER = re.compile(r"(?:0x[0-9a-fA-F]+|\d*\.?\d+(?:[eE][+-]?\d+)?)(?:ms|[smhdwy])*")
_VARIABLE = re.compile(r"\$(?:\{[^}]*\}|\w+)")
_MATCHER = re.compile(
    r"""\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)\s*,?"""
)
_LEGEND_LABEL = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")


@dataclass(frozen=True)
class Token:
    kind: str  # ident, number, string, matchers, range, variable, punct
    text: str


def _string_end(expr: str, start: int) -> int:
    quote = expr[start]
    i = start + 1
    while i < len(expr):
        if expr[i] == "\\" and quote != "`":
            i += 2
            continue
        if expr[i] == quote:
            return i + 1
        i += 1
    raise ValueError(f"unterminated string in {expr!r}")


def tokens(expr: str) -> Iterator[Token]:
    i = 0
    while i < len(expr):
        c = expr[i]
        if c.isspace():
            i += 1
        elif c == "#":  # comment to the end of the line
            end = expr.find("\n", i)
            i = len(expr) if end < 0 else end
        elif c in "\"'`":
            end = _string_end(expr, i)
            yield Token("string", expr[i:end])
            i = end
        elif c == "{":
            j = i + 1
            while j < len(expr) and expr[j] != "}":
                j = _string_end(expr, j) if expr[j] in "\"'`" else j + 1
            if j >= len(expr):
                raise ValueError(f"unterminated label matchers in {expr!r}")
            yield Token("matchers", expr[i + 1 : j])
            i = j + 1
        elif c == "[":
            end = expr.index("]", i)
            yield Token("range", expr[i : end + 1])
            i = end + 1
        elif c == "$" and (match := _VARIABLE.match(expr, i)):
            yield Token("variable", match[0])
            i = match.end()
        elif (match := _NUMBER.match(expr, i)) and not _IDENT.match(expr, i):
            yield Token("number", match[0])
            i = match.end()
        elif match := _IDENT.match(expr, i):
            yield Token("ident", match[0])
            i = match.end()
        else:
            yield Token("punct", c)
            i += 1


@dataclass
class Query:
    metrics: set[str]
    labels: set[str]


def parse_promql(expr: str) -> Query:
    """Metric names and label names (matchers, by/without/on/ignoring/group_x lists) of ``expr``."""
    found = Query(set(), set())
    toks = list(tokens(expr))
    i = 0
    while i < len(toks):
        tok = toks[i]
        following = toks[i + 1] if i + 1 < len(toks) else None
        opens = following is not None and following.kind == "punct" and following.text == "("
        # An aggregation may put its grouping first: ``sum by (le) (...)``; a metric is never followed by it.
        opens = opens or (following is not None and following.kind == "ident" and following.text in _GROUPING)
        if tok.kind == "matchers":
            for label, op, value in _MATCHER.findall(tok.text):
                if label == "__name__" and op == "=":
                    found.metrics.add(value[1:-1])
                elif label != "__name__":
                    found.labels.add(label)
        elif tok.kind == "ident" and tok.text in _GROUPING and opens:
            i += 2
            while i < len(toks) and toks[i].text != ")":
                if toks[i].kind == "ident":
                    found.labels.add(toks[i].text)
                i += 1
        elif tok.kind == "ident" and not opens and tok.text.lower() not in _KEYWORDS | _GROUPING:
            found.metrics.add(tok.text)
        i += 1
    return found


_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(?P<selector>.+?)\s*,\s*)?(?P<label>\w+)\s*\)\s*$")
_QUERY_RESULT = re.compile(r"^\s*query_result\((?P<expr>.*)\)\s*$", re.S)


def parse_variable_query(query: str) -> Query:
    """Grafana's Prometheus variable queries: label_values(selector, label), query_result(expr), PromQL."""
    if match := _LABEL_VALUES.match(query):
        found = parse_promql(match["selector"]) if match["selector"] else Query(set(), set())
        found.labels.add(match["label"])
        return found
    if match := _QUERY_RESULT.match(query):
        return parse_promql(match["expr"])
    if query.strip().startswith(("label_names(", "metrics(")):
        return Query(set(), set())
    return parse_promql(query)


# --- the dashboards' queries -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DashboardQuery:
    where: str
    query: Query
    legend_labels: frozenset[str]


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels") or [])  # collapsed rows keep their panels inside


def queries(dashboard: dict[str, Any]) -> list[DashboardQuery]:
    found: list[DashboardQuery] = []
    title = dashboard.get("title", "?")
    for panel in _panels(dashboard.get("panels") or []):
        for target in panel.get("targets") or []:
            if "expr" in target:
                legend = frozenset(_LEGEND_LABEL.findall(str(target.get("legendFormat") or "")))
                where = f"{title} / {panel.get('title', '?')} / {target.get('refId', '?')}"
                found.append(DashboardQuery(where, parse_promql(target["expr"]), legend))
    for annotation in (dashboard.get("annotations") or {}).get("list") or []:
        if annotation.get("expr"):
            legend = frozenset(_LEGEND_LABEL.findall(str(annotation.get("textFormat") or "")))
            where = f"{title} / annotation {annotation.get('name', '?')}"
            found.append(DashboardQuery(where, parse_promql(annotation["expr"]), legend))
    for variable in (dashboard.get("templating") or {}).get("list") or []:
        if variable.get("type") == "query":
            raw = variable.get("query")
            text = raw.get("query", "") if isinstance(raw, dict) else str(raw or "")
            found.append(
                DashboardQuery(
                    f"{title} / variable ${variable['name']}", parse_variable_query(text), frozenset()
                )
            )
    return found


def check_dashboard(
    dashboard: dict[str, Any],
    exported: frozenset[str] = PROMETHEUS_METRIC_NAMES,
    labels: frozenset[str] = EXPORTED_LABELS | ADDED_LABELS,
) -> Problems:
    problems: Problems = []
    for q in queries(dashboard):
        for metric in sorted(q.query.metrics - exported):
            problems.append(
                f"{q.where}: metric {metric!r} is not exported by the code (PROMETHEUS_METRIC_NAMES)"
            )
        for label in sorted((q.query.labels | q.legend_labels) - labels):
            problems.append(f"{q.where}: label {label!r} is not one the code attaches ({sorted(labels)})")
    return problems


def _load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


# --- the real dashboards ---------------------------------------------------------------------------------


def test_there_is_a_dashboard() -> None:
    assert DASHBOARDS, f"no dashboard JSON under {GRAFANA / 'dashboards'}"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_query_uses_metrics_and_labels_the_code_exports(path: Path) -> None:
    dashboard = _load(path)
    assert queries(dashboard), f"{path.name}: no PromQL found (did the JSON layout change?)"
    problems = check_dashboard(dashboard)
    assert not problems, f"{path.name}:\n" + "\n".join(f"  - {p}" for p in problems)


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_shows_what_operators_need(path: Path) -> None:
    """Lag percentiles from the lag histogram, per stage, outcomes, consumer lag, SLA violations."""
    dashboard = _load(path)
    exprs = [t["expr"] for p in _panels(dashboard["panels"]) for t in p.get("targets") or [] if "expr" in t]
    text = "\n".join(exprs)
    assert re.search(r"histogram_quantile\(0\.99,.*freshkey_lag_milliseconds_bucket", text), "no lag p99"
    assert re.search(r"histogram_quantile\(0\.5,.*freshkey_stage_duration_milliseconds_bucket", text)
    for metric in ("freshkey_cache_outcomes_total", "freshkey_consumer_lag", "freshkey_sla_violations_total"):
        assert metric in text, f"no panel queries {metric}"
    used = set().union(*(parse_promql(e).metrics for e in exprs))
    assert used <= PROMETHEUS_METRIC_NAMES


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_lag_percentile_states_its_window(path: Path) -> None:
    """Prometheus's estimate over a rate interval and the worker's figure over the SLA window are two
    figures: each says which it is (legend or panel title), so no panel shows an unlabelled p99."""
    dashboard = _load(path)
    checked = 0
    for panel in _panels(dashboard["panels"]):
        for target in panel.get("targets") or []:
            expr, shown = target.get("expr", ""), f"{panel.get('title', '')} {target.get('legendFormat', '')}"
            if "histogram_quantile" in expr and "freshkey_lag_milliseconds_bucket" in expr:
                assert "rate interval" in shown, f"{panel.get('title')}: {target.get('legendFormat')!r}"
                checked += 1
            if "freshkey_sla_lag_p99_milliseconds" in expr:
                assert "SLA window" in shown, f"{panel.get('title')}: {target.get('legendFormat')!r}"
                checked += 1
    assert checked >= 2, "no lag percentile found (did the JSON layout change?)"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_layout_and_datasource(path: Path) -> None:
    """Unique ids, panels that do not overlap, every query on the provisioned Prometheus."""
    dashboard = _load(path)
    panels = list(_panels(dashboard["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {ids}"
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, f"{panel['title']}: wider than the 24-column grid"
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]} at {(x, y)}"
                cells[(x, y)] = panel["title"]
    provisioned = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    uids = {d["uid"] for d in provisioned if d["type"] == "prometheus"}
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["current"]["value"] in uids, (
        "the datasource variable's default is not provisioned"
    )
    for panel in panels:
        for target in panel.get("targets") or []:
            source = target.get("datasource") or panel.get("datasource")
            assert source and source.get("type") == "prometheus", f"{panel['title']}: datasource {source}"
            assert source.get("uid") in uids | {"${datasource}"}, f"{panel['title']}: datasource {source}"
    assert provisioned[0]["url"] == "http://prometheus:9090", "the datasource must reach the compose service"


# --- the scanner and the check catch what they claim to --------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "metrics", "labels"),
    [
        (
            "histogram_quantile(0.99, sum by (le) "
            '(rate(freshkey_lag_milliseconds_bucket{coarse="false"}[5m])))',
            {"freshkey_lag_milliseconds_bucket"},
            {"le", "coarse"},
        ),
        (
            "sum(rate(a_total[$__rate_interval])) by (stage) / on (stage) group_left(tier) b_count offset 5m",
            {"a_total", "b_count"},
            {"stage", "tier"},
        ),
        ('{__name__="by_name", kind=~"c|u"} > bool 0.5e3', {"by_name"}, {"kind"}),
        ('count_values("value", x{s="a}b"}) and y unless z or w', {"x", "y", "z", "w"}, {"s"}),
        ("max_over_time(up[1h:5m]) * Inf", {"up"}, set()),
        ("sum without (instance) (rate(c[1m]))  # a comment naming not_a_metric", {"c"}, {"instance"}),
    ],
)
def test_promql_scanner(expr: str, metrics: set[str], labels: set[str]) -> None:
    found = parse_promql(expr)
    assert found.metrics == metrics
    assert found.labels == labels


def test_variable_queries() -> None:
    found = parse_variable_query("label_values(freshkey_lag_milliseconds_bucket, namespace)")
    assert found.metrics == {"freshkey_lag_milliseconds_bucket"} and found.labels == {"namespace"}
    assert parse_variable_query("query_result(topk(3, freshkey_consumer_lag))").metrics == {
        "freshkey_consumer_lag"
    }
    assert parse_variable_query("label_values(tier)").labels == {"tier"}


def _first_target(dashboard: dict[str, Any]) -> dict[str, Any]:
    return next(t for p in _panels(dashboard["panels"]) for t in p.get("targets") or [] if "expr" in t)


def _set_expr(expr: str) -> Any:
    def mutate(dashboard: dict[str, Any]) -> None:
        _first_target(dashboard)["expr"] = expr

    return mutate


def _set_variable(query: str) -> Any:
    def mutate(dashboard: dict[str, Any]) -> None:
        variable = next(v for v in dashboard["templating"]["list"] if v["type"] == "query")
        variable["query"] = {"query": query, "refId": "x"}

    return mutate


def _set_legend(legend: str) -> Any:
    def mutate(dashboard: dict[str, Any]) -> None:
        _first_target(dashboard)["legendFormat"] = legend

    return mutate


BROKEN = [
    ("bogus counter", _set_expr("sum(rate(freshkey_bogus_total[5m]))"), "metric 'freshkey_bogus_total'"),
    (
        "histogram under an old name",
        _set_expr("histogram_quantile(0.99, sum by (le) (rate(freshkey_lag_ms_bucket[5m])))"),
        "metric 'freshkey_lag_ms_bucket'",
    ),
    ("counter without _total", _set_expr("rate(freshkey_events[1m])"), "metric 'freshkey_events'"),
    ("metric by __name__", _set_expr('{__name__="freshkey_nope"}'), "metric 'freshkey_nope'"),
    (
        "label the code does not attach",
        _set_expr('sum by (partition) (freshkey_consumer_lag{topic="x"})'),
        "label 'partition'",
    ),
    ("legend by a missing label", _set_legend("{{shard}}"), "label 'shard'"),
    (
        "variable on a missing metric",
        _set_variable("label_values(freshkey_gone, namespace)"),
        "'freshkey_gone'",
    ),
]


@pytest.mark.parametrize(("mutate", "expected"), [pytest.param(m, e, id=case) for case, m, e in BROKEN])
@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_check_reports_a_broken_dashboard(path: Path, mutate: Any, expected: str) -> None:
    dashboard = _load(path)
    assert not check_dashboard(dashboard), "the real dashboard must pass first"
    broken = copy.deepcopy(dashboard)
    mutate(broken)
    problems = check_dashboard(broken)
    assert any(expected in p for p in problems), f"expected a problem containing {expected!r}, got {problems}"
