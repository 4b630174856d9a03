//! Plain-text rendering of control answers that both the CLI verbs and `weir run`'s logs
//! show: a reload outcome and its per-pipeline plan. No colours, no terminal detection: the
//! text reads the same in a terminal, a log line or a test.

use std::fmt::Write as _;

use crate::control::{NamedStateReloadPlan, OperatorReloadPlan, PipelineReloadPlan, ReloadOutcome};

/// A reload outcome as text: a headline (what happened), the longest pause, the plan of
/// every pipeline (what happens to each operator's state) and the messages, e.g.
///
/// ```text
/// reload applied (longest pause 120 ms)
/// pipeline totals: changed
///   events        state kept
///   sum           state migrated (script changed)
///   sum           parallelism 2 → 3 (key groups redistributed)
///   enrich        new
///   old_dedup     state dropped
/// pipeline audit: unchanged
/// ```
pub fn render_reload(outcome: &ReloadOutcome) -> String {
    let mut out = headline(outcome);
    if let Some(ms) = outcome.pause_ms {
        let _ = write!(out, " (longest pause {ms} ms)");
    }
    out.push('\n');
    out.push_str(&render_reload_plan(&outcome.pipelines));
    for message in &outcome.messages {
        let message = message.trim_end();
        if message.contains('\n') {
            let _ = writeln!(out, "{message}");
        } else {
            let _ = writeln!(out, "  {message}");
        }
    }
    out
}

/// The per-pipeline part of [`render_reload`]: per operator its state, then (when they
/// differ from "kept as they were") its named states, then its parallelism change; problems
/// and state dropped on purpose last.
pub fn render_reload_plan(pipelines: &[PipelineReloadPlan]) -> String {
    let mut out = String::new();
    for p in pipelines {
        let change = match p.change.as_str() {
            "added" => "added (starts empty)",
            "removed" => "removed (stopped with a savepoint)",
            "changed" => "changed (savepoint, new graph, restore)",
            other => other,
        };
        let _ = writeln!(out, "pipeline {}: {change}", p.pipeline);
        if let Some((from, to)) = &p.backend {
            let _ = writeln!(
                out,
                "  state backend {from} → {to} (the savepoint is read back into {to})"
            );
        }
        let width = p
            .operators
            .iter()
            .map(|o| o.id.chars().count())
            .max()
            .unwrap_or(0)
            .max(12);
        for op in &p.operators {
            let _ = writeln!(out, "  {:<width$}  {}", op.id, operator_state(op));
            let all_kept = op
                .states
                .iter()
                .all(|s| s.change == "kept" || s.change == "migrated");
            if !all_kept {
                for st in &op.states {
                    let _ = writeln!(out, "  {:<width$}  {}", op.id, named_state(st));
                }
            }
            if op.unrecorded {
                let _ = writeln!(
                    out,
                    "  {:<width$}  state names and kinds not compared (not recorded by the \
                     snapshot, taken by an older Weir)",
                    op.id
                );
            }
            if let Some((old, new)) = op.parallelism {
                let how = if op.key_groups_redistributed {
                    " (key groups redistributed)"
                } else if op.state == "stateless" {
                    ""
                } else {
                    " (its state is split among the new subtasks)"
                };
                let _ = writeln!(out, "  {:<width$}  parallelism {old} → {new}{how}", op.id);
            }
        }
        for waived in &p.waived {
            let _ = writeln!(out, "  allowed: {waived}");
        }
        for problem in &p.problems {
            let _ = writeln!(out, "  problem: {problem}");
        }
    }
    out
}

fn named_state(st: &NamedStateReloadPlan) -> String {
    let name = &st.name;
    let kind = &st.kind;
    match (st.change.as_str(), &st.from_kind) {
        ("kept", _) => format!("state `{name}` ({kind}) kept"),
        ("migrated", _) => format!("state `{name}` ({kind}) migrated"),
        ("new", _) => format!("state `{name}` ({kind}) new (starts empty)"),
        ("dropped", _) => format!("state `{name}` ({kind}) dropped (not declared any more)"),
        ("retyped", Some(from)) => {
            format!("state `{name}` {from} → {kind} (every value goes through migrate)")
        }
        ("incompatible", Some(from)) => {
            format!("state `{name}` {from} → {kind}: incompatible (no migrate)")
        }
        (other, _) => format!("state `{name}` ({kind}) {other}"),
    }
}

fn headline(outcome: &ReloadOutcome) -> String {
    match outcome.result.as_str() {
        "applied" => "reload applied".to_owned(),
        "unchanged" => "reload: nothing changed".to_owned(),
        "rejected" => "reload rejected: nothing changed".to_owned(),
        "rolled_back" => {
            "reload rolled back: the new version failed to start; the old one runs again".to_owned()
        }
        "failed" => "reload failed: the new version failed and so did the rollback".to_owned(),
        "planned" => "reload plan (nothing applied)".to_owned(),
        other => format!("reload: {other}"),
    }
}

