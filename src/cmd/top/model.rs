//! What `weir top` shows, computed from two samples of the job: per operator the rates of its
//! cumulative counters (records in and out per second, errors), the share of wall time its
//! subtasks spent backpressured or busy, its input queue fill and its lag; per pipeline its
//! state, restarts and last checkpoint; for the job its reloads. Pure: no I/O, no terminal.

use std::collections::HashMap;
use std::time::Duration;

use weir_engine::control::{CheckpointInfo, JobStatus, OperatorStatus, SubtaskStatus};

/// One reading of the job: its status and each pipeline's checkpoint history.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    /// When it was taken (monotonic, for rates).
    pub at: Duration,
    /// When it was taken (Unix milliseconds, for ages).
    pub now_ms: u64,
    /// The status.
    pub status: JobStatus,
    /// Completed checkpoints by pipeline (most recent last).
    pub checkpoints: HashMap<String, Vec<CheckpointInfo>>,
}

/// The whole screen's content.
#[derive(Clone, Debug, PartialEq)]
pub struct View {
    /// The pipeline file.
    pub file: String,
    /// Reloads applied, and the last reload's result and age.
    pub reloads: String,
    /// Seconds the rates are measured over (`None` on the first sample).
    pub over: Option<f64>,
    /// Per pipeline, in file order.
    pub pipelines: Vec<PipelineView>,
}

/// One pipeline.
#[derive(Clone, Debug, PartialEq)]
pub struct PipelineView {
    /// Its id.
    pub id: String,
    /// Its state.
    pub state: String,
    /// Restarts after failures.
    pub restarts: u32,
    /// The last completed checkpoint: id, age and duration, as text (`-` when none).
    pub checkpoint: String,
    /// Per operator, in plan order.
    pub operators: Vec<OperatorRow>,
}

/// One operator's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct OperatorRow {
    /// Its id.
    pub id: String,
    /// `source`, `operator` or `sink`.
    pub role: String,
    /// Its `type:`.
    pub type_name: String,
    /// Its parallelism.
    pub parallelism: u32,
    /// Records in per second.
    pub in_rate: Option<f64>,
    /// Records out per second.
    pub out_rate: Option<f64>,
    /// Errors so far.
    pub errors: u64,
    /// Errors per second.
    pub error_rate: Option<f64>,
    /// Share of wall time its subtasks were backpressured, 0..=1.
    pub backpressure: Option<f64>,
    /// Share of wall time its subtasks were busy, 0..=1.
    pub busy: Option<f64>,
    /// The fullest input queue of its subtasks, 0..=1 (`None` for a source).
    pub queue: Option<f64>,
    /// Sources: how far behind their input they are, summed over subtasks, when known.
    pub lag: Option<u64>,
}

/// The column titles of an operator table.
pub const COLUMNS: [&str; 11] = [
    "OPERATOR",
    "TYPE",
    "PAR",
    "IN/s",
    "OUT/s",
    "ERRORS",
    "ERR/s",
    "BACKPRESSURE",
    "BUSY",
    "QUEUE",
    "LAG",
];

/// Which columns align right (numbers).
pub const RIGHT: [bool; 11] = [
    false, false, true, true, true, true, true, true, true, true, true,
];

/// Per second: `cur - prev` over `secs`; `None` without an interval or when the counter went
/// back (a counter that restarted is no rate).
pub fn rate(prev: u64, cur: u64, secs: f64) -> Option<f64> {
    (secs > 0.0 && cur >= prev).then(|| (cur - prev) as f64 / secs)
}

/// The share of `elapsed_ms` × `subtasks` that a cumulative time counter grew by, clamped to
/// 0..=1 (timers and samples are not taken at the same instants).
pub fn share(prev_ms: u64, cur_ms: u64, elapsed_ms: f64, subtasks: usize) -> Option<f64> {
    let wall = elapsed_ms * subtasks.max(1) as f64;
    (wall > 0.0 && cur_ms >= prev_ms).then(|| ((cur_ms - prev_ms) as f64 / wall).clamp(0.0, 1.0))
}

