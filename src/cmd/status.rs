//! `weir status [--json]`: the pipelines of a running `weir run` as a table (state, records,
//! checkpoints, restarts, what each restored from), the partitions of sources that have them
//! (Kafka: each partition's next offset and lag, per subtask), each pipeline's last checkpoint
//! (duration, size, channel state, longest alignment), its reload count and last reload; or the
//! API's `JobStatus` as JSON.

use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use clap::Args;
use weir_engine::control::{JobStatus, PipelineStatus};

use super::api_args::{self, ApiArgs};

/// Arguments of `weir status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Print the status as JSON (the API's `JobStatus`) instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub api: ApiArgs,
}

/// Runs `weir status`.
pub fn run(args: &StatusArgs) -> ExitCode {
    let client = match args.api.client() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let status = match client.status() {
        Ok(s) => s,
        Err(e) => return api_args::fail(Some(&client), &e),
    };
    if args.json {
        match serde_json::to_string_pretty(&status) {
            Ok(json) => println!("{json}"),
            Err(e) => {
                eprintln!("error: cannot print the status as JSON: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{}", render(&status));
    }
    ExitCode::SUCCESS
}

/// The status as a table, then failures and reloads.
pub fn render(status: &JobStatus) -> String {
    let mut rows = vec![
        [
            "PIPELINE",
            "STATE",
            "SOURCE RECORDS",
            "SINK RECORDS",
            "CHECKPOINTS",
            "LATEST",
            "RESTARTS",
            "RESTORED FROM",
        ]
        .map(str::to_owned),
    ];
    for p in &status.pipelines {
        rows.push([
            p.id.clone(),
            p.state.clone(),
            p.source_records.to_string(),
            p.sink_records.to_string(),
            p.checkpoints.to_string(),
            p.latest_checkpoint
                .map_or("-".to_owned(), |c| c.to_string()),
            p.restarts.to_string(),
            p.restored_from.clone().unwrap_or_else(|| "-".to_owned()),
        ]);
    }
    // Numbers align right, text left; the last column is not padded.
    let right = [false, false, true, true, true, true, true, false];
    let mut out = format!("file: {}\n", status.file.display());
    if status.pipelines.is_empty() {
        out.push_str("no pipelines\n");
    } else {
        for line in api_args::table_lines(&rows, right) {
            out.push_str(&line);
            out.push('\n');
        }
    }
    out.push_str(&partitions(status));
    for p in &status.pipelines {
        out.push_str(&last_checkpoint(p));
    }
    for p in &status.pipelines {
        if let Some(error) = &p.error {
            out.push_str(&format!("pipeline {} failed: {error}\n", p.id));
        } else if p.consecutive_failures > 0 {
            out.push_str(&format!(
                "pipeline {}: {} failure{} in a row; the last, in `{}`: {}\n",
                p.id,
                p.consecutive_failures,
                if p.consecutive_failures == 1 { "" } else { "s" },
                p.failing.as_deref().unwrap_or("?"),
                p.last_error.as_deref().unwrap_or("?")
            ));
        }
    }
    out.push_str(&format!("reloads: {}", status.reloads));
    match &status.last_reload {
        None => out.push('\n'),
        Some(last) => {
            let at =
                humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(last.at_ms));
            let pause = last
                .pause_ms
                .map(|ms| format!(", longest pause {}", api_args::duration(ms)))
                .unwrap_or_default();
            out.push_str(&format!(
                "; last reload {} at {at}{pause}\n",
                last.result.replace('_', " ")
            ));
            for message in &last.messages {
                for line in message.trim_end().lines() {
                    out.push_str(&format!("  {line}\n"));
                }
            }
        }
    }
    out
}

/// The figures of a pipeline's last completed checkpoint on one line (empty before the
/// first): id, duration, size and new bytes, the channel state it persisted (unaligned
/// checkpoints) and the longest barrier alignment; then the failed checkpoints, if any.
fn last_checkpoint(p: &PipelineStatus) -> String {
    let mut out = String::new();
    if let Some(c) = &p.last_checkpoint {
        out.push_str(&format!(
            "last checkpoint of {}: {} in {}, {} ({} new)",
            p.id,
            c.id,
            api_args::duration(c.duration_ms),
            api_args::bytes(c.size),
            api_args::bytes(c.new_bytes)
        ));
        if c.channel_state_bytes > 0 {
            out.push_str(&format!(
                ", channel state {}",
                api_args::bytes(c.channel_state_bytes)
            ));
        }
        if let Some(a) = c.alignment.iter().max_by_key(|a| a.alignment_ms)
            && a.alignment_ms > 0
        {
            out.push_str(&format!(
                ", longest alignment {} ({}/{})",
                api_args::duration(a.alignment_ms),
                a.task,
                a.subtask
            ));
        }
        out.push('\n');
    }
    if p.checkpoints_failed > 0 {
        out.push_str(&format!(
            "checkpoints of {} failed: {}\n",
            p.id, p.checkpoints_failed
        ));
    }
    out
}

/// One table per source with partitions (Kafka): each partition's subtask, next offset and
/// lag (`-` when the end is not known yet); empty when no source has partitions.
fn partitions(status: &JobStatus) -> String {
    let mut out = String::new();
    for p in &status.pipelines {
        for op in p.operators.iter().filter(|o| o.role == "source") {
            let mut parts: Vec<_> = op
                .subtasks
                .iter()
                .flat_map(|s| s.partitions.iter().map(move |part| (s.subtask, part)))
                .map(|(subtask, part)| {
                    // `topic/number`: ordered by topic, then by number.
                    let (topic, n) = part
                        .partition
                        .rsplit_once('/')
                        .unwrap_or((&part.partition, ""));
                    (topic, n.parse::<i64>().unwrap_or(-1), subtask, part)
                })
                .collect();
            if parts.is_empty() {
                continue;
            }
            parts.sort_by_key(|(topic, n, subtask, _)| (*topic, *n, *subtask));
            let mut rows = vec![["PARTITION", "SUBTASK", "OFFSET", "LAG"].map(str::to_owned)];
            for (_, _, subtask, part) in parts {
                rows.push([
                    part.partition.clone(),
                    subtask.to_string(),
                    part.offset.to_string(),
                    part.lag.map_or("-".to_owned(), |l| l.to_string()),
                ]);
            }
            out.push_str(&format!("partitions of {}/{}:\n", p.id, op.id));
            for line in api_args::table_lines(&rows, [false, true, true, true]) {
                out.push_str(&format!("  {line}\n"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use weir_engine::control::{
        LastCheckpointStatus, OperatorStatus, ReloadOutcome, SubtaskAlignment, SubtaskStatus,
    };

    use super::*;

    #[test]
    fn renders_a_table() {
        let status = JobStatus {
            file: PathBuf::from("p.yaml"),
            pipelines: vec![
                PipelineStatus {
                    id: "totals".into(),
                    state: "running".into(),
                    source_records: 1200,
                    sink_records: 1100,
                    checkpoints: 3,
                    latest_checkpoint: Some(3),
                    last_checkpoint: Some(LastCheckpointStatus {
                        id: 3,
                        duration_ms: 45,
                        size: 3 << 20,
                        new_bytes: 512 << 10,
                        alignment: vec![
                            SubtaskAlignment {
                                task: "sum".into(),
                                subtask: 0,
                                alignment_ms: 2,
                            },
                            SubtaskAlignment {
                                task: "sum".into(),
                                subtask: 1,
                                alignment_ms: 30,
                            },
                        ],
                        channel_state_bytes: 12 << 10,
                    }),
                    checkpoints_failed: 1,
                    ..PipelineStatus::default()
                },
                PipelineStatus {
                    id: "a".into(),
                    state: "failed".into(),
                    restarts: 4,
                    restored_from: Some("/s/chk-2".into()),
                    error: Some("boom".into()),
                    ..PipelineStatus::default()
                },
                PipelineStatus {
                    id: "poison".into(),
                    state: "restarting".into(),
                    restarts: 8,
                    consecutive_failures: 8,
                    failing: Some("parse".into()),
                    last_error: Some("no such field".into()),
                    ..PipelineStatus::default()
                },
            ],
            reloads: 1,
            last_reload: Some(ReloadOutcome {
                result: "rolled_back".into(),
                messages: vec!["x failed\ny".into()],
                pause_ms: Some(1500),
                at_ms: 0,
                ..ReloadOutcome::default()
            }),
            ..JobStatus::default()
        };
        assert_eq!(
            render(&status),
            "file: p.yaml\n\
             PIPELINE  STATE       SOURCE RECORDS  SINK RECORDS  CHECKPOINTS  LATEST  RESTARTS  RESTORED FROM\n\
             totals    running               1200          1100            3       3         0  -\n\
             a         failed                   0             0            0       -         4  /s/chk-2\n\
             poison    restarting               0             0            0       -         8  -\n\
             last checkpoint of totals: 3 in 45 ms, 3.0 MiB (512.0 KiB new), channel state 12.0 KiB, longest alignment 30 ms (sum/1)\n\
             checkpoints of totals failed: 1\n\
             pipeline a failed: boom\n\
             pipeline poison: 8 failures in a row; the last, in `parse`: no such field\n\
             reloads: 1; last reload rolled back at 1970-01-01T00:00:00Z, longest pause 1.5 s\n\
             \x20 x failed\n\
             \x20 y\n"
        );
    }

    #[test]
    fn renders_the_partitions_of_kafka_sources() {
        // The partitions from JSON, as `weir status` receives them from the API.
        let parts = |v: serde_json::Value| serde_json::from_value(v).expect("partitions");
        let subtask = |subtask, partitions| SubtaskStatus {
            subtask,
            partitions,
            ..SubtaskStatus::default()
        };
        let op = |id: &str, role: &str, subtasks| OperatorStatus {
            id: id.into(),
            role: role.into(),
            subtasks,
            ..OperatorStatus::default()
        };
        let status = JobStatus {
            file: PathBuf::from("k.yaml"),
            pipelines: vec![PipelineStatus {
                id: "totals".into(),
                state: "running".into(),
                operators: vec![
                    op(
                        "orders",
                        "source",
                        vec![
                            subtask(
                                0,
                                parts(serde_json::json!([
                                    {"partition": "orders/0", "offset": 120, "lag": 3},
                                    {"partition": "orders/10", "offset": 5, "lag": null},
                                ])),
                            ),
                            subtask(
                                1,
                                parts(serde_json::json!([
                                    {"partition": "orders/2", "offset": 1_000_000, "lag": 0},
                                ])),
                            ),
                        ],
                    ),
                    op("files", "source", vec![subtask(0, Vec::new())]),
                    op("out", "sink", vec![subtask(0, Vec::new())]),
                ],
                ..PipelineStatus::default()
            }],
            ..JobStatus::default()
        };
        let text = render(&status);
        assert!(
            text.ends_with(
                "partitions of totals/orders:\n\
                 \x20 PARTITION  SUBTASK   OFFSET  LAG\n\
                 \x20 orders/0         0      120    3\n\
                 \x20 orders/2         1  1000000    0\n\
                 \x20 orders/10        0        5    -\n\
                 reloads: 0\n"
            ),
            "{text}"
        );
    }
}
