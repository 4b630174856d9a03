//! No silently ignored setting: every field the JSON Schema (generated from the model) lets a
//! user write is read by the engine, read by validation alone, rejected by validation, a
//! discriminator, or purely descriptive, and [`TABLE`] says which, where it is read and what
//! proves it. The test fails when:
//!
//! - a schema field has no entry, or an entry matches no schema field: the table covers the
//!   schema exactly, so a new field forces a reviewed decision;
//! - an entry's `reads` do not hold: each names a source file and a Rust expression that must
//!   occur in it outside comments (an `Engine` field must be read outside `schema/`);
//! - an entry's proofs do not hold: a test `file::function` must exist and mention the field's
//!   key (in its body, or in a constant or function of the same file it uses); a corpus file
//!   (`tests/invalid/*.yaml`) must fail validation with an error located at that field;
//! - an `Engine` field has no proof and is not in the reviewed [`UNPROVEN`] list, or a
//!   `Rejected` or `Validation` field has no corpus proof.
//!
//! The allow-list of purely descriptive fields is the `Descriptive` rows: only `description`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde_json::Value;
use weir_engine::validate::validate_file;

/// What the system does with a field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Use {
    /// The engine (planner, runtime, CLI) reads it and behaves accordingly.
    Engine,
    /// Only validation reads it: its whole meaning is a check (`version`).
    Validation,
    /// Rejected by validation: any use (or any but the default) is an error.
    Rejected,
    /// The discriminator of a tagged variant (`type`, `backend`, `strategy`, `kind`): it
    /// selects the variant the engine builds.
    Tag,
    /// Changes nothing that runs; only shown (the reviewed allow-list).
    Descriptive,
}

/// One row: a schema path pattern (`[type=*]` matches any variant; the most specific pattern
/// wins), its use, where it is read (file, expression), and its proofs.
struct Entry {
    path: &'static str,
    used: Use,
    reads: &'static [(&'static str, &'static str)],
    proofs: &'static [&'static str],
}

const fn e(
    path: &'static str,
    used: Use,
    reads: &'static [(&'static str, &'static str)],
    proofs: &'static [&'static str],
) -> Entry {
    Entry {
        path,
        used,
        reads,
        proofs,
    }
}

use Use::{Descriptive, Engine, Rejected, Tag, Validation};

const COMPILE: &str = "engine/src/plan/compile.rs";
const REGISTRY: &str = "engine/src/registry.rs";
const SUPERVISOR: &str = "engine/src/job/pipeline/supervisor.rs";
const SPAWN: &str = "engine/src/job/pipeline/spawn.rs";
const STORAGE: &str = "engine/src/job/pipeline/storage.rs";
const PLAN: &str = "engine/src/plan/mod.rs";
const COORDINATOR: &str = "engine/src/checkpoint/coordinator.rs";
const RESTART: &str = "engine/src/recovery/restart.rs";
const SCRIPT: &str = "engine/src/script/mod.rs";
const GENERATOR: &str = "engine/src/connectors/generator.rs";
const CONNECTORS: &str = "engine/src/connectors/mod.rs";
const EVENT_TIME: &str = "engine/src/connectors/event_time.rs";
const TIME_EXTRACTOR: &str = "engine/src/record/event_time.rs";
const AGGREGATE: &str = "engine/src/operators/aggregate.rs";
const WINDOW: &str = "engine/src/operators/window.rs";
const ROCKSDB: &str = "engine/src/state/rocksdb.rs";
const SETTINGS: &str = "engine/src/api/settings.rs";
const VALIDATE: &str = "schema/src/validate.rs";
const POSTGRES: &str = "engine/src/connectors/postgres.rs";
const KAFKA: &str = "engine/src/connectors/kafka.rs";

