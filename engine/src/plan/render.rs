//! Rendering a [`FilePlan`] for people: plain text (`weir graph`), Graphviz DOT and Mermaid.
//!
//! Each rendering shows, per pipeline, the logical graph (nodes with id, type and parallelism;
//! edges labelled with their partitioning, dead-letter edges marked; chained nodes grouped;
//! sources with `event_time` marked as where watermarks originate) and
//! the physical graph (one task per chain and subtask; for each edge between chains, which
//! subtasks it connects). This module only reads plans: output is deterministic (plan order,
//! never hash order) and nothing here may change a plan or panic on a malformed one.

use std::fmt::Write as _;

use super::{Chain, FilePlan, Partitioning, PipelinePlan, PlanEdge, PlanNode};

/// In DOT and Mermaid output, a chain with more subtasks than this is drawn as one node
/// `name[0..p)` instead of one node per subtask, so that all-to-all exchanges stay readable.
pub const MAX_DRAWN_SUBTASKS: u32 = 8;

/// The plan as indented plain text: per pipeline, its nodes, edges and chains, then its tasks
/// and the subtask connections of every exchange between tasks.
pub fn text(plan: &FilePlan) -> String {
    let mut out = String::new();
    for (i, pipeline) in plan.pipelines.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        text_pipeline(&mut out, pipeline);
    }
    out
}

/// The plan as a Graphviz `digraph`: one cluster per pipeline holding a logical cluster (one
/// `cluster_..._chain...` per chain) and a physical cluster (one per task, a node per subtask).
pub fn dot(plan: &FilePlan) -> String {
    let mut out = String::from("digraph weir {\n  rankdir=LR;\n  node [shape=box];\n");
    for (pi, pipeline) in plan.pipelines.iter().enumerate() {
        dot_pipeline(&mut out, pi, pipeline);
    }
    out.push_str("}\n");
    out
}

/// The plan as a Mermaid `flowchart`: one subgraph per pipeline holding a logical subgraph (one
/// subgraph per chain) and a physical subgraph (one per task, a node per subtask).
pub fn mermaid(plan: &FilePlan) -> String {
    let mut out = String::from("flowchart LR\n");
    for (pi, pipeline) in plan.pipelines.iter().enumerate() {
        mermaid_pipeline(&mut out, pi, pipeline);
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Shared views of a plan

/// The node's YAML id, or `?` for an index outside the plan.
fn node_id(plan: &PipelinePlan, node: super::NodeId) -> &str {
    plan.nodes.get(node.0).map_or("?", |n| n.id.as_str())
}

/// A node's type and parallelism, as `map x2`.
fn node_summary(node: &PlanNode) -> String {
    format!("{} x{}", node.type_name(), node.parallelism)
}

/// Where watermarks originate: a source with `event_time`, as `watermarks: ts - 1s (idle
/// 30s)`; `None` for every other node.
fn watermark_origin(node: &PlanNode) -> Option<String> {
    let super::NodeKind::Source(source) = &node.kind else {
        return None;
    };
    let et = source.event_time()?;
    let mut s = format!("watermarks: {}", et.field);
    if let Some(d) = et.max_out_of_orderness.filter(|d| !d.get().is_zero()) {
        let _ = write!(s, " - {d}");
    }
    if let Some(d) = et.idle_timeout {
        let _ = write!(s, " (idle {d})");
    }
    Some(s)
}

/// A task's name: the ids of its chained nodes joined by `+`.
fn chain_name(plan: &PipelinePlan, chain: &Chain) -> String {
    chain
        .nodes
        .iter()
        .map(|&n| node_id(plan, n))
        .collect::<Vec<_>>()
        .join("+")
}

/// Index of the chain holding each node (`None` for a node in no chain).
fn chain_index(plan: &PipelinePlan) -> Vec<Option<usize>> {
    let mut index = vec![None; plan.nodes.len()];
    for (c, chain) in plan.chains.iter().enumerate() {
        for node in &chain.nodes {
            if let Some(slot) = index.get_mut(node.0) {
                *slot = Some(c);
            }
        }
    }
    index
}

/// Whether the edge joins two consecutive nodes of one chain (it then runs inside a task).
fn is_chained(plan: &PipelinePlan, edge: &PlanEdge) -> bool {
    plan.chains.iter().any(|c| {
        c.nodes
            .windows(2)
            .any(|w| w[0] == edge.from && w[1] == edge.to)
    })
}

/// An edge that crosses tasks, with the chains at both ends.
struct Exchange<'a> {
    edge: &'a PlanEdge,
    from_chain: usize,
    to_chain: usize,
}

/// The edges between tasks, in plan edge order.
fn exchanges(plan: &PipelinePlan) -> Vec<Exchange<'_>> {
    let index = chain_index(plan);
    plan.edges
        .iter()
        .filter(|e| !is_chained(plan, e))
        .filter_map(|edge| {
            let from_chain = index.get(edge.from.0).copied().flatten()?;
            let to_chain = index.get(edge.to.0).copied().flatten()?;
            Some(Exchange {
                edge,
                from_chain,
                to_chain,
            })
        })
        .collect()
}

