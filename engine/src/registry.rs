//! The registry: every built-in `type:` (sources, operators, sinks) and its builder. A builder
//! runs once per plan node (compiling its script once) and returns a factory that makes one
//! instance per subtask. Construction returns `Result` and never panics.
//!
//! It sits above both `operators` and `connectors` because it is the one place that knows all
//! of them: so neither imports the other, and both depend only on the interface they
//! implement (`element`). The job builds a pipeline's elements through it.

use std::sync::Arc;

use rhai::Engine;
use weir_schema::{OperatorSpec, SinkFormat, SinkSpec, SourceSpec, StateSpec};

use crate::base::error::{Result, RunError};
use crate::connectors::event_time::EventTimeSource;
use crate::connectors::file::{DEFAULT_POLL_INTERVAL, FileSink, FileSource, prepare_sink_dir};
use crate::connectors::pacing::Pacing;
use crate::connectors::generator::GeneratorSource;
use crate::connectors::kafka::{KafkaSink, KafkaSinkConfig, KafkaSource, KafkaSourceConfig};
use crate::connectors::stdin::StdinSource;
use crate::connectors::stdout::StdoutSink;
use crate::connectors::{LineParser, Source};
use crate::element::Operator;
use crate::operators::aggregate::{Accumulator, AggregateOperator, Aggregation};
use crate::operators::filter::FilterOperator;
use crate::operators::flat_map::FlatMapOperator;
use crate::operators::key_by::{KeyByOperator, KeySelector};
use crate::operators::map::MapOperator;
use crate::operators::process::ProcessOperator;
use crate::operators::reduce::ReduceOperator;
use crate::operators::union::UnionOperator;
use crate::operators::window::{WindowConfig, WindowOperator};
use crate::plan::{NodeKind, PipelinePlan, PlanNode};
use crate::record::FieldPath;
use crate::script::runtime::{CompiledScript, ScriptFn};

/// Makes an operator (or sink) instance for a subtask `(subtask, parallelism)`.
pub type OperatorFactory = Box<dyn Fn(u32, u32) -> Result<Box<dyn Operator>> + Send + Sync>;
/// Makes a source instance for a subtask `(subtask, parallelism)`.
pub type SourceFactory = Box<dyn Fn(u32, u32) -> Result<Box<dyn Source>> + Send + Sync>;

/// What a node builds into.
pub enum NodeBuilder {
    /// A source.
    Source(SourceFactory),
    /// An operator; `keyed` ones get a state backend.
    Operator {
        /// The factory.
        factory: OperatorFactory,
        /// Whether it needs keyed state.
        keyed: bool,
    },
    /// A sink (an operator that passes nothing on).
    Sink(OperatorFactory),
}

/// What builders need from the pipeline.
pub struct BuildContext<'a> {
    /// The pipeline's plan.
    pub plan: &'a PipelinePlan,
    /// The pipeline's sandboxed engine with the runtime functions.
    pub engine: Arc<Engine>,
}

impl BuildContext<'_> {
    fn error(&self, node: &PlanNode, message: impl Into<String>) -> RunError {
        RunError::Build {
            pipeline: self.plan.id.clone(),
            element: node.id.clone(),
            message: message.into(),
        }
    }

    fn compile(&self, node: &PlanNode) -> Result<Arc<CompiledScript>> {
        let text = node
            .script
            .as_deref()
            .ok_or_else(|| self.error(node, "this operator needs a script"))?;
        CompiledScript::compile(&self.engine, text)
            .map(|script| Arc::new(script.at(node.script_origin.clone())))
            .map_err(|e| self.error(node, format!("script does not compile: {e}")))
    }

    /// `limits.max_outputs_per_record` of the pipeline.
    fn max_outputs_per_record(&self) -> usize {
        usize::try_from(self.plan.spec.limits.max_outputs_per_record).unwrap_or(usize::MAX)
    }

    fn script_factory(
        &self,
        node: &PlanNode,
    ) -> Result<impl Fn() -> ScriptFn + Send + Sync + use<>> {
        let script = self.compile(node)?;
        let engine = Arc::clone(&self.engine);
        Ok(move || ScriptFn::new(Arc::clone(&engine), Arc::clone(&script)))
    }
}

/// Builds a plan node.
///
/// # Errors
/// A script that does not compile, or a spec the runtime cannot honour.
pub fn build(node: &PlanNode, ctx: &BuildContext<'_>) -> Result<NodeBuilder> {
    match &node.kind {
        NodeKind::Source(s) => build_source(node, s, ctx).map(NodeBuilder::Source),
        NodeKind::Operator(o) => build_operator(node, o, ctx),
        NodeKind::Sink(s) => build_sink(node, s, ctx).map(NodeBuilder::Sink),
    }
}

