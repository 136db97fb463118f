//! A workflow drawn as inline SVG on the server: tasks laid out in layers by
//! their longest path from a root (a task always sits right of everything
//! it waits for), ordered within a layer by where their upstream tasks sit,
//! then by id, so the same graph always draws the same way.

use std::collections::{BTreeSet, HashMap};

use maud::{Markup, html};

use crate::workflow::WorkflowGraph;

const NODE_W: usize = 176;
const NODE_H: usize = 44;
const COL_GAP: usize = 72;
const ROW_GAP: usize = 16;
const MARGIN: usize = 12;
/// Characters of a task name shown in its box (the whole name is its title).
const NAME_CHARS: usize = 22;

/// The states in the legend's order, with their fill colours.
pub(crate) const STATE_COLOURS: [(&str, &str); 7] = [
    ("pending", "#e4e4e7"),
    ("queued", "#cfe0fc"),
    ("processing", "#fde68a"),
    ("errored", "#fdc98f"),
    ("completed", "#bfe5c2"),
    ("failed", "#f6b3ad"),
    ("canceled", "#d6cce4"),
];

fn colour(state: &str) -> &'static str {
    STATE_COLOURS
        .iter()
        .find(|(s, _)| *s == state)
        .map_or("#ffffff", |(_, c)| c)
}

/// A place in a layer: a task, or a bend of an edge that spans more than
/// one layer (it takes a row of its own, so it runs between boxes, never
/// through one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Slot {
    /// A task, by its id.
    Task(i64),
    /// The `step`-th bend of edge `(from, to)`.
    Bend(i64, i64, usize),
}

/// Layers of slots, left to right. `nodes` are `(id, upstream ids)`;
/// upstream ids that are not nodes are ignored. A node's layer is one more
/// than the highest layer among its upstream nodes (0 for a root); an edge
/// spanning several layers gets a bend in each layer between. Within a
/// layer, slots are ordered by the mean row of what they come from, tasks
/// before bends, then by id.
pub(crate) fn slots(nodes: &[(i64, Vec<i64>)]) -> Vec<Vec<Slot>> {
    let known: HashMap<i64, usize> = nodes.iter().enumerate().map(|(i, n)| (n.0, i)).collect();
    let ups: Vec<Vec<usize>> = nodes
        .iter()
        .map(|(id, up)| {
            let mut u: Vec<usize> = up
                .iter()
                .filter(|u| *u != id)
                .filter_map(|u| known.get(u).copied())
                .collect();
            u.sort_unstable();
            u.dedup();
            u
        })
        .collect();
    let mut downs: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    let mut waiting: Vec<usize> = ups.iter().map(Vec::len).collect();
    for (d, us) in ups.iter().enumerate() {
        for &u in us {
            downs[u].push(d);
        }
    }
    // Kahn's order, lowest index first: deterministic.
    let mut ready: BTreeSet<usize> = (0..nodes.len()).filter(|&i| waiting[i] == 0).collect();
    let mut layer = vec![None::<usize>; nodes.len()];
    while let Some(i) = ready.pop_first() {
        let l = ups[i].iter().filter_map(|&u| layer[u]).map(|l| l + 1).max();
        layer[i] = Some(l.unwrap_or(0));
        for &d in &downs[i] {
            waiting[d] -= 1;
            if waiting[d] == 0 {
                ready.insert(d);
            }
        }
    }
    // A cycle cannot be enqueued; should one be in the data anyway, its
    // tasks go in a last layer rather than nowhere.
    let last = layer.iter().flatten().max().map_or(0, |l| l + 1);
    let layer: Vec<usize> = layer.into_iter().map(|l| l.unwrap_or(last)).collect();
    let depth = layer.iter().max().map_or(0, |l| l + 1);
    // Each slot with what it comes from (the slots of the layer before it).
    let mut out: Vec<Vec<(Slot, Vec<Slot>)>> = vec![Vec::new(); depth];
    for (i, &l) in layer.iter().enumerate() {
        let mut from = Vec::new();
        for &u in &ups[i] {
            let (id, uid) = (nodes[i].0, nodes[u].0);
            let mut prev = Slot::Task(uid);
            for (step, bend_layer) in (layer[u] + 1..l).enumerate() {
                let bend = Slot::Bend(uid, id, step);
                out[bend_layer].push((bend, vec![prev]));
                prev = bend;
            }
            from.push(prev);
        }
        out[l].push((Slot::Task(nodes[i].0), from));
    }
    let mut row: HashMap<Slot, usize> = HashMap::new();
    let mut layers = Vec::with_capacity(depth);
    for mut slots in out {
        let key = |(slot, from): &(Slot, Vec<Slot>)| {
            let rows: Vec<usize> = from.iter().filter_map(|f| row.get(f).copied()).collect();
            #[allow(clippy::cast_precision_loss)] // a few hundred slots at most
            let mean = if rows.is_empty() {
                0.0
            } else {
                rows.iter().sum::<usize>() as f64 / rows.len() as f64
            };
            let tie = match *slot {
                Slot::Task(id) => (0, id, 0, 0),
                Slot::Bend(from, to, step) => (1, from, to, step),
            };
            (mean, tie)
        };
        let mut keyed: Vec<_> = slots.drain(..).map(|s| (key(&s), s.0)).collect();
        keyed.sort_by(|a, b| a.0.0.total_cmp(&b.0.0).then(a.0.1.cmp(&b.0.1)));
        let ordered: Vec<Slot> = keyed.into_iter().map(|(_, s)| s).collect();
        for (r, s) in ordered.iter().enumerate() {
            row.insert(*s, r);
        }
        layers.push(ordered);
    }
    layers
}

