//! Where `weir run` serves its control API and which token it requires: the command-line
//! flags, the environment and the file's `api:` section combined by one rule, **flags win
//! over the file**:
//!
//! | setting | first of                                                                 |
//! |---------|--------------------------------------------------------------------------|
//! | on/off  | `--no-api` (off); `--api-port` (on); `api.enabled`; on                   |
//! | port    | `--api-port`; `api.port`; [`DEFAULT_PORT`](super::DEFAULT_PORT)          |
//! | token   | `--api-token`; `WEIR_API_TOKEN`; the variable `api.token_env` names; none |
//!
//! A token given in any of these ways must be usable: empty, unset (`token_env` naming a
//! variable that is not set) or not printable ASCII is an error, never a silent "no token".
//! This module reads nothing itself: the caller passes the environment as a lookup function,
//! so the rules are tested without touching the process environment.

use std::ffi::OsString;

use weir_schema::ApiSpec;

use super::server::ApiConfig;
use super::{DEFAULT_PORT, TOKEN_ENV};

/// The API flags of `weir run`, as given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApiFlags {
    /// `--no-api`.
    pub no_api: bool,
    /// `--api-port`.
    pub port: Option<u16>,
    /// `--api-token`.
    pub token: Option<String>,
}

/// Where the token in force came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenSource {
    /// No token: mutating calls are open to local processes.
    None,
    /// `--api-token`.
    Flag,
    /// The `WEIR_API_TOKEN` environment variable.
    WeirEnv,
    /// The variable named by the file's `api.token_env`.
    FileEnv(String),
}

/// The API settings in force, with where they came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiSettings {
    /// Where to listen and the token; `None` when the API is off.
    pub config: Option<ApiConfig>,
    /// Where the token came from.
    pub token_source: TokenSource,
    /// Flags or variables that override a setting of the file, one sentence each (for the
    /// log: a file setting that does not apply must not go unnoticed).
    pub overrides: Vec<String>,
}

/// Why the API settings cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, miette::Diagnostic)]
pub enum SettingsError {
    /// An empty token would mean "no authentication" while the user asked for one.
    #[error("the API token from {given_by} is empty")]
    #[diagnostic(
        code(weir::api::empty_token),
        help(
            "give a non-empty token (e.g. `openssl rand -hex 16`), or leave the token out \
             altogether to run the API without one"
        )
    )]
    EmptyToken {
        /// `--api-token`, `WEIR_API_TOKEN` or the `token_env` variable.
        given_by: String,
    },
    /// `api.token_env` names a variable that is not set.
    #[error("the file's `api.token_env` names the environment variable `{name}`, which is not set")]
    #[diagnostic(
        code(weir::api::token_env_unset),
        help(
            "export `{name}` with the token before `weir run`, pass --api-token, or remove \
             `token_env` from the file to run the API without a token"
        )
    )]
    TokenEnvUnset {
        /// The variable's name.
        name: String,
    },
    /// The token cannot travel in an `Authorization` header as it is.
    #[error("the API token from {given_by} contains {what}")]
    #[diagnostic(
        code(weir::api::bad_token),
        help(
            "use printable ASCII without spaces (letters, digits, punctuation), such as the \
             output of `openssl rand -hex 16`"
        )
    )]
    BadToken {
        /// `--api-token`, `WEIR_API_TOKEN` or the `token_env` variable.
        given_by: String,
        /// What is wrong with it.
        what: &'static str,
    },
}

