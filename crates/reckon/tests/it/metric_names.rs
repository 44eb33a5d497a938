//! Every PromQL expression of the alert rules and the Grafana dashboard parses
//! (`promql-parser`) and names only metrics reckon exports: the list comes from the
//! metrics' own descriptors (`reckon_web::metrics::exported_metric_names`), never a copy.
//! Plus the dashboard conventions a linter would check (stable uid, datasource variable,
//! units, `$__rate_interval`).

use promql_parser::parser::{self, Expr};
use promql_parser::util::{ExprVisitor, walk_expr};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

struct Names(BTreeSet<String>);

impl ExprVisitor for Names {
    type Error = String;
    fn pre_visit(&mut self, e: &Expr) -> Result<bool, String> {
        let vs = match e {
            Expr::VectorSelector(vs) => vs,
            Expr::MatrixSelector(ms) => &ms.vs,
            _ => return Ok(true),
        };
        let name = vs
            .name
            .clone()
            .ok_or_else(|| format!("selector without a metric name: {vs}"))?;
        self.0.insert(name);
        Ok(true)
    }
}

fn metric_names(expr: &str) -> BTreeSet<String> {
    let q = expr
        .replace("$__rate_interval", "5m")
        .replace("$tenant", ".*");
    let ast = parser::parse(&q).unwrap_or_else(|e| panic!("{expr}: {e}"));
    let mut v = Names(BTreeSet::new());
    walk_expr(&mut v, &ast).unwrap_or_else(|e| panic!("{expr}: {e}"));
    v.0
}

/// Series Prometheus makes itself for every target: rules about a replica being scraped at
/// all read these, not reckon's exposition.
const SCRAPE_SERIES: [&str; 1] = ["up"];

fn check_exported(origin: &str, expr: &str, exported: &BTreeSet<String>) -> usize {
    let names = metric_names(expr);
    for n in names
        .iter()
        .filter(|n| !SCRAPE_SERIES.contains(&n.as_str()))
    {
        let base = ["_bucket", "_count", "_sum"]
            .iter()
            .find_map(|s| n.strip_suffix(s))
            .filter(|b| exported.contains(*b));
        assert!(
            exported.contains(n) || base.is_some(),
            "{origin}: {n} is not a metric reckon exports (expr: {expr})"
        );
    }
    names.len()
}

fn exported() -> BTreeSet<String> {
    let e: BTreeSet<String> = reckon_web::metrics::exported_metric_names()
        .into_iter()
        .collect();
    // The contract names of PRODUCT.md "Metrics" are all among them.
    for n in [
        "reckon_unresolved_effects",
        "reckon_oldest_unresolved_age_seconds",
        "reckon_oldest_unresolved_timestamp_seconds",
        "reckon_source_last_scan_success_timestamp_seconds",
        "reckon_source_scan_errors_total",
        "reckon_records_ingested_total",
        "reckon_records_quarantined_total",
        "reckon_reconcile_outcomes_total",
        "reckon_provider_request_duration_seconds",
        "reckon_audit_findings",
        "reckon_audit_last_run_timestamp_seconds",
    ] {
        assert!(e.contains(n), "PRODUCT.md metric {n} is not exported");
    }
    e
}

#[test]
fn alert_rules_use_only_exported_metrics() {
    let exported = exported();
    let text = std::fs::read_to_string(root().join("deploy/prometheus/alerts.yml")).unwrap();
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    let mut alerts = 0;
    for g in doc["groups"].as_sequence().unwrap() {
        for r in g["rules"].as_sequence().unwrap() {
            let name = r["alert"].as_str().expect("only alerting rules");
            let expr = r["expr"].as_str().unwrap();
            assert!(
                check_exported(name, expr, &exported) > 0,
                "{name} reads no metric"
            );
            assert!(
                matches!(r["labels"]["severity"].as_str(), Some("warning" | "page")),
                "{name}: severity"
            );
            assert!(r["for"].as_str().is_some(), "{name}: for");
            let description = r["annotations"]["description"].as_str().unwrap_or("");
            assert!(
                description.contains("Next:"),
                "{name}: a description that says what to do next"
            );
            // Absolute wherever the alert is read (Alertmanager, Slack, Grafana): the base
            // is the external label every Prometheus loading these rules sets, and a loud
            // stand-in where one does not (never a bare "#anchor").
            let runbook = r["annotations"]["runbook_url"].as_str().unwrap();
            let (base, anchor) = runbook.split_once('#').unwrap();
            assert_eq!(
                base,
                "{{ or $externalLabels.reckon_runbooks_url `UNSET-external-label-reckon_runbooks_url` }}",
                "{name}: runbook_url"
            );
            let runbooks = std::fs::read_to_string(root().join("docs/runbooks.md")).unwrap();
            assert!(
                runbooks.lines().any(
                    |l| l.strip_prefix("## ").map(str::to_lowercase).as_deref() == Some(anchor)
                ),
                "{name}: no runbook section #{anchor}"
            );
            alerts += 1;
        }
    }
    assert!(alerts >= 8);
}

#[test]
fn dashboard_uses_only_exported_metrics_and_follows_the_conventions() {
    let exported = exported();
    let path = root().join("deploy/grafana/dashboards/reckon.json");
    let d: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(d["uid"], "reckon-overview", "stable uid");
    assert!(d["id"].is_null());
    let vars = d["templating"]["list"].as_array().unwrap();
    assert!(
        vars.iter().any(|v| v["name"] == "datasource"
            && v["type"] == "datasource"
            && v["query"] == "prometheus"),
        "datasource variable"
    );
    let mut exprs = 0;
    for p in d["panels"].as_array().unwrap() {
        let title = p["title"].as_str().unwrap();
        assert!(
            !p["description"].as_str().unwrap_or("").is_empty(),
            "{title}: description"
        );
        assert_eq!(
            p["datasource"]["uid"], "${datasource}",
            "{title}: datasource"
        );
        assert!(
            p["fieldConfig"]["defaults"]["unit"].as_str().is_some(),
            "{title}: unit"
        );
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            assert_eq!(
                t["datasource"]["uid"], "${datasource}",
                "{title}: target datasource"
            );
            if expr.contains("rate(") {
                assert!(
                    expr.contains("[$__rate_interval]"),
                    "{title}: use $__rate_interval"
                );
            }
            check_exported(title, expr, &exported);
            exprs += 1;
        }
    }
    assert!(exprs >= 10);
    // The tenant variable's query too.
    for v in vars.iter().filter(|v| v["type"] == "query") {
        let q = v["definition"].as_str().unwrap();
        let inner = q
            .strip_prefix("label_values(")
            .and_then(|r| r.split_once(','))
            .map(|(m, _)| m.trim())
            .unwrap();
        check_exported("tenant variable", inner, &exported);
    }
}

#[test]
fn an_unknown_metric_name_is_caught() {
    let exported = exported();
    let r = std::panic::catch_unwind(|| {
        check_exported("test", "rate(reckon_no_such_metric_total[5m])", &exported)
    });
    assert!(r.is_err());
    assert_eq!(
        check_exported(
            "test",
            "histogram_quantile(0.99, sum by (le) (rate(reckon_provider_request_duration_seconds_bucket[5m])))",
            &exported
        ),
        1
    );
}
