//! The all-reduce of one bucket across a cluster: which algorithm the live
//! communicator's chooser would run, and when each node is done with it.
//!
//! Costs come from `gw_collectives::model`, the same functions the live
//! communicator chooses with, so a prediction here and a choice there never
//! disagree. Flat algorithms are costed over the slowest link they cross;
//! hier runs one level of the cluster (node, rack, spine) per level of the
//! hierarchy. The hierarchical case is simulated group by group: a node
//! starts its reduce-scatter when its own devices are ready, a rack when its
//! nodes are done, the spine when every rack is, and the all-gathers come
//! back down, so a slow node delays only what waits for it.

use crate::cluster::{Cluster, Level};
use gw_collectives::Algo;
use gw_collectives::model::{self, FlatLinks, Level as CostLevel, Link};

/// The cluster as the cost model sees it.
pub struct Network {
    /// Innermost first; `ranks` is the largest group at that level.
    pub levels: Vec<CostLevel>,
    /// What the flat algorithms are bound by.
    pub flat: FlatLinks,
    pub gamma: f64,
    pub n: usize,
    /// Per level, the link of a group of the given size is the same; kept
    /// so that groups of other sizes can be costed.
    links: Vec<Link>,
}

impl Network {
    pub fn of(cluster: &Cluster, gamma: f64) -> Network {
        let max_devices = cluster
            .racks
            .iter()
            .flatten()
            .map(|n| n.devices)
            .max()
            .unwrap_or(1);
        let max_nodes = cluster.racks.iter().map(|r| r.len()).max().unwrap_or(1);
        let sizes = [max_devices, max_nodes, cluster.racks.len()];
        let mut levels = Vec::new();
        let mut links = Vec::new();
        let none = Link {
            alpha: 0.0,
            beta: 0.0,
        };
        let mut flat = FlatLinks::same(none);
        for (lv, ranks) in Level::ALL.into_iter().zip(sizes) {
            // Parsing guarantees a link wherever a level has several groups.
            let Some(spec) = cluster.link(lv) else {
                levels.push(CostLevel {
                    link: none,
                    ranks: 1,
                });
                links.push(none);
                continue;
            };
            // Above the node every device of a node sends at once (hier
            // runs one ring per local rank; rhd, tree and rd pair ranks
            // across nodes), so each gets a share of the node's NICs; a flat
            // ring has one flow per node boundary, striped over the NICs as
            // NCCL's channels do.
            let sharing = if spec.per_device {
                1.0
            } else {
                max_devices as f64
            };
            let link = Link {
                alpha: spec.alpha_s,
                beta: sharing / spec.node_bytes_s,
            };
            if ranks > 1 {
                let slower = |a: Link, b: Link| Link {
                    alpha: a.alpha.max(b.alpha),
                    beta: a.beta.max(b.beta),
                };
                let one_flow = Link {
                    alpha: spec.alpha_s,
                    beta: 1.0 / spec.node_bytes_s,
                };
                flat.ring = slower(flat.ring, one_flow);
                flat.others = slower(flat.others, link);
            }
            levels.push(CostLevel { link, ranks });
            links.push(link);
        }
        Network {
            levels,
            flat,
            gamma,
            n: cluster.device_count(),
            links,
        }
    }

    /// The algorithm for `bytes` (the live chooser's, unless forced) and
    /// its predicted time when every rank starts together.
    pub fn choose(&self, forced: Option<Algo>, bytes: u64) -> (Algo, f64) {
        let bytes = bytes as usize;
        match forced {
            None => model::choose_on(self.flat, Some(&self.levels), self.gamma, self.n, bytes),
            Some(Algo::Hier) => (
                Algo::Hier,
                model::predict_levels(&self.levels, self.gamma, bytes),
            ),
            Some(a) => (
                a,
                model::predict_flat(self.flat.of(a), self.gamma, self.n, a, bytes),
            ),
        }
    }

    /// Hier's reduce-scatter and all-gather halves at `level` for a group
    /// of `ranks` holding `share` bytes each.
    fn phases(&self, level: usize, ranks: usize, share: f64) -> (f64, f64) {
        model::level_phases(
            CostLevel {
                link: self.links[level],
                ranks,
            },
            self.gamma,
            share,
        )
    }

    /// Simulates hier for one bucket of `bytes`: `ready[node]` is when the
    /// slowest device of each node (racks' nodes in order) has the bucket
    /// and its previous bucket is done; returns when each node has the
    /// result.
    pub fn hier_ends(&self, cluster: &Cluster, bytes: u64, ready: &[f64]) -> Vec<f64> {
        let s = bytes as f64;
        let mut node_up = Vec::with_capacity(ready.len());
        let mut rack_up = Vec::with_capacity(cluster.racks.len());
        let mut rack_share = Vec::with_capacity(cluster.racks.len());
        let mut i = 0;
        for rack in &cluster.racks {
            let mut start = 0.0f64;
            let mut share = 0.0f64;
            for node in rack {
                let (rs, _) = self.phases(0, node.devices, s);
                let up = ready[i] + rs;
                node_up.push(up);
                start = start.max(up);
                share = share.max(s / node.devices as f64);
                i += 1;
            }
            let (rs, _) = self.phases(1, rack.len(), share);
            rack_up.push(start + rs);
            rack_share.push(share / rack.len() as f64);
        }
        let top_share = rack_share.iter().copied().fold(0.0, f64::max);
        let (rs, ag) = self.phases(2, cluster.racks.len(), top_share);
        let top = rack_up.iter().copied().fold(0.0, f64::max) + rs + ag;
        let mut ends = Vec::with_capacity(ready.len());
        for (r, rack) in cluster.racks.iter().enumerate() {
            let (_, rack_ag) = self.phases(1, rack.len(), rack_share[r] * rack.len() as f64);
            for node in rack {
                let (_, node_ag) = self.phases(0, node.devices, s);
                ends.push(top + rack_ag + node_ag);
            }
        }
        ends
    }
}