/// The tasks of each layer, left to right ([`slots`] without the bends).
#[cfg(test)]
fn layers(nodes: &[(i64, Vec<i64>)]) -> Vec<Vec<i64>> {
    slots(nodes)
        .into_iter()
        .map(|l| {
            l.into_iter()
                .filter_map(|s| match s {
                    Slot::Task(id) => Some(id),
                    Slot::Bend(..) => None,
                })
                .collect()
        })
        .collect()
}

fn shorten(name: &str) -> String {
    if name.chars().count() <= NAME_CHARS {
        return name.to_owned();
    }
    let mut s: String = name.chars().take(NAME_CHARS - 1).collect();
    s.push('…');
    s
}

/// The graph as an `<svg>`: one box per task (`id="node-{id}"`,
/// `data-state`), linked to its job page through `job_href`, and one arrow
/// per edge from upstream to dependent (`id="edge-{from}-{to}"`).
pub(crate) fn svg(graph: &WorkflowGraph, job_href: impl Fn(i64) -> String) -> Markup {
    let nodes: Vec<(i64, Vec<i64>)> = graph
        .tasks
        .iter()
        .map(|t| (t.id, t.upstream.clone()))
        .collect();
    let layers = slots(&nodes);
    let mut at: HashMap<Slot, (usize, usize)> = HashMap::new();
    for (l, slots) in layers.iter().enumerate() {
        for (r, slot) in slots.iter().enumerate() {
            at.insert(
                *slot,
                (
                    MARGIN + l * (NODE_W + COL_GAP),
                    MARGIN + r * (NODE_H + ROW_GAP),
                ),
            );
        }
    }
    let rows = layers.iter().map(Vec::len).max().unwrap_or(0);
    let width = 2 * MARGIN + (layers.len() * (NODE_W + COL_GAP)).saturating_sub(COL_GAP);
    let height = 2 * MARGIN + (rows * (NODE_H + ROW_GAP)).saturating_sub(ROW_GAP);
    let edges = graph.edges();
    // From the upstream box's right side to the dependent's left side, a
    // curve between layers and a straight run across each bend's slot.
    let path = |from: i64, to: i64| {
        let (x, y) = at[&Slot::Task(from)];
        let mut d = format!("M {} {}", x + NODE_W, y + NODE_H / 2);
        let mut last = (x + NODE_W, y + NODE_H / 2);
        let mut step = 0;
        loop {
            let bend = Slot::Bend(from, to, step);
            let (next, through) = match at.get(&bend) {
                Some(&(x, y)) => ((x, y + NODE_H / 2), true),
                None => {
                    let (x, y) = at[&Slot::Task(to)];
                    ((x, y + NODE_H / 2), false)
                }
            };
            let mid = (last.0 + next.0) / 2;
            d.push_str(&format!(
                " C {mid} {}, {mid} {}, {} {}",
                last.1, next.1, next.0, next.1
            ));
            if !through {
                return d;
            }
            last = (next.0 + NODE_W, next.1);
            d.push_str(&format!(" L {} {}", last.0, last.1));
            step += 1;
        }
    };
    html! {
        svg class="workflow" id="workflow-graph" xmlns="http://www.w3.org/2000/svg"
            width=(width) height=(height) viewBox=(format!("0 0 {width} {height}"))
            role="img" aria-label=(format!("workflow {}: {} tasks, {} edges", graph.id, graph.tasks.len(), edges.len()))
            data-nodes=(graph.tasks.len()) data-edges=(edges.len()) {
            defs {
                marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5"
                    markerWidth="7" markerHeight="7" orient="auto-start-reverse" {
                    path d="M 0 0 L 10 5 L 0 10 z" fill="#6b7280" {}
                }
            }
            @for (from, to) in &edges {
                path id=(format!("edge-{from}-{to}")) class="edge" data-from=(from) data-to=(to)
                    d=(path(*from, *to)) fill="none" stroke="#6b7280" stroke-width="1.5"
                    marker-end="url(#arrow)" {}
            }
            @for t in &graph.tasks {
                @let (x, y) = at[&Slot::Task(t.id)];
                @let label = t.label();
                a href=(job_href(t.id)) {
                    g id=(format!("node-{}", t.id)) class="node" data-state=(t.state) data-name=(label)
                        transform=(format!("translate({x},{y})")) {
                        title { (label) " · " (t.state) " · job " (t.id) }
                        rect width=(NODE_W) height=(NODE_H) rx="6" fill=(colour(&t.state))
                            stroke="#52525b" {}
                        text x="8" y="18" font-size="13" font-weight="600" { (shorten(&label)) }
                        text x="8" y="35" font-size="11" fill="#3f3f46" { (t.state) " · #" (t.id) }
                    }
                }
            }
        }
    }
}

