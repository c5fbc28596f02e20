//! Where a job's ranks run: a pure function of the free slots, so the policy
//! is unit-tested without a database or a network.
//!
//! Policy (for now): keep a job in as few racks as possible, and inside them
//! on as few nodes as possible ("fill nodes"). At each level we take the
//! smallest number k of groups whose free slots can hold the job, fill the
//! k-1 largest completely, and put the rest on the *smallest* remaining group
//! that holds it (best fit), which leaves large holes for large jobs. Ranks
//! are numbered consecutively along racks and nodes, so ranks that share a
//! node (or a rack) are neighbours, which hierarchical all-reduces like.

/// A node that could take ranks now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FreeNode {
    pub name: String,
    pub rack: String,
    /// Slots not taken by other jobs' live ranks.
    pub free: u32,
}

/// The node of every rank (index = rank), or `None` if the job does not fit
/// in the free slots now. `nodes` in registration order, which breaks ties.
pub fn place(nodes: &[FreeNode], workers: u32) -> Option<Vec<String>> {
    if workers == 0 {
        return None;
    }
    // Racks in order of first appearance, with their nodes.
    let mut racks: Vec<(&str, Vec<usize>)> = Vec::new();
    for (i, n) in nodes.iter().enumerate().filter(|(_, n)| n.free > 0) {
        match racks.iter_mut().find(|(r, _)| *r == n.rack) {
            Some((_, v)) => v.push(i),
            None => racks.push((&n.rack, vec![i])),
        }
    }
    let rack_free: Vec<u64> = racks
        .iter()
        .map(|(_, v)| v.iter().map(|&i| u64::from(nodes[i].free)).sum())
        .collect();
    let mut out = Vec::with_capacity(workers as usize);
    for (r, take) in fewest(&rack_free, u64::from(workers))? {
        let members = &racks[r].1;
        let node_free: Vec<u64> = members.iter().map(|&i| u64::from(nodes[i].free)).collect();
        for (n, k) in fewest(&node_free, take)? {
            let name = &nodes[members[n]].name;
            out.extend(std::iter::repeat_n(name.clone(), k as usize));
        }
    }
    Some(out)
}

