//! The end-to-end delivery guarantee a pipeline actually has, derived from its spec: the
//! checkpoint mode, whether its sources can replay, whether its sinks can commit, its failover
//! strategy and its state backend. `weir validate` prints it as a note per pipeline and
//! `weir graph` with each pipeline; the README has the table these rules produce.
//!
//! The rules look at two questions separately, whether a failure can *lose* a record's effect
//! and whether it can *repeat* it, and name the level from the answers: neither is
//! exactly-once, only repeats is at-least-once, only losses is at-most-once, both is no
//! guarantee. Every answer carries its reason, so the note says why. This module reads the
//! spec only; it decides nothing at run time.

use std::fmt;

use weir_schema::{
    CheckpointMode, CheckpointSpec, FailoverSpec, PipelineSpec, RestartSpec, StateSpec,
};

/// A delivery guarantee, from strongest to weakest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Every record affects state and output exactly once, across failures and crashes.
    ExactlyOnce,
    /// Nothing is lost; after a failure some records may affect the output twice.
    AtLeastOnce,
    /// Nothing is repeated; a failure may lose records' effects (state, unfinished output).
    AtMostOnce,
    /// A failure may both lose and repeat records.
    None,
}

impl Level {
    /// The level's name as printed (`exactly-once`, ..., `no guarantee`).
    pub fn name(self) -> &'static str {
        match self {
            Self::ExactlyOnce => "exactly-once",
            Self::AtLeastOnce => "at-least-once",
            Self::AtMostOnce => "at-most-once",
            Self::None => "no guarantee",
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A pipeline's guarantee and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Guarantee {
    /// The level.
    pub level: Level,
    /// Why the level is what it is: what can lose records, what can repeat them, and caveats
    /// that do not change the level (a `memory` backend). Never empty.
    pub reasons: Vec<String>,
}

impl fmt::Display for Guarantee {
    /// `exactly-once (reason; reason)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.level, self.reasons.join("; "))
    }
}

/// Whether a file sink in a pipeline with these checkpoint settings commits in two phases:
/// checkpoints enabled and `mode: exactly_once`.
pub fn file_sink_commits_in_two_phases(checkpoints: &CheckpointSpec) -> bool {
    checkpoints.enabled && checkpoints.mode == CheckpointMode::ExactlyOnce
}

