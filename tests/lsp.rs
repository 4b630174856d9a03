//! `weir lsp` driven as an editor drives it: the real binary as a child process, LSP messages
//! framed with `Content-Length` over its standard input and output. Checks the handshake,
//! diagnostics on open and change (the same as `weir validate --format json`, at exact UTF-16
//! positions), hover, completion, definition, errors for unknown requests, robustness on
//! hostile text, test files, and shutdown/exit.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_weir");

/// A guard against a hung server, not a timing assertion.
const PATIENCE: Duration = Duration::from_secs(120);

struct Client {
    child: Child,
    stdin: Option<ChildStdin>,
    incoming: Receiver<Value>,
    /// Notifications read while waiting for something else.
    notes: Vec<Value>,
    next_id: i64,
}

impl Client {
    fn start() -> Self {
        let mut child = Command::new(BIN)
            .arg("lsp")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("weir lsp starts");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, incoming) = channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            loop {
                let mut length = None;
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let line = line.trim_end();
                    if line.is_empty() {
                        break;
                    }
                    if let Some(n) = line.strip_prefix("Content-Length: ") {
                        length = n.parse::<usize>().ok();
                    }
                }
                let mut body = vec![0; length.expect("a Content-Length header")];
                if r.read_exact(&mut body).is_err() {
                    return;
                }
                let v: Value = serde_json::from_slice(&body).expect("a JSON message");
                if tx.send(v).is_err() {
                    return;
                }
            }
        });
        let stdin = child.stdin.take();
        Self {
            child,
            stdin,
            incoming,
            notes: Vec::new(),
            next_id: 1,
        }
    }

    fn send(&mut self, message: &Value) {
        let body = serde_json::to_string(message).expect("json");
        let stdin = self.stdin.as_mut().expect("stdin open");
        write!(stdin, "Content-Length: {}\r\n\r\n{body}", body.len()).expect("write");
        stdin.flush().expect("flush");
    }

    fn notify(&mut self, method: &str, params: Value) {
        self.send(&json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    fn recv(&mut self) -> Value {
        self.incoming
            .recv_timeout(PATIENCE)
            .expect("the server answers")
    }

    /// Sends a request and returns its response (the whole message).
    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let m = self.recv();
            if m.get("id") == Some(&json!(id)) && m.get("method").is_none() {
                return m;
            }
            self.notes.push(m);
        }
    }

    /// The next diagnostics published for `uri`.
    fn diagnostics(&mut self, uri: &str) -> Vec<Value> {
        let is_it = |m: &Value| {
            m["method"] == "textDocument/publishDiagnostics" && m["params"]["uri"] == uri
        };
        if let Some(i) = self.notes.iter().position(is_it) {
            let m = self.notes.remove(i);
            return m["params"]["diagnostics"]
                .as_array()
                .cloned()
                .unwrap_or_default();
        }
        loop {
            let m = self.recv();
            if is_it(&m) {
                return m["params"]["diagnostics"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
            }
            self.notes.push(m);
        }
    }

    fn initialize(&mut self) -> Value {
        let r = self.request(
            "initialize",
            json!({"processId": null, "rootUri": null, "capabilities": {}}),
        );
        self.notify("initialized", json!({}));
        r
    }

    fn open(&mut self, uri: &str, text: &str) {
        self.notify(
            "textDocument/didOpen",
            json!({"textDocument": {"uri": uri, "languageId": "yaml", "version": 1, "text": text}}),
        );
    }

    fn change(&mut self, uri: &str, version: i32, text: &str) {
        self.notify(
            "textDocument/didChange",
            json!({"textDocument": {"uri": uri, "version": version}, "contentChanges": [{"text": text}]}),
        );
    }

    fn at(&mut self, method: &str, uri: &str, pos: (u32, u32)) -> Value {
        let r = self.request(
            method,
            json!({"textDocument": {"uri": uri}, "position": {"line": pos.0, "character": pos.1}}),
        );
        assert!(r.get("error").is_none(), "{method} failed: {r}");
        r["result"].clone()
    }

    /// `shutdown` then `exit`; the exit status.
    fn shutdown(mut self) -> i32 {
        let r = self.request("shutdown", Value::Null);
        assert_eq!(r["result"], Value::Null, "{r}");
        self.notify("exit", Value::Null);
        self.stdin = None;
        self.child.wait().expect("exits").code().unwrap_or(-1)
    }
}