/// Whether records go subtask i → subtask i (else every upstream subtask reaches every
/// downstream one).
fn is_one_to_one(edge: &PlanEdge, from: &Chain, to: &Chain) -> bool {
    edge.partitioning == Partitioning::Forward && from.parallelism == to.parallelism
}

/// The number of subtask-to-subtask channels of an exchange.
fn channel_count(edge: &PlanEdge, from: &Chain, to: &Chain) -> u64 {
    if is_one_to_one(edge, from, to) {
        u64::from(from.parallelism)
    } else {
        u64::from(from.parallelism) * u64::from(to.parallelism)
    }
}

/// The edge label: partitioning, and whether it carries dead letters or late records.
fn edge_label(edge: &PlanEdge) -> String {
    if edge.late {
        format!("{}, late records", edge.partitioning.name())
    } else if edge.dead_letter {
        format!("{}, dead letter", edge.partitioning.name())
    } else {
        edge.partitioning.name().to_owned()
    }
}

/// The subtasks drawn for a chain: one per subtask, or a single range when there are more than
/// [`MAX_DRAWN_SUBTASKS`]. Each entry is `(identifier suffix, label suffix)`.
fn drawn_subtasks(chain: &Chain) -> Vec<(String, String)> {
    if chain.parallelism <= MAX_DRAWN_SUBTASKS {
        (0..chain.parallelism)
            .map(|s| (format!("s{s}"), format!("[{s}]")))
            .collect()
    } else {
        vec![("all".to_owned(), format!("[0..{})", chain.parallelism))]
    }
}

