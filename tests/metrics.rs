//! `GET /metrics` against real runs, over real HTTP: a `weir run` whose figures are scraped
//! while it runs, across a hot reload (scraped all through the reload: every scrape answers and
//! no counter goes back), and whose summary counts every generation; and a run in this
//! process with an injected failure, whose counters keep counting across the restart.
//! Nothing asserts on time.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use common::output::committed;
use common::run::DEADLINE;
use common::running::Running;

use weir_engine::api::ApiConfig;
use weir_engine::job::{self, JobOptions};
use weir_engine::runtime::fault::{Fault, FaultKind};

const COUNT: u64 = 20_000;

const SUM: &str = "fn reduce(acc, r) { #{user: acc.user, n: r.n, amount: acc.amount + r.amount} }";
/// The same sums, written differently (a reload that changes the script).
const SUM_REFACTORED: &str = "fn reduce(acc, r) { let amount = acc.amount + r.amount; #{user: acc.user, n: r.n, amount: amount} }\n          fn migrate(old) { old }";

/// Running totals per user: a generator (paced by `rate`), a keyed reduce and a file sink.
fn yaml(rate: u64, script: &str) -> String {
    format!(
        "version: 1
pipelines:
  - id: totals
    state: {{backend: fs}}
    checkpoints: {{mode: exactly_once, interval: 500ms, storage: .weir/checkpoints}}
    restart: {{strategy: fixed_delay, attempts: 3, delay: 10ms}}
    sources:
      - id: events
        type: generator
        count: {COUNT}
        rate: {rate}
        fields:
          n: {{kind: sequence}}
          user: {{kind: key, prefix: u, cardinality: 50}}
          amount: {{kind: int, min: 1, max: 10}}
    operators:
      - {{id: by_user, type: key_by, input: events, field: user}}
      - id: total
        type: reduce
        input: by_user
        emit: updates
        script: |
          {script}
    sinks:
      - {{id: out, type: file, input: total, path: out/totals}}
"
    )
}

/// One scrape: `(status code, content type, body)`.
fn get_metrics(api: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(api).expect("connect to the control API");
    stream
        .set_read_timeout(Some(DEADLINE))
        .expect("set a read timeout");
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {api}\r\nAuthorization: Bearer scraper\r\nConnection: close\r\n\r\n"
    )
    .expect("send the request");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read the answer");
    let (head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status code");
    let content_type = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type:")
                .map(|v| v.trim().to_owned())
        })
        .unwrap_or_default();
    (code, content_type, body.to_owned())
}

/// The samples of a scrape: `name{labels}` → value. Checks the text is well formed.
fn samples(text: &str) -> BTreeMap<String, f64> {
    assert!(text.ends_with("# EOF\n"), "no `# EOF` at the end:\n{text}");
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (key, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("a sample line without a value: `{line}`"));
        assert!(
            key.starts_with("weir_"),
            "a name without the prefix: `{line}`"
        );
        out.insert(key.to_owned(), value.parse().expect("a number"));
    }
    out
}

/// The value of one subtask-level sample of `name` for `operator` subtask 0.
fn component(
    samples: &BTreeMap<String, f64>,
    name: &str,
    operator: &str,
    role: &str,
    ty: &str,
) -> f64 {
    let key = format!(
        "{name}{{pipeline=\"totals\",operator=\"{operator}\",role=\"{role}\",type=\"{ty}\",subtask=\"0\"}}"
    );
    *samples
        .get(&key)
        .unwrap_or_else(|| panic!("no sample `{key}` in {samples:#?}"))
}

fn sink_records(samples: &BTreeMap<String, f64>) -> f64 {
    component(
        samples,
        "weir_component_received_records_total",
        "out",
        "sink",
        "file",
    )
}

/// Scrapes `api` in a loop on a thread until told to stop: every answer must be a 200 with
/// the sink's counter never going back. Returns the stop flag and the values seen.
fn scrape_all_along(api: String) -> (Arc<AtomicBool>, std::thread::JoinHandle<Vec<f64>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let handle = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let Ok(stream) = TcpStream::connect(&api) else {
                    break; // the run ended
                };
                drop(stream);
                let (code, _, body) = get_metrics(&api);
                assert_eq!(code, 200, "a scrape failed:\n{body}");
                let value = sink_records(&samples(&body));
                if let Some(last) = seen.last() {
                    assert!(
                        value >= *last,
                        "the sink's counter went back: {last} → {value}"
                    );
                }
                seen.push(value);
                std::thread::sleep(Duration::from_millis(20));
            }
            seen
        })
    };
    (stop, handle)
}