fn total(op: &OperatorStatus, f: impl Fn(&SubtaskStatus) -> u64) -> u64 {
    op.subtasks.iter().map(f).sum()
}

/// The view of `cur`, with rates against `prev` when there is one.
pub fn view(prev: Option<&Sample>, cur: &Sample) -> View {
    let secs = prev
        .map(|p| cur.at.saturating_sub(p.at).as_secs_f64())
        .filter(|s| *s > 0.0);
    let find = |pipeline: &str, id: &str| -> Option<&OperatorStatus> {
        prev?
            .status
            .pipelines
            .iter()
            .find(|p| p.id == pipeline)?
            .operators
            .iter()
            .find(|o| o.id == id)
    };
    let pipelines = cur
        .status
        .pipelines
        .iter()
        .map(|p| {
            let operators = p
                .operators
                .iter()
                .map(|op| {
                    let before = find(&p.id, &op.id);
                    let per_sec = |f: &dyn Fn(&SubtaskStatus) -> u64| {
                        let (b, s) = (before?, secs?);
                        rate(total(b, f), total(op, f), s)
                    };
                    let of_wall = |f: &dyn Fn(&SubtaskStatus) -> u64| {
                        let (b, s) = (before?, secs?);
                        share(total(b, f), total(op, f), s * 1000.0, op.subtasks.len())
                    };
                    let lags: Vec<u64> = op.subtasks.iter().filter_map(|s| s.lag).collect();
                    OperatorRow {
                        id: op.id.clone(),
                        role: op.role.clone(),
                        type_name: op.type_name.clone(),
                        parallelism: op.parallelism,
                        in_rate: per_sec(&|s| s.records_in),
                        out_rate: per_sec(&|s| s.records_out),
                        errors: total(op, |s| s.errors),
                        error_rate: per_sec(&|s| s.errors),
                        backpressure: of_wall(&|s| s.backpressured_ms),
                        busy: of_wall(&|s| s.busy_ms),
                        queue: (op.role != "source")
                            .then(|| op.subtasks.iter().map(|s| s.queue_fill).fold(0.0, f64::max)),
                        lag: (!lags.is_empty()).then(|| lags.iter().sum()),
                    }
                })
                .collect();
            PipelineView {
                id: p.id.clone(),
                state: p.state.clone(),
                restarts: p.restarts,
                checkpoint: last_checkpoint(cur, &p.id, p.latest_checkpoint),
                operators,
            }
        })
        .collect();
    let reloads = match &cur.status.last_reload {
        Some(last) => format!(
            "{} (last {} {} ago)",
            cur.status.reloads,
            last.result.replace('_', " "),
            age(cur.now_ms.saturating_sub(last.at_ms))
        ),
        None => cur.status.reloads.to_string(),
    };
    View {
        file: cur.status.file.display().to_string(),
        reloads,
        over: secs,
        pipelines,
    }
}

/// `#12, 3.2 s ago, took 15 ms`; `-` when none completed.
fn last_checkpoint(cur: &Sample, pipeline: &str, latest: Option<u64>) -> String {
    let last = cur.checkpoints.get(pipeline).and_then(|h| h.last());
    match (last, latest) {
        (Some(c), _) => {
            let ended = c.trigger_time_ms + c.duration_ms;
            let kind = if c.kind == "checkpoint" {
                String::new()
            } else {
                format!(" {}", c.kind)
            };
            format!(
                "#{}{kind}, {} ago, took {}",
                c.id,
                age(cur.now_ms.saturating_sub(ended)),
                millis(c.duration_ms)
            )
        }
        (None, Some(id)) => format!("#{id}"),
        (None, None) => "-".to_owned(),
    }
}

/// Milliseconds as a short age: `850 ms`, `3.2 s`, `4m 10s`, `2h 5m`.
pub fn age(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{}m {}s", ms / 60_000, (ms % 60_000) / 1000),
        _ => format!("{}h {}m", ms / 3_600_000, (ms % 3_600_000) / 60_000),
    }
}

fn millis(ms: u64) -> String {
    age(ms)
}