fn build_source(
    node: &PlanNode,
    spec: &SourceSpec,
    ctx: &BuildContext<'_>,
) -> Result<SourceFactory> {
    let factory = build_plain_source(node, spec, ctx)?;
    let Some(event_time) = spec.event_time().cloned() else {
        return Ok(factory);
    };
    // Only sources that declare event time read it and make watermarks.
    let on_error = spec.on_error().cloned().unwrap_or_default();
    Ok(Box::new(move |s, p| {
        let inner = factory(s, p)?;
        Ok(Box::new(EventTimeSource::new(inner, &event_time, &on_error)) as Box<dyn Source>)
    }))
}

fn build_plain_source(
    node: &PlanNode,
    spec: &SourceSpec,
    ctx: &BuildContext<'_>,
) -> Result<SourceFactory> {
    Ok(match spec {
        SourceSpec::File(f) => {
            let pattern = ctx.plan.resolve_path(&f.path);
            let parser = LineParser::new(f.format, f.csv.as_ref());
            let (on_error, follow) = (f.on_error.clone(), f.follow);
            let poll_interval = f.poll_interval.map_or(DEFAULT_POLL_INTERVAL, |d| d.0);
            // Event time reads a big file in stripes, so readers stay close in time.
            let striped = f.event_time.is_some();
            let pacing = Pacing::default();
            Box::new(move |s, p| {
                Ok(Box::new(
                    FileSource::new(pattern.clone(), parser.clone(), on_error.clone(), follow, s, p)
                        .with_poll_interval(poll_interval)
                        .with_striping(striped)
                        .with_pacing(pacing.clone()),
                ) as Box<dyn Source>)
            })
        }
        SourceSpec::Generator(g) => {
            // Build once to surface bad values at build time.
            GeneratorSource::new(g.seed, g.count, g.rate, &g.fields, 0, 1)
                .map_err(|e| ctx.error(node, e))?;
            let g = g.clone();
            let (pipeline, id) = (ctx.plan.id.clone(), node.id.clone());
            Box::new(move |s, p| {
                GeneratorSource::new(g.seed, g.count, g.rate, &g.fields, s, p)
                    .map(|x| Box::new(x) as Box<dyn Source>)
                    .map_err(|message| RunError::Build {
                        pipeline: pipeline.clone(),
                        element: id.clone(),
                        message,
                    })
            })
        }
        SourceSpec::Kafka(k) => {
            let config = KafkaSourceConfig::from_spec(k, &ctx.plan.id)
                .map_err(|message| ctx.error(node, message))?;
            let config = Arc::new(config);
            Box::new(move |s, p| {
                Ok(Box::new(KafkaSource::new(Arc::clone(&config), s, p)) as Box<dyn Source>)
            })
        }
        SourceSpec::Stdin(s) => {
            let parser = LineParser::new(s.format, s.csv.as_ref());
            let on_error = s.on_error.clone();
            Box::new(move |_, _| {
                Ok(Box::new(StdinSource::new(parser.clone(), &on_error)) as Box<dyn Source>)
            })
        }
    })
}

