//! The reload plan: what a new version of the pipeline file means for the running one, per
//! pipeline (`unchanged`, `changed`, `added`, `removed`) and, for a changed pipeline, per
//! source, operator and sink (its state is `kept`, `migrated`, `new`, `dropped`, or it is
//! `stateless`; per named state; parallelism and key groups; the state backend), with every
//! reason the plan cannot be applied.
//!
//! Pure logic over two compiled [`FilePlan`]s: no I/O, no savepoints, no running tasks. What
//! happens to each node's state is not decided here but by
//! [`crate::checkpoint::restore_plan::decide`], over the running plan's shape (what its
//! savepoint will record) and the new plan's: the same function the restore of that
//! savepoint calls, so that `weir reload --plan` and the reload itself can never disagree.
//! This module only adds the pipeline-level diff (a typed [`Change`] per pipeline, which the
//! job applies) and turns it into the wire form at the API's edge ([`PipelineDiff::to_wire`]).

use crate::checkpoint::restore_plan::{
    self, PipelineShape, Problem, RestoreKind, RestorePlan, StateChange,
};
use crate::control::{NamedStateReloadPlan, OperatorReloadPlan, PipelineReloadPlan};
use crate::plan::{FilePlan, PipelinePlan};

/// What a reload does to one pipeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Same spec, same scripts: keeps running, no pause.
    Unchanged,
    /// Savepoint, stop, start the new graph, restore; what the restore does to each node's
    /// state, and what refuses it.
    Changed(Box<RestorePlan>),
    /// Only in the new file: starts empty.
    Added,
    /// Only in the running file: stopped with a savepoint.
    Removed,
}

impl Change {
    /// The wire form ([`PipelineReloadPlan::change`]).
    pub fn as_str(&self) -> &'static str {
        match self {
            Change::Unchanged => "unchanged",
            Change::Changed(_) => "changed",
            Change::Added => "added",
            Change::Removed => "removed",
        }
    }
}

/// One pipeline's part of a reload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipelineDiff {
    /// The pipeline id.
    pub pipeline: String,
    /// What happens to it.
    pub change: Change,
}

impl PipelineDiff {
    /// What refuses the change (only a changed pipeline's restore can be refused).
    pub fn problems(&self) -> &[Problem] {
        match &self.change {
            Change::Changed(decision) => &decision.problems,
            _ => &[],
        }
    }

    /// The wire form, for the API and `weir reload`.
    pub fn to_wire(&self) -> PipelineReloadPlan {
        let plan = match &self.change {
            Change::Changed(decision) => decision_to_wire(decision),
            _ => PipelineReloadPlan::default(),
        };
        PipelineReloadPlan {
            pipeline: self.pipeline.clone(),
            change: self.change.as_str().to_owned(),
            ..plan
        }
    }
}

/// The values of [`OperatorReloadPlan::state`] (the wire form of
/// [`restore_plan::Fate`]).
pub mod state {
    /// Restored as is.
    #[cfg(any(test, feature = "testkit"))]
    pub const KEPT: &str = "kept";
    /// Restored through the new script's `migrate(old)`.
    #[cfg(any(test, feature = "testkit"))]
    pub const MIGRATED: &str = "migrated";
    /// Holds state but has nothing to restore: starts empty.
    #[cfg(any(test, feature = "testkit"))]
    pub const NEW: &str = "new";
    /// Gone from the new file; its state is not restored.
    #[cfg(any(test, feature = "testkit"))]
    pub const DROPPED: &str = "dropped";
    /// Holds no state.
    #[cfg(any(test, feature = "testkit"))]
    pub const STATELESS: &str = "stateless";
}