/// The LSP position (line, UTF-16 column) of a byte offset.
fn utf16(text: &str, offset: usize) -> (u32, u32) {
    let before = &text[..offset];
    let line = before.matches('\n').count();
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col: usize = before[line_start..].chars().map(char::len_utf16).sum();
    (line as u32, col as u32)
}

/// The (line, character) of the first occurrence of `needle`, plus `plus` characters.
fn pos(text: &str, needle: &str, plus: usize) -> (u32, u32) {
    let at = text
        .find(needle)
        .unwrap_or_else(|| panic!("`{needle}` in the text"));
    let (l, c) = utf16(text, at);
    (l, c + plus as u32)
}

fn range_of(d: &Value) -> ((u32, u32), (u32, u32)) {
    let p = |v: &Value| {
        (
            v["line"].as_u64().unwrap_or(u64::MAX) as u32,
            v["character"].as_u64().unwrap_or(u64::MAX) as u32,
        )
    };
    (p(&d["range"]["start"]), p(&d["range"]["end"]))
}

fn uri_of(path: &Path) -> String {
    format!("file://{}", path.display())
}

const VALID: &str = "\
version: 1
pipelines:
  - id: p
    sources:
      - id: gen
        type: generator
        count: 3
        fields:
          user: {kind: sequence}
    operators:
      - id: m
        type: map
        input: gen
        script: |
          fn map(r) { let s = \"😀é\"; #{user: r.user, total: get(r, \"n\", 0)} }
    sinks:
      - id: out
        type: stdout
        inputs: [m]
";

/// `weir validate --format json`'s diagnostics of a file, for comparison.
fn validate_json(path: &Path) -> Vec<Value> {
    let out = Command::new(BIN)
        .args(["validate", "--format", "json"])
        .arg(path)
        .output()
        .expect("weir validate runs");
    let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
    doc["files"][0]["diagnostics"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Asserts that the server's diagnostics are validate's: same codes, messages (plus the help
/// line) and byte spans, at UTF-16 positions.
fn assert_same_as_validate(text: &str, lsp: &[Value], validate: &[Value]) {
    assert_eq!(
        lsp.len(),
        validate.len(),
        "lsp {lsp:#?}\nvalidate {validate:#?}"
    );
    for (l, v) in lsp.iter().zip(validate) {
        assert_eq!(l["code"], v["code"]);
        assert_eq!(l["source"], "weir");
        let message = l["message"].as_str().unwrap_or_default();
        let expected = match v["help"].as_str() {
            Some(h) => format!("{}\nhelp: {h}", v["message"].as_str().unwrap_or_default()),
            None => v["message"].as_str().unwrap_or_default().to_owned(),
        };
        assert!(
            message.starts_with(&expected),
            "{message:?} vs {expected:?}"
        );
        let severity = if v["severity"] == "error" { 1 } else { 2 };
        assert_eq!(l["severity"], severity);
        let offset = v["offset"].as_u64().unwrap_or_default() as usize;
        let length = v["length"].as_u64().unwrap_or_default() as usize;
        assert_eq!(
            range_of(l),
            (utf16(text, offset), utf16(text, offset + length)),
            "{l}"
        );
    }
}

#[test]
fn an_editor_session_gets_diagnostics_hover_completion_and_definitions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("orders.yaml");
    let uri = uri_of(&path);
    let mut c = Client::start();

    let init = c.initialize();
    let caps = &init["result"]["capabilities"];
    assert_eq!(caps["textDocumentSync"]["change"], 1, "full sync: {init}");
    assert_eq!(caps["textDocumentSync"]["openClose"], true);
    assert_eq!(caps["textDocumentSync"]["save"], true);
    assert_eq!(caps["hoverProvider"], true);
    assert_eq!(caps["definitionProvider"], true);
    assert!(caps["completionProvider"].is_object());
    assert_eq!(init["result"]["serverInfo"]["name"], "weir");

    // A valid file: no diagnostics.
    c.open(&uri, VALID);
    assert_eq!(c.diagnostics(&uri), Vec::<Value>::new());

    // A Rhai syntax error inside the block scalar, after non-ASCII text on its line: reported
    // where `weir validate` reports it, in UTF-16 units.
    let broken = VALID.replace("get(r, \"n\", 0)}", "get(r, \"n\", 0}");
    std::fs::write(&path, &broken).expect("write");
    c.change(&uri, 2, &broken);
    let lsp = c.diagnostics(&uri);
    let validate = validate_json(&path);
    assert_eq!(lsp.len(), 1, "{lsp:#?}");
    assert_eq!(lsp[0]["code"], "weir::script::syntax");
    assert_same_as_validate(&broken, &lsp, &validate);
    let script_line = pos(&broken, "fn map", 0).0;
    let (start, _) = range_of(&lsp[0]);
    assert_eq!(start.0, script_line);
    // Bytes and UTF-16 units differ after `😀é` (6 bytes, 3 units): the column is in units.
    let byte_col = validate[0]["offset"].as_u64().unwrap_or_default() as usize
        - broken[..validate[0]["offset"].as_u64().unwrap_or_default() as usize]
            .rfind('\n')
            .map_or(0, |i| i + 1);
    assert_eq!(start.1 as usize, byte_col - 3);

    // A dangling input and a duplicate id at once: each with its help line, the duplicate
    // with where the id was first used, in the message and as related information.
    let many = VALID
        .replace("input: gen", "input: gne")
        .replace("      - id: out", "      - id: gen");
    std::fs::write(&path, &many).expect("write");
    c.change(&uri, 3, &many);
    let lsp = c.diagnostics(&uri);
    assert_same_as_validate(&many, &lsp, &validate_json(&path));
    let dup = lsp
        .iter()
        .find(|d| d["code"] == "weir::config::duplicate_id")
        .expect("duplicate id diagnostic");
    let (l, ch) = pos(&many, "gen\n        type: generator", 0);
    assert_eq!(
        dup["relatedInformation"],
        json!([{"location": {"uri": uri, "range": {"start": {"line": l, "character": ch}, "end": {"line": l, "character": ch + 3}}}, "message": "first used here"}])
    );
    let message = dup["message"].as_str().unwrap_or_default();
    assert!(
        message.ends_with(&format!(
            "\nfirst used here: line {}, column {}",
            l + 1,
            ch + 1
        )),
        "{message}"
    );
    assert!(
        lsp.iter()
            .any(|d| d["code"] == "weir::config::unknown_input")
    );

    // An undefined `${VAR}`: at the reference.
    let env = VALID.replace("count: 3", "count: ${WEIR_LSP_TEST_SURELY_UNSET}");
    c.change(&uri, 4, &env);
    let lsp = c.diagnostics(&uri);
    assert_eq!(lsp.len(), 1, "{lsp:#?}");
    assert_eq!(lsp[0]["code"], "weir::env::undefined");
    let var = env.find("${WEIR_LSP").expect("reference");
    assert_eq!(range_of(&lsp[0]), (utf16(&env, var), utf16(&env, var + 29)));

    // A Rhai error in a `script_file`: shown at the `script_file:` value, pointing into the
    // script file.
    let script = dir.path().join("bad.rhai");
    std::fs::write(&script, "fn map(r) {\n  r.x +\n}\n").expect("write");
    let filed = VALID.replace(
        "        script: |\n          fn map(r) { let s = \"😀é\"; #{user: r.user, total: get(r, \"n\", 0)} }\n",
        "        script_file: bad.rhai\n",
    );
    c.change(&uri, 5, &filed);
    let lsp = c.diagnostics(&uri);
    assert_eq!(lsp.len(), 1, "{lsp:#?}");
    assert_eq!(lsp[0]["code"], "weir::script::syntax");
    let (l, ch) = pos(&filed, "bad.rhai", 0);
    assert_eq!(range_of(&lsp[0]), ((l, ch), (l, ch + 8)));
    let related = &lsp[0]["relatedInformation"][0]["location"];
    assert_eq!(related["uri"], uri_of(&script));
    assert!(
        lsp[0]["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with(&format!("{}:", script.display()))
    );
    // The script file fixed and saved: the pipeline's diagnostics follow.
    std::fs::write(&script, "fn map(r) { r }\n").expect("write");
    c.notify(
        "textDocument/didSave",
        json!({"textDocument": {"uri": uri_of(&script)}}),
    );
    assert_eq!(c.diagnostics(&uri), Vec::<Value>::new());

    // Fixed: the diagnostics are cleared.
    c.change(&uri, 6, VALID);
    assert_eq!(c.diagnostics(&uri), Vec::<Value>::new());

    // Hover on a key: its schema description, over the key.
    let schema = weir_schema::schema::json_schema();
    let count_doc = schema["$defs"]["SourceSpec"]["oneOf"]
        .as_array()
        .and_then(|b| {
            b.iter()
                .find(|b| b["properties"]["type"]["const"] == "generator")
        })
        .and_then(|b| b["properties"]["count"]["description"].as_str())
        .expect("count is described")
        .replace('\n', " ");
    let h = c.at("textDocument/hover", &uri, pos(VALID, "count:", 2));
    assert!(
        h["contents"]["value"]
            .as_str()
            .unwrap_or_default()
            .contains(&count_doc),
        "{h}"
    );
    let (l, ch) = pos(VALID, "count:", 0);
    assert_eq!(
        h["range"],
        json!({"start": {"line": l, "character": ch}, "end": {"line": l, "character": ch + 5}})
    );

    // Hover on `type: map`: what a map is.
    let h = c.at("textDocument/hover", &uri, pos(VALID, "map\n", 1));
    assert!(
        h["contents"]["value"]
            .as_str()
            .unwrap_or_default()
            .contains("One record in, one record out"),
        "{h}"
    );

    // Hover on a script function: its script API entry.
    let get = weir_engine::script_api::HOST_FUNCTIONS
        .iter()
        .find(|f| f.name == "get")
        .expect("get is documented");
    let h = c.at("textDocument/hover", &uri, pos(VALID, "get(r", 1));
    let text = h["contents"]["value"].as_str().unwrap_or_default();
    assert!(
        text.contains(get.meaning) && text.contains("get(record: map"),
        "{text}"
    );
    let (l, ch) = pos(VALID, "get(r", 0);
    assert_eq!(h["range"]["start"], json!({"line": l, "character": ch}));

    // Completion of an operator's `type:` value: every operator type the schema knows.
    let typed = VALID.replace("type: map", "type: ");
    c.change(&uri, 7, &typed);
    let _ = c.diagnostics(&uri);
    let items = c.at("textDocument/completion", &uri, pos(&typed, "type: \n", 6));
    let labels: Vec<&str> = items
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["label"].as_str())
        .collect();
    let ops: Vec<&str> = schema["$defs"]["OperatorSpec"]["oneOf"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b["properties"]["type"]["const"].as_str())
        .collect();
    assert_eq!(labels, ops);

    // Completion of keys on a new line of the operator: its keys that are not written yet.
    let keyed = VALID.replace("        input: gen\n", "        input: gen\n        on\n");
    c.change(&uri, 8, &keyed);
    let _ = c.diagnostics(&uri);
    let items = c.at(
        "textDocument/completion",
        &uri,
        pos(&keyed, "        on\n", 10),
    );
    let on_error = items
        .as_array()
        .into_iter()
        .flatten()
        .find(|i| i["label"] == "on_error")
        .expect("on_error is offered");
    let (l, _) = pos(&keyed, "        on\n", 0);
    assert_eq!(
        on_error["textEdit"],
        json!({"range": {"start": {"line": l, "character": 8}, "end": {"line": l, "character": 10}}, "newText": "on_error: "})
    );
    let labels: Vec<&str> = items
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["label"].as_str())
        .collect();
    assert!(
        !labels.contains(&"id") && !labels.contains(&"input") && labels.contains(&"script_file"),
        "{labels:?}"
    );

    // Completion of input ids: the pipeline's sources and operators, not the sink itself.
    c.change(&uri, 9, VALID);
    let _ = c.diagnostics(&uri);
    let items = c.at("textDocument/completion", &uri, pos(VALID, "[m]", 1));
    let labels: Vec<&str> = items
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["label"].as_str())
        .collect();
    assert_eq!(labels, ["gen", "m"]);

    // Completion of record fields after `r.`: the generator's and the map's outputs.
    let items = c.at("textDocument/completion", &uri, pos(VALID, "r.user", 2));
    let labels: Vec<&str> = items
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["label"].as_str())
        .collect();
    assert!(
        labels.contains(&"user") && labels.contains(&"total"),
        "{labels:?}"
    );

    // Definition of an input: the id of the element it names.
    let d = c.at("textDocument/definition", &uri, pos(VALID, "input: gen", 8));
    let (l, ch) = pos(VALID, "gen\n        type: generator", 0);
    assert_eq!(
        d,
        json!({"uri": uri, "range": {"start": {"line": l, "character": ch}, "end": {"line": l, "character": ch + 3}}})
    );
    let d = c.at("textDocument/definition", &uri, pos(VALID, "[m]", 1));
    let (l, ch) = pos(VALID, "m\n        type: map", 0);
    assert_eq!(d["range"]["start"], json!({"line": l, "character": ch}));
    // Nothing to go to from a key.
    assert_eq!(
        c.at("textDocument/definition", &uri, pos(VALID, "count", 1)),
        Value::Null
    );

    // An unknown request is an error, not silence; so are parameters that do not parse.
    let r = c.request("workspace/symbol", json!({"query": ""}));
    assert_eq!(r["error"]["code"], -32601, "{r}");
    let r = c.request("textDocument/hover", json!({"textDocument": {"uri": uri}}));
    assert_eq!(r["error"]["code"], -32602, "{r}");

    // Closing clears the file's diagnostics.
    c.notify(
        "textDocument/didClose",
        json!({"textDocument": {"uri": uri}}),
    );
    assert_eq!(c.diagnostics(&uri), Vec::<Value>::new());

    assert_eq!(c.shutdown(), 0);
}

