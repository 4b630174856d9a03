//! The web page of `weir run` in a real headless browser (Chromium through chromedriver): a
//! `weir run` of an endless pipeline with an API token, the page opened with the token in its
//! URL fragment; the page must draw one graph node per source, operator and sink with its id,
//! its figures must change from one reading to the next, and the checkpoint and reload
//! histories must fill in. Every wait polls against a generous deadline.
//!
//! Needs `chromium` and `chromedriver` (see `common::browser`): without them the test fails and
//! says what to install.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::path::Path;

use common::browser::Browser;
use common::running::Running;
use serde_json::Value;

const TOKEN: &str = "page-token-4b1d";

/// An endless generator through a filter and a map into a file sink, checkpointing often.
const PIPELINE: &str = "version: 1
pipelines:
  - id: live
    checkpoints: {interval: 300ms}
    sources:
      - {id: ticks, type: generator, rate: 300, fields: {n: {kind: sequence}}}
    operators:
      - {id: evens, type: filter, input: ticks, script: 'fn filter(r) { r.n % 2 == 0 }'}
      - {id: halved, type: map, input: evens, script: 'fn map(r) { #{half: r.n / 2} }'}
    sinks:
      - {id: out, type: file, input: halved, path: out}
";

/// What the page shows, read in one script: the graph's nodes (id, their text), the edges,
/// the pipeline's figures, the connection state and the history tables' rows.
const READ_PAGE: &str = r#"
const nodes = Array.from(document.querySelectorAll('svg.graph [data-operator]'));
const text = (selector) => {
  const node = document.querySelector(selector);
  return node ? node.textContent : null;
};
return {
  connection: document.getElementById('connection').getAttribute('data-state'),
  notice: text('#notice'),
  nodes: nodes.map((n) => ({ id: n.getAttribute('data-operator'), text: n.textContent })),
  edges: Array.from(document.querySelectorAll('svg.graph [data-edge]'))
    .map((e) => e.getAttribute('data-edge')),
  source_records: text('[data-pipeline="live"] [data-figure="source_records"]'),
  sink_records: text('[data-pipeline="live"] [data-figure="sink_records"]'),
  source_rate: text('[data-pipeline="live"] [data-figure="source_rate"]'),
  checkpoints: document.querySelectorAll('[data-pipeline="live"] table.checkpoints tbody tr').length,
  reloads: Array.from(document.querySelectorAll('#reloads tbody tr')).map((r) => r.textContent),
};
"#;

fn node_ids(page: &Value) -> Vec<String> {
    page["nodes"]
        .as_array()
        .map(|nodes| {
            nodes
                .iter()
                .filter_map(|n| n["id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_page_shows_the_graph_and_live_figures_in_a_real_browser() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("live.yaml"), PIPELINE).unwrap();
    let run = Running::start(tmp.path(), Path::new("live.yaml"), &["--api-token", TOKEN]);
    let status = run.wait_until("records and per-operator figures", |s| {
        s.pipelines
            .iter()
            .any(|p| p.source_records > 0 && !p.operators.is_empty())
    });
    let expected: Vec<String> = status.pipelines[0]
        .operators
        .iter()
        .map(|o| o.id.clone())
        .collect();
    assert_eq!(expected, ["ticks", "evens", "halved", "out"], "{status:#?}");

    let browser = Browser::start();
    browser.open(&format!("http://{}/#token={TOKEN}", run.api));

    // The graph: one node per element, each showing its id, and the edges of the plan.
    let page = browser.wait_for("the operator graph", READ_PAGE, |p| {
        p["connection"] == "live" && node_ids(p).len() == expected.len()
    });
    assert_eq!(node_ids(&page), expected, "{page:#}");
    for node in page["nodes"].as_array().unwrap() {
        let id = node["id"].as_str().unwrap();
        assert!(
            node["text"].as_str().is_some_and(|t| t.contains(id)),
            "the node of `{id}` shows its id: {node:#}"
        );
    }
    let edges: Vec<&str> = page["edges"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(edges, ["ticks->evens", "evens->halved", "halved->out"]);

    // The figures update: the record count read now changes in a later reading, and a rate
    // appears (after two readings).
    let first = page["sink_records"].clone();
    browser.wait_for("the sink's record count to change", READ_PAGE, |p| {
        p["sink_records"] != first && p["sink_records"].is_string()
    });
    browser.wait_for("a source rate", READ_PAGE, |p| {
        p["source_rate"].as_str().is_some_and(|r| r.ends_with("/s"))
    });

    // The checkpoint history, and a reload (the same file: `unchanged`) in the reload history.
    browser.wait_for("a checkpoint in the history", READ_PAGE, |p| {
        p["checkpoints"].as_u64().is_some_and(|n| n > 0)
    });
    let out = run.cli_env(&["reload"], &[("WEIR_API_TOKEN", TOKEN)]);
    assert!(
        out.status.success(),
        "weir reload: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = browser.wait_for("the reload in the history", READ_PAGE, |p| {
        p["reloads"].as_array().is_some_and(|r| !r.is_empty())
    });
    assert!(
        page["reloads"][0]
            .as_str()
            .is_some_and(|r| r.contains("unchanged")),
        "{page:#}"
    );
    assert!(
        !run.log().contains(TOKEN),
        "the token is in the log:\n{}",
        run.log()
    );
}