/// Every schema field and what happens to it, one row per line (kept unformatted so that it
/// reads as a table).
#[rustfmt::skip]
const TABLE: &[Entry] = &[
    // The file.
    e(".version", Validation, &[("schema/src/schema.rs", "codes::UNSUPPORTED_VERSION")], &["tests/invalid/unsupported_version.yaml"]),
    e(".api", Engine, &[("src/cmd/run.rs", "s.api.clone()")], &["tests/savepoints.rs::the_api_section_sets_port_and_token_and_flags_win"]),
    e(".api.enabled", Engine, &[(SETTINGS, "spec.enabled")], &["engine/src/api/settings.rs::the_file_sets_port_token_and_enabled", "tests/savepoints.rs::the_api_section_sets_port_and_token_and_flags_win"]),
    e(".api.port", Engine, &[(SETTINGS, "spec.port")], &["engine/src/api/settings.rs::the_file_sets_port_token_and_enabled", "tests/savepoints.rs::the_api_section_sets_port_and_token_and_flags_win"]),
    e(".api.token_env", Engine, &[(SETTINGS, "spec.token_env")], &["tests/savepoints.rs::the_api_section_sets_port_and_token_and_flags_win", "tests/invalid/api_token_env_not_a_name.yaml"]),
    e(".pipelines", Engine, &[("engine/src/plan/mod.rs", "spec.pipelines")], &["tests/runtime_golden.rs::reference_pipelines_match_their_golden_output"]),
    // A pipeline.
    e(".pipelines[].id", Engine, &[(COMPILE, "spec.id")], &["tests/savepoints.rs::stopping_one_pipeline_with_a_savepoint_leaves_the_other_running"]),
    e(".pipelines[].description", Descriptive, &[("engine/src/plan/render.rs", "plan.spec.description")], &["engine/src/plan/render.rs::text_lists_nodes_edges_chains_and_exchanges"]),
    e(".pipelines[].parallelism", Engine, &[(COMPILE, "spec.parallelism")], &["tests/runtime_operators.rs::word_count_is_the_same_at_parallelism_1_and_4"]),
    e(".pipelines[].max_parallelism", Engine, &[(COMPILE, "spec.effective_max_parallelism()")], &["tests/savepoints.rs::a_changed_max_parallelism_is_refused"]),
    e(".pipelines[].state", Engine, &[(SPAWN, "plan.spec.state")], &["engine/src/reload/plan.rs::a_state_backend_change_is_fine"]),
    e(".pipelines[].state[backend=*].backend", Tag, &[(SPAWN, "match &plan.spec.state")], &[]),
    e(".pipelines[].state[backend=rocksdb].path", Engine, &[(PLAN, "r.path")], &[]),
    e(".pipelines[].state[backend=rocksdb].incremental", Engine, &[(ROCKSDB, "spec.incremental")], &["engine/src/state/rocksdb.rs::incremental_false_passes_checkpoint_files_restore_rescale"]),
    e(".pipelines[].state[backend=rocksdb].block_cache_size", Engine, &[(ROCKSDB, "spec.block_cache_size")], &[]),
    e(".pipelines[].state[backend=rocksdb].write_buffer_size", Engine, &[(ROCKSDB, "spec.write_buffer_size")], &[]),
    e(".pipelines[].checkpoints", Engine, &[(STORAGE, "plan.spec.checkpoints")], &["tests/event_time.rs::a_reload_moves_open_windows_and_pending_timers_and_changes_nothing"]),
    e(".pipelines[].checkpoints.enabled", Engine, &[(COORDINATOR, "spec.enabled"), (STORAGE, "spec.enabled")], &[]),
    e(".pipelines[].checkpoints.interval", Engine, &[(COORDINATOR, "spec.interval")], &["engine/src/checkpoint/coordinator.rs::checkpoint_plan_from_a_compiled_pipeline"]),
    e(".pipelines[].checkpoints.mode", Engine, &[(STORAGE, "spec.mode")], &["tests/cli.rs::validate_and_graph_state_each_pipelines_guarantee"]),
    e(".pipelines[].checkpoints.storage", Engine, &[(PLAN, "spec.checkpoints.storage")], &["tests/hot_reload.rs::a_crash_looping_pipeline_is_fixed_by_an_edit_and_stops_during_back_off"]),
    e(".pipelines[].checkpoints.timeout", Engine, &[(COORDINATOR, "spec.timeout")], &["engine/src/checkpoint/coordinator.rs::timeouts_and_declines_count_against_tolerable_failures"]),
    e(".pipelines[].checkpoints.min_pause", Engine, &[(COORDINATOR, "spec.min_pause")], &["engine/src/checkpoint/coordinator.rs::max_concurrent_and_min_pause_gate_triggers"]),
    e(".pipelines[].checkpoints.max_concurrent", Engine, &[(COORDINATOR, "spec.max_concurrent")], &["engine/src/checkpoint/coordinator.rs::max_concurrent_and_min_pause_gate_triggers", "tests/invalid/unaligned_max_concurrent.yaml"]),
    e(".pipelines[].checkpoints.tolerable_failures", Engine, &[(COORDINATOR, "spec.tolerable_failures")], &["engine/src/checkpoint/coordinator.rs::timeouts_and_declines_count_against_tolerable_failures"]),
    e(".pipelines[].checkpoints.retain", Engine, &[(STORAGE, "spec.retain")], &["tests/recovery_cli.rs::a_killed_run_resumes_and_skips_a_damaged_checkpoint"]),
    e(".pipelines[].checkpoints.unaligned", Engine, &[("engine/src/job/wiring.rs", "ck.unaligned"), (SUPERVISOR, "spec.unaligned")], &["tests/recovery_kill.rs::unaligned_checkpoints_stay_exactly_once_under_kills_with_a_slow_sink", "tests/invalid/unaligned_at_least_once.yaml"]),
    e(".pipelines[].checkpoints.aligned_timeout", Engine, &[(SUPERVISOR, "spec.aligned_timeout")], &["tests/recovery_kill.rs::unaligned_checkpoints_with_an_aligned_timeout_stay_exactly_once", "tests/invalid/aligned_timeout_without_unaligned.yaml"]),
    e(".pipelines[].savepoints", Engine, &[(PLAN, "spec.savepoints.dir")], &["engine/src/plan/mod.rs::savepoints_go_to_the_configured_dir_else_under_checkpoint_storage"]),
    e(".pipelines[].savepoints.dir", Engine, &[(PLAN, "spec.savepoints.dir"), ("engine/src/job/confine.rs", "plan.paths.savepoints")], &["engine/src/plan/mod.rs::savepoints_go_to_the_configured_dir_else_under_checkpoint_storage", "tests/savepoints.rs::api_savepoint_dirs_are_confined_to_the_savepoint_root"]),
    e(".pipelines[].restart", Engine, &[(SUPERVISOR, "plan.spec.effective_restart()")], &["tests/recovery_faults.rs::restart_none_fails_the_pipeline_with_the_record"]),
    e(".pipelines[].restart[strategy=*].strategy", Tag, &[(RESTART, "RestartSpec::FixedDelay(s)")], &[]),
    e(".pipelines[].restart[strategy=fixed_delay].attempts", Engine, &[(RESTART, "s.attempts")], &["engine/src/recovery/restart.rs::fixed_delay_restarts_attempts_times_with_the_same_delay"]),
    e(".pipelines[].restart[strategy=fixed_delay].delay", Engine, &[(RESTART, "s.delay")], &["engine/src/recovery/restart.rs::fixed_delay_restarts_attempts_times_with_the_same_delay"]),
    e(".pipelines[].restart[strategy=failure_rate].max_failures", Engine, &[(RESTART, "s.max_failures")], &["engine/src/recovery/restart.rs::failure_rate_counts_failures_in_a_sliding_window"]),
    e(".pipelines[].restart[strategy=failure_rate].interval", Engine, &[(RESTART, "s.interval")], &["engine/src/recovery/restart.rs::failure_rate_counts_failures_in_a_sliding_window"]),
    e(".pipelines[].restart[strategy=failure_rate].delay", Engine, &[(RESTART, "s.delay")], &["engine/src/recovery/restart.rs::failure_rate_counts_failures_in_a_sliding_window"]),
    e(".pipelines[].restart[strategy=exponential_delay].initial", Engine, &[(RESTART, "s.initial")], &["engine/src/recovery/restart.rs::exponential_delay_grows_by_the_multiplier_up_to_max"]),
    e(".pipelines[].restart[strategy=exponential_delay].max", Engine, &[(RESTART, "s.max")], &["engine/src/recovery/restart.rs::exponential_delay_grows_by_the_multiplier_up_to_max"]),
    e(".pipelines[].restart[strategy=exponential_delay].multiplier", Engine, &[(RESTART, "s.multiplier")], &["engine/src/recovery/restart.rs::exponential_delay_grows_by_the_multiplier_up_to_max"]),
    e(".pipelines[].restart[strategy=exponential_delay].reset_after", Engine, &[(RESTART, "s.reset_after")], &["engine/src/recovery/restart.rs::exponential_delay_resets_after_reset_after_without_failure"]),
    e(".pipelines[].restart[strategy=exponential_delay].jitter", Engine, &[(RESTART, "s.jitter")], &["engine/src/recovery/restart.rs::exponential_delay_jitter_stays_within_its_bounds"]),
    e(".pipelines[].restart[strategy=exponential_delay].attempts", Engine, &[(RESTART, "s.attempts")], &["engine/src/recovery/restart.rs::exponential_delay_grows_by_the_multiplier_up_to_max"]),
    e(".pipelines[].failover", Engine, &[(SUPERVISOR, "plan.spec.failover")], &["tests/recovery_faults.rs::failover_strategies_restart_their_scope"]),
    e(".pipelines[].limits", Engine, &[(SUPERVISOR, "plan.spec.limits")], &["engine/src/script/runtime.rs::the_operation_budget_is_per_invocation"]),
    e(".pipelines[].limits.max_operations", Engine, &[(SCRIPT, "limits.max_operations")], &["engine/src/script/runtime.rs::the_operation_budget_is_per_invocation"]),
    e(".pipelines[].limits.max_call_levels", Engine, &[(SCRIPT, "limits.max_call_levels")], &["tests/script_sandbox.rs::recursion_as_deep_as_the_limits_allow_runs_on_the_real_runtime"]),
    e(".pipelines[].limits.max_expr_depth", Engine, &[(SCRIPT, "limits.max_expr_depth")], &["tests/script_sandbox.rs::recursion_as_deep_as_the_limits_allow_runs_on_the_real_runtime"]),
    e(".pipelines[].limits.max_string_size", Engine, &[(SCRIPT, "limits.max_string_size")], &["engine/src/script/fast.rs::native_evaluation_is_indistinguishable_from_rhai"]),
    e(".pipelines[].limits.max_array_size", Engine, &[(SCRIPT, "limits.max_array_size")], &[]),
    e(".pipelines[].limits.max_outputs_per_record", Engine, &[(REGISTRY, "limits.max_outputs_per_record")], &["tests/script_sandbox.rs::flat_map_and_emit_over_the_output_budget_are_record_errors"]),
    e(".pipelines[].limits.max_map_size", Engine, &[(SCRIPT, "limits.max_map_size")], &["engine/src/script/fast.rs::native_evaluation_is_indistinguishable_from_rhai"]),
    // Sources.
    e(".pipelines[].sources", Engine, &[(COMPILE, "spec.sources")], &["tests/runtime_operators.rs::union_rebalance_and_broadcast"]),
    e(".pipelines[].sources[][type=*].type", Tag, &[(REGISTRY, "SourceSpec::File(f)")], &[]),
    e(".pipelines[].sources[][type=*].id", Engine, &[(COMPILE, "source.id()")], &["tests/runtime_operators.rs::union_rebalance_and_broadcast"]),
    e(".pipelines[].sources[][type=*].parallelism", Engine, &[(COMPILE, "source.parallelism()")], &["tests/savepoints.rs::rescaling_a_bounded_split_file_source_3_to_2_to_1_equals_the_straight_run"]),
    e(".pipelines[].sources[][type=*].format", Engine, &[(REGISTRY, "LineParser::new(f.format"), (REGISTRY, "LineParser::new(s.format")], &["tests/runtime_operators.rs::csv_in_csv_out_and_glob_sources"]),
    e(".pipelines[].sources[][type=*].csv", Engine, &[(REGISTRY, "f.csv.as_ref()"), (REGISTRY, "s.csv.as_ref()")], &["engine/src/connectors/file.rs::csv_with_header_over_several_files_replays_exactly", "tests/invalid/csv_options_without_csv_format.yaml"]),
    e(".pipelines[].sources[][type=*].csv.delimiter", Engine, &[(CONNECTORS, "csv.delimiter")], &[]),
    e(".pipelines[].sources[][type=*].csv.header", Engine, &[(CONNECTORS, "csv.header")], &["engine/src/connectors/file.rs::csv_with_header_over_several_files_replays_exactly"]),
    e(".pipelines[].sources[][type=*].on_error", Engine, &[(REGISTRY, "f.on_error"), (REGISTRY, "s.on_error")], &["tests/runtime_operators.rs::malformed_input_fails_with_file_and_line_or_is_skipped"]),
    e(".pipelines[].sources[][type=*].on_error.dead_letter", Engine, &[(COMPILE, "source.dead_letter()"), (CONNECTORS, "SourceOnError::DeadLetter(_)")], &["tests/source_records.rs::jsonl_records_that_cannot_be_read_become_dead_letters_with_file_line_and_text"]),
    e(".pipelines[].sources[][type=file].path", Engine, &[(REGISTRY, "resolve_path(&f.path)")], &["tests/runtime_operators.rs::csv_in_csv_out_and_glob_sources"]),
    e(".pipelines[].sources[][type=file].follow", Engine, &[(REGISTRY, "f.follow")], &["engine/src/connectors/file.rs::follow_mode_resumes_files_and_partial_lines"]),
    e(".pipelines[].sources[][type=*].event_time", Engine, &[(REGISTRY, "spec.event_time()")], &["engine/src/runtime/task.rs::a_source_task_sends_its_watermarks_after_the_records_that_made_them"]),
    e(".pipelines[].sources[][type=*].event_time.field", Engine, &[(TIME_EXTRACTOR, "FieldPath::new(&spec.field)")], &["engine/src/connectors/event_time.rs::extractors_read_ms_seconds_and_rfc3339_and_say_what_is_wrong"]),
    e(".pipelines[].sources[][type=*].event_time.unit", Engine, &[(TIME_EXTRACTOR, "spec.unit")], &["engine/src/connectors/event_time.rs::extractors_read_ms_seconds_and_rfc3339_and_say_what_is_wrong"]),
    e(".pipelines[].sources[][type=*].event_time.format", Engine, &[(TIME_EXTRACTOR, "spec.format")], &["engine/src/connectors/event_time.rs::extractors_read_ms_seconds_and_rfc3339_and_say_what_is_wrong"]),
    e(".pipelines[].sources[][type=*].event_time.max_out_of_orderness", Engine, &[(EVENT_TIME, "spec.out_of_orderness_ms()")], &["engine/src/connectors/event_time.rs::the_watermark_trails_the_largest_time_per_split_and_takes_the_minimum"]),
    e(".pipelines[].sources[][type=*].event_time.idle_timeout", Engine, &[(EVENT_TIME, ".idle_timeout")], &["engine/src/connectors/event_time.rs::idle_splits_stop_holding_back_and_come_back_when_they_advance"]),
    e(".pipelines[].sources[][type=file].poll_interval", Engine, &[(REGISTRY, "f.poll_interval")], &["engine/src/connectors/file.rs::a_following_reader_with_nothing_new_waits_its_poll_interval"]),
    e(".pipelines[].sources[][type=kafka].brokers", Engine, &[(KAFKA, "brokers: spec.brokers.clone()")], &["tests/kafka.rs::kafka_to_file_is_exactly_once_under_repeated_sigkill"]),
    e(".pipelines[].sources[][type=kafka].topics", Engine, &[(KAFKA, "Topics::Named(spec.topics.clone())")], &["tests/kafka.rs::kafka_to_file_is_exactly_once_under_repeated_sigkill"]),
    e(".pipelines[].sources[][type=kafka].topic_pattern", Engine, &[(KAFKA, "&spec.topic_pattern")], &["engine/src/connectors/kafka.rs::a_topic_pattern_matches_whole_topic_names"]),
    e(".pipelines[].sources[][type=kafka].format", Engine, &[(KAFKA, "format: spec.format")], &[]),
    e(".pipelines[].sources[][type=kafka].start", Engine, &[(KAFKA, "start: spec.start.clone()")], &[]),
    e(".pipelines[].sources[][type=kafka].start.timestamp", Engine, &[(KAFKA, "KafkaStartSpec::Timestamp(ms)")], &[]),
    e(".pipelines[].sources[][type=kafka].stop_at", Engine, &[(KAFKA, "stop: spec.stop_at")], &["tests/kafka.rs::kafka_to_file_is_exactly_once_under_repeated_sigkill"]),
    e(".pipelines[].sources[][type=kafka].group", Engine, &[(KAFKA, "spec\n                .group")], &[]),
    e(".pipelines[].sources[][type=kafka].discovery_interval", Engine, &[(KAFKA, "spec.discovery_interval")], &[]),
    e(".pipelines[].sources[][type=kafka].metadata_field", Engine, &[(KAFKA, "spec.metadata_field.clone()")], &["tests/kafka.rs::messages_that_do_not_parse_become_dead_letters_with_partition_and_offset"]),
    e(".pipelines[].sources[][type=kafka].properties", Engine, &[(KAFKA, "&self.config.properties")], &[]),
    e(".pipelines[].sources[][type=generator].seed", Engine, &[(REGISTRY, "g.seed")], &["tests/runtime_operators.rs::generator_output_is_the_same_at_any_parallelism"]),
    e(".pipelines[].sources[][type=generator].count", Engine, &[(REGISTRY, "g.count")], &["tests/runtime_operators.rs::generator_output_is_the_same_at_any_parallelism"]),
    e(".pipelines[].sources[][type=generator].rate", Engine, &[(REGISTRY, "g.rate")], &["engine/src/connectors/generator.rs::restore_from_a_rate_limited_run_keeps_the_sequence"]),
    e(".pipelines[].sources[][type=generator].fields", Engine, &[(REGISTRY, "&g.fields")], &["tests/runtime_operators.rs::generator_output_is_the_same_at_any_parallelism"]),
    e(".pipelines[].sources[][type=generator].fields{}[kind=*].kind", Tag, &[(GENERATOR, "GeneratorFieldSpec::Sequence { start }")], &[]),
    e(".pipelines[].sources[][type=generator].fields{}[kind=sequence].start", Engine, &[(GENERATOR, "GeneratorFieldSpec::Sequence { start }")], &["engine/src/connectors/generator.rs::values_stay_in_range"]),
    e(".pipelines[].sources[][type=generator].fields{}[kind=int].min", Engine, &[(GENERATOR, "GeneratorFieldSpec::Int { min, max }")], &["engine/src/connectors/generator.rs::values_stay_in_range"]),
    e(".pipelines[].sources[][type=generator].fields{}[kind=int].max", Engine, &[(GENERATOR, "GeneratorFieldSpec::Int { min, max }")], &["engine/src/connectors/generator.rs::values_stay_in_range"]),
    e(".pipelines[].sources[][type=generator].fields{}[kind=float].min", Engine, &[(GENERATOR, "GeneratorFieldSpec::Float { min, max }")], &[]),
    e(".pipelines[].sources[][type=generator].fields{}[kind=float].max", Engine, &[(GENERATOR, "GeneratorFieldSpec::Float { min, max }")], &[]),
    e(".pipelines[].sources[][type=generator].fields{}[kind=key].prefix", Engine, &[(GENERATOR, "Field::Key(prefix.clone()")], &["engine/src/connectors/generator.rs::values_stay_in_range"]),
    e(".pipelines[].sources[][type=generator].fields{}[kind=key].cardinality", Engine, &[(GENERATOR, "(*cardinality).max(1)")], &["tests/runtime_operators.rs::generator_output_is_the_same_at_any_parallelism"]),
    e(".pipelines[].sources[][type=generator].fields{}[kind=choice].values", Engine, &[(GENERATOR, "GeneratorFieldSpec::Choice { values }")], &[]),
    e(".pipelines[].sources[][type=generator].fields{}[kind=timestamp].start", Engine, &[(GENERATOR, "Field::Timestamp(*start, *step)")], &[]),
    e(".pipelines[].sources[][type=generator].fields{}[kind=timestamp].step", Engine, &[(GENERATOR, "Field::Timestamp(*start, *step)")], &[]),
    e(".pipelines[].sources[][type=generator].fields{}[kind=const].value", Engine, &[(GENERATOR, "GeneratorFieldSpec::Const { value }")], &[]),
    // Operators: the fields every kind has, then each kind's own.
    e(".pipelines[].operators", Engine, &[(COMPILE, "spec.operators")], &["tests/runtime_operators.rs::map_filter_flat_map_match_a_sequential_reference"]),
    e(".pipelines[].operators[][type=*].type", Tag, &[(REGISTRY, "OperatorSpec::Map(_)")], &[]),
    e(".pipelines[].operators[][type=*].id", Engine, &[(COMPILE, "operator.id()")], &["tests/runtime_operators.rs::map_filter_flat_map_match_a_sequential_reference"]),
    e(".pipelines[].operators[][type=*].input", Engine, &[(COMPILE, ".wiring()")], &["tests/runtime_operators.rs::map_filter_flat_map_match_a_sequential_reference"]),
    e(".pipelines[].operators[][type=*].inputs", Engine, &[(COMPILE, ".wiring()")], &["tests/runtime_operators.rs::union_rebalance_and_broadcast"]),
    e(".pipelines[].operators[][type=*].parallelism", Engine, &[(COMPILE, "operator.parallelism()")], &["tests/runtime_operators.rs::word_count_is_the_same_at_parallelism_1_and_4"]),
    e(".pipelines[].operators[][type=*].partitioning", Engine, &[(COMPILE, "operator.partitioning()")], &["engine/src/plan/compile.rs::declared_broadcast_and_rebalance_are_kept", "tests/invalid/partitioning_after_key_by.yaml"]),
    e(".pipelines[].operators[][type=*].on_error", Engine, &[(COMPILE, "operator.on_error()"), (SPAWN, "o.on_error()")], &["tests/runtime_operators.rs::on_error_skip_and_dead_letter"]),
    e(".pipelines[].operators[][type=*].on_error.dead_letter", Engine, &[(COMPILE, "OnErrorSpec::DeadLetter")], &["tests/runtime_operators.rs::on_error_skip_and_dead_letter"]),
    e(".pipelines[].operators[][type=union].on_error", Rejected, &[(VALIDATE, "u.on_error != OnErrorSpec::Fail")], &["tests/invalid/union_on_error.yaml"]),
    e(".pipelines[].operators[][type=union].on_error.dead_letter", Rejected, &[(VALIDATE, "OnErrorSpec::DeadLetter(_) => path.join(\"on_error\").join(\"dead_letter\")")], &["tests/invalid/union_dead_letter.yaml"]),
    e(".pipelines[].operators[][type=*].script", Engine, &[(COMPILE, "operator.script()")], &["tests/runtime_operators.rs::map_filter_flat_map_match_a_sequential_reference"]),
    e(".pipelines[].operators[][type=*].script_file", Engine, &[(COMPILE, "ScriptRef::File(file)")], &["engine/src/plan/compile.rs::script_file_is_read_relative_to_base_dir"]),
    e(".pipelines[].operators[][type=key_by].field", Engine, &[(REGISTRY, "match &k.field")], &["tests/runtime_operators.rs::word_count_is_the_same_at_parallelism_1_and_4"]),
    e(".pipelines[].operators[][type=reduce].emit", Engine, &[(REGISTRY, "(r.emit, r.key_field.clone())")], &["tests/runtime_operators.rs::builtin_aggregations_and_rhai_reduce_match_reference"]),
    e(".pipelines[].operators[][type=reduce].key_field", Engine, &[(REGISTRY, "(r.emit, r.key_field.clone())")], &["tests/runtime_operators.rs::builtin_aggregations_and_rhai_reduce_match_reference"]),
    e(".pipelines[].operators[][type=aggregate].emit", Engine, &[(REGISTRY, "(a.emit, a.key_field.clone())")], &["tests/runtime_operators.rs::emit_updates_ends_with_the_final_value_per_key"]),
    e(".pipelines[].operators[][type=aggregate].key_field", Engine, &[(REGISTRY, "(a.emit, a.key_field.clone())")], &["tests/runtime_operators.rs::builtin_aggregations_and_rhai_reduce_match_reference"]),
    e(".pipelines[].operators[][type=aggregate].aggregations", Engine, &[(REGISTRY, "a.aggregations.iter().map(Aggregation::from_spec)")], &["tests/runtime_operators.rs::builtin_aggregations_and_rhai_reduce_match_reference"]),
    e(".pipelines[].operators[][type=aggregate].aggregations[].fn", Engine, &[(AGGREGATE, "function: spec.function")], &["tests/runtime_operators.rs::builtin_aggregations_and_rhai_reduce_match_reference"]),
    e(".pipelines[].operators[][type=aggregate].aggregations[].field", Engine, &[(AGGREGATE, "spec.field.as_deref()")], &["tests/runtime_operators.rs::builtin_aggregations_and_rhai_reduce_match_reference", "tests/invalid/count_with_field.yaml"]),
    e(".pipelines[].operators[][type=aggregate].aggregations[].as", Engine, &[(AGGREGATE, "spec.output_name()")], &["tests/runtime_operators.rs::builtin_aggregations_and_rhai_reduce_match_reference"]),
    e(".pipelines[].operators[][type=window].window", Engine, &[(WINDOW, "Assigner::from_spec(&spec.window)")], &["tests/runtime_operators.rs::a_processing_time_window_emits_its_open_windows_at_the_end_of_input"]),
    e(".pipelines[].operators[][type=window].window.tumbling", Engine, &[(WINDOW, "WindowKindSpec::Tumbling { size }")], &["tests/runtime_operators.rs::a_processing_time_window_emits_its_open_windows_at_the_end_of_input"]),
    e(".pipelines[].operators[][type=window].window.tumbling.size", Engine, &[(WINDOW, "millis(size.0)")], &["tests/runtime_operators.rs::a_processing_time_window_emits_its_open_windows_at_the_end_of_input"]),
    e(".pipelines[].operators[][type=window].window.sliding", Engine, &[(WINDOW, "WindowKindSpec::Sliding { size, slide }")], &["schema/src/validate.rs::a_window_validates_its_kind_durations_and_accumulator"]),
    e(".pipelines[].operators[][type=window].window.sliding.size", Engine, &[(WINDOW, "millis(size.0)")], &["schema/src/validate.rs::a_window_validates_its_kind_durations_and_accumulator"]),
    e(".pipelines[].operators[][type=window].window.sliding.slide", Engine, &[(WINDOW, "millis(slide.0)")], &["schema/src/validate.rs::a_window_validates_its_kind_durations_and_accumulator"]),
    e(".pipelines[].operators[][type=window].window.session", Engine, &[(WINDOW, "WindowKindSpec::Session { gap }")], &["engine/src/operators/window.rs::a_scripted_session_window_without_fn_merge_is_invalid"]),
    e(".pipelines[].operators[][type=window].window.session.gap", Engine, &[(WINDOW, "millis(gap.0)")], &["engine/src/operators/window.rs::a_scripted_session_window_without_fn_merge_is_invalid"]),
    e(".pipelines[].operators[][type=window].time", Engine, &[(WINDOW, "match spec.time")], &["tests/runtime_operators.rs::a_processing_time_window_emits_its_open_windows_at_the_end_of_input"]),
    e(".pipelines[].operators[][type=window].time_field", Engine, &[(REGISTRY, "&w.time_field")], &["schema/src/validate.rs::an_event_time_window_needs_event_time_upstream_and_late_names_a_sink"]),
    e(".pipelines[].operators[][type=window].aggregations", Engine, &[(REGISTRY, "w.aggregations.iter().map(Aggregation::from_spec)")], &["tests/runtime_operators.rs::a_processing_time_window_emits_its_open_windows_at_the_end_of_input"]),
    e(".pipelines[].operators[][type=window].aggregations[].fn", Engine, &[(AGGREGATE, "function: spec.function")], &["tests/runtime_operators.rs::a_processing_time_window_emits_its_open_windows_at_the_end_of_input"]),
    e(".pipelines[].operators[][type=window].aggregations[].field", Engine, &[(AGGREGATE, "spec.field.as_deref()")], &["tests/runtime_operators.rs::a_processing_time_window_emits_its_open_windows_at_the_end_of_input"]),
    e(".pipelines[].operators[][type=window].aggregations[].as", Engine, &[(AGGREGATE, "spec.output_name()")], &["tests/runtime_operators.rs::a_processing_time_window_emits_its_open_windows_at_the_end_of_input"]),
    e(".pipelines[].operators[][type=window].allowed_lateness", Engine, &[(WINDOW, "spec.lateness()")], &["engine/src/operators/window.rs::allowed_lateness_re_emits_and_later_records_are_dropped_and_counted"]),
    e(".pipelines[].operators[][type=window].late", Engine, &[(WINDOW, "spec.late.is_some()"), (COMPILE, "operator.late_target()")], &["engine/src/plan/compile.rs::a_late_edge_is_a_side_output_of_its_own"]),
    e(".pipelines[].operators[][type=window].emit", Engine, &[(WINDOW, "emit: spec.emit")], &["engine/src/operators/window.rs::on_update_emits_every_change_and_nothing_at_close"]),
    e(".pipelines[].operators[][type=window].key_field", Engine, &[(WINDOW, "spec.key_field.clone()")], &["tests/runtime_operators.rs::a_processing_time_window_emits_its_open_windows_at_the_end_of_input"]),
    e(".pipelines[].operators[][type=process].state", Engine, &[(REGISTRY, "p.state.iter()")], &["tests/runtime_operators.rs::process_with_value_list_and_map_state"]),
    e(".pipelines[].operators[][type=process].state{}.kind", Engine, &[(REGISTRY, "d.kind()")], &["schema/src/validate.rs::state_entries_take_the_short_and_the_long_form"]),
    e(".pipelines[].operators[][type=process].state{}.ttl", Engine, &[(REGISTRY, "d.ttl()?.get()")], &["engine/src/operators/process.rs::expired_values_read_as_absent_and_renew_as_declared", "tests/invalid/state_ttl_not_positive.yaml"]),
    e(".pipelines[].operators[][type=process].state{}.ttl_update", Engine, &[(REGISTRY, "d.ttl_update()")], &["schema/src/validate.rs::state_entries_take_the_short_and_the_long_form"]),
    // Sinks.
    e(".pipelines[].sinks", Engine, &[(COMPILE, "spec.sinks")], &["tests/runtime_operators.rs::map_filter_flat_map_match_a_sequential_reference"]),
    e(".pipelines[].sinks[][type=*].type", Tag, &[(REGISTRY, "SinkSpec::File(f)")], &[]),
    e(".pipelines[].sinks[][type=*].id", Engine, &[(COMPILE, "sink.id()")], &["tests/runtime_operators.rs::map_filter_flat_map_match_a_sequential_reference"]),
    e(".pipelines[].sinks[][type=*].input", Engine, &[(COMPILE, ".wiring()")], &["tests/runtime_operators.rs::map_filter_flat_map_match_a_sequential_reference"]),
    e(".pipelines[].sinks[][type=*].inputs", Engine, &[(COMPILE, ".wiring()")], &[]),
    e(".pipelines[].sinks[][type=*].format", Engine, &[(REGISTRY, "f.format == SinkFormat::Csv"), (REGISTRY, "s.format == SinkFormat::Csv")], &["tests/runtime_operators.rs::csv_in_csv_out_and_glob_sources"]),
    e(".pipelines[].sinks[][type=file].path", Engine, &[(REGISTRY, "resolve_path(&f.path)")], &["tests/runtime_operators.rs::csv_in_csv_out_and_glob_sources"]),
    e(".pipelines[].sinks[][type=file].prefix", Engine, &[(REGISTRY, "f.prefix.clone()")], &[]),
    e(".pipelines[].sinks[][type=file].max_part_size", Engine, &[(REGISTRY, "f.max_part_size")], &[]),
    e(".pipelines[].sinks[][type=file].parallelism", Engine, &[(COMPILE, "sink.parallelism()")], &["tests/runtime_operators.rs::word_count_is_the_same_at_parallelism_1_and_4"]),
    e(".pipelines[].sinks[][type=file].partitioning", Engine, &[(COMPILE, "sink.partitioning()")], &["tests/invalid/partitioning_after_key_by.yaml"]),
    e(".pipelines[].sinks[][type=postgres].connection_env", Engine, &[(POSTGRES, "&spec.connection_env")], &["tests/postgres.rs::exactly_once_under_sigkills_equals_the_failure_free_run", "tests/invalid/postgres_connection_env_is_a_url.yaml"]),
    e(".pipelines[].sinks[][type=postgres].table", Engine, &[(POSTGRES, "quote_table(&spec.table)")], &["tests/postgres.rs::exactly_once_under_sigkills_equals_the_failure_free_run", "tests/invalid/postgres_key_not_a_column.yaml"]),
    e(".pipelines[].sinks[][type=postgres].columns", Engine, &[(POSTGRES, "spec.columns")], &["tests/postgres.rs::exactly_once_under_sigkills_equals_the_failure_free_run"]),
    e(".pipelines[].sinks[][type=postgres].mode", Engine, &[(POSTGRES, "match spec.mode")], &["tests/postgres.rs::at_least_once_upsert_absorbs_replays", "tests/invalid/postgres_upsert_without_key.yaml"]),
    e(".pipelines[].sinks[][type=postgres].key", Engine, &[(POSTGRES, ".key")], &["tests/postgres.rs::at_least_once_upsert_absorbs_replays", "tests/invalid/postgres_key_with_insert.yaml"]),
    e(".pipelines[].sinks[][type=postgres].batch_size", Engine, &[(POSTGRES, ".batch_size")], &["tests/postgres.rs::at_least_once_upsert_absorbs_replays"]),
    e(".pipelines[].sinks[][type=postgres].parallelism", Engine, &[(COMPILE, "sink.parallelism()")], &["tests/postgres.rs::at_least_once_upsert_absorbs_replays"]),
    e(".pipelines[].sinks[][type=postgres].partitioning", Engine, &[(COMPILE, "sink.partitioning()")], &["tests/postgres.rs::at_least_once_upsert_absorbs_replays"]),
    e(".pipelines[].sinks[][type=kafka].brokers", Engine, &[(KAFKA, "brokers: spec.brokers.clone()")], &["tests/kafka.rs::file_to_kafka_at_least_once_loses_nothing_under_sigkill"]),
    e(".pipelines[].sinks[][type=kafka].topic", Engine, &[(KAFKA, "(Some(t), None) => TopicOf::Fixed(t.clone())")], &["tests/kafka.rs::file_to_kafka_at_least_once_loses_nothing_under_sigkill"]),
    e(".pipelines[].sinks[][type=kafka].topic_field", Engine, &[(KAFKA, "TopicOf::Field(FieldPath::new(f))")], &["tests/invalid/kafka_sink_topic_and_topic_field.yaml"]),
    e(".pipelines[].sinks[][type=kafka].key_field", Engine, &[(KAFKA, "spec.key_field.as_deref()")], &["tests/kafka.rs::file_to_kafka_at_least_once_loses_nothing_under_sigkill"]),
    e(".pipelines[].sinks[][type=kafka].headers", Engine, &[(KAFKA, "(name.clone(), FieldPath::new(field))")], &["tests/kafka.rs::file_to_kafka_at_least_once_loses_nothing_under_sigkill"]),
    e(".pipelines[].sinks[][type=kafka].flush_timeout", Engine, &[(KAFKA, "spec.flush_timeout")], &[]),
    e(".pipelines[].sinks[][type=kafka].properties", Engine, &[(KAFKA, "properties: spec.properties.clone()")], &[]),
    e(".pipelines[].sinks[][type=kafka].parallelism", Engine, &[(COMPILE, "sink.parallelism()")], &["tests/kafka.rs::file_to_kafka_at_least_once_loses_nothing_under_sigkill"]),
    e(".pipelines[].sinks[][type=kafka].partitioning", Engine, &[(COMPILE, "sink.partitioning()")], &[]),
];