/// Combines `flags`, the file's `spec` and the environment (`env(name)`, the value of a
/// variable) into the settings in force.
///
/// # Errors
/// [`SettingsError`] when a token is asked for and is empty, unset or unusable. A token
/// setting of an API that is off is not checked.
pub fn resolve(
    flags: &ApiFlags,
    spec: &ApiSpec,
    env: &dyn Fn(&str) -> Option<OsString>,
) -> Result<ApiSettings, SettingsError> {
    let mut overrides = Vec::new();
    let enabled = if flags.no_api {
        if spec.enabled {
            overrides.push("--no-api switches off the API the file's `api:` enables".to_owned());
        }
        false
    } else if flags.port.is_some() && !spec.enabled {
        overrides.push(
            "--api-port switches on the API the file disables (`api.enabled: false`)".to_owned(),
        );
        true
    } else {
        spec.enabled
    };
    if !enabled {
        return Ok(ApiSettings {
            config: None,
            token_source: TokenSource::None,
            overrides,
        });
    }
    let port = match flags.port {
        Some(p) => {
            if spec.port != DEFAULT_PORT && spec.port != p {
                overrides.push(format!(
                    "--api-port {p} overrides the file's `api.port: {}`",
                    spec.port
                ));
            }
            p
        }
        None => spec.port,
    };
    let (token, token_source) = if let Some(t) = &flags.token {
        (Some(t.clone()), TokenSource::Flag)
    } else if let Some(t) = env(TOKEN_ENV) {
        (Some(text(t, TOKEN_ENV)?), TokenSource::WeirEnv)
    } else if let Some(name) = &spec.token_env {
        let value = env(name).ok_or_else(|| SettingsError::TokenEnvUnset { name: name.clone() })?;
        (Some(text(value, name)?), TokenSource::FileEnv(name.clone()))
    } else {
        (None, TokenSource::None)
    };
    if let (Some(name), TokenSource::Flag | TokenSource::WeirEnv) = (&spec.token_env, &token_source)
    {
        let by = if token_source == TokenSource::Flag {
            "--api-token"
        } else {
            TOKEN_ENV
        };
        overrides.push(format!(
            "the token from {by} overrides the file's `api.token_env: {name}`"
        ));
    }
    if let Some(t) = &token {
        check_token(t, &source_name(&token_source))?;
    }
    Ok(ApiSettings {
        config: Some(ApiConfig::local(port, token)),
        token_source,
        overrides,
    })
}

/// How the log and errors name a token's source.
pub fn source_name(source: &TokenSource) -> String {
    match source {
        TokenSource::None => "nowhere".to_owned(),
        TokenSource::Flag => "--api-token".to_owned(),
        TokenSource::WeirEnv => format!("the environment variable `{TOKEN_ENV}`"),
        TokenSource::FileEnv(name) => {
            format!("the environment variable `{name}` (the file's `api.token_env`)")
        }
    }
}

fn text(value: OsString, name: &str) -> Result<String, SettingsError> {
    value.into_string().map_err(|_| SettingsError::BadToken {
        given_by: format!("the environment variable `{name}`"),
        what: "bytes that are not UTF-8",
    })
}

