//! The blocking client of the control API, for the CLI verbs: one method per route over a
//! minimal HTTP/1.1 exchange on a `std::net::TcpStream` (one connection per call,
//! `Connection: close`, `Content-Length` or chunked answers).
//!
//! It owns the address syntax the CLI accepts and the classification of failures (nothing
//! listening, an API error carrying its [`ControlError`], a timeout, protocol and I/O errors).
//! It renders nothing for the terminal: the CLI turns a [`ClientError`] into a report.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::DEFAULT_PORT;
use super::server::ErrorBody;
use crate::control::{
    CheckpointInfo, ControlError, JobStatus, ReloadOutcome, ReloadRequest, SavepointInfo,
    SavepointRequest, StopOutcome, StopRequest, TapEvent, TapRequest,
};

/// How long a call waits for its answer by default: mutating calls answer when the work is
/// done, and a savepoint of a large state or a reload may take minutes.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest answer read (a status of many pipelines is a few kilobytes).
const MAX_ANSWER: u64 = 64 * 1024 * 1024;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The address given is not `HOST:PORT` or `http://HOST:PORT`.
    #[error("`{given}` is not an API address: {reason}")]
    Address {
        /// The address as given.
        given: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Connection refused: no `weir run` (or none with its API on) listens there.
    #[error(
        "nothing is listening on {addr}: is `weir run` running, with the API on? \
         (`weir run --api-port`)"
    )]
    NotListening {
        /// `HOST:PORT`.
        addr: String,
    },
    /// The API answered with an error.
    #[error("{error}")]
    Api {
        /// The HTTP status.
        status: u16,
        /// The error, as the server sent it.
        error: ControlError,
    },
    /// No answer within the read timeout; the work asked for may still be going on.
    #[error(
        "no answer from {addr} within {} s: the call may still be running in `weir run`; \
         `weir status` shows where it stands",
        after.as_secs()
    )]
    TimedOut {
        /// `HOST:PORT`.
        addr: String,
        /// The timeout.
        after: Duration,
    },
    /// Something answered, but not like the Weir API.
    #[error("unexpected answer from {addr} to `{request}`: {message}")]
    Protocol {
        /// `HOST:PORT`.
        addr: String,
        /// `METHOD PATH`.
        request: String,
        /// What was wrong with the answer.
        message: String,
    },
    /// The connection failed for another reason.
    #[error("cannot talk to {addr}: {source}")]
    Io {
        /// `HOST:PORT`.
        addr: String,
        /// What the operating system said.
        #[source]
        source: io::Error,
    },
}

/// An answer as received: status, headers (names lower-cased) and the de-chunked body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawResponse {
    /// The HTTP status.
    pub status: u16,
    /// Header names (lower case) and values, in order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl RawResponse {
    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Calls the control API of one `weir run`.
#[derive(Clone, Debug)]
pub struct ApiClient {
    /// `HOST:PORT`.
    authority: String,
    token: Option<String>,
    read_timeout: Option<Duration>,
}

impl ApiClient {
    /// A client of the API at `addr` (`127.0.0.1:8642`, `localhost`, `http://host:port/`; the
    /// port defaults to 8642), sending `token` as a bearer token when given (an empty token
    /// counts as none).
    ///
    /// # Errors
    /// [`ClientError::Address`] when `addr` is not of those forms.
    pub fn new(addr: &str, token: Option<String>) -> Result<Self, ClientError> {
        Ok(Self {
            authority: parse_authority(addr)?,
            token: token.filter(|t| !t.is_empty()),
            read_timeout: Some(DEFAULT_READ_TIMEOUT),
        })
    }