/// The pairs of drawn subtasks an exchange connects, as indices into [`drawn_subtasks`].
fn drawn_connections(edge: &PlanEdge, from: &Chain, to: &Chain) -> Vec<(usize, usize)> {
    let ups = drawn_subtasks(from).len();
    let downs = drawn_subtasks(to).len();
    if is_one_to_one(edge, from, to) && ups == downs {
        (0..ups).map(|i| (i, i)).collect()
    } else {
        (0..ups)
            .flat_map(|u| (0..downs).map(move |d| (u, d)))
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Text

fn text_pipeline(out: &mut String, plan: &PipelinePlan) {
    let _ = writeln!(
        out,
        "pipeline {} (max_parallelism {})",
        plan.id, plan.max_parallelism
    );
    if let Some(d) = &plan.spec.description {
        for line in d.lines() {
            let _ = writeln!(out, "  # {line}");
        }
    }
    let g = super::guarantee::guarantee(&plan.spec);
    let _ = writeln!(out, "  guarantee: {}", g.level);
    for reason in &g.reasons {
        let _ = writeln!(out, "    - {reason}");
    }

    out.push_str("  logical graph:\n    nodes:\n");
    for node in &plan.nodes {
        let _ = write!(
            out,
            "      {}: {} (x{})",
            node.id,
            node.type_name(),
            node.parallelism
        );
        match watermark_origin(node) {
            Some(w) => {
                let _ = writeln!(out, ", {w}");
            }
            None => out.push('\n'),
        }
    }
    out.push_str("    edges:\n");
    if plan.edges.is_empty() {
        out.push_str("      (none)\n");
    }
    for edge in &plan.edges {
        let _ = writeln!(
            out,
            "      {} -> {} [{}]",
            node_id(plan, edge.from),
            node_id(plan, edge.to),
            edge_label(edge)
        );
    }
    out.push_str("    chains:\n");
    for (c, chain) in plan.chains.iter().enumerate() {
        let members = chain
            .nodes
            .iter()
            .map(|&n| node_id(plan, n))
            .collect::<Vec<_>>()
            .join(" -> ");
        let _ = writeln!(
            out,
            "      chain {} (x{}): {members}",
            c + 1,
            chain.parallelism
        );
    }

    let exchanges = exchanges(plan);
    let subtasks: u64 = plan.chains.iter().map(|c| u64::from(c.parallelism)).sum();
    let channels: u64 = exchanges
        .iter()
        .map(|x| channel_count(x.edge, &plan.chains[x.from_chain], &plan.chains[x.to_chain]))
        .sum();
    let _ = writeln!(
        out,
        "  physical graph (subtasks: {subtasks}, channels: {channels}):\n    tasks:"
    );
    for chain in &plan.chains {
        let _ = writeln!(
            out,
            "      {}[0..{})",
            chain_name(plan, chain),
            chain.parallelism
        );
    }
    out.push_str("    exchanges:\n");
    if exchanges.is_empty() {
        out.push_str("      (none)\n");
    }
    for x in &exchanges {
        let (from, to) = (&plan.chains[x.from_chain], &plan.chains[x.to_chain]);
        let shape = if is_one_to_one(x.edge, from, to) {
            "one-to-one, i -> i"
        } else {
            "all-to-all"
        };
        let dead = if x.edge.late {
            ", late records"
        } else if x.edge.dead_letter {
            ", dead letters"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "      {}[0..{}) ={}=> {}[0..{}) ({shape}{dead})",
            node_id(plan, x.edge.from),
            from.parallelism,
            x.edge.partitioning.name(),
            node_id(plan, x.edge.to),
            to.parallelism
        );
    }
}

// ---------------------------------------------------------------------------------------------
// DOT

/// Text escaped for the inside of a DOT double-quoted string.
fn dot_escape(s: &str) -> String {
    let mut e = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '"' => e.push_str("\\\""),
            '\\' => e.push_str("\\\\"),
            '\n' => e.push_str("\\n"),
            '\r' => {}
            c => e.push(c),
        }
    }
    e
}

/// A DOT double-quoted string.
fn dot_quote(s: &str) -> String {
    format!("\"{}\"", dot_escape(s))
}

/// A DOT label of several lines, each escaped.
fn dot_lines(lines: &[&str]) -> String {
    let escaped: Vec<String> = lines.iter().map(|l| dot_escape(l)).collect();
    format!("\"{}\"", escaped.join("\\n"))
}

fn dot_edge_attrs(edge: &PlanEdge) -> String {
    let label = dot_quote(&edge_label(edge));
    if edge.dead_letter {
        format!("[label={label}, style=dashed, color=red]")
    } else {
        format!("[label={label}]")
    }
}