/// A usable token: not empty, printable ASCII without spaces (it travels as
/// `Authorization: Bearer <token>` and is compared byte for byte).
fn check_token(token: &str, source: &str) -> Result<(), SettingsError> {
    if token.is_empty() {
        return Err(SettingsError::EmptyToken {
            given_by: source.to_owned(),
        });
    }
    let what = if token.bytes().any(|b| b == b' ' || b == b'\t') {
        "whitespace"
    } else if token.bytes().any(|b| b.is_ascii_control()) {
        "control characters (a trailing newline?)"
    } else if !token.is_ascii() {
        "characters that are not ASCII"
    } else {
        return Ok(());
    };
    Err(SettingsError::BadToken {
        given_by: source.to_owned(),
        what,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(enabled: bool, port: u16, token_env: Option<&str>) -> ApiSpec {
        ApiSpec {
            enabled,
            port,
            token_env: token_env.map(str::to_owned),
        }
    }

    fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| {
            vars.iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| OsString::from(v))
        }
    }

    fn run(
        flags: &ApiFlags,
        spec: &ApiSpec,
        vars: &[(&str, &str)],
    ) -> Result<ApiSettings, SettingsError> {
        resolve(flags, spec, &env_of(vars))
    }

    #[test]
    fn defaults_listen_on_8642_without_a_token() {
        let s = run(&ApiFlags::default(), &ApiSpec::default(), &[]).expect("ok");
        assert_eq!(s.config, Some(ApiConfig::local(DEFAULT_PORT, None)));
        assert_eq!(s.token_source, TokenSource::None);
        assert!(s.overrides.is_empty());
    }

    #[test]
    fn the_file_sets_port_token_and_enabled() {
        let file = spec(true, 7071, Some("MY_WEIR_TOKEN"));
        let s = run(&ApiFlags::default(), &file, &[("MY_WEIR_TOKEN", "s3cret")]).expect("ok");
        assert_eq!(
            s.config,
            Some(ApiConfig::local(7071, Some("s3cret".into())))
        );
        assert_eq!(s.token_source, TokenSource::FileEnv("MY_WEIR_TOKEN".into()));
        let off = run(
            &ApiFlags::default(),
            &spec(false, 7071, Some("MY_WEIR_TOKEN")),
            &[],
        )
        .expect("an API that is off needs no token");
        assert_eq!(off.config, None);
    }

    #[test]
    fn flags_win_over_the_file_and_say_so() {
        let file = spec(false, 7071, Some("MY_WEIR_TOKEN"));
        let flags = ApiFlags {
            no_api: false,
            port: Some(9000),
            token: Some("flag-token".into()),
        };
        let s = run(&flags, &file, &[]).expect("the flag's token needs no MY_WEIR_TOKEN");
        assert_eq!(
            s.config,
            Some(ApiConfig::local(9000, Some("flag-token".into())))
        );
        assert_eq!(s.token_source, TokenSource::Flag);
        assert_eq!(s.overrides.len(), 3, "{:?}", s.overrides);
        assert!(
            s.overrides
                .iter()
                .any(|o| o.contains("--api-port 9000 overrides"))
        );
        assert!(
            s.overrides
                .iter()
                .any(|o| o.contains("token_env: MY_WEIR_TOKEN"))
        );

        let off = ApiFlags {
            no_api: true,
            ..ApiFlags::default()
        };
        let s = run(&off, &spec(true, 7071, None), &[]).expect("ok");
        assert_eq!(s.config, None);
        assert!(s.overrides[0].contains("--no-api"));
    }

    #[test]
    fn weir_api_token_comes_before_the_files_variable() {
        let file = spec(true, 7071, Some("MY_WEIR_TOKEN"));
        let s = run(
            &ApiFlags::default(),
            &file,
            &[
                ("WEIR_API_TOKEN", "env-token"),
                ("MY_WEIR_TOKEN", "file-token"),
            ],
        )
        .expect("ok");
        assert_eq!(
            s.config,
            Some(ApiConfig::local(7071, Some("env-token".into())))
        );
        assert_eq!(s.token_source, TokenSource::WeirEnv);
        assert!(s.overrides[0].contains("WEIR_API_TOKEN overrides"));
    }

    #[test]
    fn unusable_tokens_are_errors_never_no_token() {
        let flag = |t: &str| ApiFlags {
            token: Some(t.into()),
            ..ApiFlags::default()
        };
        let d = ApiSpec::default();
        assert_eq!(
            run(&flag(""), &d, &[]),
            Err(SettingsError::EmptyToken {
                given_by: "--api-token".into()
            })
        );
        assert!(matches!(
            run(&ApiFlags::default(), &d, &[("WEIR_API_TOKEN", "")]),
            Err(SettingsError::EmptyToken { given_by }) if given_by.contains("WEIR_API_TOKEN")
        ));
        let file = spec(true, 7071, Some("MY_WEIR_TOKEN"));
        assert_eq!(
            run(&ApiFlags::default(), &file, &[]),
            Err(SettingsError::TokenEnvUnset {
                name: "MY_WEIR_TOKEN".into()
            })
        );
        assert!(matches!(
            run(&ApiFlags::default(), &file, &[("MY_WEIR_TOKEN", "")]),
            Err(SettingsError::EmptyToken { given_by }) if given_by.contains("MY_WEIR_TOKEN")
        ));
        for (bad, what) in [
            ("a b", "whitespace"),
            ("tok\n", "control"),
            ("tökén", "not ASCII"),
        ] {
            assert!(
                matches!(run(&flag(bad), &d, &[]), Err(SettingsError::BadToken { what: w, .. }) if w.contains(what)),
                "{bad:?}"
            );
        }
        // An API that is off checks no token.
        let off = ApiFlags {
            no_api: true,
            token: Some(String::new()),
            ..ApiFlags::default()
        };
        assert!(run(&off, &d, &[]).is_ok());
    }

    #[test]
    fn every_error_has_a_code_and_help() {
        use miette::Diagnostic;
        for e in [
            SettingsError::EmptyToken {
                given_by: "--api-token".into(),
            },
            SettingsError::TokenEnvUnset { name: "X".into() },
            SettingsError::BadToken {
                given_by: "--api-token".into(),
                what: "whitespace",
            },
        ] {
            assert!(
                e.code()
                    .is_some_and(|c| c.to_string().starts_with("weir::api::"))
            );
            assert!(e.help().is_some());
        }
    }
}