fn build_operator(
    node: &PlanNode,
    spec: &OperatorSpec,
    ctx: &BuildContext<'_>,
) -> Result<NodeBuilder> {
    let keyed = spec.is_keyed();
    let factory: OperatorFactory = match spec {
        OperatorSpec::Map(_) => {
            let f = ctx.script_factory(node)?;
            Box::new(move |_, _| Ok(Box::new(MapOperator::new(f())) as Box<dyn Operator>))
        }
        OperatorSpec::Filter(_) => {
            let f = ctx.script_factory(node)?;
            Box::new(move |_, _| Ok(Box::new(FilterOperator::new(f())) as Box<dyn Operator>))
        }
        OperatorSpec::FlatMap(_) => {
            let f = ctx.script_factory(node)?;
            let max = ctx.max_outputs_per_record();
            Box::new(move |_, _| Ok(Box::new(FlatMapOperator::new(f(), max)) as Box<dyn Operator>))
        }
        OperatorSpec::KeyBy(k) => match &k.field {
            Some(field) => {
                let path = FieldPath::new(field);
                Box::new(move |_, _| {
                    Ok(
                        Box::new(KeyByOperator::new(KeySelector::Field(path.clone())))
                            as Box<dyn Operator>,
                    )
                })
            }
            None => {
                let f = ctx.script_factory(node)?;
                Box::new(move |_, _| {
                    Ok(Box::new(KeyByOperator::new(KeySelector::Script(Box::new(f())))) as Box<dyn Operator>)
                })
            }
        },
        OperatorSpec::Reduce(r) => {
            let f = ctx.script_factory(node)?;
            let (emit, key_field) = (r.emit, r.key_field.clone());
            Box::new(move |_, _| {
                Ok(Box::new(ReduceOperator::new(f(), emit, key_field.clone()))
                    as Box<dyn Operator>)
            })
        }
        OperatorSpec::Aggregate(a) => {
            let (emit, key_field) = (a.emit, a.key_field.clone());
            if a.aggregations.is_empty() {
                let f = ctx.script_factory(node)?;
                Box::new(move |_, _| {
                    Ok(
                        Box::new(AggregateOperator::scripted(f(), emit, key_field.clone()))
                            as Box<dyn Operator>,
                    )
                })
            } else {
                check_aggregations(node, &a.aggregations, ctx)?;
                let aggs: Vec<Aggregation> =
                    a.aggregations.iter().map(Aggregation::from_spec).collect();
                Box::new(move |_, _| {
                    Ok(Box::new(AggregateOperator::builtin(
                        aggs.clone(),
                        emit,
                        key_field.clone(),
                    )) as Box<dyn Operator>)
                })
            }
        }
        OperatorSpec::Process(p) => {
            let f = ctx.script_factory(node)?;
            let declared: Vec<_> = p.state.iter().map(|(n, d)| (n.clone(), d.kind())).collect();
            let ttl: Vec<_> = p
                .state
                .iter()
                .filter_map(|(n, d)| Some((n.clone(), d.ttl()?.get(), d.ttl_update())))
                .collect();
            let max = ctx.max_outputs_per_record();
            Box::new(move |_, _| {
                let op = ProcessOperator::new(f(), declared.clone(), max).with_ttl(ttl.clone());
                Ok(Box::new(op) as Box<dyn Operator>)
            })
        }
        OperatorSpec::Window(w) => {
            let (event_time, carried) = window_event_time(node, w, ctx)?;
            let heap = matches!(ctx.plan.spec.state, StateSpec::Memory | StateSpec::Fs);
            let config = WindowConfig::from_spec(w, &event_time)
                .on_heap(heap)
                .with_carried_times(carried);
            if w.aggregations.is_empty() {
                let f = ctx.script_factory(node)?;
                Box::new(move |_, _| {
                    Ok(Box::new(WindowOperator::new(
                        Accumulator::scripted(f()),
                        config.clone(),
                    )) as Box<dyn Operator>)
                })
            } else {
                check_aggregations(node, &w.aggregations, ctx)?;
                let aggs: Vec<Aggregation> =
                    w.aggregations.iter().map(Aggregation::from_spec).collect();
                Box::new(move |_, _| {
                    Ok(Box::new(WindowOperator::new(
                        Accumulator::Builtin(aggs.clone()),
                        config.clone(),
                    )) as Box<dyn Operator>)
                })
            }
        }
        OperatorSpec::Union(_) => Box::new(|_, _| Ok(Box::new(UnionOperator) as Box<dyn Operator>)),
    };
    Ok(NodeBuilder::Operator { factory, keyed })
}

/// How an event-time window reads a record's event time: the field is its `time_field`, else
/// the one `event_time.field` of the sources upstream (validation insists there is one); the
/// unit or format is the sources' when they agree, else epoch milliseconds. Unused (a default)
/// for processing-time windows. Also whether the event times the sources read and the records
/// carry ([`Batch::times`](crate::base::message::Batch::times)) are the window's.
fn window_event_time(
    node: &PlanNode,
    w: &weir_schema::WindowSpec,
    ctx: &BuildContext<'_>,
) -> Result<(weir_schema::EventTimeSpec, bool)> {
    let spec = &ctx.plan.spec;
    let found: Vec<Option<&weir_schema::EventTimeSpec>> = spec
        .upstream_sources(&node.id)
        .into_iter()
        .map(|si| spec.sources[si].event_time())
        .collect();
    let declared: Vec<&weir_schema::EventTimeSpec> = found.iter().flatten().copied().collect();
    let same = |f: &dyn Fn(&weir_schema::EventTimeSpec) -> String| {
        declared.windows(2).all(|p| f(p[0]) == f(p[1]))
    };
    let first = declared.first();
    let field = match (&w.time_field, first) {
        (Some(f), _) => f.clone(),
        (None, _) if w.time == weir_schema::WindowTimeSpec::Processing => String::new(),
        (None, Some(e)) if found.iter().all(Option::is_some) && same(&|e| e.field.clone()) => {
            e.field.clone()
        }
        _ => {
            return Err(ctx.error(
                node,
                "an event-time window needs `time_field`, or sources upstream that all take \
                 event time from one field (`event_time.field`)",
            ));
        }
    };
    let how = same(&|e| format!("{:?}{:?}", e.unit, e.format));
    // The times the sources read travel with the records; they are the window's own when
    // every source upstream reads this very field the same way.
    let carried = w.time == weir_schema::WindowTimeSpec::Event
        && how
        && !found.is_empty()
        && found.iter().all(|e| e.is_some_and(|e| e.field == field));
    Ok((
        weir_schema::EventTimeSpec {
            field,
            unit: first.filter(|_| how).and_then(|e| e.unit),
            format: first.filter(|_| how).and_then(|e| e.format),
            max_out_of_orderness: None,
            idle_timeout: None,
        },
        carried,
    ))
}