/// A rate as text: `-` unknown, `0`, `12.5`, `2.3k`, `1.5M`.
pub fn per_second(r: Option<f64>) -> String {
    match r {
        None => "-".to_owned(),
        Some(r) if r < 0.05 => "0".to_owned(),
        Some(r) if r < 1_000.0 => format!("{r:.1}"),
        Some(r) if r < 1_000_000.0 => format!("{:.1}k", r / 1_000.0),
        Some(r) => format!("{:.1}M", r / 1_000_000.0),
    }
}

/// A share as a percentage: `-` unknown, `37%`.
pub fn percent(s: Option<f64>) -> String {
    s.map_or("-".to_owned(), |s| format!("{:.0}%", s * 100.0))
}

impl OperatorRow {
    /// The row's cells, in [`COLUMNS`] order.
    pub fn cells(&self) -> [String; 11] {
        [
            self.id.clone(),
            self.type_name.clone(),
            self.parallelism.to_string(),
            per_second(self.in_rate),
            per_second(self.out_rate),
            self.errors.to_string(),
            per_second(self.error_rate),
            percent(self.backpressure),
            percent(self.busy),
            percent(self.queue),
            self.lag.map_or("-".to_owned(), |l| l.to_string()),
        ]
    }
}

impl PipelineView {
    /// The pipeline's headline: `pipeline p  running  restarts 0  checkpoint #12, ...`.
    pub fn headline(&self) -> String {
        format!(
            "pipeline {}  {}  restarts {}  checkpoint {}",
            self.id, self.state, self.restarts, self.checkpoint
        )
    }
}

impl View {
    /// The job's headline.
    pub fn headline(&self) -> String {
        let over = self
            .over
            .map_or("rates from the next refresh on".to_owned(), |s| {
                format!("rates over {s:.1} s")
            });
        format!("file {}  reloads {}  {over}", self.file, self.reloads)
    }

    /// The view as plain lines (the non-terminal output of `weir top`): the headline, then per
    /// pipeline its headline and an aligned table.
    pub fn plain(&self) -> String {
        let mut out = self.headline();
        out.push('\n');
        if self.pipelines.is_empty() {
            out.push_str("no pipelines\n");
        }
        for p in &self.pipelines {
            out.push_str(&p.headline());
            out.push('\n');
            let mut rows = vec![COLUMNS.map(str::to_owned)];
            rows.extend(p.operators.iter().map(OperatorRow::cells));
            let mut widths = [0usize; 11];
            for row in &rows {
                for (w, c) in widths.iter_mut().zip(row) {
                    *w = (*w).max(c.chars().count());
                }
            }
            for row in &rows {
                let cells: Vec<String> = row
                    .iter()
                    .zip(widths)
                    .zip(RIGHT)
                    .map(|((c, w), right)| {
                        if right {
                            format!("{c:>w$}")
                        } else {
                            format!("{c:<w$}")
                        }
                    })
                    .collect();
                out.push_str("  ");
                out.push_str(cells.join("  ").trim_end());
                out.push('\n');
            }
        }
        out
    }
}

#[cfg(test)]
pub(super) mod tests {
    use weir_engine::control::PipelineStatus;

    use super::*;

    #[test]
    fn rates_come_from_differences() {
        assert_eq!(rate(100, 300, 2.0), Some(100.0));
        assert_eq!(rate(100, 100, 2.0), Some(0.0));
        assert_eq!(rate(300, 100, 2.0), None, "a counter that went back");
        assert_eq!(rate(0, 10, 0.0), None, "no interval");
        assert_eq!(share(1_000, 1_500, 1_000.0, 2), Some(0.25));
        assert_eq!(share(0, 5_000, 1_000.0, 1), Some(1.0), "clamped");
        assert_eq!(share(0, 0, 0.0, 1), None);
        assert_eq!(per_second(None), "-");
        assert_eq!(per_second(Some(0.01)), "0");
        assert_eq!(per_second(Some(12.34)), "12.3");
        assert_eq!(per_second(Some(2_345.0)), "2.3k");
        assert_eq!(per_second(Some(1_500_000.0)), "1.5M");
        assert_eq!(percent(Some(0.372)), "37%");
        assert_eq!(age(850), "850 ms");
        assert_eq!(age(3_250), "3.2 s");
        assert_eq!(age(250_000), "4m 10s");
    }