fn dot_pipeline(out: &mut String, pi: usize, plan: &PipelinePlan) {
    let _ = writeln!(
        out,
        "  subgraph {} {{",
        dot_quote(&format!("cluster_p{pi}"))
    );
    let _ = writeln!(
        out,
        "    label={};",
        dot_quote(&format!(
            "pipeline {} ({})",
            plan.id,
            super::guarantee::guarantee(&plan.spec).level
        ))
    );

    // Logical graph.
    let _ = writeln!(
        out,
        "    subgraph {} {{",
        dot_quote(&format!("cluster_p{pi}_logical"))
    );
    let _ = writeln!(out, "      label={};", dot_quote("logical"));
    let index = chain_index(plan);
    for (c, chain) in plan.chains.iter().enumerate() {
        let _ = writeln!(
            out,
            "      subgraph {} {{",
            dot_quote(&format!("cluster_p{pi}_chain{c}"))
        );
        let _ = writeln!(
            out,
            "        label={};",
            dot_quote(&format!("chain {} (x{})", c + 1, chain.parallelism))
        );
        out.push_str("        style=dashed;\n");
        for node in chain.nodes.iter().filter_map(|n| plan.nodes.get(n.0)) {
            dot_logical_node(out, "        ", pi, node);
        }
        out.push_str("      }\n");
    }
    for node in plan
        .nodes
        .iter()
        .filter(|n| index.get(n.index.0).copied().flatten().is_none())
    {
        dot_logical_node(out, "      ", pi, node);
    }
    for edge in &plan.edges {
        let _ = writeln!(
            out,
            "      {} -> {} {};",
            dot_quote(&format!("p{pi}_n{}", edge.from.0)),
            dot_quote(&format!("p{pi}_n{}", edge.to.0)),
            dot_edge_attrs(edge)
        );
    }
    out.push_str("    }\n");

    // Physical graph.
    let _ = writeln!(
        out,
        "    subgraph {} {{",
        dot_quote(&format!("cluster_p{pi}_physical"))
    );
    let _ = writeln!(out, "      label={};", dot_quote("physical"));
    for (c, chain) in plan.chains.iter().enumerate() {
        let name = chain_name(plan, chain);
        let _ = writeln!(
            out,
            "      subgraph {} {{",
            dot_quote(&format!("cluster_p{pi}_task{c}"))
        );
        let _ = writeln!(
            out,
            "        label={};",
            dot_quote(&format!("{name}[0..{})", chain.parallelism))
        );
        for (suffix, label) in drawn_subtasks(chain) {
            let _ = writeln!(
                out,
                "        {} [label={}];",
                dot_quote(&format!("p{pi}_t{c}_{suffix}")),
                dot_quote(&format!("{name}{label}"))
            );
        }
        out.push_str("      }\n");
    }
    for x in exchanges(plan) {
        let (from, to) = (&plan.chains[x.from_chain], &plan.chains[x.to_chain]);
        let (ups, downs) = (drawn_subtasks(from), drawn_subtasks(to));
        for (u, d) in drawn_connections(x.edge, from, to) {
            let _ = writeln!(
                out,
                "      {} -> {} {};",
                dot_quote(&format!("p{pi}_t{}_{}", x.from_chain, ups[u].0)),
                dot_quote(&format!("p{pi}_t{}_{}", x.to_chain, downs[d].0)),
                dot_edge_attrs(x.edge)
            );
        }
    }
    out.push_str("    }\n  }\n");
}

fn dot_logical_node(out: &mut String, indent: &str, pi: usize, node: &PlanNode) {
    let _ = writeln!(
        out,
        "{indent}{} [label={}];",
        dot_quote(&format!("p{pi}_n{}", node.index.0)),
        match watermark_origin(node) {
            Some(w) => dot_lines(&[&node.id, &node_summary(node), &w]),
            None => dot_lines(&[&node.id, &node_summary(node)]),
        }
    );
}

// ---------------------------------------------------------------------------------------------
// Mermaid

/// Text safe inside a Mermaid `"..."` label: quotes, markup and `#` become entity codes.
fn mermaid_text(s: &str) -> String {
    let mut t = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '"' => t.push_str("#quot;"),
            '#' => t.push_str("#35;"),
            '<' => t.push_str("#lt;"),
            '>' => t.push_str("#gt;"),
            '&' => t.push_str("#amp;"),
            c if c.is_control() => t.push(' '),
            c => t.push(c),
        }
    }
    t
}

fn mermaid_edge(out: &mut String, indent: &str, from: &str, to: &str, edge: &PlanEdge) {
    let arrow = if edge.dead_letter { "-.->" } else { "-->" };
    let _ = writeln!(
        out,
        "{indent}{from} {arrow}|\"{}\"| {to}",
        mermaid_text(&edge_label(edge))
    );
}

