//! Compiling one [`PipelineSpec`] into a [`PipelinePlan`]: resolving input names to node ids,
//! ordering the nodes topologically, choosing each edge's partitioning, adding dead-letter
//! edges, grouping forward-connected nodes into chains and loading script text.
//!
//! This module owns the rules that turn wiring into a graph; it must not build operators,
//! compile Rhai or touch the runtime. It trusts validation for the finer rules but checks
//! everything it relies on, returning a [`PlanError`] instead of panicking.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;

use weir_schema::registry::ScriptRef;
use weir_schema::{OnErrorSpec, OperatorSpec, PartitioningSpec, PipelineSpec};

use super::{Chain, NodeId, NodeKind, Partitioning, PipelinePlan, PlanEdge, PlanError, PlanNode};

/// Plans one pipeline: one node per source, operator and sink, in topological order (ties
/// broken by declaration order: sources, then operators, then sinks), data and dead-letter
/// edges with their partitioning, and maximal chains.
///
/// Relative `script_file` paths are read relative to `base_dir`, which is also stored in the
/// plan; the runtime's own paths (checkpoint storage, savepoints, RocksDB's local directory)
/// are resolved against it here, into [`super::PipelinePaths`].
///
/// # Errors
///
/// [`PlanError::UnknownInput`] for an input that names no element, [`PlanError::Cycle`] when
/// the wiring (dead-letter edges included) has a cycle, [`PlanError::ScriptFile`] when a script
/// file cannot be read, and [`PlanError::Invalid`] for anything else validation should have
/// caught: duplicate ids, a zero parallelism, reading from a sink, a dead-letter target that is
/// not a sink, or `partitioning: forward` between elements of unequal parallelism.
pub fn compile(spec: &PipelineSpec, base_dir: &Path) -> Result<PipelinePlan, PlanError> {
    let pipeline = spec.id.as_str();
    let elements = collect_elements(spec)?;
    let wiring = resolve(pipeline, &elements)?;
    let order = topological_order(pipeline, &elements, &wiring)?;

    // `position[declaration index]` is the node's index in the plan.
    let mut position = vec![0; elements.len()];
    for (pos, &decl) in order.iter().enumerate() {
        position[decl] = pos;
    }

    let edges = build_edges(pipeline, &elements, &wiring, &order, &position)?;

    let mut nodes = Vec::with_capacity(order.len());
    for (pos, &decl) in order.iter().enumerate() {
        let element = &elements[decl];
        nodes.push(PlanNode {
            index: NodeId(pos),
            id: element.id.to_owned(),
            kind: element.kind.clone(),
            parallelism: element.parallelism,
            script: load_script(pipeline, element, base_dir)?,
            script_origin: None,
        });
    }

    let chains = build_chains(&nodes, &edges);

    Ok(PipelinePlan {
        id: spec.id.clone(),
        spec: spec.clone(),
        max_parallelism: spec.effective_max_parallelism(),
        base_dir: base_dir.to_path_buf(),
        nodes,
        edges,
        chains,
        paths: super::PipelinePaths::resolve(spec, base_dir),
    })
}

/// A source, operator or sink with its resolved parallelism, in declaration order.
struct Element<'a> {
    id: &'a str,
    kind: NodeKind,
    parallelism: u32,
    /// Input names, in `input`, then `inputs` order.
    inputs: Vec<&'a str>,
    /// The sink named by `on_error: dead_letter`.
    dead_letter: Option<&'a str>,
    /// The sink named by a window's `late`.
    late: Option<&'a str>,
    /// The declared exchange from the inputs.
    partitioning: Option<PartitioningSpec>,
}

impl Element<'_> {
    fn is_sink(&self) -> bool {
        matches!(self.kind, NodeKind::Sink(_))
    }

    fn is_key_by(&self) -> bool {
        matches!(self.kind, NodeKind::Operator(OperatorSpec::KeyBy(_)))
    }
}