/// Compares the running file's plan with a new one: one entry per pipeline of the new file,
/// in its order, then one per pipeline only the running file has, in the running order.
///
/// A pipeline is `unchanged` when its spec (compared through a canonical serialisation), every
/// node's loaded script text and its base directory are identical. For a `changed` pipeline
/// the entry lists every node of the new plan (sources, operators, sinks, in declaration
/// order), then every node only the old plan has, and the reasons it cannot be applied (see
/// [`restore_plan`]); what `allow_non_restored_state` waived is listed apart.
pub fn diff(old: &FilePlan, new: &FilePlan, allow_non_restored_state: bool) -> Vec<PipelineDiff> {
    let mut plans = Vec::with_capacity(new.pipelines.len());
    for pipeline in &new.pipelines {
        let change = match old.pipelines.iter().find(|p| p.id == pipeline.id) {
            None => Change::Added,
            Some(running) if same_version(running, pipeline) => Change::Unchanged,
            Some(running) => Change::Changed(Box::new(restore_plan::decide(
                &PipelineShape::of_plan(running),
                &PipelineShape::of_plan(pipeline),
                RestoreKind::Savepoint,
                allow_non_restored_state,
            ))),
        };
        plans.push(PipelineDiff {
            pipeline: pipeline.id.clone(),
            change,
        });
    }
    for running in &old.pipelines {
        if !new.pipelines.iter().any(|p| p.id == running.id) {
            plans.push(PipelineDiff {
                pipeline: running.id.clone(),
                change: Change::Removed,
            });
        }
    }
    plans
}

/// The wire form of a changed pipeline's restore decision (its id and change are the
/// caller's to fill in).
fn decision_to_wire(decision: &RestorePlan) -> PipelineReloadPlan {
    let operators = decision
        .nodes
        .iter()
        .map(|n| OperatorReloadPlan {
            id: n.id.clone(),
            state: n.fate.as_str().to_owned(),
            script_changed: n.script_changed,
            parallelism: n.parallelism,
            key_groups_redistributed: n.key_groups_redistributed,
            // Internal states (timers, TTL expiry) follow their operator's; not listed.
            states: n
                .states
                .iter()
                .filter(|s| !s.name.starts_with("__"))
                .map(|s| {
                    let (kind, from_kind) = match s.change {
                        StateChange::Kept(k)
                        | StateChange::Migrated(k)
                        | StateChange::New(k)
                        | StateChange::Dropped(k) => (k, None),
                        StateChange::Retyped { from, to }
                        | StateChange::Incompatible { from, to } => (to, Some(from)),
                    };
                    NamedStateReloadPlan {
                        name: s.name.clone(),
                        change: s.change.as_str().to_owned(),
                        kind: kind_str(kind).to_owned(),
                        from_kind: from_kind.map(|k| kind_str(k).to_owned()),
                    }
                })
                .collect(),
            unrecorded: n.unrecorded,
        })
        .collect();
    PipelineReloadPlan {
        pipeline: String::new(),
        change: String::new(),
        operators,
        problems: decision.problems.iter().map(ToString::to_string).collect(),
        backend: decision
            .backend
            .map(|(a, b)| (a.as_str().to_owned(), b.as_str().to_owned())),
        waived: decision.waived.iter().map(ToString::to_string).collect(),
    }
}

fn kind_str(kind: weir_schema::StateKind) -> &'static str {
    match kind {
        weir_schema::StateKind::Value => "value",
        weir_schema::StateKind::List => "list",
        weir_schema::StateKind::Map => "map",
    }
}

/// Whether every pipeline's plan can be applied (none has a problem).
pub fn is_applicable(plans: &[PipelineDiff]) -> bool {
    plans.iter().all(|p| p.problems().is_empty())
}