    /// Waits at most `timeout` for each answer (`None`: forever). Default: 15 minutes.
    #[must_use]
    pub fn with_read_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.read_timeout = timeout;
        self
    }

    /// `HOST:PORT` this client calls.
    pub fn addr(&self) -> &str {
        &self.authority
    }

    /// `GET /v1/status`.
    ///
    /// # Errors
    /// See [`ClientError`].
    pub fn status(&self) -> Result<JobStatus, ClientError> {
        self.call("GET", "/v1/status", None)
    }

    /// `GET /v1/pipelines/{pipeline}/checkpoints`.
    ///
    /// # Errors
    /// See [`ClientError`]; [`ControlError::NoSuchPipeline`] inside [`ClientError::Api`].
    pub fn checkpoints(&self, pipeline: &str) -> Result<Vec<CheckpointInfo>, ClientError> {
        self.call("GET", &pipeline_path(pipeline, "checkpoints"), None)
    }

    /// `POST /v1/pipelines/{pipeline}/checkpoints`: triggers a checkpoint and waits for it.
    ///
    /// # Errors
    /// See [`ClientError`].
    pub fn trigger_checkpoint(&self, pipeline: &str) -> Result<CheckpointInfo, ClientError> {
        self.call("POST", &pipeline_path(pipeline, "checkpoints"), Some(b""))
    }

    /// `POST /v1/pipelines/{pipeline}/savepoints`: takes a savepoint and waits until it is on
    /// disk.
    ///
    /// # Errors
    /// See [`ClientError`].
    pub fn savepoint(
        &self,
        pipeline: &str,
        request: &SavepointRequest,
    ) -> Result<SavepointInfo, ClientError> {
        self.call_json("POST", &pipeline_path(pipeline, "savepoints"), request)
    }

    /// `POST /v1/pipelines/{pipeline}/stop`: stops one pipeline and waits until it stopped.
    ///
    /// # Errors
    /// See [`ClientError`].
    pub fn stop(&self, pipeline: &str, request: &StopRequest) -> Result<StopOutcome, ClientError> {
        self.call_json("POST", &pipeline_path(pipeline, "stop"), request)
    }

    /// `POST /v1/reload`: applies (or, with `plan_only`, plans) a reload and waits for it.
    ///
    /// # Errors
    /// See [`ClientError`]. A reload that was rejected or rolled back is an `Ok` outcome
    /// with that `result`.
    pub fn reload(&self, request: &ReloadRequest) -> Result<ReloadOutcome, ClientError> {
        self.call_json("POST", "/v1/reload", request)
    }

    /// `GET /v1/pipelines/{pipeline}/tap/{operator}`: opens a tap and hands each event to
    /// `on_event` as it arrives, until the tap ends (its [`TapEvent::End`]) or `on_event`
    /// returns `false` (the connection is then closed, which closes the tap). Waits for events
    /// as long as it takes: a quiet operator sends none.
    ///
    /// # Errors
    /// See [`ClientError`]; an unknown pipeline or operator is a [`ClientError::Api`].
    pub fn tap(
        &self,
        pipeline: &str,
        request: &TapRequest,
        mut on_event: impl FnMut(TapEvent) -> bool,
    ) -> Result<(), ClientError> {
        let mut path = pipeline_path(pipeline, "tap/");
        path.push_str(&encode(&request.operator));
        path.push_str(&format!(
            "?side={}&sample={}",
            request.side.as_str(),
            request.sample
        ));
        if let Some(limit) = request.limit {
            path.push_str(&format!("&limit={limit}"));
        }
        let io = |source: io::Error| ClientError::Io {
            addr: self.authority.clone(),
            source,
        };
        let protocol = |message: String| ClientError::Protocol {
            addr: self.authority.clone(),
            request: format!("GET {path}"),
            message,
        };
        let mut stream = self.connect()?;
        stream.set_read_timeout(None).map_err(io)?;
        let _ = stream.set_nodelay(true);
        let mut head = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: weir/{}\r\n\
             Accept: application/x-ndjson\r\nConnection: close\r\n",
            self.authority,
            env!("CARGO_PKG_VERSION")
        );
        if let Some(token) = &self.token {
            head.push_str(&format!("Authorization: Bearer {token}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).map_err(io)?;
        let mut reader = BufReader::new(stream);
        let mut headers = Vec::new();
        loop {
            let before = headers.len();
            let n = reader.read_until(b'\n', &mut headers).map_err(io)?;
            if n == 0 || headers[before..].iter().all(u8::is_ascii_whitespace) {
                break;
            }
        }
        let (status, head, _) = parse_head(&headers).map_err(protocol)?;
        if !(200..300).contains(&status) {
            // An error answer is short and complete: read it whole.
            let mut data = headers;
            let _ = (&mut reader).take(MAX_ANSWER).read_to_end(&mut data);
            let answer = parse_response(&data, true).map_err(protocol)?;
            return match serde_json::from_slice::<ErrorBody>(&answer.body) {
                Ok(ErrorBody { error }) => Err(ClientError::Api {
                    status: answer.status,
                    error,
                }),
                Err(_) => Err(protocol(format!(
                    "HTTP {} with a body that is not a Weir API error: {}",
                    answer.status,
                    snippet(&answer.body)
                ))),
            };
        }
        let chunked = head.iter().any(|(n, v)| {
            n == "transfer-encoding"
                && v.split(',')
                    .any(|c| c.trim().eq_ignore_ascii_case("chunked"))
        });
        let mut body: Box<dyn BufRead> = if chunked {
            Box::new(BufReader::new(Chunked {
                inner: reader,
                left: 0,
                done: false,
            }))
        } else {
            Box::new(reader)
        };
        let mut line = Vec::new();
        loop {
            line.clear();
            if body.read_until(b'\n', &mut line).map_err(io)? == 0 {
                return Err(protocol(
                    "the tap's stream ended without its end event".into(),
                ));
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let event: TapEvent = serde_json::from_slice(&line).map_err(|e| {
                protocol(format!(
                    "a line that is not a tap event ({e}): {}",
                    snippet(&line)
                ))
            })?;
            let end = matches!(event, TapEvent::End { .. });
            if !on_event(event) || end {
                return Ok(());
            }
        }
    }

    /// Sends `method path` with `body` (JSON) and decodes a 2xx answer as `T`; any other
    /// status becomes [`ClientError::Api`] when its body is an API error.
    ///
    /// # Errors
    /// See [`ClientError`].
    pub fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<T, ClientError> {
        let answer = self.raw(method, path, body)?;
        let protocol = |message: String| ClientError::Protocol {
            addr: self.authority.clone(),
            request: format!("{method} {path}"),
            message,
        };
        if (200..300).contains(&answer.status) {
            return serde_json::from_slice(&answer.body).map_err(|e| {
                protocol(format!(
                    "HTTP {} with a body that is not the expected JSON ({e}): {}",
                    answer.status,
                    snippet(&answer.body)
                ))
            });
        }
        match serde_json::from_slice::<ErrorBody>(&answer.body) {
            Ok(ErrorBody { error }) => Err(ClientError::Api {
                status: answer.status,
                error,
            }),
            Err(_) => Err(protocol(format!(
                "HTTP {} with a body that is not a Weir API error: {}",
                answer.status,
                snippet(&answer.body)
            ))),
        }
    }

    fn call_json<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        request: &impl Serialize,
    ) -> Result<T, ClientError> {
        let body = serde_json::to_vec(request).map_err(|e| ClientError::Protocol {
            addr: self.authority.clone(),
            request: format!("{method} {path}"),
            message: format!("cannot encode the request: {e}"),
        })?;
        self.call(method, path, Some(&body))
    }

    /// Sends one request and returns the answer whatever its status.
    ///
    /// # Errors
    /// [`ClientError::NotListening`], [`ClientError::TimedOut`], [`ClientError::Io`], or
    /// [`ClientError::Protocol`] when the answer is not HTTP/1.x.
    pub fn raw(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<RawResponse, ClientError> {
        let io = |source: io::Error| ClientError::Io {
            addr: self.authority.clone(),
            source,
        };
        let mut stream = self.connect()?;
        stream.set_read_timeout(self.read_timeout).map_err(io)?;
        stream
            .set_write_timeout(Some(Duration::from_secs(60)))
            .map_err(io)?;
        let _ = stream.set_nodelay(true);

        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: weir/{}\r\n\
             Accept: application/json\r\nConnection: close\r\n",
            self.authority,
            env!("CARGO_PKG_VERSION")
        );
        if let Some(token) = &self.token {
            request.push_str(&format!("Authorization: Bearer {token}\r\n"));
        }
        let body = body.unwrap_or_default();
        if method != "GET" || !body.is_empty() {
            request.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        request.push_str("\r\n");
        let mut bytes = request.into_bytes();
        bytes.extend_from_slice(body);
        stream.write_all(&bytes).map_err(io)?;
        stream.flush().map_err(io)?;

        let mut answer = Vec::new();
        let read = (&mut stream).take(MAX_ANSWER + 1).read_to_end(&mut answer);
        let protocol = |message: String| ClientError::Protocol {
            addr: self.authority.clone(),
            request: format!("{method} {path}"),
            message,
        };
        match read {
            Ok(_) if answer.len() as u64 > MAX_ANSWER => Err(protocol(format!(
                "the answer is larger than {} MiB",
                MAX_ANSWER / (1024 * 1024)
            ))),
            Ok(_) => parse_response(&answer, true).map_err(protocol),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Err(ClientError::TimedOut {
                    addr: self.authority.clone(),
                    after: self.read_timeout.unwrap_or_default(),
                })
            }
            // A reset after a complete answer (the server closed with unread input) is fine.
            Err(e) => parse_response(&answer, false).map_err(|_| io(e)),
        }
    }

    fn connect(&self) -> Result<TcpStream, ClientError> {
        let io = |source: io::Error| ClientError::Io {
            addr: self.authority.clone(),
            source,
        };
        let addrs: Vec<SocketAddr> = self.authority.to_socket_addrs().map_err(io)?.collect();
        let mut refused = false;
        let mut last = None;
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
                Ok(stream) => return Ok(stream),
                Err(e) => {
                    refused |= e.kind() == io::ErrorKind::ConnectionRefused;
                    last = Some(e);
                }
            }
        }
        if refused {
            return Err(ClientError::NotListening {
                addr: self.authority.clone(),
            });
        }
        Err(io(last.unwrap_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "the host name resolves to no address",
            )
        })))
    }
}