/// `Engine` fields read by the engine (see their `reads`) whose effect no test pins down
/// yet, reviewed one by one. A new field cannot join this list unnoticed: the list is part
/// of the table's review.
const UNPROVEN: &[&str] = &[
    ".pipelines[].state[backend=rocksdb].path",
    ".pipelines[].state[backend=rocksdb].block_cache_size",
    ".pipelines[].state[backend=rocksdb].write_buffer_size",
    ".pipelines[].checkpoints.enabled",
    ".pipelines[].limits.max_array_size",
    ".pipelines[].sources[][type=*].csv.delimiter",
    ".pipelines[].sources[][type=generator].fields{}[kind=float].min",
    ".pipelines[].sources[][type=generator].fields{}[kind=float].max",
    ".pipelines[].sources[][type=generator].fields{}[kind=choice].values",
    ".pipelines[].sources[][type=generator].fields{}[kind=timestamp].start",
    ".pipelines[].sources[][type=generator].fields{}[kind=timestamp].step",
    ".pipelines[].sources[][type=generator].fields{}[kind=const].value",
    ".pipelines[].sinks[][type=*].inputs",
    ".pipelines[].sinks[][type=file].prefix",
    ".pipelines[].sinks[][type=file].max_part_size",
    ".pipelines[].sources[][type=kafka].format",
    ".pipelines[].sources[][type=kafka].start",
    ".pipelines[].sources[][type=kafka].start.timestamp",
    ".pipelines[].sources[][type=kafka].group",
    ".pipelines[].sources[][type=kafka].discovery_interval",
    ".pipelines[].sources[][type=kafka].properties",
    ".pipelines[].sinks[][type=kafka].flush_timeout",
    ".pipelines[].sinks[][type=kafka].properties",
    ".pipelines[].sinks[][type=kafka].partitioning",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every property path of the schema: `.a.b`, `[]` for array items, `{}` for map values,
/// `[tag=value]` for the variant of a tagged union.
fn schema_paths() -> BTreeSet<String> {
    let text = std::fs::read_to_string(root().join("schema/weir.schema.json"))
        .unwrap_or_else(|e| panic!("cannot read the schema: {e}"));
    let schema: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
    let mut out = BTreeSet::new();
    walk(&schema, &schema, "", &mut Vec::new(), &mut out);
    out
}

fn walk(
    schema: &Value,
    node: &Value,
    path: &str,
    seen: &mut Vec<String>,
    out: &mut BTreeSet<String>,
) {
    if let Some(r) = node.get("$ref").and_then(Value::as_str) {
        let name = r.rsplit('/').next().unwrap_or_default().to_owned();
        if !seen.contains(&name) {
            let target = &schema["$defs"][&name];
            seen.push(name);
            walk(schema, target, path, seen, out);
            seen.pop();
        }
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        for branch in node
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let tag = ["type", "backend", "strategy", "kind"]
                .iter()
                .find_map(|t| {
                    let v = branch.get("properties")?.get(*t)?.get("const")?.as_str()?;
                    Some(format!("[{t}={v}]"))
                });
            walk(
                schema,
                branch,
                &format!("{path}{}", tag.unwrap_or_default()),
                seen,
                out,
            );
        }
    }
    if let Some(props) = node.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            let p = format!("{path}.{k}");
            out.insert(p.clone());
            walk(schema, v, &p, seen, out);
        }
    }
    if let Some(items) = node.get("items").filter(|i| i.is_object()) {
        walk(schema, items, &format!("{path}[]"), seen, out);
    }
    if let Some(values) = node.get("additionalProperties").filter(|i| i.is_object()) {
        walk(schema, values, &format!("{path}{{}}"), seen, out);
    }
}