fn mermaid_pipeline(out: &mut String, pi: usize, plan: &PipelinePlan) {
    let _ = writeln!(
        out,
        "  subgraph p{pi} [\"pipeline {} ({})\"]",
        mermaid_text(&plan.id),
        super::guarantee::guarantee(&plan.spec).level
    );

    // Logical graph.
    let _ = writeln!(out, "    subgraph p{pi}_logical [\"logical\"]");
    let index = chain_index(plan);
    for (c, chain) in plan.chains.iter().enumerate() {
        let _ = writeln!(
            out,
            "      subgraph p{pi}_chain{c} [\"chain {} (x{})\"]",
            c + 1,
            chain.parallelism
        );
        for node in chain.nodes.iter().filter_map(|n| plan.nodes.get(n.0)) {
            mermaid_logical_node(out, "        ", pi, node);
        }
        out.push_str("      end\n");
    }
    for node in plan
        .nodes
        .iter()
        .filter(|n| index.get(n.index.0).copied().flatten().is_none())
    {
        mermaid_logical_node(out, "      ", pi, node);
    }
    for edge in &plan.edges {
        let from = format!("p{pi}_n{}", edge.from.0);
        let to = format!("p{pi}_n{}", edge.to.0);
        mermaid_edge(out, "      ", &from, &to, edge);
    }
    out.push_str("    end\n");

    // Physical graph.
    let _ = writeln!(out, "    subgraph p{pi}_physical [\"physical\"]");
    for (c, chain) in plan.chains.iter().enumerate() {
        let name = chain_name(plan, chain);
        let _ = writeln!(
            out,
            "      subgraph p{pi}_task{c} [\"{}\"]",
            mermaid_text(&format!("{name}[0..{})", chain.parallelism))
        );
        for (suffix, label) in drawn_subtasks(chain) {
            let _ = writeln!(
                out,
                "        p{pi}_t{c}_{suffix}[\"{}\"]",
                mermaid_text(&format!("{name}{label}"))
            );
        }
        out.push_str("      end\n");
    }
    for x in exchanges(plan) {
        let (from, to) = (&plan.chains[x.from_chain], &plan.chains[x.to_chain]);
        let (ups, downs) = (drawn_subtasks(from), drawn_subtasks(to));
        for (u, d) in drawn_connections(x.edge, from, to) {
            let from = format!("p{pi}_t{}_{}", x.from_chain, ups[u].0);
            let to = format!("p{pi}_t{}_{}", x.to_chain, downs[d].0);
            mermaid_edge(out, "      ", &from, &to, x.edge);
        }
    }
    out.push_str("    end\n  end\n");
}