/// `HOST:PORT` from the forms [`ApiClient::new`] accepts.
fn parse_authority(given: &str) -> Result<String, ClientError> {
    let err = |reason: &str| ClientError::Address {
        given: given.to_owned(),
        reason: reason.to_owned(),
    };
    let s = given.trim();
    let lower = s.to_ascii_lowercase();
    let rest = if lower.starts_with("http://") {
        s.get("http://".len()..).unwrap_or_default()
    } else if lower.starts_with("https://") {
        return Err(err(
            "the API speaks plain HTTP on loopback; give HOST:PORT or http://HOST:PORT",
        ));
    } else if s.contains("://") {
        return Err(err("give HOST:PORT or http://HOST:PORT"));
    } else {
        s
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() {
        return Err(err("no host; give HOST:PORT, e.g. 127.0.0.1:8642"));
    }
    if rest.contains('/') {
        return Err(err(
            "a path is not allowed; give HOST:PORT, e.g. 127.0.0.1:8642",
        ));
    }
    let check_port = |port: &str| {
        port.parse::<u16>()
            .map_err(|_| err(&format!("`{port}` is not a port number (1-65535)")))
    };
    if let Some(v6) = rest.strip_prefix('[') {
        let Some((host, after)) = v6.split_once(']') else {
            return Err(err("an IPv6 address needs its closing `]`"));
        };
        return match after.strip_prefix(':') {
            None if after.is_empty() => Ok(format!("[{host}]:{DEFAULT_PORT}")),
            None => Err(err("expected `:PORT` after `]`")),
            Some(port) => Ok(format!("[{host}]:{}", check_port(port)?)),
        };
    }
    match rest.rsplit_once(':') {
        None => Ok(format!("{rest}:{DEFAULT_PORT}")),
        Some((host, _)) if host.contains(':') => {
            Err(err("an IPv6 address goes in brackets, e.g. [::1]:8642"))
        }
        Some(("", _)) => Err(err("no host; give HOST:PORT, e.g. 127.0.0.1:8642")),
        Some((host, port)) => Ok(format!("{host}:{}", check_port(port)?)),
    }
}

/// `/v1/pipelines/{id}/{what}` with `id` percent-encoded.
fn pipeline_path(id: &str, what: &str) -> String {
    let mut path = String::from("/v1/pipelines/");
    path.push_str(&encode(id));
    path.push('/');
    path.push_str(what);
    path
}

/// `segment` percent-encoded for a path (unreserved characters kept).
fn encode(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A chunked body read as it arrives (trailers are ignored).
struct Chunked<R> {
    inner: R,
    /// Bytes left in the current chunk.
    left: usize,
    done: bool,
}

impl<R: BufRead> Read for Chunked<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_owned());
        while self.left == 0 {
            if self.done {
                return Ok(0);
            }
            let mut size = String::new();
            if self.inner.read_line(&mut size)? == 0 {
                return Err(bad("the chunked answer is cut short"));
            }
            let hex = size.split(';').next().unwrap_or_default().trim();
            if hex.is_empty() {
                // The CRLF after a chunk's data.
                continue;
            }
            self.left = usize::from_str_radix(hex, 16).map_err(|_| bad("bad chunk size"))?;
            if self.left == 0 {
                self.done = true;
                return Ok(0);
            }
        }
        let n = buf.len().min(self.left);
        let n = self.inner.read(&mut buf[..n])?;
        if n == 0 {
            return Err(bad("the chunked answer is cut short inside a chunk"));
        }
        self.left -= n;
        Ok(n)
    }
}