/// Whether `pattern` matches `path` (`*` as a tag value matches any), and how specific it
/// is (fewer wildcards wins).
fn matches(pattern: &str, path: &str) -> Option<usize> {
    let mut wild = 0;
    let (mut p, mut s) = (pattern, path);
    loop {
        match (p.find("=*]"), p.is_empty()) {
            (_, true) => return s.is_empty().then_some(usize::MAX - wild),
            (None, false) => return (p == s).then_some(usize::MAX - wild),
            (Some(i), false) => {
                let head = &p[..=i]; // up to and including `=`
                let rest = s.strip_prefix(head)?;
                let close = rest.find(']')?;
                s = &rest[close + 1..];
                p = &p[i + 3..];
                wild += 1;
            }
        }
    }
}

/// The YAML key a path ends with (`.a.b[type=x]` → `b`).
fn key_of(path: &str) -> &str {
    let last = path.rsplit('.').next().unwrap_or(path);
    last.split(['[', '{']).next().unwrap_or(last)
}

fn read(rel: &str) -> Result<String, String> {
    std::fs::read_to_string(root().join(rel)).map_err(|e| format!("cannot read `{rel}`: {e}"))
}

/// `text` without `//` comments (line and doc comments), so a mention in prose never counts
/// as a read.
fn code_only(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) if !l[..i].contains('"') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The text of `fn name` in `file` (from its line to the closing brace at its indentation).
fn function(file_text: &str, name: &str) -> Option<String> {
    let lines: Vec<&str> = file_text.lines().collect();
    let start = lines.iter().position(|l| {
        let t = l.trim_start();
        t.starts_with(&format!("fn {name}("))
            || t.starts_with(&format!("async fn {name}("))
            || t.starts_with(&format!("pub fn {name}("))
            || t.starts_with(&format!("const {name}:"))
            || t.starts_with(&format!("pub const {name}:"))
            || t.starts_with(&format!("static {name}:"))
    })?;
    let first = lines[start];
    let indent = &first[..first.len() - first.trim_start().len()];
    let is_item = !(first.trim_start().starts_with("fn ")
        || first.trim_start().starts_with("async fn ")
        || first.trim_start().starts_with("pub fn "));
    let end = lines
        .iter()
        .enumerate()
        .skip(start)
        .find(|(i, l)| {
            if !is_item {
                *i > start && **l == format!("{indent}}}")
            } else if first.contains("r#\"") {
                l.contains("\"#;")
            } else {
                l.trim_end().ends_with(';')
            }
        })
        .map_or(lines.len() - 1, |(i, _)| i);
    Some(lines[start..=end].join("\n"))
}

