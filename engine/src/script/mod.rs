//! The Rhai scripting layer: one sandboxed engine configuration shared by validation and the
//! runtime, compile-time checks of every script in a file, and mapping of Rhai positions back
//! into the YAML block scalar (or the script file) for diagnostics.
//!
//! Scripts compile once, at plan time; the runtime holds only the compiled `AST`. The sandbox:
//! no `eval`, no module imports (no file, network or process access exists in the engine at
//! all), and the limits from the pipeline's `limits:` section.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use rhai::{AST, Engine, ParseError};
use weir_schema::diagnostic::{Diagnostic, Diagnostics, codes, did_you_mean};
use weir_schema::registry::ScriptRef;
use weir_schema::{FileSpec, OperatorSpec, ScriptLimitsSpec, SourceFile, SpanIndex, YamlPath};

/// Stack size of every thread that compiles or runs scripts: compilation runs on a thread of
/// its own ([`on_script_stack`]) and the tokio runtime's worker and blocking threads are
/// built with it (`job::run`). Rhai parses and evaluates recursively, so this size and the
/// ceilings of `limits:` go together (see [`weir_schema::model::SCRIPT_DEPTH_BUDGET`]):
/// measured with Rhai 1.27, parsing takes up to ~2 KiB per level of `max_expr_depth` (so
/// the ceiling of 1000 needs ~2 MiB), and evaluation up to ~1.25 KiB per expression level
/// per call level, ~7 KiB per call level on its own (so the budget of 8192 needs ~10 MiB).
/// Tokio's default of 2 MiB overflows with the default limits already (32 call levels of
/// 64-deep expressions), which aborts the whole process.
pub const SCRIPT_STACK_SIZE: usize = 32 << 20;