/// Header names (lower case) and values, in order.
type Headers = Vec<(String, String)>;

/// The status, headers (names lower-cased) and the offset of the end of the headers of an
/// HTTP/1.x answer.
fn parse_head(data: &[u8]) -> Result<(u16, Headers, usize), String> {
    let Some(end) = find(data, b"\r\n\r\n") else {
        return Err(if data.is_empty() {
            "the connection closed without an answer".to_owned()
        } else {
            format!("the answer has no end of headers: {}", snippet(data))
        });
    };
    let head = std::str::from_utf8(data.get(..end).unwrap_or_default())
        .map_err(|_| "the answer's headers are not UTF-8".to_owned())?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.") {
        return Err(format!("not an HTTP/1.x answer: `{status_line}`"));
    }
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line `{status_line}`"))?;
    let headers: Headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Ok((status, headers, end))
}

/// Parses an HTTP/1.x answer. With `to_eof`, a body without length or chunking runs to the
/// end of `data`; without it, such a body counts as incomplete.
fn parse_response(data: &[u8], to_eof: bool) -> Result<RawResponse, String> {
    let (status, headers, end) = parse_head(data)?;
    let get = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let rest = data.get(end + 4..).unwrap_or_default();
    let chunked = get("transfer-encoding").is_some_and(|v| {
        v.split(',')
            .any(|c| c.trim().eq_ignore_ascii_case("chunked"))
    });
    let body = if chunked {
        decode_chunked(rest)?
    } else if let Some(len) = get("content-length") {
        let len: usize = len
            .parse()
            .map_err(|_| format!("bad Content-Length `{len}`"))?;
        rest.get(..len)
            .ok_or_else(|| {
                format!(
                    "the answer ended after {} of its {len} body bytes",
                    rest.len()
                )
            })?
            .to_vec()
    } else if to_eof {
        rest.to_vec()
    } else {
        return Err("incomplete answer".to_owned());
    };
    Ok(RawResponse {
        status,
        headers,
        body,
    })
}