fn mermaid_logical_node(out: &mut String, indent: &str, pi: usize, node: &PlanNode) {
    let _ = writeln!(
        out,
        "{indent}p{pi}_n{}[\"{}<br/>{}{}\"]",
        node.index.0,
        mermaid_text(&node.id),
        mermaid_text(&node_summary(node)),
        watermark_origin(node).map_or_else(String::new, |w| format!("<br/>{}", mermaid_text(&w)))
    );
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::plan::compile_file;
    use weir_schema::load_str;

    const YAML: &str = r#"version: 1
pipelines:
  - id: orders
    description: "Order totals.\nTwo lines."
    parallelism: 2
    sources:
      - {type: generator, id: orders, count: 10, fields: {n: {kind: sequence}}}
    operators:
      - {type: map, id: parse, input: orders, on_error: {dead_letter: dlq}, script: 'fn map(r) { r }'}
      - {type: key_by, id: by_n, input: parse, field: n}
      - {type: aggregate, id: totals, input: by_n, aggregations: [{fn: count}]}
    sinks:
      - {type: file, id: out, input: totals, path: out}
      - {type: file, id: dlq, path: dlq, parallelism: 1}
  - id: 'odd'
    sources:
      - {type: generator, id: 'a"b\c', count: 1, fields: {n: {kind: sequence}}}
    sinks:
      - {type: file, id: '<x#y>', input: 'a"b\c', path: out}
"#;

    fn file_plan() -> FilePlan {
        let loaded = load_str("test.yaml", YAML);
        assert!(
            !loaded.diagnostics.has_errors(),
            "test YAML does not load: {:?}",
            loaded.diagnostics
        );
        let spec = loaded.spec.expect("test YAML has a spec");
        compile_file(&spec, Path::new(".")).expect("plan compiles")
    }

    #[test]
    fn sources_with_event_time_are_marked_as_where_watermarks_originate() {
        let yaml = "version: 1\npipelines:\n  - id: p\n    sources:\n      - id: clicks\n        type: file\n        path: c.jsonl\n        event_time: {field: ts, max_out_of_orderness: 1s, idle_timeout: 30s}\n      - {id: plain, type: file, path: d.jsonl}\n    operators:\n      - {id: both, type: union, inputs: [clicks, plain]}\n    sinks:\n      - {id: out, type: stdout, input: both}\n";
        let loaded = load_str("w.yaml", yaml);
        let spec = loaded.spec.expect("spec");
        let plan = compile_file(&spec, Path::new(".")).expect("plan");
        let t = text(&plan);
        assert!(
            t.lines()
                .any(|l| l == "      clicks: file (x1), watermarks: ts - 1s (idle 30s)"),
            "{t}"
        );
        assert!(t.lines().any(|l| l == "      plain: file (x1)"), "{t}");
        assert!(dot(&plan).contains("watermarks: ts - 1s (idle 30s)"));
        assert!(mermaid(&plan).contains("<br/>watermarks: ts - 1s (idle 30s)"));
    }

    #[test]
    fn text_lists_nodes_edges_chains_and_exchanges() {
        let plan = file_plan();
        let t = text(&plan);
        assert_eq!(t, text(&plan), "output is deterministic");
        for line in [
            "pipeline orders (max_parallelism 128)",
            "  # Order totals.",
            "  # Two lines.",
            "      orders: generator (x2)",
            "      dlq: file (x1)",
            "      orders -> parse [forward]",
            "      by_n -> totals [hash]",
            "      parse -> dlq [rebalance, dead letter]",
            "      chain 1 (x2): orders -> parse",
            "      chain 2 (x2): by_n",
            "      chain 3 (x2): totals -> out",
            "      chain 4 (x1): dlq",
            "      orders+parse[0..2)",
            "      totals+out[0..2)",
            "      parse[0..2) =forward=> by_n[0..2) (one-to-one, i -> i)",
            "      by_n[0..2) =hash=> totals[0..2) (all-to-all)",
            "      parse[0..2) =rebalance=> dlq[0..1) (all-to-all, dead letters)",
        ] {
            assert!(
                t.lines().any(|l| l == line),
                "missing line {line:?} in:\n{t}"
            );
        }
        // 2 + 2 + 2 + 1 subtasks; channels 2 (forward) + 4 (hash) + 2 (dead letters).
        assert!(
            t.contains("physical graph (subtasks: 7, channels: 8)"),
            "{t}"
        );
        assert!(t.contains("pipeline odd"), "{t}");
        // Generator into a file sink without checkpoints: state and output lost on a crash.
        assert!(
            t.contains("  guarantee: at-most-once\n    - no checkpoints"),
            "{t}"
        );
        assert!(dot(&plan).contains("label=\"pipeline orders (at-most-once)\""));
        assert!(mermaid(&plan).contains("[\"pipeline orders (at-most-once)\"]"));
    }

    #[test]
    fn dot_contains_every_node_edge_and_chain() {
        let plan = file_plan();
        let d = dot(&plan);
        assert_eq!(d, dot(&plan), "output is deterministic");
        assert!(d.starts_with("digraph weir {"));
        assert_eq!(d.matches('{').count(), d.matches('}').count(), "{d}");
        for (pi, pipeline) in plan.pipelines.iter().enumerate() {
            for node in &pipeline.nodes {
                assert!(
                    d.contains(&format!("\"p{pi}_n{}\" [label=", node.index.0)),
                    "node {} missing:\n{d}",
                    node.id
                );
            }
            for edge in &pipeline.edges {
                assert!(
                    d.contains(&format!(
                        "\"p{pi}_n{}\" -> \"p{pi}_n{}\"",
                        edge.from.0, edge.to.0
                    )),
                    "edge {edge:?} missing:\n{d}"
                );
            }
            for c in 0..pipeline.chains.len() {
                assert!(
                    d.contains(&format!("subgraph \"cluster_p{pi}_chain{c}\"")),
                    "{d}"
                );
                assert!(
                    d.contains(&format!("subgraph \"cluster_p{pi}_task{c}\"")),
                    "{d}"
                );
            }
        }
        assert!(d.contains("[label=\"orders\\ngenerator x2\"]"), "{d}");
        assert!(d.contains("label=\"hash\""), "{d}");
        assert!(
            d.contains("[label=\"rebalance, dead letter\", style=dashed, color=red]"),
            "{d}"
        );
        // Ids are escaped inside quoted labels.
        assert!(d.contains(r#"[label="a\"b\\c\ngenerator x1"]"#), "{d}");
        // Physical: hash all-to-all between two subtasks each, forward one-to-one.
        for (u, v) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
            assert!(
                d.contains(&format!(
                    "\"p0_t1_s{u}\" -> \"p0_t2_s{v}\" [label=\"hash\"]"
                )),
                "{d}"
            );
        }
        assert!(
            d.contains("\"p0_t0_s1\" -> \"p0_t1_s1\" [label=\"forward\"]"),
            "{d}"
        );
        assert!(
            !d.contains("\"p0_t0_s0\" -> \"p0_t1_s1\" [label=\"forward\"]"),
            "{d}"
        );
    }

    #[test]
    fn mermaid_contains_every_node_edge_and_chain() {
        let plan = file_plan();
        let m = mermaid(&plan);
        assert_eq!(m, mermaid(&plan), "output is deterministic");
        assert!(m.starts_with("flowchart LR\n"));
        let opens = m
            .lines()
            .filter(|l| l.trim_start().starts_with("subgraph "))
            .count();
        let ends = m.lines().filter(|l| l.trim() == "end").count();
        assert_eq!(opens, ends, "{m}");
        for (pi, pipeline) in plan.pipelines.iter().enumerate() {
            for node in &pipeline.nodes {
                assert!(
                    m.contains(&format!("p{pi}_n{}[\"", node.index.0)),
                    "node {} missing:\n{m}",
                    node.id
                );
            }
            for edge in &pipeline.edges {
                let arrow = if edge.dead_letter { "-.->" } else { "-->" };
                assert!(
                    m.contains(&format!(
                        "p{pi}_n{} {arrow}|\"{}\"| p{pi}_n{}",
                        edge.from.0,
                        edge_label(edge),
                        edge.to.0
                    )),
                    "edge {edge:?} missing:\n{m}"
                );
            }
            for c in 0..pipeline.chains.len() {
                assert!(m.contains(&format!("subgraph p{pi}_chain{c} [")), "{m}");
                assert!(m.contains(&format!("subgraph p{pi}_task{c} [")), "{m}");
            }
        }
        assert!(m.contains("p0_n0[\"orders<br/>generator x2\"]"), "{m}");
        // Unsafe characters in ids become entity codes.
        assert!(m.contains("#lt;x#35;y#gt;"), "{m}");
        assert!(m.contains("a#quot;b\\c"), "{m}");
        assert!(!m.contains("<x#y>"), "{m}");
    }

    #[test]
    fn wide_tasks_are_drawn_as_one_range() {
        let loaded = load_str(
            "wide.yaml",
            "version: 1
pipelines:
  - id: wide
    parallelism: 20
    sources:
      - {type: generator, id: g, fields: {n: {kind: sequence}}}
    sinks:
      - {type: file, id: out, input: g, path: out, partitioning: rebalance}
",
        );
        let spec = loaded.spec.expect("test YAML has a spec");
        let plan = compile_file(&spec, Path::new(".")).expect("plan compiles");
        let d = dot(&plan);
        assert!(
            d.contains("\"p0_t0_all\" -> \"p0_t1_all\" [label=\"rebalance\"]"),
            "{d}"
        );
        assert!(!d.contains("p0_t0_s0"), "{d}");
        let m = mermaid(&plan);
        assert!(m.contains("p0_t0_all[\"g[0..20)\"]"), "{m}");
        let t = text(&plan);
        assert!(
            t.contains("g[0..20) =rebalance=> out[0..20) (all-to-all)"),
            "{t}"
        );
        assert!(t.contains("(subtasks: 40, channels: 400)"), "{t}");
    }

    #[test]
    fn empty_file_plan_renders_headers_only() {
        let plan = FilePlan {
            pipelines: Vec::new(),
        };
        assert_eq!(text(&plan), "");
        assert_eq!(
            dot(&plan),
            "digraph weir {\n  rankdir=LR;\n  node [shape=box];\n}\n"
        );
        assert_eq!(mermaid(&plan), "flowchart LR\n");
    }
}