fn mentions_word(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        let boundary = |c: Option<char>| c.is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        boundary(before) && boundary(after)
    })
}

/// Whether the test `name` in `file_text` mentions `key`, itself or through the constants and
/// functions of the same file it names (three levels deep).
fn test_mentions(file_text: &str, name: &str, key: &str) -> Result<bool, String> {
    let body = function(file_text, name).ok_or_else(|| format!("no `fn {name}`"))?;
    let mut frontier = vec![body];
    let mut visited: BTreeSet<String> = BTreeSet::new();
    for _ in 0..3 {
        let mut next = Vec::new();
        for text in &frontier {
            if mentions_word(text, key) {
                return Ok(true);
            }
            for ident in text
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .filter(|w| w.len() > 2 && w.chars().next().is_some_and(char::is_alphabetic))
            {
                if visited.insert(ident.to_owned())
                    && let Some(t) = function(file_text, ident)
                {
                    next.push(t);
                }
            }
        }
        frontier = next;
    }
    Ok(frontier.iter().any(|t| mentions_word(t, key)))
}

/// Checks one proof of the field `key`.
fn check_proof(proof: &str, key: &str) -> Result<(), String> {
    if let Some((file, name)) = proof.split_once("::") {
        let text = read(file)?;
        if !test_mentions(&text, name, key)? {
            return Err(format!("test `{proof}` never mentions `{key}`"));
        }
        return Ok(());
    }
    // A corpus file: it must fail with an error located at the field.
    let v = validate_file(&root().join(proof));
    let at_key = v.diagnostics.iter().any(|d| {
        d.severity == weir_schema::Severity::Error
            && d.path.as_ref().is_some_and(|p| {
                let p = p.to_string();
                p == key || p.ends_with(&format!(".{key}"))
            })
    });
    if at_key {
        Ok(())
    } else {
        Err(format!(
            "`{proof}` has no error located at `{key}`; its diagnostics: {:?}",
            v.diagnostics
                .iter()
                .map(|d| (d.code, d.path.as_ref().map(ToString::to_string)))
                .collect::<Vec<_>>()
        ))
    }
}