/// Chooses the fewest groups (by capacity `caps`) that hold `need`: the k-1
/// largest in full, then best fit for the remainder. Returns (index, amount)
/// in the order the ranks go; `None` when the total is too small.
fn fewest(caps: &[u64], need: u64) -> Option<Vec<(usize, u64)>> {
    let mut order: Vec<usize> = (0..caps.len()).filter(|&i| caps[i] > 0).collect();
    // Largest first; the stable sort keeps the input order among equals.
    order.sort_by(|&a, &b| caps[b].cmp(&caps[a]));
    let mut picked = Vec::new();
    let mut left = need;
    let mut rest = order.as_slice();
    while left > 0 {
        let (&first, tail) = rest.split_first()?;
        if caps[first] >= left {
            // The last group: the smallest one that still holds the rest.
            let best = rest
                .iter()
                .copied()
                .filter(|&i| caps[i] >= left)
                .min_by_key(|&i| caps[i])
                .unwrap_or(first);
            picked.push((best, left));
            left = 0;
        } else {
            picked.push((first, caps[first]));
            left -= caps[first];
            rest = tail;
        }
    }
    Some(picked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(name: &str, rack: &str, free: u32) -> FreeNode {
        FreeNode {
            name: name.into(),
            rack: rack.into(),
            free,
        }
    }

    fn names(v: Option<Vec<String>>) -> Vec<String> {
        v.unwrap_or_default()
    }

    #[test]
    fn fills_one_node_before_the_next() {
        let nodes = [n("a", "r", 4), n("b", "r", 4)];
        assert_eq!(names(place(&nodes, 3)), ["a", "a", "a"]);
        assert_eq!(names(place(&nodes, 6)), ["a", "a", "a", "a", "b", "b"]);
    }

    #[test]
    fn spills_over_to_a_second_node_only_when_needed() {
        let nodes = [n("n1", "r", 2), n("n2", "r", 2)];
        assert_eq!(names(place(&nodes, 3)), ["n1", "n1", "n2"]);
        assert_eq!(names(place(&nodes, 4)), ["n1", "n1", "n2", "n2"]);
    }

    #[test]
    fn best_fit_keeps_big_nodes_free() {
        let nodes = [n("big", "r", 8), n("small", "r", 2)];
        assert_eq!(names(place(&nodes, 2)), ["small", "small"]);
        assert_eq!(names(place(&nodes, 3)), ["big", "big", "big"]);
    }

    #[test]
    fn fewest_racks_even_if_another_rack_has_a_bigger_node() {
        let nodes = [
            n("a", "r1", 2),
            n("b", "r1", 2),
            n("c", "r2", 3),
            n("d", "r3", 1),
        ];
        // r1 holds 4 on its own; r2 (one node of 3) cannot.
        assert_eq!(names(place(&nodes, 4)), ["a", "a", "b", "b"]);
        // 3 fit in r2 on one node, and r2 is the tighter rack.
        assert_eq!(names(place(&nodes, 3)), ["c", "c", "c"]);
        // 5 need two racks: all of r1, then the smallest rack holding 1.
        assert_eq!(names(place(&nodes, 5)), ["a", "a", "b", "b", "d"]);
        // 6: r1 + r2 (r3 cannot hold the remaining 2).
        assert_eq!(names(place(&nodes, 6)), ["a", "a", "b", "b", "c", "c"]);
    }

    #[test]
    fn busy_nodes_are_skipped_and_too_big_jobs_wait() {
        let nodes = [n("a", "r1", 0), n("b", "r1", 1), n("c", "r2", 1)];
        assert_eq!(names(place(&nodes, 2)), ["b", "c"]);
        assert_eq!(place(&nodes, 3), None);
        assert_eq!(place(&[], 1), None);
        assert_eq!(place(&nodes, 0), None);
    }

    #[test]
    fn every_rank_is_placed_within_capacity() {
        // Exhaustive over small clusters: the result respects free slots,
        // has the right length, and uses the minimal number of racks.
        let shapes: [&[(u32, u32)]; 4] = [
            &[(1, 3), (1, 1), (2, 2), (2, 2), (3, 4)],
            &[(1, 1), (2, 1), (3, 1), (4, 1)],
            &[(1, 5), (2, 5)],
            &[(1, 2), (1, 2), (1, 2), (2, 7)],
        ];
        for shape in shapes {
            let nodes: Vec<FreeNode> = shape
                .iter()
                .enumerate()
                .map(|(i, &(r, f))| n(&format!("n{i}"), &format!("r{r}"), f))
                .collect();
            let total: u32 = nodes.iter().map(|x| x.free).sum();
            for w in 1..=total + 1 {
                let got = place(&nodes, w);
                if w > total {
                    assert_eq!(got, None);
                    continue;
                }
                let got = got.unwrap_or_default();
                assert_eq!(got.len(), w as usize);
                for node in &nodes {
                    let used = got.iter().filter(|g| **g == node.name).count() as u32;
                    assert!(used <= node.free, "{shape:?} w={w}: {got:?}");
                }
                let mut racks: Vec<&str> = got
                    .iter()
                    .filter_map(|g| nodes.iter().find(|x| &x.name == g))
                    .map(|x| x.rack.as_str())
                    .collect();
                racks.dedup();
                let distinct = {
                    let mut r = racks.clone();
                    r.sort();
                    r.dedup();
                    r.len()
                };
                // Consecutive ranks stay in one rack: no rack appears twice.
                assert_eq!(racks.len(), distinct, "{shape:?} w={w}: {got:?}");
                let mut rack_caps: Vec<(String, u32)> = Vec::new();
                for x in &nodes {
                    match rack_caps.iter_mut().find(|(r, _)| *r == x.rack) {
                        Some((_, c)) => *c += x.free,
                        None => rack_caps.push((x.rack.clone(), x.free)),
                    }
                }
                let mut c: Vec<u32> = rack_caps.iter().map(|(_, c)| *c).collect();
                c.sort_by(|a, b| b.cmp(a));
                let mut need = w;
                let mut min_racks = 0;
                for cap in c {
                    if need == 0 {
                        break;
                    }
                    need = need.saturating_sub(cap);
                    min_racks += 1;
                }
                assert_eq!(distinct, min_racks, "{shape:?} w={w}: {got:?}");
            }
        }
    }
}