#[test]
fn metrics_are_scraped_over_http_and_keep_counting_across_a_hot_reload() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.yaml");
    std::fs::write(&file, yaml(2_000, SUM)).unwrap();
    let mut run = Running::start(dir.path(), Path::new("p.yaml"), &[]);
    run.wait_until("a checkpoint and records in the sink", |s| {
        s.pipelines[0].checkpoints >= 1 && s.pipelines[0].sink_records > 0
    });

    let (code, content_type, body) = get_metrics(&run.api);
    assert_eq!(code, 200, "{body}");
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    let first = samples(&body);
    for name in [
        "weir_component_received_records",
        "weir_component_sent_records",
        "weir_component_errors",
        "weir_component_discarded_records",
        "weir_component_busy_seconds",
        "weir_component_backpressured_seconds",
        "weir_component_input_queue_fill_ratio",
        "weir_checkpoints_completed",
        "weir_last_checkpoint_duration_seconds",
        "weir_reloads",
    ] {
        assert!(
            body.contains(&format!("# TYPE {name} ")),
            "no `{name}` in:\n{body}"
        );
    }
    let produced = component(
        &first,
        "weir_component_received_records_total",
        "events",
        "source",
        "generator",
    );
    assert!(produced > 0.0, "{body}");
    assert!(sink_records(&first) > 0.0, "{body}");
    assert!(first["weir_checkpoints_completed_total{pipeline=\"totals\"}"] >= 1.0);
    assert_eq!(
        first["weir_pipeline_state{pipeline=\"totals\",state=\"running\"}"],
        1.0
    );

    // A hot reload, scraped all along.
    let (stop, scraper) = scrape_all_along(run.api.clone());
    let before = sink_records(&samples(&get_metrics(&run.api).2));
    std::fs::write(&file, yaml(2_000, SUM_REFACTORED)).unwrap();
    let out = run.cli(&["reload"]);
    assert!(
        out.status.success(),
        "weir reload failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        run.log()
    );
    let status = run.wait_until("the reload to show", |s| s.reloads == 1);
    assert_eq!(
        status.last_reload.as_ref().map(|r| r.result.as_str()),
        Some("applied")
    );
    run.wait_until("records after the reload", |s| {
        s.pipelines[0].sink_records as f64 > before
    });
    let after = samples(&get_metrics(&run.api).2);
    assert!(
        sink_records(&after) > before,
        "the sink's counter started over"
    );
    assert_eq!(after["weir_reloads_total{result=\"applied\"}"], 1.0);
    assert!(after.contains_key("weir_last_reload_pause_seconds"));
    stop.store(true, Ordering::Relaxed);
    let seen = scraper.join().expect("the scraper");
    assert!(!seen.is_empty());

    // The summary counts both generations: the sink's records equal the output lines.
    assert!(run.wait_exit(Duration::from_secs(240)), "{}", run.log());
    let lines = committed(&dir.path().join("out/totals"));
    assert_eq!(lines.len() as u64, COUNT, "{}", run.log());
    let log = run.log();
    let sink_row = log
        .lines()
        .find(|l| l.trim_start().starts_with("out ") && l.contains("file"))
        .unwrap_or_else(|| panic!("no summary row for the sink:\n{log}"));
    let sink_in: u64 = sink_row
        .split_whitespace()
        .nth(3)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no count in `{sink_row}`"));
    assert_eq!(sink_in, COUNT, "{log}");
    assert!(
        log.contains("pipeline totals: ok in ") && log.contains(&format!(", {COUNT} records, ")),
        "the summary does not count every generation:\n{log}"
    );
    assert!(!log.contains("first record in -"), "{log}");
    // The version stopped for the reload did not "finish": one such line, at the real end.
    assert_eq!(log.matches("Pipeline finished.").count(), 1, "{log}");
}

#[test]
fn counters_keep_counting_across_a_restart_after_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.yaml");
    std::fs::write(&file, yaml(4_000, SUM)).unwrap();
    let plan = common::in_process::plan_of(&file);
    let fault = Arc::new(Fault::new(COUNT / 2, FaultKind::Error));
    let (addr_tx, addr_rx) = mpsc::channel();
    let addr_tx = Mutex::new(addr_tx);
    let options = JobOptions {
        faults: vec![("totals".into(), "total".into(), Arc::clone(&fault))],
        api: Some(ApiConfig::local(0, None)),
        api_ready: Some(Arc::new(move |addr| {
            let _ = addr_tx.lock().unwrap().send(addr.to_string());
        })),
        ..JobOptions::default()
    };
    let job = std::thread::spawn(move || job::run(plan, options));
    let api = addr_rx.recv_timeout(DEADLINE).expect("the API listens");
    let (stop, scraper) = scrape_all_along(api.clone());
    // Once the failure happened, a scrape shows the restart and counters that went on.
    let mut restarted = None;
    let until = std::time::Instant::now() + DEADLINE * 2;
    while restarted.is_none() && std::time::Instant::now() < until {
        if let Ok(stream) = TcpStream::connect(&api) {
            drop(stream);
            let s = samples(&get_metrics(&api).2);
            if s["weir_pipeline_restarts_total{pipeline=\"totals\"}"] >= 1.0 {
                restarted = Some(s);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    let seen = scraper.join().expect("the scraper");
    let summary = job.join().expect("the job thread").expect("the job runs");
    assert!(fault.fired());
    let p = &summary.pipelines[0];
    assert!(p.error.is_none(), "{:?}", p.error);
    assert_eq!(p.restarts, 1);
    let restarted = restarted.expect("a scrape after the restart");
    let before_failure = seen.iter().copied().fold(0.0, f64::max);
    assert!(before_failure > 0.0);
    // The counters did not start over at the restart: what the sink received in the whole
    // run covers every output line (replayed records count again).
    let sink = p.nodes.iter().find(|n| n.id == "out").unwrap();
    let lines = committed(&dir.path().join("out/totals"));
    assert_eq!(lines.len() as u64, COUNT);
    assert!(sink.records_in >= COUNT, "{sink:?}");
    assert!(sink_records(&restarted) > 0.0);
    let failed_op = p.nodes.iter().find(|n| n.id == "total").unwrap();
    assert!(failed_op.records_in >= COUNT, "{failed_op:?}");
}