#[test]
fn every_reference_pipeline_and_example_gets_validates_diagnostics() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut c = Client::start();
    c.initialize();
    let mut seen = 0;
    for dir in ["pipelines", "examples"] {
        let mut files: Vec<_> = std::fs::read_dir(root.join(dir))
            .expect("dir")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            // Test files of `weir test` are not pipeline files: `validate` does not take them.
            .filter(|p| !p.to_string_lossy().ends_with(".test.yaml"))
            .collect();
        files.sort();
        for path in files {
            let text = std::fs::read_to_string(&path).expect("read");
            let uri = uri_of(&path);
            c.open(&uri, &text);
            let lsp = c.diagnostics(&uri);
            assert_same_as_validate(&text, &lsp, &validate_json(&path));
            seen += 1;
        }
    }
    assert!(seen >= 5, "{seen} files");
    assert_eq!(c.shutdown(), 0);
}

#[test]
fn flow_mappings_complete_and_resolve_like_block_ones() {
    let text = "\
version: 1
pipelines:
  - id: orders_totals
    sources:
      - {id: orders, type: file, path: data/orders.jsonl, format: jsonl}
    operators:
      - {id: by_user, type: key_by, input: orders, field: user}
    sinks:
      - {id: out, type: stdout, inputs: [by_user]}
";
    let uri = "file:///nonexistent/weir-lsp/flow.yaml";
    let mut c = Client::start();
    c.initialize();
    c.open(uri, text);
    let _ = c.diagnostics(uri);
    let d = c.at(
        "textDocument/definition",
        uri,
        pos(text, "orders, field", 2),
    );
    let (l, ch) = pos(text, "orders, type", 0);
    assert_eq!(d["range"]["start"], json!({"line": l, "character": ch}));
    let d = c.at("textDocument/definition", uri, pos(text, "[by_user]", 3));
    let (l, ch) = pos(text, "by_user, type", 0);
    assert_eq!(d["range"]["start"], json!({"line": l, "character": ch}));
    let h = c.at("textDocument/hover", uri, pos(text, "key_by", 2));
    let value = h["contents"]["value"].as_str().unwrap_or_default();
    assert!(value.starts_with("**`key_by`**"), "{value}");
    let items = c.at("textDocument/completion", uri, pos(text, "[by_user]", 1));
    let labels: Vec<&str> = items
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["label"].as_str())
        .collect();
    assert_eq!(labels, ["orders", "by_user"]);
    assert_eq!(c.shutdown(), 0);
}