/// Whether two versions of a pipeline are the same: spec, scripts and base directory.
fn same_version(old: &PipelinePlan, new: &PipelinePlan) -> bool {
    if !same_dir(&old.base_dir, &new.base_dir) || old.nodes.len() != new.nodes.len() {
        return false;
    }
    let scripts_equal = new.nodes.iter().all(|node| {
        old.node_by_id(&node.id)
            .is_some_and(|before| before.script == node.script)
    });
    // A spec that does not serialise (it always does) counts as changed: reloading is the
    // safe side.
    let spec_equal = match (
        serde_json::to_string(&old.spec),
        serde_json::to_string(&new.spec),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    scripts_equal && spec_equal
}

/// Whether two base directories name the same directory, however spelled: `weir run p.yaml`
/// plans with the base directory `""` (the working directory), a reload re-reads the file by
/// its absolute path. Both are made absolute against the working directory (no file system
/// access: symlinks are not resolved); a directory that cannot be made absolute compares as
/// written.
fn same_dir(a: &std::path::Path, b: &std::path::Path) -> bool {
    let absolute = |p: &std::path::Path| {
        let p = if p.as_os_str().is_empty() {
            std::path::Path::new(".")
        } else {
            p
        };
        std::path::absolute(p).ok()
    };
    a == b || matches!((absolute(a), absolute(b)), (Some(x), Some(y)) if x == y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// The wire form of the diff, as `weir reload --plan` shows it.
    fn diff(old: &FilePlan, new: &FilePlan, allow: bool) -> Vec<PipelineReloadPlan> {
        super::diff(old, new, allow)
            .iter()
            .map(PipelineDiff::to_wire)
            .collect()
    }

    /// Whether the wire plans can be applied (as [`super::is_applicable`] says of the diff).
    fn is_applicable(plans: &[PipelineReloadPlan]) -> bool {
        plans.iter().all(|p| p.problems.is_empty())
    }

    /// The wire values of [`PipelineReloadPlan::change`].
    mod change {
        pub const UNCHANGED: &str = "unchanged";
        pub const CHANGED: &str = "changed";
        pub const ADDED: &str = "added";
        pub const REMOVED: &str = "removed";
    }

    fn plan(yaml: &str) -> FilePlan {
        let validation = crate::validate::validate_str("test.yaml", yaml, Path::new("."));
        assert!(
            !validation.diagnostics.has_errors(),
            "test YAML is invalid: {:?}",
            validation.diagnostics
        );
        validation
            .plan()
            .expect("a valid file plans")
            .expect("the plan compiles")
    }

    /// A keyed pipeline in the shape of `pipelines/orders_totals.yaml`, with knobs.
    struct Totals<'a> {
        id: &'a str,
        max_parallelism: Option<u32>,
        parallelism: u32,
        source_parallelism: u32,
        reduce: &'a str,
        keyed_type: &'a str,
        extra_operator: bool,
        backend: &'a str,
    }

    impl Default for Totals<'_> {
        fn default() -> Self {
            Self {
                id: "totals",
                max_parallelism: None,
                parallelism: 2,
                source_parallelism: 2,
                reduce: "fn reduce(acc, r) { acc.amount += r.amount; acc }",
                keyed_type: "reduce",
                extra_operator: false,
                backend: "fs",
            }
        }
    }

    impl Totals<'_> {
        fn yaml(&self) -> String {
            let max = self
                .max_parallelism
                .map(|m| format!("    max_parallelism: {m}\n"))
                .unwrap_or_default();
            let (keyed, input) = if self.keyed_type == "reduce" {
                (
                    format!(
                        "      - id: sum\n        type: reduce\n        input: by_customer\n        script: |\n          {}\n",
                        self.reduce
                    ),
                    "sum",
                )
            } else {
                (
                    "      - id: sum\n        type: aggregate\n        input: by_customer\n        aggregations:\n          - {fn: sum, field: amount, as: amount}\n".to_owned(),
                    "sum",
                )
            };
            let (extra, sink_input) = if self.extra_operator {
                (
                    format!(
                        "      - id: enrich\n        type: map\n        input: {input}\n        script: |\n          fn map(r) {{ r.big = r.amount > 100; r }}\n"
                    ),
                    "enrich",
                )
            } else {
                (String::new(), input)
            };
            format!(
                r#"version: 1
pipelines:
  - id: {id}
    parallelism: {parallelism}
{max}    state:
      backend: {backend}
    checkpoints:
      mode: exactly_once
      interval: 1s
    sources:
      - id: orders
        type: generator
        seed: 1
        count: 100
        parallelism: {source_parallelism}
        fields:
          customer: {{ kind: key, prefix: c-, cardinality: 4 }}
          amount: {{ kind: int, min: 1, max: 200 }}
    operators:
      - id: by_customer
        type: key_by
        input: orders
        field: customer
{keyed}{extra}    sinks:
      - id: out
        type: file
        input: {sink_input}
        path: out/totals
"#,
                id = self.id,
                parallelism = self.parallelism,
                source_parallelism = self.source_parallelism,
                backend = self.backend,
            )
        }

        fn plan(&self) -> FilePlan {
            plan(&self.yaml())
        }
    }

    /// A stateless pipeline: a generator through a map to stdout.
    fn synthetic(script: &str) -> String {
        format!(
            r#"  - id: synthetic
    sources:
      - id: readings
        type: generator
        seed: 7
        count: 10
        fields:
          celsius: {{ kind: int, min: -10, max: 40 }}
    operators:
      - id: to_fahrenheit
        type: map
        input: readings
        script: |
          {script}
    sinks:
      - id: shown
        type: stdout
        input: to_fahrenheit
"#
        )
    }

    fn op<'a>(plan: &'a PipelineReloadPlan, id: &str) -> &'a OperatorReloadPlan {
        plan.operators
            .iter()
            .find(|o| o.id == id)
            .unwrap_or_else(|| panic!("no operator `{id}` in {plan:?}"))
    }

    fn states(plan: &PipelineReloadPlan) -> Vec<(&str, &str)> {
        plan.operators
            .iter()
            .map(|o| (o.id.as_str(), o.state.as_str()))
            .collect()
    }

    #[test]
    fn identical_files_are_unchanged() {
        let old = Totals::default().plan();
        let new = Totals::default().plan();
        let plans = diff(&old, &new, false);
        assert_eq!(plans.len(), 1);
        assert_eq!(plans[0].pipeline, "totals");
        assert_eq!(plans[0].change, change::UNCHANGED);
        assert!(plans[0].operators.is_empty());
        assert!(is_applicable(&plans));
    }

    #[test]
    fn a_relative_and_an_absolute_base_dir_of_the_same_directory_are_unchanged() {
        // `weir run p.yaml` plans with base dir `""`; the reload reads `/abs/p.yaml`.
        let yaml = Totals::default().yaml();
        let at = |dir: &Path| {
            crate::validate::validate_str("p.yaml", &yaml, dir)
                .plan()
                .expect("valid")
                .expect("plans")
        };
        let cwd = std::path::absolute(".").expect("the working directory");
        for (a, b) in [
            (Path::new(""), cwd.as_path()),
            (Path::new("."), Path::new("")),
        ] {
            let plans = diff(&at(a), &at(b), false);
            assert_eq!(plans[0].change, change::UNCHANGED, "{a:?} vs {b:?}");
        }
        let elsewhere = cwd.join("elsewhere");
        let plans = diff(&at(Path::new("")), &at(&elsewhere), false);
        assert_eq!(plans[0].change, change::CHANGED);
    }

    #[test]
    fn a_script_edit_keeps_state_and_marks_the_script() {
        let old = Totals::default().plan();
        let new = Totals {
            reduce: "fn reduce(acc, r) { acc.amount += r.amount * 2; acc }",
            ..Totals::default()
        }
        .plan();
        let plans = diff(&old, &new, false);
        let p = &plans[0];
        assert_eq!(p.change, change::CHANGED);
        assert_eq!(
            states(p),
            vec![
                ("orders", "kept"),
                ("by_customer", "stateless"),
                ("sum", "kept"),
                ("out", "kept"),
            ]
        );
        assert!(op(p, "sum").script_changed);
        assert!(!op(p, "orders").script_changed);
        assert_eq!(op(p, "sum").parallelism, None);
        assert!(p.problems.is_empty(), "{:?}", p.problems);
        assert!(is_applicable(&plans));
    }

    #[test]
    fn an_added_operator_is_new() {
        let old = Totals::default().plan();
        let new = Totals {
            extra_operator: true,
            ..Totals::default()
        }
        .plan();
        let p = &diff(&old, &new, false)[0];
        assert_eq!(p.change, change::CHANGED);
        assert_eq!(op(p, "enrich").state, state::STATELESS);
        assert!(!op(p, "enrich").script_changed);
        assert!(p.problems.is_empty(), "{:?}", p.problems);

        // A new keyed operator starts empty; the one it replaces is dropped.
        let renamed = Totals::default()
            .yaml()
            .replace("id: sum\n", "id: sum_v2\n")
            .replace("input: sum\n", "input: sum_v2\n");
        let p = &diff(&old, &plan(&renamed), true)[0];
        assert_eq!(op(p, "sum_v2").state, state::NEW);
        assert_eq!(op(p, "sum").state, state::DROPPED);
        assert!(p.problems.is_empty(), "{:?}", p.problems);
    }

    #[test]
    fn a_removed_stateful_operator_is_dropped_and_refused_unless_allowed() {
        let old = Totals {
            keyed_type: "reduce",
            ..Totals::default()
        }
        .plan();
        let new = plan(&format!(
            "version: 1\npipelines:\n{}",
            synthetic("fn map(r) { r }")
        ));
        // Same pipeline id, the keyed part removed.
        let new_yaml = format!(
            "version: 1\npipelines:\n{}",
            synthetic("fn map(r) { r }").replace("id: synthetic", "id: totals")
        );
        let new_totals = plan(&new_yaml);
        let p = &diff(&old, &new_totals, false)[0];
        assert_eq!(p.change, change::CHANGED);
        assert_eq!(
            states(p),
            vec![
                ("readings", "new"),
                ("to_fahrenheit", "stateless"),
                ("shown", "stateless"),
                ("orders", "dropped"),
                ("by_customer", "stateless"),
                ("sum", "dropped"),
                ("out", "dropped"),
            ]
        );
        assert!(
            p.problems.iter().any(|m| m.starts_with(
                "operator `sum` (reduce) held state, and the pipeline no longer has it: its \
                 state would be lost. Put it back (same `id`), or drop its state with \
                 `weir reload --allow-non-restored-state`"
            )),
            "{:?}",
            p.problems
        );
        // Every help line names a switch that exists.
        assert!(
            p.problems
                .iter()
                .all(|m| !m.contains("allow_non_restored_state")),
            "{:?}",
            p.problems
        );
        assert!(
            p.problems
                .iter()
                .any(|m| m.starts_with("source `orders` (generator)"))
        );
        assert!(
            p.problems
                .iter()
                .any(|m| m.starts_with("sink `out` (file)"))
        );
        assert!(!p.problems.iter().any(|m| m.contains("by_customer")));
        assert!(!super::is_applicable(&super::diff(
            &old,
            &new_totals,
            false
        )));

        let allowed = diff(&old, &new_totals, true);
        assert_eq!(states(&allowed[0]), states(p));
        assert!(allowed[0].problems.is_empty(), "{:?}", allowed[0].problems);
        assert_eq!(allowed[0].waived.len(), 3, "{:?}", allowed[0].waived);
        assert!(super::is_applicable(&super::diff(&old, &new_totals, true)));

        // Different pipeline ids: one added, one removed, no operators listed.
        let plans = diff(&old, &new, false);
        assert_eq!(plans.len(), 2);
        assert_eq!(
            (plans[0].pipeline.as_str(), plans[0].change.as_str()),
            ("synthetic", change::ADDED)
        );
        assert_eq!(
            (plans[1].pipeline.as_str(), plans[1].change.as_str()),
            ("totals", change::REMOVED)
        );
        assert!(plans.iter().all(|p| p.operators.is_empty()));
        assert!(is_applicable(&plans));
    }

    #[test]
    fn a_parallelism_change_is_reported_per_operator() {
        // The generator keeps its own parallelism; everything else goes from 2 to 3.
        let old = Totals::default().plan();
        let new = Totals {
            parallelism: 3,
            ..Totals::default()
        }
        .plan();
        let p = &diff(&old, &new, false)[0];
        assert_eq!(p.change, change::CHANGED);
        assert_eq!(op(p, "orders").parallelism, None);
        assert_eq!(op(p, "sum").parallelism, Some((2, 3)));
        assert_eq!(op(p, "sum").state, state::KEPT);
        assert_eq!(op(p, "out").parallelism, Some((2, 3)));
        assert!(p.problems.is_empty(), "{:?}", p.problems);
    }

    #[test]
    fn a_generator_cannot_rescale() {
        let old = Totals::default().plan();
        let new = Totals {
            source_parallelism: 1,
            ..Totals::default()
        }
        .plan();
        let plans = diff(&old, &new, true);
        let p = &plans[0];
        assert_eq!(op(p, "orders").parallelism, Some((2, 1)));
        assert_eq!(p.problems.len(), 1, "{:?}", p.problems);
        assert!(
            p.problems[0]
                .starts_with("source `orders` (generator) changed parallelism from 2 to 1")
        );
        assert!(!is_applicable(&plans));
    }

    #[test]
    fn a_file_source_can_rescale() {
        let yaml = |p: u32| {
            format!(
                r#"version: 1
pipelines:
  - id: big_orders
    checkpoints: {{ mode: exactly_once }}
    sources:
      - {{ id: orders, type: file, path: data/orders.jsonl, parallelism: {p} }}
    sinks:
      - {{ id: big, type: file, input: orders, path: out/big }}
"#
            )
        };
        let plans = diff(&plan(&yaml(1)), &plan(&yaml(2)), false);
        assert_eq!(op(&plans[0], "orders").parallelism, Some((1, 2)));
        assert_eq!(op(&plans[0], "orders").state, state::KEPT);
        assert!(is_applicable(&plans), "{:?}", plans[0].problems);
    }

    #[test]
    fn a_max_parallelism_change_is_refused() {
        let old = Totals {
            max_parallelism: Some(128),
            ..Totals::default()
        }
        .plan();
        let new = Totals {
            max_parallelism: Some(256),
            ..Totals::default()
        }
        .plan();
        let plans = diff(&old, &new, true);
        assert_eq!(plans[0].change, change::CHANGED);
        assert_eq!(plans[0].problems.len(), 1);
        assert!(
            plans[0].problems[0].starts_with(
                "the snapshot was taken with max_parallelism 128, the pipeline now has 256"
            ),
            "{}",
            plans[0].problems[0]
        );
        assert!(!plans[0].problems[0].contains("derived"));
        assert!(!is_applicable(&plans));

        // Derived from the parallelism: 80 → 128 key groups, 100 → 256.
        let old = Totals {
            parallelism: 80,
            source_parallelism: 80,
            ..Totals::default()
        }
        .plan();
        let new = Totals {
            parallelism: 100,
            source_parallelism: 80,
            ..Totals::default()
        }
        .plan();
        let plans = diff(&old, &new, true);
        assert!(
            plans[0].problems[0].contains("add `max_parallelism: 128`"),
            "{:?}",
            plans[0].problems
        );
    }

    #[test]
    fn a_state_backend_change_is_fine() {
        let old = Totals::default().plan();
        let new = Totals {
            backend: "memory",
            ..Totals::default()
        }
        .plan();
        let plans = diff(&old, &new, false);
        assert_eq!(plans[0].change, change::CHANGED);
        assert_eq!(op(&plans[0], "sum").state, state::KEPT);
        assert_eq!(
            plans[0].backend,
            Some(("fs".to_owned(), "memory".to_owned()))
        );
        assert!(is_applicable(&plans), "{:?}", plans[0].problems);
    }

    fn counter(state: &str, script: &str) -> FilePlan {
        plan(&format!(
            r#"version: 1
pipelines:
  - id: c
    checkpoints: {{ mode: exactly_once }}
    sources:
      - {{ id: src, type: file, path: data/in.jsonl }}
    operators:
      - {{ id: by, type: key_by, input: src, field: k }}
      - id: counter
        type: process
        input: by
        state: {{ {state} }}
        script: |
          {script}
    sinks:
      - {{ id: out, type: file, input: counter, path: out }}
"#
        ))
    }

    #[test]
    fn a_renamed_state_is_dropped_and_new() {
        let old = counter(
            "cnt: value",
            r#"fn process(r) { let c = state_get("cnt") ?? 0; state_set("cnt", c + 1); }"#,
        );
        let new = counter(
            "count: value",
            r#"fn process(r) { let c = state_get("count") ?? 0; state_set("count", c + 1); }"#,
        );
        let p = &diff(&old, &new, false)[0];
        let c = op(p, "counter");
        assert_eq!(c.state, state::NEW, "nothing of the old state carries over");
        let named: Vec<(&str, &str)> = c
            .states
            .iter()
            .map(|s| (s.name.as_str(), s.change.as_str()))
            .collect();
        assert_eq!(named, vec![("count", "new"), ("cnt", "dropped")]);
        assert_eq!(p.problems.len(), 1, "{:?}", p.problems);
        assert!(p.problems[0].contains("state `cnt` (value) is not declared any more"));
        assert!(p.problems[0].contains("--allow-non-restored-state"));
        let allowed = &diff(&old, &new, true)[0];
        assert!(allowed.problems.is_empty());
        assert_eq!(allowed.waived, p.problems);
    }

    #[test]
    fn a_state_kind_change_is_refused_unless_migrate_handles_it() {
        let old = counter("cnt: value", r#"fn process(r) { state_set("cnt", 1); }"#);
        let new = counter("cnt: list", r#"fn process(r) { list_push("cnt", 1); }"#);
        let p = &diff(&old, &new, true)[0];
        assert_eq!(p.problems.len(), 1, "{:?}", p.problems);
        assert!(
            p.problems[0].contains("state `cnt` changed kind from value to list"),
            "{}",
            p.problems[0]
        );
        assert_eq!(op(p, "counter").states[0].change, "incompatible");

        let migrating = counter(
            "cnt: list",
            r#"fn process(r) { list_push("cnt", 1); } fn migrate(name, old) { [old] }"#,
        );
        let p = &diff(&old, &migrating, false)[0];
        assert!(p.problems.is_empty(), "{:?}", p.problems);
        let c = op(p, "counter");
        assert_eq!(c.state, state::MIGRATED);
        assert_eq!(
            (
                c.states[0].change.as_str(),
                c.states[0].from_kind.as_deref()
            ),
            ("retyped", Some("value"))
        );
    }

    #[test]
    fn key_groups_are_redistributed_only_for_keyed_state() {
        let old = Totals::default().plan();
        let new = Totals {
            parallelism: 3,
            ..Totals::default()
        }
        .plan();
        let p = &diff(&old, &new, false)[0];
        type Moved<'a> = (&'a str, Option<(u32, u32)>, bool);
        let moved: Vec<Moved<'_>> = p
            .operators
            .iter()
            .map(|o| (o.id.as_str(), o.parallelism, o.key_groups_redistributed))
            .collect();
        assert_eq!(
            moved,
            vec![
                ("orders", None, false),
                ("by_customer", Some((2, 3)), false),
                ("sum", Some((2, 3)), true),
                ("out", Some((2, 3)), false),
            ]
        );
    }

    #[test]
    fn a_migrate_function_is_detected() {
        let old = Totals::default().plan();
        let new = Totals {
            reduce: "fn reduce(acc, r) { acc.total += r.amount; acc } fn migrate(old) { #{ total: old.amount } }",
            ..Totals::default()
        }
        .plan();
        let p = &diff(&old, &new, false)[0];
        assert_eq!(op(p, "sum").state, state::MIGRATED);
        assert!(op(p, "sum").script_changed);
        // The same script again (another element changed): already migrated, kept.
        let again = diff(&new, &new, false);
        assert_eq!(again[0].change, change::UNCHANGED);

        // Only with one parameter; a mention in a comment is no definition.
        for script in [
            "fn reduce(acc, r) { acc } fn migrate() { 1 }",
            "fn reduce(acc, r) { acc } // fn migrate(old) { old }",
        ] {
            let new = Totals {
                reduce: script,
                ..Totals::default()
            }
            .plan();
            assert_eq!(
                op(&diff(&old, &new, false)[0], "sum").state,
                state::KEPT,
                "{script}"
            );
        }
    }

    #[test]
    fn a_type_change_of_a_stateful_operator_is_refused() {
        let old = Totals::default().plan();
        let new = Totals {
            keyed_type: "aggregate",
            ..Totals::default()
        }
        .plan();
        let plans = diff(&old, &new, true);
        let p = &plans[0];
        assert_eq!(op(p, "sum").state, state::NEW);
        assert_eq!(
            p.problems,
            vec![
                "`sum` changed from reduce operator to aggregate operator: its state cannot be \
                 carried over; give it a new id to start it empty, or keep the type"
                    .to_owned()
            ]
        );
        assert!(!is_applicable(&plans));
    }

    #[test]
    fn a_type_change_of_a_stateless_operator_is_fine() {
        let old = plan(&format!(
            "version: 1\npipelines:\n{}",
            synthetic("fn map(r) { r }")
        ));
        let new_yaml = format!(
            "version: 1\npipelines:\n{}",
            synthetic("fn filter(r) { true }")
        )
        .replace("type: map", "type: filter");
        let plans = diff(&old, &plan(&new_yaml), false);
        assert_eq!(op(&plans[0], "to_fahrenheit").state, state::STATELESS);
        assert!(op(&plans[0], "to_fahrenheit").script_changed);
        assert!(is_applicable(&plans), "{:?}", plans[0].problems);
    }

    #[test]
    fn an_unchanged_pipeline_next_to_a_changed_one() {
        let file = |reduce: &str, map: &str| {
            let totals = Totals {
                reduce,
                ..Totals::default()
            }
            .yaml();
            format!("{totals}{}", synthetic(map))
        };
        let old = plan(&file("fn reduce(acc, r) { acc }", "fn map(r) { r }"));
        let new = plan(&file(
            "fn reduce(acc, r) { acc }",
            "fn map(r) { r.f = 1; r }",
        ));
        let plans = diff(&old, &new, false);
        assert_eq!(
            plans
                .iter()
                .map(|p| (p.pipeline.as_str(), p.change.as_str()))
                .collect::<Vec<_>>(),
            vec![("totals", "unchanged"), ("synthetic", "changed")]
        );
        assert!(plans[0].operators.is_empty());
        assert_eq!(
            states(&plans[1]),
            vec![
                ("readings", "kept"),
                ("to_fahrenheit", "stateless"),
                ("shown", "stateless"),
            ]
        );
        assert!(op(&plans[1], "to_fahrenheit").script_changed);
        assert!(is_applicable(&plans));
    }

    #[test]
    fn a_script_file_edit_is_a_change() {
        let dir = tempfile::tempdir().expect("tempdir");
        let yaml = synthetic("x").replace("script: |\n          x", "script_file: scripts/m.rhai");
        let yaml = format!("version: 1\npipelines:\n{yaml}");
        std::fs::create_dir(dir.path().join("scripts")).expect("mkdir");
        let script = dir.path().join("scripts/m.rhai");
        std::fs::write(&script, "fn map(r) { r }").expect("write");
        let load = |yaml: &str| {
            crate::validate::validate_str("p.yaml", yaml, dir.path())
                .plan()
                .expect("valid")
                .expect("plans")
        };
        let old = load(&yaml);
        assert_eq!(diff(&old, &load(&yaml), false)[0].change, change::UNCHANGED);
        std::fs::write(&script, "fn map(r) { r.x = 1; r }").expect("write");
        let plans = diff(&old, &load(&yaml), false);
        assert_eq!(plans[0].change, change::CHANGED);
        assert!(op(&plans[0], "to_fahrenheit").script_changed);
    }

    #[test]
    fn an_at_least_once_file_sink_holds_no_state() {
        let yaml = |mode: &str, extra: &str| {
            format!(
                r#"version: 1
pipelines:
  - id: p
    checkpoints: {{ mode: {mode} }}
    sources:
      - {{ id: orders, type: file, path: data/orders.jsonl }}
    sinks:
      - {{ id: big, type: file, input: orders, path: out/big }}
{extra}"#
            )
        };
        let old = plan(&yaml("at_least_once", ""));
        let new = plan(&yaml(
            "at_least_once",
            "      - { id: shown, type: stdout, input: orders }\n",
        ));
        let p = &diff(&old, &new, false)[0];
        assert_eq!(op(p, "big").state, state::STATELESS);
        assert_eq!(op(p, "shown").state, state::STATELESS);

        // Removing it loses nothing; removing a two-phase one would.
        let p = &diff(&new, &old, false)[0];
        assert_eq!(op(p, "shown").state, state::STATELESS);
        assert!(p.problems.is_empty(), "{:?}", p.problems);
        let old = plan(&yaml("exactly_once", ""));
        let new = plan(&yaml("exactly_once", "").replace("id: big", "id: big2"));
        let p = &diff(&old, &new, false)[0];
        assert_eq!(op(p, "big").state, state::DROPPED);
        assert_eq!(op(p, "big2").state, state::NEW);
        assert_eq!(p.problems.len(), 1);
    }
}