/// Decodes a chunked body (trailers are ignored).
fn decode_chunked(mut data: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let line_end = find(data, b"\r\n").ok_or("the chunked answer is cut short")?;
        let line = std::str::from_utf8(data.get(..line_end).unwrap_or_default())
            .map_err(|_| "a chunk size is not UTF-8".to_owned())?;
        let size_hex = line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|_| format!("bad chunk size `{size_hex}`"))?;
        data = data.get(line_end + 2..).unwrap_or_default();
        if size == 0 {
            return Ok(out);
        }
        let chunk = data
            .get(..size)
            .ok_or("the chunked answer is cut short inside a chunk")?;
        out.extend_from_slice(chunk);
        data = data
            .get(size..)
            .and_then(|d| d.strip_prefix(b"\r\n"))
            .ok_or("a chunk is not followed by CRLF")?;
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The start of a body, for messages.
fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return "(empty)".to_owned();
    }
    match text.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", text.get(..i).unwrap_or_default()),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        let ok = |s: &str| parse_authority(s).expect(s);
        assert_eq!(ok("127.0.0.1:8642"), "127.0.0.1:8642");
        assert_eq!(ok("http://127.0.0.1:9000/"), "127.0.0.1:9000");
        assert_eq!(ok("HTTP://localhost:1"), "localhost:1");
        assert_eq!(ok("localhost"), "localhost:8642");
        assert_eq!(ok(" [::1]:7 "), "[::1]:7");
        assert_eq!(ok("[::1]"), "[::1]:8642");
        for bad in [
            "https://x:1",
            "ftp://x",
            "",
            "x:port",
            "x:99999",
            "::1",
            "x:1/v1",
            ":1",
        ] {
            assert!(
                matches!(parse_authority(bad), Err(ClientError::Address { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn pipeline_ids_are_encoded() {
        assert_eq!(pipeline_path("a_b-1", "stop"), "/v1/pipelines/a_b-1/stop");
        assert_eq!(
            pipeline_path("a b/c", "stop"),
            "/v1/pipelines/a%20b%2Fc/stop"
        );
    }

    #[test]
    fn content_length_answer() {
        let r = parse_response(
            b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\nX-A: b\r\n\r\n{}",
            true,
        )
        .expect("parses");
        assert_eq!(r.status, 201);
        assert_eq!(r.body, b"{}");
        assert_eq!(r.header("x-a"), Some("b"));
        assert!(parse_response(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n{}", true).is_err());
    }

    #[test]
    fn chunked_answer() {
        let r = parse_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
              4;ext=1\r\n{\"a\"\r\n3\r\n: 1\r\n1\r\n}\r\n0\r\nTrailer: x\r\n\r\n",
            true,
        )
        .expect("parses");
        assert_eq!(r.body, b"{\"a\": 1}");
        assert!(
            parse_response(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\nabc",
                true
            )
            .is_err()
        );
    }

    #[test]
    fn close_delimited_and_garbage() {
        let r = parse_response(b"HTTP/1.0 200 OK\r\n\r\nhello", true).expect("parses");
        assert_eq!(r.body, b"hello");
        assert!(parse_response(b"HTTP/1.0 200 OK\r\n\r\nhello", false).is_err());
        assert!(parse_response(b"SSH-2.0-OpenSSH\r\n", true).is_err());
        assert!(parse_response(b"", true).is_err());
        assert!(parse_response(b"HTTP/1.1 abc OK\r\n\r\n", true).is_err());
    }
}