/// The wiring with names resolved to declaration indices.
struct Wiring {
    /// Per element, the elements it reads from, in declaration order of its inputs.
    inputs: Vec<Vec<usize>>,
    /// Per element, the sink its failed records go to.
    dead_letter: Vec<Option<usize>>,
    /// Per element, the sink its late records go to.
    late: Vec<Option<usize>>,
}

fn invalid(pipeline: &str, message: String) -> PlanError {
    PlanError::Invalid {
        pipeline: pipeline.to_owned(),
        message,
    }
}

/// Lists every element in declaration order with its resolved parallelism.
fn collect_elements(spec: &PipelineSpec) -> Result<Vec<Element<'_>>, PlanError> {
    let mut elements =
        Vec::with_capacity(spec.sources.len() + spec.operators.len() + spec.sinks.len());
    for source in &spec.sources {
        elements.push(Element {
            id: source.id(),
            kind: NodeKind::Source(source.clone()),
            parallelism: source.parallelism().unwrap_or(spec.parallelism),
            inputs: Vec::new(),
            dead_letter: source.dead_letter(),
            late: None,
            partitioning: None,
        });
    }
    for operator in &spec.operators {
        let dead_letter = match operator.on_error() {
            OnErrorSpec::DeadLetter(sink) => Some(sink.as_str()),
            OnErrorSpec::Fail | OnErrorSpec::Skip => None,
        };
        elements.push(Element {
            id: operator.id(),
            kind: NodeKind::Operator(operator.clone()),
            parallelism: operator.parallelism().unwrap_or(spec.parallelism),
            inputs: operator
                .wiring()
                .names()
                .into_iter()
                .map(|(name, _)| name)
                .collect(),
            dead_letter,
            late: operator.late_target(),
            partitioning: operator.partitioning(),
        });
    }
    for sink in &spec.sinks {
        elements.push(Element {
            id: sink.id(),
            kind: NodeKind::Sink(sink.clone()),
            parallelism: sink.parallelism().unwrap_or(spec.parallelism),
            inputs: sink
                .wiring()
                .names()
                .into_iter()
                .map(|(name, _)| name)
                .collect(),
            dead_letter: None,
            late: None,
            partitioning: sink.partitioning(),
        });
    }
    if let Some(zero) = elements.iter().find(|e| e.parallelism == 0) {
        return Err(invalid(
            &spec.id,
            format!("`{}` has parallelism 0; it must be at least 1", zero.id),
        ));
    }
    Ok(elements)
}