/// Every built-in aggregation that reads a field names one.
fn check_aggregations(
    node: &PlanNode,
    aggregations: &[weir_schema::AggregationSpec],
    ctx: &BuildContext<'_>,
) -> Result<()> {
    for agg in aggregations {
        if agg.function.needs_field() && agg.field.is_none() {
            return Err(ctx.error(node, format!("`{}` needs a `field`", agg.output_name())));
        }
    }
    Ok(())
}

fn build_sink(node: &PlanNode, spec: &SinkSpec, ctx: &BuildContext<'_>) -> Result<OperatorFactory> {
    Ok(match spec {
        SinkSpec::File(f) => {
            let dir = ctx.plan.resolve_path(&f.path);
            let csv = f.format == SinkFormat::Csv;
            let ext = if csv { "csv" } else { "jsonl" };
            prepare_sink_dir(&dir, &f.prefix, ext).map_err(|source| RunError::Io {
                pipeline: ctx.plan.id.clone(),
                element: node.id.clone(),
                what: "cannot prepare",
                path: dir.clone(),
                source,
            })?;
            let prefix = f.prefix.clone();
            let max = f.max_part_size.map(|s| s.bytes());
            let two_phase =
                crate::connectors::file_sink::uses_two_phase_commit(&ctx.plan.spec.checkpoints);
            Box::new(move |s, _| {
                Ok(Box::new(
                    FileSink::new(dir.clone(), prefix.clone(), csv, max, s)
                        .two_phase_commit(two_phase),
                ) as Box<dyn Operator>)
            })
        }
        SinkSpec::Kafka(k) => {
            let config = Arc::new(KafkaSinkConfig::from_spec(k));
            Box::new(move |_, _| {
                Ok(Box::new(KafkaSink::new(Arc::clone(&config))) as Box<dyn Operator>)
            })
        }
        SinkSpec::Stdout(s) => {
            let csv = s.format == SinkFormat::Csv;
            Box::new(move |_, _| Ok(Box::new(StdoutSink::new(csv)) as Box<dyn Operator>))
        }
        SinkSpec::Postgres(p) => {
            use crate::connectors::postgres::{PostgresConfig, PostgresSink};
            let two_phase =
                crate::plan::guarantee::file_sink_commits_in_two_phases(&ctx.plan.spec.checkpoints);
            let config = PostgresConfig::from_spec(p, &ctx.plan.id, two_phase)
                .map_err(|e| ctx.error(node, e))?;
            // `weir run` says before the start when the server allows no prepared transactions.
            config.preflight().map_err(|e| ctx.error(node, e))?;
            let config = Arc::new(config);
            Box::new(move |s, _| {
                Ok(Box::new(PostgresSink::new(Arc::clone(&config), s)) as Box<dyn Operator>)
            })
        }
    })
}

/// The operator-local state of a node of section `section` and `type:` `type_name` (a
/// source's positions, a file sink's pending parts) as JSON with named fields, for
/// `weir inspect`; `None` for a type whose local state has no description.
pub fn describe_local_state(
    section: crate::checkpoint::metadata::Section,
    type_name: &str,
    bytes: &[u8],
) -> Option<Result<serde_json::Value>> {
    use crate::checkpoint::metadata::Section;
    use crate::connectors::{event_time, file, file_sink, generator, kafka, postgres, stdin};
    // A source with `event_time` keeps its watermark in front of its position.
    let (bytes, watermark) = match section {
        Section::Source => match event_time::inner_position(bytes) {
            Ok(split) => split,
            Err(e) => return Some(Err(e)),
        },
        _ => (bytes, None),
    };
    let described = match (section, type_name) {
        (Section::Source, "file") => file::describe_snapshot(bytes),
        (Section::Source, "generator") => generator::describe_snapshot(bytes),
        (Section::Source, "stdin") => stdin::describe_snapshot(bytes),
        (Section::Source, "kafka") => kafka::describe_snapshot(bytes),
        (Section::Sink, "file") => file_sink::describe_snapshot(bytes),
        (Section::Sink, "postgres") => postgres::describe_snapshot(bytes),
        _ => return None,
    };
    Some(described.map(|mut v| {
        if let (Some(w), Some(m)) = (watermark, v.as_object_mut()) {
            m.insert("watermark".into(), serde_json::Value::from(w));
        }
        v
    }))
}
