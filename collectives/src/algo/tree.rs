//! Double-binary-tree all-reduce (NCCL's "tree" algorithm), for small messages.
//!
//! Tree 0 is NCCL's in-order binary tree over the ranks (rank 0 is the root,
//! with the single child `2^⌊log2(n−1)⌋`; leaves are the odd ranks). Tree 1 is
//! tree 0 mirrored (`r → n−1−r`) when `n` is even and shifted (`r → r+1`)
//! when it is odd, so that a rank is an inner node in at most one of the two
//! trees (for odd `n`, rank 0 is inner in both, as in NCCL).
//!
//! The first `⌈count/2⌉` elements are reduced up and broadcast down tree 0,
//! the rest tree 1; each half is cut into segments, and segment `k` of a tree
//! moves up while earlier segments move down. The root of each tree applies
//! the final reduction (`finalize`), everyone else receives the result.
//!
//! Step numbers: `(2·tree + phase)·M + k` with phase 0 up and 1 down and `M`
//! segments per half; each (tree, phase) is one stream per peer.

use gw_transport::Result;

use super::dag::{Alias, Builder, DagSchedule, Desc, Pool, check_steps, nsegs, segment};
use super::{Buf, Loc, OpSpec};

/// One rank's place in a tree: parent and up to two children.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Node {
    pub parent: Option<usize>,
    pub children: [Option<usize>; 2],
}

/// NCCL's `ncclGetBtree`.
pub(super) fn btree(n: usize, rank: usize) -> Node {
    let mut bit = 1;
    while bit < n {
        if bit & rank != 0 {
            break;
        }
        bit <<= 1;
    }
    if rank == 0 {
        let child = if n > 1 { Some(bit >> 1) } else { None };
        return Node {
            parent: None,
            children: [None, child],
        };
    }
    let mut up = (rank ^ bit) | (bit << 1);
    if up >= n {
        up = rank ^ bit;
    }
    let mut lowbit = bit >> 1;
    let down0 = if lowbit == 0 {
        None
    } else {
        Some(rank - lowbit)
    };
    let mut down1 = if lowbit == 0 {
        None
    } else {
        Some(rank + lowbit)
    };
    while let Some(d) = down1
        && d >= n
    {
        lowbit >>= 1;
        down1 = if lowbit == 0 {
            None
        } else {
            Some(rank + lowbit)
        };
    }
    Node {
        parent: Some(up),
        children: [down0, down1],
    }
}

/// Rank `rank`'s place in tree `t` (0 or 1) of the double binary tree.
pub(super) fn dtree(n: usize, rank: usize, t: usize) -> Node {
    if t == 0 {
        return btree(n, rank);
    }
    let odd = n % 2 == 1;
    let to = |x: usize| if odd { (x + 1) % n } else { n - 1 - x };
    let from = if odd {
        (rank + n - 1) % n
    } else {
        n - 1 - rank
    };
    let b = btree(n, from);
    Node {
        parent: b.parent.map(to),
        children: b.children.map(|c| c.map(to)),
    }
}

