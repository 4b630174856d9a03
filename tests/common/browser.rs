//! A real headless browser for the web page test: Chromium driven by chromedriver over the
//! W3C WebDriver HTTP protocol ([`Browser`]: open a URL, run a script, read what it returns).
//!
//! The browser and its driver are `chromium` and `chromedriver` on `PATH` (Debian's
//! `chromium` and `chromium-driver` packages, which `./cargo.sh test` installs when they are
//! missing), or the programs `WEIR_CHROMIUM` and `WEIR_CHROMEDRIVER` name. When they are not
//! there, [`Browser::start`] fails the test with what to install: it never skips.
//!
//! The WebDriver calls go over a minimal HTTP/1.1 exchange on a `TcpStream` (one connection
//! per call), enough for chromedriver's JSON answers.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::run::DEADLINE;

/// The flags Chromium needs to run headless in a container or CI machine, quietly.
const CHROMIUM_FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-crash-reporter",
    "--disable-breakpad",
];

/// How long one WebDriver call may take (starting the browser is the slow one).
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// `program` as given when it is a path, else the first match on `PATH`.
fn find_program(program: &str) -> Option<PathBuf> {
    let given = Path::new(program);
    if given.components().count() > 1 {
        return given.is_file().then(|| given.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// The browser or driver named by `env` (default `default`), or a failure saying what to
/// install.
fn required(env: &str, default: &str) -> PathBuf {
    let name = std::env::var(env).unwrap_or_else(|_| default.to_owned());
    find_program(&name).unwrap_or_else(|| {
        panic!(
            "the web page test needs a headless Chromium and its chromedriver, and `{name}` is \
             not found (on PATH, or as {env} names it). Run the tests with \
             `./cargo.sh test --release --workspace`, which installs them on Debian and Ubuntu \
             (apt-get install chromium chromium-driver), or install Chromium and a matching \
             chromedriver yourself and set WEIR_CHROMIUM and WEIR_CHROMEDRIVER to them"
        )
    })
}

/// A free loopback port (free when asked; chromedriver binds it right after).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// One HTTP call to `127.0.0.1:port`: the status and the body as JSON (`null` when empty or
/// not JSON). `Err` when nothing answers.
fn call(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> std::io::Result<(u16, Value)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(CALL_TIMEOUT))?;
    let body = body.map(Value::to_string).unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
         Content-Type: application/json; charset=utf-8\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes())?;
    // chromedriver keeps the connection open despite `Connection: close`: the answer ends
    // where its `Content-Length` (or its last chunk) says, not at end of stream.
    let mut answer = Vec::new();
    let mut buf = [0_u8; 16 * 1024];
    loop {
        let n = stream.read(&mut buf)?;
        answer.extend_from_slice(&buf[..n]);
        if n == 0 || complete(&answer) {
            break;
        }
    }
    let text = String::from_utf8_lossy(&answer);
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = if is_chunked(head) {
        unchunk(rest)
    } else {
        rest.to_owned()
    };
    Ok((status, serde_json::from_str(&body).unwrap_or(Value::Null)))
}

/// The value of header `name` (case-insensitive) in an answer's head.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim().eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

fn is_chunked(head: &str) -> bool {
    header(head, "transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
}

/// Whether `answer` holds a whole HTTP answer (head and body).
fn complete(answer: &[u8]) -> bool {
    let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&answer[..end]);
    let body = answer.len() - end - 4;
    if is_chunked(&head) {
        return answer.ends_with(b"\r\n0\r\n\r\n") || (body == 5 && answer.ends_with(b"0\r\n\r\n"));
    }
    match header(&head, "content-length").and_then(|v| v.parse::<usize>().ok()) {
        Some(length) => body >= length,
        None => false,
    }
}

/// The payload of a chunked body.
fn unchunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
        else {
            break;
        };
        if size == 0 || tail.len() < size {
            break;
        }
        out.push_str(&tail[..size]);
        rest = tail[size..].trim_start_matches("\r\n");
    }
    out
}

/// A chromedriver with one headless Chromium session. Dropping it ends the session (the
/// browser quits) and stops the driver.
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
    /// The browser's fresh profile directory, removed with it.
    profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session with a fresh profile.
    pub fn start() -> Self {
        let chromium = required("WEIR_CHROMIUM", "chromium");
        let chromedriver = required("WEIR_CHROMEDRIVER", "chromedriver");
        let port = free_port();
        let driver = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", chromedriver.display()));
        let profile = tempfile::tempdir().expect("a profile directory");
        let mut browser = Self {
            driver,
            port,
            session: String::new(),
            profile,
        };
        let until = Instant::now() + DEADLINE;
        loop {
            match call(port, "GET", "/status", None) {
                Ok((200, s)) if s["value"]["ready"] == true => break,
                _ => {}
            }
            if let Ok(Some(exit)) = browser.driver.try_wait() {
                panic!("{} ended at start ({exit})", chromedriver.display());
            }
            assert!(
                Instant::now() < until,
                "{} did not answer on port {port} within {DEADLINE:?}",
                chromedriver.display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut args: Vec<String> = CHROMIUM_FLAGS.iter().map(|f| (*f).to_owned()).collect();
        args.push(format!(
            "--user-data-dir={}",
            browser.profile.path().display()
        ));
        let capabilities = json!({
            "capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {"binary": chromium, "args": args},
            }}
        });
        let (status, answer) =
            call(port, "POST", "/session", Some(&capabilities)).expect("chromedriver answers");
        let session = answer["value"]["sessionId"].as_str().unwrap_or_else(|| {
            panic!(
                "chromedriver could not start {} ({status}): {answer:#}",
                chromium.display()
            )
        });
        browser.session = session.to_owned();
        browser
    }

    /// A WebDriver command of this session: its `value`; fails the test on an error answer.
    fn command(&self, method: &str, path: &str, body: &Value) -> Value {
        let path = format!("/session/{}{path}", self.session);
        let (status, answer) =
            call(self.port, method, &path, Some(body)).expect("chromedriver answers");
        assert_eq!(status, 200, "WebDriver {method} {path} failed: {answer:#}");
        answer["value"].clone()
    }

    /// Opens `url` (returns once the document loaded).
    pub fn open(&self, url: &str) {
        self.command("POST", "/url", &json!({ "url": url }));
    }

    /// Runs `script` (a function body; `return` its result) in the page: what it returned.
    pub fn run(&self, script: &str) -> Value {
        self.command(
            "POST",
            "/execute/sync",
            &json!({ "script": script, "args": [] }),
        )
    }

    /// Polls `script` until `done` holds for its result, which it returns; fails with `what`
    /// and the last result after [`DEADLINE`].
    pub fn wait_for(
        &self,
        what: &str,
        script: &str,
        mut done: impl FnMut(&Value) -> bool,
    ) -> Value {
        let until = Instant::now() + DEADLINE;
        loop {
            let value = self.run(script);
            if done(&value) {
                return value;
            }
            assert!(
                Instant::now() < until,
                "the page did not show {what} within {DEADLINE:?}; last reading: {value:#}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let path = format!("/session/{}", self.session);
            let _ = call(self.port, "DELETE", &path, None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