#[test]
fn hostile_text_gives_diagnostics_and_the_server_keeps_answering() {
    let mut c = Client::start();
    c.initialize();
    let uri = "file:///nonexistent/weir-lsp/hostile.yaml";
    let texts = [
        String::new(),
        "\u{0}\u{1}\u{7f}\u{fffd}".repeat(100),
        "pipelines:\n  - id: p\n    sour".to_owned(),
        "a: [".repeat(10_000),
        "- ".repeat(100_000),
        format!("x: \"{}\"\n", "y".repeat(17 * 1024 * 1024)),
        "script: |\n  fn map(r) { \u{1F600}".to_owned(),
    ];
    for (i, text) in texts.iter().enumerate() {
        let version = i32::try_from(i).unwrap_or_default() + 1;
        if i == 0 {
            c.open(uri, text);
        } else {
            c.change(uri, version, text);
        }
        let d = c.diagnostics(uri);
        assert!(!d.is_empty(), "text {i} has diagnostics");
        for (line, ch) in [(0, 0), (0, 5), (1, 3), (2, 8), (99, 99)] {
            for method in [
                "textDocument/hover",
                "textDocument/completion",
                "textDocument/definition",
            ] {
                let _ = c.at(method, uri, (line, ch));
            }
        }
    }
    assert_eq!(c.shutdown(), 0);
}