fn operator_state(op: &OperatorReloadPlan) -> String {
    let mut s = match op.state.as_str() {
        "kept" => "state kept".to_owned(),
        "migrated" => "state migrated".to_owned(),
        "dropped" => "state dropped".to_owned(),
        "new" => "new".to_owned(),
        "stateless" => "stateless".to_owned(),
        other => format!("state {other}"),
    };
    if op.script_changed {
        s.push_str(" (script changed)");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(
        id: &str,
        state: &str,
        script_changed: bool,
        par: Option<(u32, u32)>,
    ) -> OperatorReloadPlan {
        OperatorReloadPlan {
            id: id.into(),
            state: state.into(),
            script_changed,
            parallelism: par,
            key_groups_redistributed: par.is_some() && state != "stateless",
            ..OperatorReloadPlan::default()
        }
    }

    #[test]
    fn renders_an_applied_reload() {
        let outcome = ReloadOutcome {
            result: "applied".into(),
            pipelines: vec![
                PipelineReloadPlan {
                    pipeline: "totals".into(),
                    change: "changed".into(),
                    operators: vec![
                        op("events", "kept", false, None),
                        op("sum", "migrated", true, Some((2, 3))),
                        op("enrich", "new", false, None),
                        op("old_dedup", "dropped", false, None),
                        op("shape", "stateless", true, Some((2, 3))),
                    ],
                    problems: vec![],
                    ..PipelineReloadPlan::default()
                },
                PipelineReloadPlan {
                    pipeline: "audit".into(),
                    change: "unchanged".into(),
                    ..PipelineReloadPlan::default()
                },
            ],
            messages: vec!["took the savepoint /s/sp-7".into()],
            pause_ms: Some(120),
            at_ms: 0,
        };
        assert_eq!(
            render_reload(&outcome),
            "reload applied (longest pause 120 ms)\n\
             pipeline totals: changed (savepoint, new graph, restore)\n\
             \x20 events        state kept\n\
             \x20 sum           state migrated (script changed)\n\
             \x20 sum           parallelism 2 → 3 (key groups redistributed)\n\
             \x20 enrich        new\n\
             \x20 old_dedup     state dropped\n\
             \x20 shape         stateless (script changed)\n\
             \x20 shape         parallelism 2 → 3\n\
             pipeline audit: unchanged\n\
             \x20 took the savepoint /s/sp-7\n"
        );
    }

    #[test]
    fn renders_named_states_backends_and_waived_state() {
        let named =
            |name: &str, change: &str, kind: &str, from: Option<&str>| NamedStateReloadPlan {
                name: name.into(),
                change: change.into(),
                kind: kind.into(),
                from_kind: from.map(Into::into),
            };
        let plan = PipelineReloadPlan {
            pipeline: "p".into(),
            change: "changed".into(),
            operators: vec![
                OperatorReloadPlan {
                    states: vec![
                        named("count", "new", "value", None),
                        named("cnt", "dropped", "value", None),
                    ],
                    ..op("counter", "new", true, None)
                },
                OperatorReloadPlan {
                    states: vec![named("seen", "retyped", "list", Some("value"))],
                    ..op("dedup", "migrated", true, None)
                },
                OperatorReloadPlan {
                    states: vec![named("acc", "kept", "value", None)],
                    ..op("sum", "kept", false, None)
                },
            ],
            backend: Some(("fs".into(), "rocksdb".into())),
            waived: vec!["operator `counter`: state `cnt` ...".into()],
            ..PipelineReloadPlan::default()
        };
        assert_eq!(
            render_reload_plan(&[plan]),
            "pipeline p: changed (savepoint, new graph, restore)\n\
             \x20 state backend fs → rocksdb (the savepoint is read back into rocksdb)\n\
             \x20 counter       new (script changed)\n\
             \x20 counter       state `count` (value) new (starts empty)\n\
             \x20 counter       state `cnt` (value) dropped (not declared any more)\n\
             \x20 dedup         state migrated (script changed)\n\
             \x20 dedup         state `seen` value → list (every value goes through migrate)\n\
             \x20 sum           state kept\n\
             \x20 allowed: operator `counter`: state `cnt` ...\n"
        );
    }

    #[test]
    fn renders_problems_and_multiline_messages() {
        let outcome = ReloadOutcome {
            result: "rejected".into(),
            pipelines: vec![PipelineReloadPlan {
                pipeline: "p".into(),
                change: "changed".into(),
                operators: vec![],
                problems: vec!["max_parallelism changed".into()],
                ..PipelineReloadPlan::default()
            }],
            messages: vec!["× error one\n  │ detail\n".into()],
            pause_ms: None,
            at_ms: 0,
        };
        let text = render_reload(&outcome);
        assert!(
            text.starts_with("reload rejected: nothing changed\n"),
            "{text}"
        );
        assert!(
            text.contains("  problem: max_parallelism changed\n"),
            "{text}"
        );
        assert!(text.ends_with("× error one\n  │ detail\n"), "{text}");
    }
}