/// The colours' key, as a row of small swatches.
pub(crate) fn legend() -> Markup {
    let step = 104;
    let width = step * STATE_COLOURS.len();
    html! {
        svg class="legend" width=(width) height="20" viewBox=(format!("0 0 {width} 20")) role="img" aria-label="state colours" {
            @for (i, (state, fill)) in STATE_COLOURS.iter().enumerate() {
                rect x=(i * step) y="3" width="14" height="14" rx="3" fill=(fill) stroke="#52525b" {}
                text x=(i * step + 19) y="15" font-size="12" { (state) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_follow_the_longest_path_from_a_root() {
        // 1 → 2 → 4, 1 → 3 → 4, 1 → 4, 5 alone, 6 waits for 9 (not a node).
        let nodes = vec![
            (1, vec![]),
            (2, vec![1]),
            (3, vec![1]),
            (4, vec![1, 2, 3]),
            (5, vec![]),
            (6, vec![9]),
        ];
        assert_eq!(layers(&nodes), vec![vec![1, 5, 6], vec![2, 3], vec![4]]);
    }

    #[test]
    fn a_layer_is_ordered_by_where_its_upstream_tasks_sit() {
        // 3 sits under 1, 4 under 2: their dependents follow in that order
        // whatever their ids.
        let nodes = vec![
            (1, vec![]),
            (2, vec![]),
            (3, vec![2]),
            (4, vec![1]),
            (5, vec![3]),
            (6, vec![4]),
        ];
        assert_eq!(layers(&nodes), vec![vec![1, 2], vec![4, 3], vec![6, 5]]);
    }

    #[test]
    fn an_edge_across_layers_bends_through_each_layer_between() {
        // 1 → 2 → 3 → 4 and 1 → 4: the long edge takes a row in layers 1
        // and 2, below the chain.
        let nodes = vec![(1, vec![]), (2, vec![1]), (3, vec![2]), (4, vec![3, 1])];
        assert_eq!(
            slots(&nodes),
            vec![
                vec![Slot::Task(1)],
                vec![Slot::Task(2), Slot::Bend(1, 4, 0)],
                vec![Slot::Task(3), Slot::Bend(1, 4, 1)],
                vec![Slot::Task(4)],
            ]
        );
    }

    #[test]
    fn a_cycle_in_the_data_still_places_every_node() {
        let nodes = vec![(1, vec![]), (2, vec![3]), (3, vec![2])];
        let l = layers(&nodes);
        assert_eq!(l.iter().map(Vec::len).sum::<usize>(), 3);
    }
}