/// Double-binary-tree all-reduce, `n >= 2`.
pub(super) fn allreduce(spec: &OpSpec) -> Result<DagSchedule> {
    let (n, r, count, seg) = spec.dims();
    let half = count.div_ceil(2);
    let halves = [(0, half), (half, count - half)];
    let m = nsegs(half, seg);
    check_steps("tree all-reduce", m.checked_mul(4))?;
    let mut b = Builder::new(
        "double-binary-tree all-reduce",
        Alias {
            send_off: 0,
            recv_off: 0,
            len: count,
        },
        spec.depth,
    );
    let slot_len = seg.min(half);
    let nodes = [dtree(n, r, 0), dtree(n, r, 1)];
    // `depth` slots per (tree, child) for the partial sums coming up.
    let mut pools: Vec<[Option<Pool>; 2]> = nodes
        .iter()
        .map(|node| {
            node.children
                .map(|c| c.map(|_| b.pool(spec.depth, slot_len)))
        })
        .collect();
    const PHASES: [&str; 4] = [
        "reduce (tree 0)",
        "broadcast (tree 0)",
        "reduce (tree 1)",
        "broadcast (tree 1)",
    ];
    for k in 0..m {
        for (t, node) in nodes.iter().enumerate() {
            let (hoff, hlen) = halves[t];
            let Some((off, len)) = segment(hlen, seg, k) else {
                continue;
            };
            let mine = Loc::new(Buf::Recv, hoff + off, len);
            let up_stream = 2 * t as u32;
            let up_step = (2 * t * m + k) as u32;
            let down_stream = up_stream + 1;
            let down_step = ((2 * t + 1) * m + k) as u32;
            let desc_up = Desc::new(PHASES[2 * t], 0, 1, k, m);
            let desc_down = Desc::new(PHASES[2 * t + 1], 0, 1, k, m);

            // Up: add the children's partial sums to the own contribution.
            let mut partials = Vec::with_capacity(2);
            for (c, pool) in node.children.iter().zip(pools[t].iter_mut()) {
                if let (Some(c), Some(pool)) = (c, pool) {
                    let slot = pool.slot(len);
                    b.recv(*c as u32, up_step, up_stream, slot, desc_up);
                    partials.push(slot);
                }
            }
            let own = Loc::new(Buf::Send, hoff + off, len);
            let last = partials.len();
            for (i, slot) in partials.into_iter().enumerate() {
                let a = if i == 0 { own } else { mine };
                b.reduce(
                    mine,
                    a,
                    slot,
                    node.parent.is_none() && i + 1 == last,
                    desc_up,
                );
            }
            if let Some(p) = node.parent {
                let src = if last > 0 {
                    mine
                } else if spec.scaled {
                    b.copy(mine, own, false, desc_up);
                    mine
                } else {
                    own
                };
                b.send(p as u32, up_step, up_stream, src, desc_up);
                // Down: the result comes from the parent.
                b.recv(p as u32, down_step, down_stream, mine, desc_down);
            }
            for c in node.children.iter().flatten() {
                b.send(*c as u32, down_step, down_stream, mine, desc_down);
            }
        }
    }
    Ok(b.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both trees span all ranks, parent and child links agree, and (for even
    /// `n`) no rank is an inner node of both trees.
    #[test]
    fn double_binary_tree_shape() {
        for n in 1..=70 {
            let mut inner = vec![0; n];
            for t in 0..2 {
                let nodes: Vec<Node> = (0..n).map(|r| dtree(n, r, t)).collect();
                let roots: Vec<usize> = (0..n).filter(|&r| nodes[r].parent.is_none()).collect();
                assert_eq!(roots.len(), 1, "n={n} tree {t}");
                for (r, node) in nodes.iter().enumerate() {
                    if let Some(p) = node.parent {
                        assert!(p < n);
                        assert_eq!(
                            nodes[p]
                                .children
                                .iter()
                                .flatten()
                                .filter(|&&c| c == r)
                                .count(),
                            1,
                            "n={n} t={t} r={r}"
                        );
                    }
                    for &c in node.children.iter().flatten() {
                        assert!(c < n && c != r);
                        assert_eq!(nodes[c].parent, Some(r), "n={n} t={t} r={r} c={c}");
                    }
                    if node.children.iter().any(Option::is_some) {
                        inner[r] += 1;
                    }
                }
                // Every rank reaches the root.
                for r in 0..n {
                    let (mut x, mut hops) = (r, 0);
                    while let Some(p) = nodes[x].parent {
                        x = p;
                        hops += 1;
                        assert!(hops <= n);
                    }
                    assert_eq!(x, roots[0]);
                }
            }
            if n % 2 == 0 {
                assert!(inner.iter().all(|&c| c <= 1), "n={n}: {inner:?}");
            }
        }
    }
}