/// Resolves input and dead-letter names to declaration indices.
fn resolve(pipeline: &str, elements: &[Element<'_>]) -> Result<Wiring, PlanError> {
    let mut by_id: HashMap<&str, usize> = HashMap::with_capacity(elements.len());
    for (index, element) in elements.iter().enumerate() {
        if by_id.insert(element.id, index).is_some() {
            return Err(invalid(
                pipeline,
                format!("the id `{}` is declared more than once", element.id),
            ));
        }
    }

    let mut inputs = Vec::with_capacity(elements.len());
    let mut dead_letter = Vec::with_capacity(elements.len());
    let mut late = Vec::with_capacity(elements.len());
    for element in elements {
        let mut resolved = Vec::with_capacity(element.inputs.len());
        for &name in &element.inputs {
            let Some(&index) = by_id.get(name) else {
                return Err(PlanError::UnknownInput {
                    pipeline: pipeline.to_owned(),
                    element: element.id.to_owned(),
                    input: name.to_owned(),
                });
            };
            if elements[index].is_sink() {
                return Err(invalid(
                    pipeline,
                    format!(
                        "`{}` reads from `{name}`, which is a sink and produces no records",
                        element.id
                    ),
                ));
            }
            resolved.push(index);
        }
        inputs.push(resolved);

        let target = match element.dead_letter {
            None => None,
            Some(name) => match by_id.get(name) {
                Some(&index) if elements[index].is_sink() => Some(index),
                Some(_) => {
                    return Err(invalid(
                        pipeline,
                        format!(
                            "`{}` sends dead letters to `{name}`, which is not a sink",
                            element.id
                        ),
                    ));
                }
                None => {
                    return Err(invalid(
                        pipeline,
                        format!(
                            "`{}` sends dead letters to `{name}`, which does not exist",
                            element.id
                        ),
                    ));
                }
            },
        };
        dead_letter.push(target);
        late.push(match element.late {
            None => None,
            Some(name) => Some(side_target(
                pipeline,
                elements,
                &by_id,
                element.id,
                name,
                "late records",
            )?),
        });
    }
    Ok(Wiring {
        inputs,
        dead_letter,
        late,
    })
}

/// Resolves the sink `name` that `element` sends `what` to.
fn side_target(
    pipeline: &str,
    elements: &[Element<'_>],
    by_id: &HashMap<&str, usize>,
    element: &str,
    name: &str,
    what: &str,
) -> Result<usize, PlanError> {
    match by_id.get(name) {
        Some(&index) if elements[index].is_sink() => Ok(index),
        Some(_) => Err(invalid(
            pipeline,
            format!("`{element}` sends {what} to `{name}`, which is not a sink"),
        )),
        None => Err(invalid(
            pipeline,
            format!("`{element}` sends {what} to `{name}`, which does not exist"),
        )),
    }
}

/// Kahn's algorithm over data and side-output edges; among ready elements the first declared
/// goes first. Returns declaration indices in plan order.
fn topological_order(
    pipeline: &str,
    elements: &[Element<'_>],
    wiring: &Wiring,
) -> Result<Vec<usize>, PlanError> {
    let n = elements.len();
    let mut successors: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut predecessors: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut in_degree = vec![0usize; n];
    let mut connect = |from: usize, to: usize| {
        successors[from].push(to);
        predecessors[to].push(from);
        in_degree[to] += 1;
    };
    for (to, inputs) in wiring.inputs.iter().enumerate() {
        for &from in inputs {
            connect(from, to);
        }
    }
    for side in [&wiring.dead_letter, &wiring.late] {
        for (from, target) in side.iter().enumerate() {
            if let Some(to) = *target {
                connect(from, to);
            }
        }
    }

    let mut ready: BTreeSet<usize> = (0..n).filter(|&i| in_degree[i] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(next) = ready.pop_first() {
        order.push(next);
        for &succ in &successors[next] {
            in_degree[succ] -= 1;
            if in_degree[succ] == 0 {
                ready.insert(succ);
            }
        }
    }
    if order.len() == n {
        return Ok(order);
    }

    // Every element left over has a left-over predecessor; walking predecessors from the first
    // one declared must revisit an element, and that element lies on a cycle.
    let mut placed = vec![false; n];
    for &i in &order {
        placed[i] = true;
    }
    let mut current = (0..n).find(|&i| !placed[i]).unwrap_or(0);
    let mut seen = vec![false; n];
    while !seen[current] {
        seen[current] = true;
        match predecessors[current].iter().find(|&&p| !placed[p]) {
            Some(&p) => current = p,
            None => break,
        }
    }
    Err(PlanError::Cycle {
        pipeline: pipeline.to_owned(),
        element: elements[current].id.to_owned(),
    })
}

/// Data edges in wiring order, then dead-letter edges, grouped by downstream node (stable).
fn build_edges(
    pipeline: &str,
    elements: &[Element<'_>],
    wiring: &Wiring,
    order: &[usize],
    position: &[usize],
) -> Result<Vec<PlanEdge>, PlanError> {
    let mut edges = Vec::new();
    for (to, &decl) in order.iter().enumerate() {
        let downstream = &elements[decl];
        for &input in &wiring.inputs[decl] {
            edges.push(PlanEdge {
                from: NodeId(position[input]),
                to: NodeId(to),
                partitioning: data_partitioning(pipeline, &elements[input], downstream)?,
                dead_letter: false,
                late: false,
            });
        }
    }
    for &decl in order {
        let sides = [(wiring.dead_letter[decl], false), (wiring.late[decl], true)];
        for (target, late) in sides {
            let Some(target) = target else { continue };
            let partitioning = if elements[decl].parallelism == elements[target].parallelism {
                Partitioning::Forward
            } else {
                Partitioning::Rebalance
            };
            edges.push(PlanEdge {
                from: NodeId(position[decl]),
                to: NodeId(position[target]),
                partitioning,
                dead_letter: true,
                late,
            });
        }
    }
    edges.sort_by_key(|e| e.to);
    Ok(edges)
}

/// The exchange on a data edge: always hash out of a `key_by`, else the declared one, else
/// forward for equal parallelism and rebalance otherwise.
fn data_partitioning(
    pipeline: &str,
    upstream: &Element<'_>,
    downstream: &Element<'_>,
) -> Result<Partitioning, PlanError> {
    if upstream.is_key_by() {
        return Ok(Partitioning::Hash);
    }
    let equal = upstream.parallelism == downstream.parallelism;
    Ok(match downstream.partitioning {
        Some(PartitioningSpec::Forward) if !equal => {
            return Err(invalid(
                pipeline,
                format!(
                    "`{}` declares `partitioning: forward`, but its parallelism {} differs from its input `{}`'s {}",
                    downstream.id, downstream.parallelism, upstream.id, upstream.parallelism
                ),
            ));
        }
        Some(PartitioningSpec::Forward) => Partitioning::Forward,
        Some(PartitioningSpec::Rebalance) => Partitioning::Rebalance,
        Some(PartitioningSpec::Broadcast) => Partitioning::Broadcast,
        None if equal => Partitioning::Forward,
        None => Partitioning::Rebalance,
    })
}

/// Groups nodes into maximal chains. A node joins its upstream's chain when its only incoming
/// edge is forward with equal parallelism, that upstream has no other outgoing edge, and the
/// node is not a union. Nodes arrive in topological order, so the upstream's chain exists and
/// the upstream is its last node.
fn build_chains(nodes: &[PlanNode], edges: &[PlanEdge]) -> Vec<Chain> {
    let n = nodes.len();
    let mut incoming: Vec<Vec<&PlanEdge>> = vec![Vec::new(); n];
    let mut out_degree = vec![0usize; n];
    for edge in edges {
        if edge.from.0 < n && edge.to.0 < n {
            incoming[edge.to.0].push(edge);
            out_degree[edge.from.0] += 1;
        }
    }

    let mut chains: Vec<Chain> = Vec::new();
    let mut chain_of: Vec<Option<usize>> = vec![None; n];
    for node in nodes {
        let is_union = matches!(node.kind, NodeKind::Operator(OperatorSpec::Union(_)));
        let joins = match incoming[node.index.0].as_slice() {
            [edge]
                if !is_union
                    && edge.partitioning == Partitioning::Forward
                    && nodes[edge.from.0].parallelism == node.parallelism
                    && out_degree[edge.from.0] == 1 =>
            {
                chain_of[edge.from.0]
            }
            _ => None,
        };
        match joins.and_then(|c| chains.get_mut(c).map(|chain| (c, chain))) {
            Some((c, chain)) => {
                chain.nodes.push(node.index);
                chain_of[node.index.0] = Some(c);
            }
            None => {
                chain_of[node.index.0] = Some(chains.len());
                chains.push(Chain {
                    nodes: vec![node.index],
                    parallelism: node.parallelism,
                });
            }
        }
    }
    chains
}

/// The script text of an operator: inline, or read from `script_file` relative to `base_dir`.
fn load_script(
    pipeline: &str,
    element: &Element<'_>,
    base_dir: &Path,
) -> Result<Option<Arc<str>>, PlanError> {
    let NodeKind::Operator(operator) = &element.kind else {
        return Ok(None);
    };
    match operator.script() {
        None => Ok(None),
        Some(ScriptRef::Inline(text)) => Ok(Some(Arc::from(text))),
        Some(ScriptRef::File(file)) => {
            let path = base_dir.join(file);
            // Bounded like the pipeline file (a device or a huge file is an error).
            match weir_schema::read_text(&path) {
                Ok(text) => Ok(Some(Arc::from(text))),
                Err(e) => Err(PlanError::ScriptFile {
                    pipeline: pipeline.to_owned(),
                    element: element.id.to_owned(),
                    path,
                    source: Box::new(e),
                }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_schema::load_str;

    /// Parses a file holding one pipeline and returns that pipeline.
    fn pipeline(yaml: &str) -> PipelineSpec {
        let loaded = load_str("test.yaml", yaml);
        assert!(
            !loaded.diagnostics.has_errors(),
            "test YAML does not load: {:?}",
            loaded.diagnostics
        );
        let mut file = loaded.spec.expect("test YAML has a spec");
        assert_eq!(file.pipelines.len(), 1);
        file.pipelines.remove(0)
    }

    fn plan(yaml: &str) -> PipelinePlan {
        compile(&pipeline(yaml), Path::new(".")).expect("plan compiles")
    }

    fn ids(plan: &PipelinePlan) -> Vec<&str> {
        plan.nodes.iter().map(|n| n.id.as_str()).collect()
    }

    fn edge<'a>(plan: &'a PipelinePlan, from: &str, to: &str) -> &'a PlanEdge {
        let from = plan.node_by_id(from).expect("from node").index;
        let to = plan.node_by_id(to).expect("to node").index;
        plan.edges
            .iter()
            .find(|e| e.from == from && e.to == to)
            .expect("edge exists")
    }

    fn chains(plan: &PipelinePlan) -> Vec<Vec<&str>> {
        plan.chains
            .iter()
            .map(|c| {
                c.nodes
                    .iter()
                    .map(|n| plan.nodes[n.0].id.as_str())
                    .collect()
            })
            .collect()
    }

    const GEN: &str = "{type: generator, id: gen, count: 10, fields: {n: {kind: sequence}}}";

    #[test]
    fn nodes_are_in_topological_order_with_declaration_tie_break() {
        let p = plan(&format!(
            "version: 1
pipelines:
  - id: p
    sources:
      - {GEN}
      - {{type: generator, id: gen2, fields: {{n: {{kind: sequence}}}}}}
    operators:
      - {{type: filter, id: late, input: early, script: 'fn filter(r) {{ true }}'}}
      - {{type: map, id: early, input: gen, script: 'fn map(r) {{ r }}'}}
      - {{type: union, id: both, inputs: [late, gen2]}}
    sinks:
      - {{type: file, id: out, input: both, path: out}}
"
        ));
        assert_eq!(ids(&p), ["gen", "gen2", "early", "late", "both", "out"]);
        for (i, node) in p.nodes.iter().enumerate() {
            assert_eq!(node.index, NodeId(i));
        }
        for e in &p.edges {
            assert!(e.from < e.to, "edge {e:?} goes backwards");
        }
        assert_eq!(p.edges.len(), 5);
        assert_eq!(p.max_parallelism, 128);
        assert_eq!(p.id, "p");
    }

    #[test]
    fn parallelism_overrides_and_stdio_are_one() {
        let p = plan(
            "version: 1
pipelines:
  - id: p
    parallelism: 4
    sources:
      - {type: stdin, id: in}
    operators:
      - {type: map, id: m, input: in, parallelism: 3, script: 'fn map(r) { r }'}
      - {type: map, id: d, input: m, script: 'fn map(r) { r }'}
    sinks:
      - {type: stdout, id: out, input: d}
",
        );
        let par: Vec<u32> = p.nodes.iter().map(|n| n.parallelism).collect();
        assert_eq!(par, [1, 3, 4, 1]);
        assert_eq!(
            p.node_by_id("m").and_then(|n| n.script.as_deref()),
            Some("fn map(r) { r }")
        );
        assert!(p.node_by_id("in").is_some_and(|n| n.script.is_none()));
    }

    #[test]
    fn key_by_edges_are_hash() {
        let p = plan(&format!(
            "version: 1
pipelines:
  - id: p
    parallelism: 2
    sources:
      - {GEN}
    operators:
      - {{type: key_by, id: k, input: gen, field: n}}
      - {{type: aggregate, id: agg, input: k, aggregations: [{{fn: count}}]}}
      - {{type: map, id: after, input: k, script: 'fn map(r) {{ r }}'}}
    sinks:
      - {{type: file, id: out, inputs: [agg, after], path: out}}
"
        ));
        assert_eq!(edge(&p, "gen", "k").partitioning, Partitioning::Forward);
        assert_eq!(edge(&p, "k", "agg").partitioning, Partitioning::Hash);
        assert_eq!(edge(&p, "k", "after").partitioning, Partitioning::Hash);
        assert_eq!(edge(&p, "agg", "out").partitioning, Partitioning::Forward);
    }

    #[test]
    fn parallelism_change_rebalances() {
        let p = plan(&format!(
            "version: 1
pipelines:
  - id: p
    parallelism: 2
    sources:
      - {GEN}
    operators:
      - {{type: map, id: m, input: gen, parallelism: 3, script: 'fn map(r) {{ r }}'}}
    sinks:
      - {{type: stdout, id: out, input: m}}
"
        ));
        assert_eq!(edge(&p, "gen", "m").partitioning, Partitioning::Rebalance);
        assert_eq!(edge(&p, "m", "out").partitioning, Partitioning::Rebalance);
        assert_eq!(chains(&p), [vec!["gen"], vec!["m"], vec!["out"]]);
    }

    #[test]
    fn declared_broadcast_and_rebalance_are_kept() {
        let p = plan(&format!(
            "version: 1
pipelines:
  - id: p
    parallelism: 2
    sources:
      - {GEN}
    operators:
      - {{type: map, id: b, input: gen, partitioning: broadcast, script: 'fn map(r) {{ r }}'}}
    sinks:
      - {{type: file, id: out, input: b, path: out, partitioning: rebalance}}
"
        ));
        assert_eq!(edge(&p, "gen", "b").partitioning, Partitioning::Broadcast);
        assert_eq!(edge(&p, "b", "out").partitioning, Partitioning::Rebalance);
        assert_eq!(p.chains.len(), 3, "no forward edge, so nothing chains");
    }

    #[test]
    fn forward_with_unequal_parallelism_is_rejected() {
        let spec = pipeline(&format!(
            "version: 1
pipelines:
  - id: p
    sources:
      - {GEN}
    operators:
      - {{type: map, id: m, input: gen, parallelism: 2, partitioning: forward, script: 'fn map(r) {{ r }}'}}
    sinks:
      - {{type: stdout, id: out, input: m}}
"
        ));
        let err = compile(&spec, Path::new(".")).expect_err("forward 1 -> 2 is invalid");
        assert!(
            matches!(&err, PlanError::Invalid { pipeline, message } if pipeline == "p" && message.contains("`m`")),
            "{err}"
        );
    }

    #[test]
    fn forward_runs_chain_and_unions_and_fan_out_break_chains() {
        let p = plan(&format!(
            "version: 1
pipelines:
  - id: p
    parallelism: 2
    sources:
      - {GEN}
      - {{type: generator, id: other, fields: {{n: {{kind: sequence}}}}}}
    operators:
      - {{type: map, id: parse, input: gen, script: 'fn map(r) {{ r }}'}}
      - {{type: filter, id: big, input: parse, script: 'fn filter(r) {{ true }}'}}
      - {{type: union, id: u, input: other}}
      - {{type: map, id: after_union, input: u, script: 'fn map(r) {{ r }}'}}
    sinks:
      - {{type: file, id: a, input: big, path: a}}
      - {{type: file, id: b, input: big, path: b}}
      - {{type: file, id: c, input: after_union, path: c}}
"
        ));
        assert_eq!(
            chains(&p),
            [
                vec!["gen", "parse", "big"],
                vec!["other"],
                vec!["u", "after_union", "c"],
                vec!["a"],
                vec!["b"]
            ]
        );
        assert!(p.chains.iter().all(|c| c.parallelism == 2));
        // Every node in exactly one chain.
        for node in &p.nodes {
            assert_eq!(
                p.chains
                    .iter()
                    .filter(|c| c.nodes.contains(&node.index))
                    .count(),
                1
            );
        }
        // Chains in topological order of their heads.
        let heads: Vec<NodeId> = p.chains.iter().map(|c| c.nodes[0]).collect();
        assert!(heads.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn dead_letter_edge_goes_to_the_sink_and_ends_the_chain() {
        let p = plan(&format!(
            "version: 1
pipelines:
  - id: p
    parallelism: 2
    sources:
      - {GEN}
    operators:
      - {{type: map, id: m, input: gen, on_error: {{dead_letter: dlq}}, script: 'fn map(r) {{ r }}'}}
    sinks:
      - {{type: file, id: out, input: m, path: out}}
      - {{type: stdout, id: dlq}}
"
        ));
        let dl = edge(&p, "m", "dlq");
        assert!(dl.dead_letter);
        assert_eq!(dl.partitioning, Partitioning::Rebalance);
        assert!(!edge(&p, "m", "out").dead_letter);
        assert_eq!(p.outputs_of(dl.from).count(), 2);
        assert_eq!(chains(&p), [vec!["gen", "m"], vec!["out"], vec!["dlq"]]);
    }

    #[test]
    fn a_late_edge_is_a_side_output_of_its_own() {
        let p = plan(&format!(
            "version: 1
pipelines:
  - id: p
    sources:
      - {GEN}
    operators:
      - {{type: key_by, id: by, input: gen, field: n}}
      - {{type: window, id: w, input: by, window: {{tumbling: {{size: 1s}}}}, time_field: n, aggregations: [{{fn: count}}], late: slow, on_error: {{dead_letter: dlq}}}}
    sinks:
      - {{type: file, id: out, input: w, path: out}}
      - {{type: file, id: slow, path: slow}}
      - {{type: file, id: dlq, path: dlq}}
"
        ));
        let late = edge(&p, "w", "slow");
        assert!(late.dead_letter && late.late);
        let dl = edge(&p, "w", "dlq");
        assert!(dl.dead_letter && !dl.late);
        assert!(!edge(&p, "w", "out").late);
    }

    #[test]
    fn dead_letter_edge_with_equal_parallelism_is_forward() {
        let p = plan(&format!(
            "version: 1
pipelines:
  - id: p
    sources:
      - {GEN}
    operators:
      - {{type: map, id: m, input: gen, on_error: {{dead_letter: dlq}}, script: 'fn map(r) {{ r }}'}}
    sinks:
      - {{type: file, id: out, input: m, path: out}}
      - {{type: file, id: dlq, path: dlq}}
"
        ));
        let dl = edge(&p, "m", "dlq");
        assert!(dl.dead_letter);
        assert_eq!(dl.partitioning, Partitioning::Forward);
    }

    #[test]
    fn cycle_is_an_error_naming_an_element_on_it() {
        let spec = pipeline(&format!(
            "version: 1
pipelines:
  - id: p
    sources:
      - {GEN}
    operators:
      - {{type: union, id: a, inputs: [gen, c]}}
      - {{type: map, id: b, input: a, script: 'fn map(r) {{ r }}'}}
      - {{type: map, id: c, input: b, script: 'fn map(r) {{ r }}'}}
      - {{type: map, id: after, input: c, script: 'fn map(r) {{ r }}'}}
    sinks:
      - {{type: file, id: out, input: after, path: out}}
"
        ));
        match compile(&spec, Path::new(".")) {
            Err(PlanError::Cycle { pipeline, element }) => {
                assert_eq!(pipeline, "p");
                assert!(
                    ["a", "b", "c"].contains(&element.as_str()),
                    "{element} is not on the cycle"
                );
            }
            other => panic!("expected a cycle error, got {other:?}"),
        }
    }

    #[test]
    fn self_loop_is_a_cycle() {
        let spec = pipeline(&format!(
            "version: 1
pipelines:
  - id: p
    sources:
      - {GEN}
    operators:
      - {{type: union, id: u, inputs: [gen, u]}}
    sinks:
      - {{type: file, id: out, input: u, path: out}}
"
        ));
        assert!(
            matches!(compile(&spec, Path::new(".")), Err(PlanError::Cycle { element, .. }) if element == "u")
        );
    }

    #[test]
    fn unknown_input_is_an_error() {
        let spec = pipeline(&format!(
            "version: 1
pipelines:
  - id: p
    sources:
      - {GEN}
    operators:
      - {{type: map, id: m, input: nope, script: 'fn map(r) {{ r }}'}}
    sinks:
      - {{type: file, id: out, input: m, path: out}}
"
        ));
        match compile(&spec, Path::new(".")) {
            Err(PlanError::UnknownInput {
                pipeline,
                element,
                input,
            }) => {
                assert_eq!(
                    (pipeline.as_str(), element.as_str(), input.as_str()),
                    ("p", "m", "nope")
                );
            }
            other => panic!("expected an unknown-input error, got {other:?}"),
        }
    }

    #[test]
    fn bad_dead_letter_targets_and_duplicate_ids_are_invalid() {
        for yaml in [
            format!(
                "version: 1
pipelines:
  - id: p
    sources: [{GEN}]
    operators:
      - {{type: map, id: m, input: gen, on_error: {{dead_letter: missing}}, script: 'fn map(r) {{ r }}'}}
    sinks: [{{type: file, id: out, input: m, path: out}}]
"
            ),
            format!(
                "version: 1
pipelines:
  - id: p
    sources: [{GEN}]
    operators:
      - {{type: map, id: m, input: gen, on_error: {{dead_letter: gen}}, script: 'fn map(r) {{ r }}'}}
    sinks: [{{type: file, id: out, input: m, path: out}}]
"
            ),
            format!(
                "version: 1
pipelines:
  - id: p
    sources: [{GEN}]
    sinks: [{{type: file, id: gen, input: gen, path: out}}]
"
            ),
        ] {
            let spec = pipeline(&yaml);
            assert!(matches!(compile(&spec, Path::new(".")), Err(PlanError::Invalid { .. })), "{yaml}");
        }
    }

    #[test]
    fn script_file_is_read_relative_to_base_dir() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir(dir.path().join("scripts")).expect("mkdir");
        std::fs::write(dir.path().join("scripts/m.rhai"), "fn map(r) { r }\n")
            .expect("write script");
        let spec = pipeline(&format!(
            "version: 1
pipelines:
  - id: p
    sources: [{GEN}]
    operators:
      - {{type: map, id: m, input: gen, script_file: scripts/m.rhai}}
      - {{type: map, id: missing, input: m, script_file: scripts/nope.rhai}}
    sinks: [{{type: file, id: out, input: m, path: out}}]
"
        ));
        match compile(&spec, dir.path()) {
            Err(PlanError::ScriptFile { element, path, .. }) => {
                assert_eq!(element, "missing");
                assert_eq!(path, dir.path().join("scripts/nope.rhai"));
            }
            other => panic!("expected a script-file error, got {other:?}"),
        }

        let mut spec = spec;
        spec.operators.truncate(1);
        let p = compile(&spec, dir.path()).expect("plan compiles");
        assert_eq!(
            p.node_by_id("m").and_then(|n| n.script.as_deref()),
            Some("fn map(r) { r }\n")
        );
        assert_eq!(p.base_dir, dir.path());
    }
}