#[test]
fn test_files_get_the_test_file_diagnostics_and_its_schema() {
    let mut c = Client::start();
    c.initialize();
    let uri = "file:///nonexistent/weir-lsp/orders.test.yaml";
    let valid = "pipeline: orders.yaml\ntests:\n  - name: one\n    inputs: {}\n    expect: {}\n";
    c.open(uri, valid);
    let first = c.diagnostics(uri);
    // What `weir test`'s loader says of the same text, nothing more.
    let loaded = weir_schema::test_file::load_test_str("orders.test.yaml", valid);
    assert_eq!(first.len(), loaded.diagnostics.iter().count(), "{first:#?}");
    // A key the test-file schema does not know: located at the key, as `weir test` says it.
    let unknown = valid.replace("pipeline:", "pipelin:");
    c.change(uri, 2, &unknown);
    let d = c.diagnostics(uri);
    assert!(!d.is_empty(), "no diagnostic for an unknown key");
    assert_eq!(d[0]["range"]["start"]["line"], 0, "{d:#?}");
    // A syntax error is still a YAML diagnostic.
    c.change(uri, 3, "pipeline: orders.yaml\ntests:\n  - name: [one\n");
    let d = c.diagnostics(uri);
    assert!(
        d.iter().any(|x| x["code"] == "weir::yaml::syntax"),
        "{d:#?}"
    );
    // Hover walks the test-file schema, not the pipeline schema.
    c.change(uri, 4, valid);
    let _ = c.diagnostics(uri);
    let hover = c.at("textDocument/hover", uri, (0, 2));
    let text = hover.to_string();
    assert!(text.contains("pipeline file under test"), "{hover}");
    assert_eq!(c.shutdown(), 0);
}