    fn op(id: &str, role: &str, subtasks: &[(u64, u64, u64, u64)]) -> OperatorStatus {
        OperatorStatus {
            id: id.into(),
            role: role.into(),
            type_name: if role == "operator" { "map" } else { role }.into(),
            parallelism: subtasks.len() as u32,
            subtasks: subtasks
                .iter()
                .enumerate()
                .map(
                    |(i, &(records_in, records_out, errors, backpressured_ms))| SubtaskStatus {
                        subtask: i as u32,
                        records_in,
                        records_out,
                        errors,
                        backpressured_ms,
                        queue_fill: 0.5 * i as f64,
                        lag: (role == "source").then_some(100),
                        ..SubtaskStatus::default()
                    },
                )
                .collect(),
            ..OperatorStatus::default()
        }
    }

    /// A sample of pipeline `p` at second `at` with `k` records through every element.
    pub(crate) fn sample(at: u64, k: u64) -> Sample {
        Sample {
            at: Duration::from_secs(at),
            now_ms: 1_700_000_000_000 + at * 1000,
            status: JobStatus {
                file: "p.yaml".into(),
                pipelines: vec![PipelineStatus {
                    id: "p".into(),
                    state: "running".into(),
                    restarts: 1,
                    latest_checkpoint: Some(4),
                    operators: vec![
                        op("ev", "source", &[(k, k, 0, 0)]),
                        op(
                            "tag",
                            "operator",
                            &[(k / 2, k / 2, k / 100, k), (k / 2, k / 2, 0, 0)],
                        ),
                        op("out", "sink", &[(k, 0, 0, 0)]),
                    ],
                    ..PipelineStatus::default()
                }],
                reloads: 0,
                last_reload: None,
                ..JobStatus::default()
            },
            checkpoints: HashMap::from([(
                "p".to_owned(),
                vec![CheckpointInfo {
                    id: 4,
                    kind: "checkpoint".into(),
                    trigger_time_ms: 1_700_000_000_000 + at * 1000 - 2_500,
                    duration_ms: 30,
                    ..CheckpointInfo::default()
                }],
            )]),
        }
    }

    #[test]
    fn a_view_has_rates_against_the_previous_sample() {
        let first = view(None, &sample(10, 1_000));
        assert_eq!(first.over, None);
        assert!(
            first.pipelines[0]
                .operators
                .iter()
                .all(|o| o.in_rate.is_none())
        );
        let v = view(Some(&sample(10, 1_000)), &sample(12, 5_000));
        assert_eq!(v.over, Some(2.0));
        let p = &v.pipelines[0];
        assert_eq!(p.checkpoint, "#4, 2.5 s ago, took 30 ms");
        let tag = &p.operators[1];
        assert_eq!(tag.in_rate, Some(2_000.0));
        assert_eq!(tag.error_rate, Some(20.0));
        assert_eq!(tag.errors, 50);
        // 4000 ms backpressured of 2 subtasks x 2000 ms.
        assert_eq!(tag.backpressure, Some(1.0));
        assert_eq!(tag.queue, Some(0.5));
        assert_eq!(p.operators[0].queue, None, "a source has no input queue");
        assert_eq!(p.operators[0].lag, Some(100));
        assert_eq!(
            v.plain(),
            "file p.yaml  reloads 0  rates over 2.0 s\n\
             pipeline p  running  restarts 1  checkpoint #4, 2.5 s ago, took 30 ms\n\
             \x20 OPERATOR  TYPE    PAR  IN/s  OUT/s  ERRORS  ERR/s  BACKPRESSURE  BUSY  QUEUE  LAG\n\
             \x20 ev        source    1  2.0k   2.0k       0      0            0%    0%      -  100\n\
             \x20 tag       map       2  2.0k   2.0k      50   20.0          100%    0%    50%    -\n\
             \x20 out       sink      1  2.0k      0       0      0            0%    0%     0%    -\n"
        );
    }
}