/// The guarantee `spec` gives (see the module docs).
pub fn guarantee(spec: &PipelineSpec) -> Guarantee {
    let mut loses = Vec::new();
    let mut repeats = Vec::new();
    let mut notes = Vec::new();
    let ck = &spec.checkpoints;
    // Records are repeated only by a replay: with no source that can replay, nothing is.
    let replays = spec.sources.iter().any(|s| s.is_replayable());
    if ck.enabled {
        for s in spec.sources.iter().filter(|s| !s.is_replayable()) {
            loses.push(format!(
                "source `{}` ({}) cannot replay: records read since the last checkpoint are \
                 lost on a failure",
                s.id(),
                s.type_name()
            ));
        }
        if replays && ck.mode == CheckpointMode::AtLeastOnce {
            repeats.push(
                "`checkpoints.mode: at_least_once`: barriers are not aligned, so records after \
                 a checkpoint can reach state and output before it and again after a restore"
                    .to_owned(),
            );
        }
        for s in spec
            .sinks
            .iter()
            .filter(|s| replays && !s.is_transactional())
        {
            repeats.push(format!(
                "sink `{}` ({}) cannot take back output written after the last checkpoint: it \
                 is written again after a failure",
                s.id(),
                s.type_name()
            ));
        }
        match spec.failover {
            FailoverSpec::Noop => loses.push(
                "`failover: noop`: a failed subtask stays down and the records sent to it are \
                 dropped"
                    .to_owned(),
            ),
            FailoverSpec::Individual => {
                let why = "`failover: individual`: records in flight when a subtask restarts are \
                           not replayed, and a restarted source repeats what followed the \
                           checkpoint";
                loses.push(why.to_owned());
                repeats.push(why.to_owned());
            }
            FailoverSpec::Full | FailoverSpec::Region => {}
        }
        if matches!(spec.state, StateSpec::Memory) {
            notes.push(
                "`memory` state keeps checkpoints in this process: this holds across task \
                 failures, and a crash of `weir` makes the next run start over"
                    .to_owned(),
            );
        }
    } else {
        loses.push(
            "no checkpoints: a failure loses the state and the output not finished yet, and a \
             new run starts over"
                .to_owned(),
        );
        let restarts = !matches!(spec.effective_restart(), RestartSpec::None);
        if restarts && replays {
            for s in spec.sinks.iter().filter(|s| !s.is_transactional()) {
                repeats.push(format!(
                    "a restart reads the input again from its start, and sink `{}` ({}) keeps \
                     what it wrote before",
                    s.id(),
                    s.type_name()
                ));
            }
        }
    }
    let level = match (loses.is_empty(), repeats.is_empty()) {
        (true, true) => Level::ExactlyOnce,
        (true, false) => Level::AtLeastOnce,
        (false, true) => Level::AtMostOnce,
        (false, false) => Level::None,
    };
    let mut reasons = Vec::new();
    if level == Level::ExactlyOnce {
        reasons.push(
            "aligned `exactly_once` checkpoints, replayable sources, sinks that commit with the \
             checkpoint"
                .to_owned(),
        );
    }
    for r in loses.into_iter().chain(repeats) {
        if !reasons.contains(&r) {
            reasons.push(r);
        }
    }
    reasons.extend(notes);
    Guarantee { level, reasons }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The guarantee of a one-pipeline YAML text.
    fn of(yaml: &str) -> Guarantee {
        let loaded = weir_schema::load::load_str("t.yaml", yaml);
        let spec = loaded.spec.expect("the test pipeline loads");
        guarantee(&spec.pipelines[0])
    }

    /// A pipeline with `head` (checkpoints, state, failover...), `source` and `sink` lines.
    fn pipeline(head: &str, source: &str, sink: &str) -> String {
        format!(
            "version: 1
pipelines:
  - id: p
{head}    sources:
      - {source}
    sinks:
      - {sink}
"
        )
    }

    const FILE_IN: &str = "{id: in, type: file, path: in.jsonl}";
    const GEN_IN: &str = "{id: in, type: generator, count: 10, fields: {n: {kind: sequence}}}";
    const STDIN: &str = "{id: in, type: stdin}";
    const FILE_OUT: &str = "{id: out, type: file, input: in, path: out}";
    const STDOUT: &str = "{id: out, type: stdout, input: in}";
    const EXACTLY: &str = "    checkpoints: {interval: 1s}\n    state: {backend: fs}\n";
    const AT_LEAST: &str =
        "    checkpoints: {interval: 1s, mode: at_least_once}\n    state: {backend: fs}\n";

    fn check(g: &Guarantee, level: Level, why: &[&str]) {
        assert_eq!(g.level, level, "{g}");
        assert!(!g.reasons.is_empty(), "{g}");
        let text = g.to_string();
        for w in why {
            assert!(text.contains(w), "`{w}` missing from: {text}");
        }
    }

    #[test]
    fn exactly_once_needs_aligned_checkpoints_replay_and_commit() {
        for source in [FILE_IN, GEN_IN] {
            let g = of(&pipeline(EXACTLY, source, FILE_OUT));
            check(
                &g,
                Level::ExactlyOnce,
                &["aligned `exactly_once` checkpoints"],
            );
            assert_eq!(g.reasons.len(), 1, "{g}");
        }
        let g = of(&pipeline(
            "    checkpoints: {interval: 1s}\n",
            FILE_IN,
            FILE_OUT,
        ));
        check(&g, Level::ExactlyOnce, &["`memory` state", "start over"]);
    }

    #[test]
    fn at_least_once_says_why() {
        let g = of(&pipeline(AT_LEAST, FILE_IN, FILE_OUT));
        check(&g, Level::AtLeastOnce, &["at_least_once", "not aligned"]);
        let g = of(&pipeline(AT_LEAST, GEN_IN, STDOUT));
        check(
            &g,
            Level::AtLeastOnce,
            &["not aligned", "sink `out` (stdout) cannot take back output"],
        );
    }

    #[test]
    fn without_checkpoints_a_crash_loses_state_and_output() {
        for sink in [FILE_OUT, STDOUT] {
            let g = of(&pipeline("", FILE_IN, sink));
            check(&g, Level::AtMostOnce, &["no checkpoints", "start"]);
        }
        let g = of(&pipeline(
            "    checkpoints: {enabled: false}\n",
            STDIN,
            FILE_OUT,
        ));
        check(&g, Level::AtMostOnce, &["no checkpoints"]);
        // A restart strategy without checkpoints reads the input again into a sink that keeps
        // what it wrote.
        let restart = "    restart: {strategy: fixed_delay, attempts: 3, delay: 1s}\n";
        let g = of(&pipeline(restart, FILE_IN, STDOUT));
        check(
            &g,
            Level::None,
            &["no checkpoints", "reads the input again", "`out` (stdout)"],
        );
        let g = of(&pipeline(restart, FILE_IN, FILE_OUT));
        check(&g, Level::AtMostOnce, &["no checkpoints"]);
    }

    #[test]
    fn a_source_that_cannot_replay_loses_records_and_repeats_none() {
        for sink in [FILE_OUT, STDOUT] {
            let g = of(&pipeline(AT_LEAST, STDIN, sink));
            check(
                &g,
                Level::AtMostOnce,
                &["source `in` (stdin) cannot replay"],
            );
            assert_eq!(g.reasons.len(), 1, "{g}");
        }
    }

    #[test]
    fn failover_strategies_weaken_the_guarantee() {
        let noop = format!("{EXACTLY}    failover: noop\n");
        let g = of(&pipeline(&noop, FILE_IN, FILE_OUT));
        check(&g, Level::AtMostOnce, &["`failover: noop`"]);
        let individual = format!("{EXACTLY}    failover: individual\n");
        let g = of(&pipeline(&individual, FILE_IN, FILE_OUT));
        check(&g, Level::None, &["`failover: individual`"]);
        assert_eq!(g.reasons.len(), 1, "one reason, not repeated: {g}");
        for failover in ["full", "region"] {
            let head = format!("{EXACTLY}    failover: {failover}\n");
            assert_eq!(
                of(&pipeline(&head, FILE_IN, FILE_OUT)).level,
                Level::ExactlyOnce
            );
        }
    }
}
