//! `weir top` against a real `weir run`, in its plain mode (standard output is not a
//! terminal here): `--once` prints one snapshot of every pipeline and operator, `-n N` prints N
//! refreshes; nothing listening is exit code 2. The terminal screen itself is unit-tested on
//! ratatui's test backend (`src/cmd/top/screen.rs`).

mod common;

use std::path::Path;

use common::run::Run;

const PIPELINES: &str = "version: 1
pipelines:
  - id: p
    checkpoints: {mode: exactly_once, interval: 1s, storage: .weir/checkpoints}
    sources:
      - {id: ev, type: generator, count: 10000000, rate: 2000, fields: {n: {kind: sequence}}}
    operators:
      - id: tag
        type: map
        input: ev
        parallelism: 2
        script: |
          fn map(r) { r.tag = 1; r }
    sinks:
      - {id: out, type: file, input: tag, path: out/p}
  - id: q
    sources:
      - {id: ticks, type: generator, count: 10000000, rate: 500, fields: {n: {kind: sequence}}}
    sinks:
      - {id: sink, type: file, input: ticks, path: out/q}
";

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The cells of the table row of `id` in one block of `weir top` output.
fn row<'a>(block: &'a str, id: &str) -> Vec<&'a str> {
    block
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.first() == Some(&id))
        .unwrap_or_else(|| panic!("no row `{id}` in:\n{block}"))
}

fn is_rate(cell: &str) -> bool {
    let number = cell.trim_end_matches(['k', 'M']);
    number.parse::<f64>().is_ok()
}

#[test]
fn top_prints_every_pipeline_and_operator_with_rates() {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(tmp.path().join("p.yaml"), PIPELINES).expect("write");
    let mut run = Run::start(tmp.path(), Path::new("p.yaml"), &[]);
    run.wait_checkpoints(&["p"], 1);

    let out = run.cli(&["top", "--once", "--interval", "0.5"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let block = text(&out.stdout);
    let lines: Vec<&str> = block.lines().collect();
    assert!(
        lines[0].contains("p.yaml")
            && lines[0].contains("reloads 0 ")
            && lines[0].contains("rates over"),
        "{block}"
    );
    let header = lines
        .iter()
        .position(|l| l.starts_with("pipeline p  running  restarts 0  checkpoint #"))
        .unwrap_or_else(|| panic!("no headline of `p`:\n{block}"));
    assert!(lines[header].contains(" ago, took "), "{block}");
    assert_eq!(
        lines[header + 1].split_whitespace().collect::<Vec<_>>(),
        [
            "OPERATOR",
            "TYPE",
            "PAR",
            "IN/s",
            "OUT/s",
            "ERRORS",
            "ERR/s",
            "BACKPRESSURE",
            "BUSY",
            "QUEUE",
            "LAG"
        ],
        "{block}"
    );
    // Every element of both pipelines, with its type and parallelism and measured rates.
    for (id, ty, par) in [
        ("ev", "generator", "1"),
        ("tag", "map", "2"),
        ("out", "file", "1"),
        ("ticks", "generator", "1"),
        ("sink", "file", "1"),
    ] {
        let cells = row(&block, id);
        assert_eq!(&cells[1..3], [ty, par], "{block}");
        assert!(is_rate(cells[3]) && is_rate(cells[4]), "{id}: {block}");
        assert_eq!(cells[5], "0", "no errors: {block}");
        assert!(
            cells[7].ends_with('%') && cells[8].ends_with('%'),
            "{block}"
        );
    }
    assert_eq!(
        row(&block, "ev")[9],
        "-",
        "a source has no input queue: {block}"
    );
    // `q` takes no checkpoints.
    assert!(
        block.contains("pipeline q  running  restarts 0  checkpoint -"),
        "{block}"
    );

    // Plain mode repeats: three blocks, separated by blank lines.
    let out = run.cli(&["top", "-n", "3", "--interval", "0.3"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let all = text(&out.stdout);
    let blocks: Vec<&str> = all.split("\n\n").collect();
    assert_eq!(blocks.len(), 3, "{all}");
    for b in blocks {
        assert!(b.starts_with("file "), "{all}");
        assert_eq!(row(b, "tag")[1], "map", "{all}");
    }
    run.kill();

    let out = run.cli(&["top", "--once"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("nothing is listening"),
        "{}",
        text(&out.stderr)
    );
}
