//! `weir checkpoints PIPELINE [--format table|json]`: the checkpoint history of one pipeline
//! of a running `weir run` (the API's `GET /v1/pipelines/{id}/checkpoints`): per checkpoint
//! or savepoint its id, kind, status, trigger and end time, duration, size, new bytes, and
//! the subtask it waited for with that subtask's alignment; then why the failed ones failed.

use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use clap::{Args, ValueEnum};
use weir_engine::control::CheckpointInfo;

use super::api_args::{self, ApiArgs};

/// How `weir checkpoints` prints the history.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// A table, oldest first, then the failures.
    #[default]
    Table,
    /// The API's answer: a JSON array of checkpoints, oldest first.
    Json,
}

/// Arguments of `weir checkpoints`.
#[derive(Args, Debug)]
pub struct CheckpointsArgs {
    /// The pipeline id.
    pub pipeline: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    #[command(flatten)]
    pub api: ApiArgs,
}

/// Runs `weir checkpoints`.
pub fn run(args: &CheckpointsArgs) -> ExitCode {
    let client = match args.api.client() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let history = match client.checkpoints(&args.pipeline) {
        Ok(h) => h,
        Err(e) => return api_args::fail(Some(&client), &e),
    };
    match args.format {
        Format::Json => match serde_json::to_string_pretty(&history) {
            Ok(json) => println!("{json}"),
            Err(e) => {
                eprintln!("error: cannot print the checkpoints as JSON: {e}");
                return ExitCode::FAILURE;
            }
        },
        Format::Table => print!("{}", render(&args.pipeline, &history)),
    }
    ExitCode::SUCCESS
}

/// Unix milliseconds as an RFC 3339 time with milliseconds (UTC).
fn time(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// The history as a table, then one line per checkpoint that persisted channel state (unaligned
/// checkpoints: bytes in all and per subtask), then one line per failed or aborted checkpoint
/// with its reason.
pub fn render(pipeline: &str, history: &[CheckpointInfo]) -> String {
    if history.is_empty() {
        return format!("pipeline {pipeline}: no checkpoint completed or failed yet\n");
    }
    let header = [
        "ID",
        "KIND",
        "STATUS",
        "TRIGGERED",
        "ENDED",
        "DURATION",
        "SIZE",
        "NEW",
        "SLOWEST SUBTASK",
        "ALIGNMENT",
    ];
    let mut rows = vec![header.map(str::to_owned)];
    for c in history {
        let slowest = c.slowest();
        let trigger = time(c.trigger_time_ms);
        let end = time(c.end_time_ms());
        // The end shares the trigger's date nearly always: show its time of day only.
        let end = match (trigger.get(..11), end.get(11..)) {
            (Some(day), Some(clock)) if end.starts_with(day) => clock.to_owned(),
            _ => end,
        };
        let (size, new) = if c.failed() {
            ("-".to_owned(), "-".to_owned())
        } else {
            (api_args::bytes(c.size), api_args::bytes(c.new_bytes))
        };
        rows.push([
            c.id.to_string(),
            c.kind.clone(),
            c.status.clone(),
            trigger,
            end,
            api_args::duration(c.duration_ms),
            size,
            new,
            // The task names its subtask already (`sum[1]`).
            slowest.map_or("-".to_owned(), |s| {
                format!("{} {}", s.task, api_args::duration(s.ack_ms))
            }),
            slowest.map_or("-".to_owned(), |s| api_args::duration(s.alignment_ms)),
        ]);
    }
    // Numbers align right, text left; the last column is not padded.
    let right = [
        true, false, false, false, false, true, true, true, false, true,
    ];
    let mut out = String::new();
    for line in api_args::table_lines(&rows, right) {
        out.push_str(line.trim_end());
        out.push('\n');
    }
    // Unaligned checkpoints: the in-flight records they persisted, per subtask that had any.
    for c in history.iter().filter(|c| c.channel_state_bytes > 0) {
        let parts: Vec<String> = c
            .subtasks
            .iter()
            .filter(|s| s.channel_state_bytes > 0)
            .map(|s| format!("{} {}", s.task, api_args::bytes(s.channel_state_bytes)))
            .collect();
        out.push_str(&format!(
            "{} {} channel state: {} ({})\n",
            c.kind,
            c.id,
            api_args::bytes(c.channel_state_bytes),
            parts.join(", ")
        ));
    }
    for c in history.iter().filter(|c| c.failed()) {
        out.push_str(&format!(
            "{} {} {}: {}\n",
            c.kind,
            c.id,
            c.status,
            c.failure.as_deref().unwrap_or("no reason recorded")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use weir_engine::control::SubtaskCheckpointInfo;

    use super::*;

    fn subtask(task: &str, subtask: u32, ack_ms: u64, alignment_ms: u64) -> SubtaskCheckpointInfo {
        SubtaskCheckpointInfo {
            task: task.into(),
            subtask,
            size: 10,
            ack_ms,
            alignment_ms,
            channel_state_bytes: 0,
        }
    }

    #[test]
    fn renders_completed_and_failed_checkpoints() {
        let history = vec![
            CheckpointInfo {
                id: 7,
                kind: "checkpoint".into(),
                status: "completed".into(),
                trigger_time_ms: 1_700_000_000_000,
                duration_ms: 1_250,
                size: 3 * 1024 * 1024 + 400 * 1024,
                new_bytes: 2048,
                alignment_ms: 40,
                subtasks: vec![subtask("gen[0]", 0, 5, 0), subtask("sum[1]", 1, 1_200, 40)],
                ..CheckpointInfo::default()
            },
            CheckpointInfo {
                id: 8,
                kind: "savepoint".into(),
                status: "failed".into(),
                failure: Some("timed out".into()),
                trigger_time_ms: 1_700_000_060_000,
                duration_ms: 600_000,
                ..CheckpointInfo::default()
            },
        ];
        assert_eq!(
            render("p", &history),
            [
                "ID  KIND        STATUS     TRIGGERED                 ENDED          DURATION     SIZE      NEW  SLOWEST SUBTASK  ALIGNMENT",
                " 7  checkpoint  completed  2023-11-14T22:13:20.000Z  22:13:21.250Z     1.2 s  3.4 MiB  2.0 KiB  sum[1] 1.2 s         40 ms",
                " 8  savepoint   failed     2023-11-14T22:14:20.000Z  22:24:20.000Z    10m 0s        -        -  -                        -",
                "savepoint 8 failed: timed out\n",
            ]
            .join("\n")
        );
        assert_eq!(
            render("p", &[]),
            "pipeline p: no checkpoint completed or failed yet\n"
        );
    }

    #[test]
    fn renders_the_channel_state_of_unaligned_checkpoints() {
        let mut with = subtask("sum[1]", 1, 30, 0);
        with.channel_state_bytes = 2048;
        let history = vec![CheckpointInfo {
            id: 3,
            kind: "checkpoint".into(),
            status: "completed".into(),
            channel_state_bytes: 2048,
            subtasks: vec![subtask("sum[0]", 0, 20, 0), with],
            ..CheckpointInfo::default()
        }];
        let text = render("p", &history);
        assert!(
            text.ends_with("checkpoint 3 channel state: 2.0 KiB (sum[1] 2.0 KiB)\n"),
            "{text}"
        );
    }
}