/// Runs `f` on a thread with a [`SCRIPT_STACK_SIZE`] stack and waits for it: compiling a
/// script as deep as `limits:` allows must not depend on the stack of whichever thread asks
/// (the main thread's is whatever `ulimit -s` says).
///
/// # Errors
/// When the thread cannot be started (out of resources).
pub fn on_script_stack<R: Send>(f: impl FnOnce() -> R + Send) -> std::io::Result<R> {
    std::thread::scope(|scope| {
        let handle = std::thread::Builder::new()
            .name("weir-script-compile".to_owned())
            .stack_size(SCRIPT_STACK_SIZE)
            .spawn_scoped(scope, f)?;
        match handle.join() {
            Ok(r) => Ok(r),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// Builds the sandboxed Rhai engine used everywhere (validation and runtime).
///
/// Limits come from the pipeline's `limits:`; `eval` is disabled and no module resolver is
/// installed, so `import` cannot load anything. Data errors are strict ([`strict`]): a missing
/// field or a type mix is an error, not `()` or `false`. The runtime registers its own functions
/// (`emit`, state access) on the returned engine.
pub fn build_engine(limits: &ScriptLimitsSpec) -> Engine {
    let mut engine = Engine::new();
    engine.set_max_operations(limits.max_operations);
    engine.set_max_call_levels(usize::try_from(limits.max_call_levels).unwrap_or(usize::MAX));
    let depth = usize::try_from(limits.max_expr_depth).unwrap_or(usize::MAX);
    engine.set_max_expr_depths(depth, depth);
    engine
        .set_max_string_size(usize::try_from(limits.max_string_size.bytes()).unwrap_or(usize::MAX));
    engine.set_max_array_size(usize::try_from(limits.max_array_size).unwrap_or(usize::MAX));
    engine.set_max_map_size(usize::try_from(limits.max_map_size).unwrap_or(usize::MAX));
    engine.set_max_modules(0);
    // `print` and `debug` never write to stdout (a `stdout` sink's records go there): they
    // are log lines on stderr, naming the pipeline and operator that ran the script.
    engine.on_print(runtime::log_print);
    engine.on_debug(runtime::log_debug);
    engine.disable_symbol("eval");
    engine.set_module_resolver(rhai::module_resolvers::DummyModuleResolver::new());
    strict::install(&mut engine);
    engine
}

/// Compiles a script. The error keeps Rhai's position (1-based line and column in the script).
/// Parsing recurses: call it on a thread with a [`SCRIPT_STACK_SIZE`] stack.
pub fn compile(engine: &Engine, text: &str) -> Result<AST, Box<ParseError>> {
    engine.compile(text).map_err(Box::new)
}

/// Whether `ast` defines a function `name` with `arity` parameters.
pub fn defines(ast: &AST, name: &str, arity: usize) -> bool {
    ast.iter_functions()
        .any(|f| f.name == name && f.params.len() == arity)
}

/// Where a script's text sits, for mapping Rhai positions to file offsets.
struct ScriptLocation {
    file: Arc<SourceFile>,
    /// Byte offset of script line 1, column 1.
    origin: usize,
    /// For an inline block scalar: the YAML line and column (1-based) of script line 1 col 1,
    /// so that script line n maps to YAML line `line + n - 1` at the same indentation.
    block: Option<(usize, usize)>,
}

impl ScriptLocation {
    fn offset(&self, line: usize, col: usize) -> usize {
        match self.block {
            Some((l0, c0)) => self
                .file
                .offset_of(l0 + line.saturating_sub(1), c0 + col.saturating_sub(1)),
            None if line <= 1 => {
                let rest = &self.file.text[self.origin.min(self.file.text.len())..];
                self.origin
                    + rest
                        .char_indices()
                        .nth(col.saturating_sub(1))
                        .map_or(rest.len(), |(b, _)| b)
            }
            None => self.file.offset_of(line, col),
        }
    }
}

/// Where every operator's script sits, by pipeline (in file order) and operator id: the
/// pipeline file's line and column of an inline script's first character, or the script file.
pub fn origins(
    spec: &FileSpec,
    spans: &SpanIndex,
    source: &SourceFile,
    base_dir: &Path,
) -> Vec<HashMap<String, Arc<errors::ScriptOrigin>>> {
    let mut out = Vec::with_capacity(spec.pipelines.len());
    for (pi, pipeline) in spec.pipelines.iter().enumerate() {
        let mut found = HashMap::new();
        for (oi, op) in pipeline.operators.iter().enumerate() {
            let at = YamlPath::root()
                .join("pipelines")
                .join(pi)
                .join("operators")
                .join(oi);
            let origin = match op.script() {
                None => continue,
                Some(ScriptRef::Inline(_)) => {
                    let path = at.join("script");
                    let Some(node) = spans.node(&path) else {
                        continue;
                    };
                    let start = node.span.start;
                    let key_end = spans.key_span(&path).end;
                    let block = source
                        .text
                        .get(key_end..start)
                        .is_some_and(|between| between.contains(['|', '>']));
                    let quote = source.text[start..].starts_with(['"', '\'']);
                    let (line, column) = source.line_col(start + usize::from(quote));
                    errors::ScriptOrigin {
                        file: source.name.clone(),
                        line,
                        column,
                        block,
                    }
                }
                Some(ScriptRef::File(file)) => {
                    let full = if file.is_absolute() {
                        file.to_path_buf()
                    } else {
                        base_dir.join(file)
                    };
                    errors::ScriptOrigin::file(full.display().to_string())
                }
            };
            found.insert(op.id().to_owned(), Arc::new(origin));
        }
        out.push(found);
    }
    out
}

/// Compiles every script in the file and checks that each defines the functions its operator
/// needs. Diagnostics point at the exact line and column inside the YAML block scalar, or in
/// the script file. Runs on a thread of its own ([`on_script_stack`]).
pub fn check_scripts(
    spec: &FileSpec,
    spans: &SpanIndex,
    source: &Arc<SourceFile>,
    base_dir: &Path,
) -> Diagnostics {
    on_script_stack(|| check_scripts_here(spec, spans, source, base_dir)).unwrap_or_else(|e| {
        let mut out = Diagnostics::new();
        out.push(
            Diagnostic::error(
                codes::IO,
                format!("cannot start a thread to compile the scripts: {e}"),
            )
            .help("the system is out of threads or memory; try again"),
        );
        out
    })
}

fn check_scripts_here(
    spec: &FileSpec,
    spans: &SpanIndex,
    source: &Arc<SourceFile>,
    base_dir: &Path,
) -> Diagnostics {
    let mut out = Diagnostics::new();
    for (pi, pipeline) in spec.pipelines.iter().enumerate() {
        let engine = build_engine(&pipeline.limits);
        for (oi, op) in pipeline.operators.iter().enumerate() {
            let at = YamlPath::root()
                .join("pipelines")
                .join(pi)
                .join("operators")
                .join(oi);
            let Some(script) = op.script() else { continue };
            let (text, location, key) = match script {
                ScriptRef::Inline(text) => {
                    let path = at.join("script");
                    let Some(node) = spans.node(&path) else {
                        continue;
                    };
                    let start = node.span.start;
                    let is_block = {
                        let key_end = spans.key_span(&path).end;
                        source
                            .text
                            .get(key_end..start)
                            .is_some_and(|between| between.contains(['|', '>']))
                    };
                    let quote = source.text[start..].starts_with(['"', '\'']);
                    let origin = start + usize::from(quote);
                    let block = is_block.then(|| source.line_col(start));
                    (
                        text.to_owned(),
                        ScriptLocation {
                            file: Arc::clone(source),
                            origin,
                            block,
                        },
                        path,
                    )
                }
                ScriptRef::File(file) => {
                    let full = if file.is_absolute() {
                        file.to_path_buf()
                    } else {
                        base_dir.join(file)
                    };
                    let path = at.join("script_file");
                    // Bounded like the pipeline file: a device or a huge file is an error.
                    let text = match weir_schema::read_text(&full) {
                        Ok(t) => t,
                        Err(e) => {
                            out.push(
                                Diagnostic::error(
                                    codes::SCRIPT_FILE,
                                    format!("{path}: script file unusable: {e}"),
                                )
                                .at(source, spans.span(&path))
                                .label("script file not readable")
                                .help(format!(
                                    "{}; script files are relative to the pipeline file",
                                    e.help
                                ))
                                .with_path(path),
                            );
                            continue;
                        }
                    };
                    let mut f = SourceFile::new(full.display().to_string(), text.clone());
                    f.path = Some(full);
                    (
                        text,
                        ScriptLocation {
                            file: Arc::new(f),
                            origin: 0,
                            block: None,
                        },
                        path,
                    )
                }
            };
            match compile(&engine, &text) {
                Err(e) => {
                    let pos = e.1;
                    let (line, col) = (pos.line().unwrap_or(1), pos.position().unwrap_or(1));
                    let offset = location.offset(line, col);
                    let end = location.file.text[offset..]
                        .chars()
                        .next()
                        .map_or(offset, |c| offset + c.len_utf8());
                    out.push(
                        Diagnostic::error(
                            codes::SCRIPT_SYNTAX,
                            format!("script of `{}` does not compile: {}", op.id(), e.0),
                        )
                        .at(&location.file, offset..end)
                        .label(e.0.to_string())
                        .help(syntax_help(&e))
                        .with_path(key.clone()),
                    );
                }
                Ok(ast) => {
                    check_functions(op, &ast, spans, source, &key, &mut out);
                    check_event_timers(pipeline, op, &text, spans, source, &key, &mut out);
                }
            }
        }
    }
    out
}

/// A `process` script that sets event-time timers needs `event_time` on every source
/// upstream: without watermarks its timers would fire only at the end of a bounded input.
fn check_event_timers(
    pipeline: &weir_schema::PipelineSpec,
    op: &OperatorSpec,
    text: &str,
    spans: &SpanIndex,
    source: &Arc<SourceFile>,
    key: &YamlPath,
    out: &mut Diagnostics,
) {
    if !matches!(op, OperatorSpec::Process(_)) || !calls(text, "register_event_timer") {
        return;
    }
    let without: Vec<String> = pipeline
        .upstream_sources(op.id())
        .into_iter()
        .map(|si| &pipeline.sources[si])
        .filter(|s| s.event_time().is_none())
        .map(|s| format!("`{}`", s.id()))
        .collect();
    if without.is_empty() {
        return;
    }
    let list = without.join(", ");
    out.push(
        Diagnostic::error(
            codes::NO_EVENT_TIME,
            format!(
                "`process` operator `{}` sets event-time timers but is downstream of {list}, \
                 which declare no `event_time`",
                op.id()
            ),
        )
        .at(source, spans.key_span(key))
        .label("no watermarks reach these timers")
        .help(format!(
            "declare `event_time: {{field: <field>}}` on {list} so that watermarks fire the \
             timers, or use `register_processing_timer`"
        ))
        .with_path(key.clone()),
    );
}

/// Whether `text` calls the function `name` (a call, not a longer name containing it).
fn calls(text: &str, name: &str) -> bool {
    text.match_indices(name).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + name.len()..].trim_start();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_') && after.starts_with('(')
    })
}

fn syntax_help(e: &ParseError) -> String {
    let text = e.0.to_string();
    if text.contains("eval") {
        "`eval` is disabled in Weir's sandbox; write the logic directly".to_owned()
    } else if text.contains("Expecting ')'")
        || text.contains("Expecting '}'")
        || text.contains("Expecting ']'")
    {
        "a bracket opened earlier is not closed".to_owned()
    } else {
        "fix the Rhai syntax at this point (Rhai reference: https://rhai.rs/book/)".to_owned()
    }
}

fn check_functions(
    op: &OperatorSpec,
    ast: &AST,
    spans: &SpanIndex,
    source: &Arc<SourceFile>,
    key: &YamlPath,
    out: &mut Diagnostics,
) {
    check_on_timer(op, ast, spans, source, key, out);
    for &(name, arity) in op.required_functions() {
        if defines(ast, name, arity) {
            continue;
        }
        let params = match (name, arity) {
            (_, 0) => String::new(),
            (_, 1) => "r".to_owned(),
            ("merge", _) => "a, b".to_owned(),
            _ => "acc, r".to_owned(),
        };
        let found: Vec<String> = ast
            .iter_functions()
            .map(|f| format!("{}({})", f.name, f.params.join(", ")))
            .collect();
        let same_name = ast.iter_functions().find(|f| f.name == name);
        let help = if let Some(f) = same_name {
            format!(
                "`fn {name}` takes {} parameter(s) here; `{}` calls it with {arity}: `fn {name}({params})`",
                f.params.len(),
                op.type_name()
            )
        } else if let Some(close) = did_you_mean(name, ast.iter_functions().map(|f| f.name)) {
            format!("did you mean to name `fn {close}` `fn {name}({params})`?")
        } else if found.is_empty() {
            format!("define it: `fn {name}({params}) {{ ... }}`")
        } else {
            format!(
                "define `fn {name}({params}) {{ ... }}`; the script defines: {}",
                found.join(", ")
            )
        };
        let span_key = spans.key_span(key);
        out.push(
            Diagnostic::error(
                codes::SCRIPT_MISSING_FUNCTION,
                format!(
                    "`{}` operator `{}` needs `fn {name}({params})` in its script",
                    op.type_name(),
                    op.id()
                ),
            )
            .at(source, span_key)
            .label(format!(
                "no `fn {name}` with {arity} parameter(s) in this script"
            ))
            .help(help)
            .with_path(key.clone()),
        );
    }
}
pub mod api;
pub mod errors;
pub mod fast;
pub mod native;
pub mod runtime;
pub mod strict;

/// `fn on_timer(ts, kind)` is called only by `process`, with two parameters: defined
/// elsewhere, or with another arity, it would silently never run.
fn check_on_timer(
    op: &OperatorSpec,
    ast: &AST,
    spans: &SpanIndex,
    source: &Arc<SourceFile>,
    key: &YamlPath,
    out: &mut Diagnostics,
) {
    let Some(f) = ast.iter_functions().find(|f| f.name == "on_timer") else {
        return;
    };
    let is_process = matches!(op, OperatorSpec::Process(_));
    if is_process && f.params.len() == 2 {
        return;
    }
    let (message, label, help) = if is_process {
        (
            format!(
                "`process` operator `{}` defines `fn on_timer` with {} parameter(s)",
                op.id(),
                f.params.len()
            ),
            "`fn on_timer` takes `(ts, kind)`".to_owned(),
            "write `fn on_timer(ts, kind) { ... }`: `ts` is the timer's time, `kind` is \
             \"event\" or \"processing\""
                .to_owned(),
        )
    } else {
        (
            format!(
                "`{}` operator `{}` defines `fn on_timer`, which only `process` calls",
                op.type_name(),
                op.id()
            ),
            "never called here".to_owned(),
            "timers are keyed state of a `process` operator (after a `key_by`); move the \
             logic into a `type: process` operator, or remove `fn on_timer`"
                .to_owned(),
        )
    };
    out.push(
        Diagnostic::error(codes::SCRIPT_MISPLACED_FUNCTION, message)
            .at(source, spans.key_span(key))
            .label(label)
            .help(help)
            .with_path(key.clone()),
    );
}

#[cfg(test)]
mod tests {
    use weir_schema::diagnostic::codes;

    use super::calls;

    fn pipeline(event_time: &str, script: &str) -> String {
        format!(
            "version: 1\npipelines:\n  - id: p\n    sources:\n      - {{id: src, type: file, path: in.jsonl{event_time}}}\n    operators:\n      - {{id: by, type: key_by, input: src, field: user}}\n      - id: proc\n        type: process\n        input: by\n        script: |\n          {script}\n    sinks:\n      - {{id: out, type: stdout, input: proc}}\n"
        )
    }

    fn codes_of(text: &str) -> Vec<&'static str> {
        let v = crate::validate::validate_str("p.yaml", text, std::path::Path::new("."));
        v.diagnostics.iter().map(|d| d.code).collect()
    }

    #[test]
    fn event_timers_need_event_time_upstream() {
        let script = "fn process(r) { register_event_timer(r.ts + 10); } fn on_timer(ts, kind) { emit(ts); }";
        assert_eq!(codes_of(&pipeline("", script)), vec![codes::NO_EVENT_TIME]);
        assert_eq!(
            codes_of(&pipeline(", event_time: {field: ts}", script)),
            Vec::<&str>::new()
        );
        let processing = "fn process(r) { register_processing_timer(now() + 10); } fn on_timer(ts, kind) { emit(ts); }";
        assert_eq!(codes_of(&pipeline("", processing)), Vec::<&str>::new());
    }

    #[test]
    fn a_call_is_told_from_a_longer_name() {
        assert!(calls("x; register_event_timer (1)", "register_event_timer"));
        assert!(!calls("my_register_event_timer(1)", "register_event_timer"));
        assert!(!calls("let register_event_timer_at = 1;", "register_event_timer"));
    }
}
