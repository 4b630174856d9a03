//! Validation of a whole pipeline file: YAML and schema (from `weir-schema`), the semantic
//! rules over the spec, and the Rhai scripts (compiled here, with errors mapped back into the
//! YAML block scalar or the script file). Every stage runs that can; all diagnostics come back
//! in one list, sorted by position.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use weir_schema::{Diagnostics, FileSpec, Secrets, SourceFile, SpanIndex, load};

use crate::plan::{FilePlan, PlanError, compile_file};

/// The outcome of validating one file.
#[derive(Debug)]
pub struct Validation {
    /// The file's text and name.
    pub source: Arc<SourceFile>,
    /// The typed spec, when the file loaded (it may still carry semantic errors).
    pub spec: Option<FileSpec>,
    /// Every node's span, when the YAML parsed.
    pub spans: Option<SpanIndex>,
    /// Every problem found (secrets already redacted).
    pub diagnostics: Diagnostics,
    /// Values that came from `${secret:...}` references: redact them from anything shown
    /// about this file (plans, status, logs).
    pub secrets: Secrets,
    /// Directory that relative paths resolve against.
    pub base_dir: PathBuf,
}

impl Validation {
    /// Whether the file can run: no errors, and no warnings when `deny_warnings`.
    pub fn is_ok(&self, deny_warnings: bool) -> bool {
        let warnings_fail = deny_warnings && self.diagnostics.warning_count() > 0;
        !(self.diagnostics.has_errors() || warnings_fail)
    }

    /// Plans the validated spec, each script with its place in the file (so run-time script
    /// errors name the file's line and column). `None` when the file has errors.
    pub fn plan(&self) -> Option<Result<FilePlan, PlanError>> {
        if self.diagnostics.has_errors() {
            return None;
        }
        let spec = self.spec.as_ref()?;
        Some(compile_file(spec, &self.base_dir).map(|mut plan| {
            if let Some(spans) = &self.spans {
                let origins = crate::script::origins(spec, spans, &self.source, &self.base_dir);
                for (pipeline, origins) in plan.pipelines.iter_mut().zip(origins) {
                    for node in &mut pipeline.nodes {
                        node.script_origin = origins.get(node.id.as_str()).cloned();
                    }
                }
            }
            plan
        }))
    }
}

/// Validates a pipeline file on disk.
pub fn validate_file(path: &Path) -> Validation {
    let loaded = load::load_file(path);
    let base_dir = path
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    finish(loaded, base_dir)
}

/// Validates a pipeline file's bytes (checked to be UTF-8 within the size limit, as from
/// disk); relative paths resolve against `base_dir`. The entry point the fuzzer drives.
pub fn validate_bytes(name: &str, bytes: Vec<u8>, base_dir: &Path) -> Validation {
    finish(load::load_bytes(name, bytes), base_dir.to_path_buf())
}

/// Validates pipeline text; relative paths resolve against `base_dir`.
pub fn validate_str(name: &str, text: &str, base_dir: &Path) -> Validation {
    finish(load::load_str(name, text), base_dir.to_path_buf())
}

fn finish(loaded: load::LoadedFile, base_dir: PathBuf) -> Validation {
    let mut diagnostics = loaded.diagnostics;
    if let (Some(spec), Some(spans)) = (&loaded.spec, &loaded.spans) {
        diagnostics.extend(weir_schema::validate::validate(
            spec,
            spans,
            &loaded.source,
            &base_dir,
        ));
        diagnostics.extend(crate::script::check_scripts(
            spec,
            spans,
            &loaded.source,
            &base_dir,
        ));
    }
    loaded.secrets.redact_diagnostics(&mut diagnostics);
    diagnostics.sort();
    diagnostics.truncate_to(weir_schema::diagnostic::MAX_REPORTED);
    Validation {
        source: loaded.source,
        spec: loaded.spec,
        spans: loaded.spans,
        diagnostics,
        secrets: loaded.secrets,
        base_dir,
    }
}
