//! `GET /metrics`: a [`JobStatus`] as Prometheus metrics, in the OpenMetrics text format that
//! Prometheus scrapes, encoded by the `prometheus-client` crate. Every figure comes from the
//! status the job answers at scrape time (its counters live in the job's metrics store and
//! count across reloads and restarts), so this module keeps no state and measures nothing.
//!
//! Names follow Vector's `component_*` and Flink's checkpoint metrics, with a `weir_` prefix;
//! `docs/METRICS.md` lists every one with its labels.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::control::{JobStatus, OperatorStatus, PipelineStatus, SubtaskStatus};

/// The `Content-Type` of the answer.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

type Labels = Vec<(&'static str, String)>;
type Counters = Family<Labels, Counter<u64>>;
type SecondsCounters = Family<Labels, Counter<f64, std::sync::atomic::AtomicU64>>;
type Gauges = Family<Labels, Gauge<i64>>;
type RatioGauges = Family<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>;

/// Every metric family of one scrape.
#[derive(Default)]
struct Families {
    received: Counters,
    sent: Counters,
    errors: Counters,
    discarded: Counters,
    late: Counters,
    received_bytes: Counters,
    busy: SecondsCounters,
    backpressured: SecondsCounters,
    queue_fill: RatioGauges,
    lag: Gauges,
    pipeline_state: Gauges,
    restarts: Counters,
    checkpoints_completed: Counters,
    checkpoints_failed: Counters,
    checkpoints_in_progress: Gauges,
    last_checkpoint_id: Gauges,
    last_checkpoint_duration: RatioGauges,
    last_checkpoint_size: Gauges,
    last_checkpoint_new_bytes: Gauges,
    alignment: RatioGauges,
    state_size: Gauges,
    reloads: Counters,
    last_reload_pause: RatioGauges,
}

/// Clamps a count into a gauge's `i64`.
fn gauge(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Families {
    fn subtask(&self, p: &PipelineStatus, op: &OperatorStatus, s: &SubtaskStatus) {
        let labels: Labels = vec![
            ("pipeline", p.id.clone()),
            ("operator", op.id.clone()),
            ("role", op.role.clone()),
            ("type", op.type_name.clone()),
            ("subtask", s.subtask.to_string()),
        ];
        self.received.get_or_create(&labels).inc_by(s.records_in);
        if op.role != "sink" {
            self.sent.get_or_create(&labels).inc_by(s.records_out);
        }
        self.errors.get_or_create(&labels).inc_by(s.errors);
        for (reason, n) in [("skipped", s.skipped), ("dead_letter", s.dead_lettered)] {
            let mut l = labels.clone();
            l.push(("reason", reason.to_owned()));
            self.discarded.get_or_create(&l).inc_by(n);
        }
        if op.type_name == "window" {
            for (reason, n) in [("dropped", s.late_dropped), ("late_output", s.late_sent)] {
                let mut l = labels.clone();
                l.push(("reason", reason.to_owned()));
                self.late.get_or_create(&l).inc_by(n);
            }
        }
        if op.role == "source" {
            self.received_bytes
                .get_or_create(&labels)
                .inc_by(s.bytes_read);
        } else {
            self.queue_fill.get_or_create(&labels).set(s.queue_fill);
        }
        self.busy
            .get_or_create(&labels)
            .inc_by(s.busy_ms as f64 / 1e3);
        self.backpressured
            .get_or_create(&labels)
            .inc_by(s.backpressured_ms as f64 / 1e3);
        if let Some(lag) = s.lag {
            self.lag.get_or_create(&labels).set(gauge(lag));
        }
    }

    fn pipeline(&self, p: &PipelineStatus) {
        let labels: Labels = vec![("pipeline", p.id.clone())];
        let mut state = labels.clone();
        state.push(("state", p.state.clone()));
        self.pipeline_state.get_or_create(&state).set(1);
        self.restarts
            .get_or_create(&labels)
            .inc_by(u64::from(p.restarts));
        self.checkpoints_completed
            .get_or_create(&labels)
            .inc_by(p.checkpoints);
        self.checkpoints_failed
            .get_or_create(&labels)
            .inc_by(p.checkpoints_failed);
        self.checkpoints_in_progress
            .get_or_create(&labels)
            .set(gauge(p.checkpoints_in_progress));
        if let Some(c) = &p.last_checkpoint {
            self.last_checkpoint_id
                .get_or_create(&labels)
                .set(gauge(c.id));
            self.last_checkpoint_duration
                .get_or_create(&labels)
                .set(c.duration_ms as f64 / 1e3);
            self.last_checkpoint_size
                .get_or_create(&labels)
                .set(gauge(c.size));
            self.last_checkpoint_new_bytes
                .get_or_create(&labels)
                .set(gauge(c.new_bytes));
            for a in &c.alignment {
                let l: Labels = vec![
                    ("pipeline", p.id.clone()),
                    ("operator", a.task.clone()),
                    ("subtask", a.subtask.to_string()),
                ];
                self.alignment
                    .get_or_create(&l)
                    .set(a.alignment_ms as f64 / 1e3);
            }
        }
        for s in &p.state_sizes {
            let l: Labels = vec![
                ("pipeline", p.id.clone()),
                ("operator", s.operator.clone()),
                ("backend", s.backend.clone()),
            ];
            self.state_size.get_or_create(&l).set(gauge(s.bytes));
        }
        for op in &p.operators {
            for s in &op.subtasks {
                self.subtask(p, op, s);
            }
        }
    }

    fn job(&self, status: &JobStatus) {
        for (result, n) in [
            ("applied", status.reloads),
            ("rejected", status.reloads_rejected),
            ("rolled_back", status.reloads_rolled_back),
            ("failed", status.reloads_failed),
        ] {
            self.reloads
                .get_or_create(&vec![("result", result.to_owned())])
                .inc_by(n);
        }
        if let Some(ms) = status.last_reload_pause_ms {
            self.last_reload_pause
                .get_or_create(&Vec::new())
                .set(ms as f64 / 1e3);
        }
        for p in &status.pipelines {
            self.pipeline(p);
        }
    }

    fn register(self, r: &mut Registry) {
        // Counter names get their `_total` from the encoder, help texts their final period.
        r.register(
            "component_received_records",
            "Records that entered the element (a source: records it produced)",
            self.received,
        );
        r.register(
            "component_sent_records",
            "Records the element sent downstream (sources and operators)",
            self.sent,
        );
        r.register(
            "component_errors",
            "Records that failed in the element and were skipped or dead-lettered (a source: unreadable input)",
            self.errors,
        );
        r.register(
            "component_discarded_records",
            "Failed records by what happened to them: reason=\"skipped\" (dropped) or \"dead_letter\" (sent to a dead-letter output)",
            self.discarded,
        );
        r.register(
            "component_late_records",
            "Records a window received after their windows closed and their allowed lateness passed, by what became of them: reason=\"dropped\" (counted only) or \"late_output\" (sent to its `late` sink)",
            self.late,
        );
        r.register(
            "component_received_bytes",
            "Bytes a source read (file sources)",
            self.received_bytes,
        );
        r.register(
            "component_busy_seconds",
            "Time the subtask spent processing",
            self.busy,
        );
        r.register(
            "component_backpressured_seconds",
            "Time the subtask spent waiting for room in a full downstream channel",
            self.backpressured,
        );
        r.register(
            "component_input_queue_fill_ratio",
            "How full the subtask's input channels were when it last took a batch (0 to 1; the head element of a task's chain)",
            self.queue_fill,
        );
        r.register(
            "source_lag_bytes",
            "Bytes a file source has still to read to reach the end of its input",
            self.lag,
        );
        r.register(
            "pipeline_state",
            "1 for the state the pipeline is in (label state)",
            self.pipeline_state,
        );
        r.register(
            "pipeline_restarts",
            "Task restarts after failures",
            self.restarts,
        );
        r.register(
            "checkpoints_completed",
            "Checkpoints and savepoints completed",
            self.checkpoints_completed,
        );
        r.register(
            "checkpoints_failed",
            "Checkpoints aborted (declined, timed out, failed to write)",
            self.checkpoints_failed,
        );
        r.register(
            "checkpoints_in_progress",
            "Checkpoints triggered and neither completed nor aborted yet",
            self.checkpoints_in_progress,
        );
        r.register(
            "last_checkpoint_id",
            "Id of the last completed checkpoint",
            self.last_checkpoint_id,
        );
        r.register(
            "last_checkpoint_duration_seconds",
            "Trigger to completion of the last completed checkpoint",
            self.last_checkpoint_duration,
        );
        r.register(
            "last_checkpoint_size_bytes",
            "Bytes of every file the last completed checkpoint references",
            self.last_checkpoint_size,
        );
        r.register(
            "last_checkpoint_new_bytes",
            "Bytes of the last completed checkpoint that the one before it did not reference",
            self.last_checkpoint_new_bytes,
        );
        r.register(
            "last_checkpoint_alignment_seconds",
            "Barrier alignment of each task (named by its head operator) and subtask in the last completed checkpoint",
            self.alignment,
        );
        r.register(
            "state_size_bytes",
            "Bytes of an operator's state in the last completed checkpoint, over its subtasks",
            self.state_size,
        );
        r.register(
            "reloads",
            "Hot reloads by result: applied, rejected, rolled_back, failed",
            self.reloads,
        );
        r.register(
            "last_reload_pause_seconds",
            "The pause of the last reload that paused a pipeline",
            self.last_reload_pause,
        );
    }
}

/// `status` in the OpenMetrics text format, every name prefixed `weir_`.
pub fn render(status: &JobStatus) -> String {
    let families = Families::default();
    families.job(status);
    let mut registry = Registry::with_prefix("weir");
    families.register(&mut registry);
    let mut out = String::new();
    // Writing into a `String` cannot fail.
    let _ = encode(&mut out, &registry);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::{LastCheckpointStatus, StateSizeStatus, SubtaskAlignment};

    fn status() -> JobStatus {
        JobStatus {
            reloads: 2,
            reloads_rejected: 1,
            last_reload_pause_ms: Some(250),
            pipelines: vec![PipelineStatus {
                id: "p".into(),
                state: "running".into(),
                restarts: 1,
                checkpoints: 3,
                checkpoints_failed: 1,
                last_checkpoint: Some(LastCheckpointStatus {
                    id: 4,
                    duration_ms: 1500,
                    size: 2048,
                    new_bytes: 100,
                    alignment: vec![SubtaskAlignment {
                        task: "count".into(),
                        subtask: 0,
                        alignment_ms: 20,
                    }],
                    channel_state_bytes: 0,
                }),
                state_sizes: vec![StateSizeStatus {
                    operator: "count".into(),
                    backend: "rocksdb".into(),
                    bytes: 1024,
                }],
                operators: vec![
                    OperatorStatus {
                        id: "in".into(),
                        role: "source".into(),
                        type_name: "file".into(),
                        parallelism: 1,
                        subtasks: vec![SubtaskStatus {
                            records_in: 10,
                            records_out: 10,
                            bytes_read: 300,
                            lag: Some(0),
                            ..SubtaskStatus::default()
                        }],
                        ..OperatorStatus::default()
                    },
                    OperatorStatus {
                        id: "out".into(),
                        role: "sink".into(),
                        type_name: "file".into(),
                        parallelism: 1,
                        inputs: vec!["in".into()],
                        subtasks: vec![SubtaskStatus {
                            records_in: 9,
                            errors: 1,
                            dead_lettered: 1,
                            busy_ms: 1500,
                            queue_fill: 0.5,
                            ..SubtaskStatus::default()
                        }],
                    },
                ],
                ..PipelineStatus::default()
            }],
            ..JobStatus::default()
        }
    }

    #[test]
    fn every_figure_becomes_a_labelled_sample() {
        let text = render(&status());
        for line in [
            "weir_component_received_records_total{pipeline=\"p\",operator=\"in\",role=\"source\",type=\"file\",subtask=\"0\"} 10",
            "weir_component_received_records_total{pipeline=\"p\",operator=\"out\",role=\"sink\",type=\"file\",subtask=\"0\"} 9",
            "weir_component_sent_records_total{pipeline=\"p\",operator=\"in\",role=\"source\",type=\"file\",subtask=\"0\"} 10",
            "weir_component_discarded_records_total{pipeline=\"p\",operator=\"out\",role=\"sink\",type=\"file\",subtask=\"0\",reason=\"dead_letter\"} 1",
            "weir_component_discarded_records_total{pipeline=\"p\",operator=\"out\",role=\"sink\",type=\"file\",subtask=\"0\",reason=\"skipped\"} 0",
            "weir_component_received_bytes_total{pipeline=\"p\",operator=\"in\",role=\"source\",type=\"file\",subtask=\"0\"} 300",
            "weir_component_busy_seconds_total{pipeline=\"p\",operator=\"out\",role=\"sink\",type=\"file\",subtask=\"0\"} 1.5",
            "weir_component_input_queue_fill_ratio{pipeline=\"p\",operator=\"out\",role=\"sink\",type=\"file\",subtask=\"0\"} 0.5",
            "weir_source_lag_bytes{pipeline=\"p\",operator=\"in\",role=\"source\",type=\"file\",subtask=\"0\"} 0",
            "weir_pipeline_state{pipeline=\"p\",state=\"running\"} 1",
            "weir_pipeline_restarts_total{pipeline=\"p\"} 1",
            "weir_checkpoints_completed_total{pipeline=\"p\"} 3",
            "weir_checkpoints_failed_total{pipeline=\"p\"} 1",
            "weir_last_checkpoint_duration_seconds{pipeline=\"p\"} 1.5",
            "weir_last_checkpoint_size_bytes{pipeline=\"p\"} 2048",
            "weir_last_checkpoint_alignment_seconds{pipeline=\"p\",operator=\"count\",subtask=\"0\"} 0.02",
            "weir_state_size_bytes{pipeline=\"p\",operator=\"count\",backend=\"rocksdb\"} 1024",
            "weir_reloads_total{result=\"applied\"} 2",
            "weir_reloads_total{result=\"rejected\"} 1",
            "weir_last_reload_pause_seconds 0.25",
            "# TYPE weir_component_received_records counter",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing `{line}` in:\n{text}"
            );
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
        // A sink sends nothing downstream: no such sample.
        assert!(
            !text.contains("weir_component_sent_records_total{pipeline=\"p\",operator=\"out\"")
        );
    }

    #[test]
    fn an_empty_job_still_answers() {
        let text = render(&JobStatus::default());
        assert!(
            text.contains("weir_reloads_total{result=\"applied\"} 0"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }
}