#[test]
fn the_table_covers_the_schema_exactly() {
    let paths = schema_paths();
    assert!(
        paths.len() > 150,
        "the schema walk found only {} fields",
        paths.len()
    );
    let mut problems = Vec::new();
    let mut used: BTreeMap<&str, usize> = BTreeMap::new();
    for path in &paths {
        let best = TABLE
            .iter()
            .filter_map(|e| matches(e.path, path).map(|rank| (rank, e)))
            .max_by_key(|(rank, _)| *rank);
        match best {
            Some((_, e)) => *used.entry(e.path).or_default() += 1,
            None => problems.push(format!(
                "schema field `{path}` is in no row: decide whether the engine reads it (and \
                 where), validation rejects it, or it is purely descriptive, and add a row"
            )),
        }
    }
    for e in TABLE {
        if !used.contains_key(e.path) {
            problems.push(format!("row `{}` matches no schema field (stale)", e.path));
        }
    }
    let mut seen = BTreeSet::new();
    for e in TABLE {
        if !seen.insert(e.path) {
            problems.push(format!("row `{}` appears twice", e.path));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_row_is_read_where_it_says_and_proven() {
    let mut problems = Vec::new();
    for e in TABLE {
        let key = key_of(e.path);
        if e.used != Descriptive && e.reads.is_empty() {
            problems.push(format!("`{}`: no `reads`", e.path));
        }
        for (file, needle) in e.reads {
            if e.used == Engine && file.starts_with("schema/") {
                problems.push(format!(
                    "`{}`: an engine field must be read outside `schema/`",
                    e.path
                ));
            }
            match read(file) {
                Ok(text) if code_only(&text).contains(needle) => {}
                Ok(_) => problems.push(format!(
                    "`{}`: `{file}` does not contain `{needle}`",
                    e.path
                )),
                Err(err) => problems.push(format!("`{}`: {err}", e.path)),
            }
        }
        for proof in e.proofs {
            if let Err(err) = check_proof(proof, key) {
                problems.push(format!("`{}`: {err}", e.path));
            }
        }
        let corpus = e.proofs.iter().any(|p| p.ends_with(".yaml"));
        match e.used {
            Engine if e.proofs.is_empty() && !UNPROVEN.contains(&e.path) => problems.push(format!(
                "`{}` is read by the engine but no test proves its effect: name one (or, after \
                 review, list it in UNPROVEN)",
                e.path
            )),
            Engine if !e.proofs.is_empty() && UNPROVEN.contains(&e.path) => {
                problems.push(format!("`{}` is proven: remove it from UNPROVEN", e.path))
            }
            Rejected | Validation if !corpus => problems.push(format!(
                "`{}` must be proven by a corpus file that fails validation at it",
                e.path
            )),
            _ => {}
        }
    }
    for p in UNPROVEN {
        if !TABLE.iter().any(|e| e.path == *p && e.used == Engine) {
            problems.push(format!("UNPROVEN lists `{p}`, which is no engine row"));
        }
    }
    let descriptive: Vec<&str> = TABLE
        .iter()
        .filter(|e| e.used == Descriptive)
        .map(|e| e.path)
        .collect();
    assert_eq!(
        descriptive,
        [".pipelines[].description"],
        "the allow-list of purely descriptive fields changed: review it"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_checker_itself_catches_what_it_should() {
    // Wildcards match any variant and lose to exact rows.
    let exact = matches(".a[type=union].b", ".a[type=union].b").expect("matches");
    let wild = matches(".a[type=*].b", ".a[type=union].b").expect("matches");
    assert!(exact > wild);
    assert_eq!(matches(".a[type=*].b", ".a[type=map].c"), None);
    assert_eq!(matches(".a[type=*].b", ".a[type=map].b.c"), None);
    assert_eq!(
        key_of(".p[].sources[][type=file].csv.delimiter"),
        "delimiter"
    );
    assert_eq!(key_of(".p[].restart[strategy=none].strategy"), "strategy");
    // A proof that does not mention the key fails, and so does a missing test.
    let absent = format!("{}_{}", "absent", "key");
    assert!(
        check_proof(
            "tests/schema_fields.rs::the_checker_itself_catches_what_it_should",
            &absent
        )
        .is_err()
    );
    assert!(check_proof("tests/schema_fields.rs::no_such_test", "x").is_err());
    // A corpus file proves only the field its error is at.
    assert!(check_proof("tests/invalid/union_on_error.yaml", "on_error").is_ok());
    assert!(check_proof("tests/invalid/union_on_error.yaml", "follow").is_err());
    // Comments are not reads.
    assert!(!code_only("// reads spec.follow\nlet x = 1;").contains("spec.follow"));
}