#[test]
fn a_burst_of_changes_ends_with_the_last_texts_diagnostics_and_shutdown_still_exits_cleanly() {
    let mut c = Client::start();
    c.initialize();
    let uri = "file:///nonexistent/weir-lsp/burst.yaml";
    c.open(uri, VALID);
    for version in 2..=20 {
        let text = if version % 2 == 0 {
            VALID.replace("type: map", "type: mapp")
        } else {
            VALID.to_owned()
        };
        c.change(uri, version, &text);
    }
    // Whatever was skipped on the way, the last version's diagnostics arrive.
    loop {
        let m = c.recv();
        if m["method"] == "textDocument/publishDiagnostics" && m["params"]["version"] == 20 {
            let d = m["params"]["diagnostics"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            assert_eq!(d.len(), 1, "{d:#?}");
            assert_eq!(d[0]["code"], "weir::config::unknown_type");
            break;
        }
    }
    // A change, `shutdown` and `exit` sent at once: the change's check may read `shutdown`
    // and `exit` ahead; the server still answers `shutdown` and exits with 0.
    c.change(uri, 21, VALID);
    c.send(&json!({"jsonrpc": "2.0", "id": 99, "method": "shutdown"}));
    c.notify("exit", Value::Null);
    c.stdin = None;
    let answered = loop {
        let m = c.recv();
        if m["id"] == 99 {
            break m;
        }
    };
    assert_eq!(answered["result"], Value::Null, "{answered}");
    assert_eq!(c.child.wait().expect("exits").code(), Some(0));
}

#[test]
fn exit_without_shutdown_is_status_1() {
    let mut c = Client::start();
    c.initialize();
    c.notify("exit", Value::Null);
    c.stdin = None;
    assert_eq!(c.child.wait().expect("exits").code(), Some(1));
}
