//! The all-reduce of one bucket across a cluster: which algorithm the live
//! communicator's chooser would run, and when each node is done with it.
//!
//! Costs come from `gw_collectives::model`, the same functions the live
//! communicator chooses with, so a prediction here and a choice there never
//! disagree. Flat algorithms are costed over the slowest links they cross;
//! hier runs one level of the cluster (node, rack, spine) per level of the
//! hierarchy. The hierarchical case is simulated group by group: a node
//! starts its reduce-scatter when its own devices are ready, a rack when its
//! nodes are done, the spine when every rack is, and the all-gathers come
//! back down, so a slow node delays only what waits for it.

use crate::cluster::{Cluster, Level, LinkSpec};
use gw_collectives::Algo;
use gw_collectives::model::{self, FlatLinks, Level as CostLevel, Link};

/// The cluster as the cost model sees it.
pub struct Network {
    /// Per level (innermost first): its link, and the largest group there.
    specs: Vec<(Option<LinkSpec>, usize)>,
    max_devices: usize,
    /// Devices per node where every node has as many (the live
    /// communicator's "ranks per host"), else 2: where β curves are read
    /// (`Curve::beta_for`).
    host_ranks: usize,
    /// Ranks per processor (CPU ranks), scaling β and γ.
    k: f64,
    pub gamma: f64,
    pub n: usize,
}

const NONE: Link = Link {
    alpha: 0.0,
    beta: 0.0,
};

impl Network {
    /// γ is the slowest device's ([`Cluster::gamma`]); it and every α and
    /// β grow by the cluster's oversubscription.
    pub fn of(cluster: &Cluster) -> Network {
        let k = cluster.oversubscription();
        let max_devices = cluster
            .racks
            .iter()
            .flatten()
            .map(|n| n.devices)
            .max()
            .unwrap_or(1);
        let even = cluster
            .racks
            .iter()
            .flatten()
            .all(|n| n.devices == max_devices);
        let host_ranks = if even { max_devices } else { 2 };
        let max_nodes = cluster.racks.iter().map(|r| r.len()).max().unwrap_or(1);
        let sizes = [max_devices, max_nodes, cluster.racks.len()];
        Network {
            specs: Level::ALL
                .into_iter()
                .zip(sizes)
                .map(|(lv, ranks)| (cluster.link(lv).cloned(), ranks))
                .collect(),
            max_devices,
            host_ranks,
            k,
            gamma: cluster.gamma() * k,
            n: cluster.device_count(),
        }
    }

    /// Level `i`'s link for all-reduces of `bytes`. Above the node every
    /// device of a node sends at once (hier runs one ring per local rank;
    /// rhd, tree and rd pair ranks across nodes), so each gets a share of
    /// the node's NICs.
    fn link(&self, i: usize, bytes: u64) -> Link {
        match &self.specs[i].0 {
            None => NONE,
            Some(spec) => {
                let sharing = if spec.per_device {
                    1.0
                } else {
                    self.max_devices as f64
                };
                Link {
                    alpha: self.k * spec.alpha_s,
                    beta: self.k * sharing / spec.bytes_s_at(bytes, self.host_ranks),
                }
            }
        }
    }

    /// The hierarchy for all-reduces of `bytes`.
    pub fn levels(&self, bytes: u64) -> Vec<CostLevel> {
        (0..self.specs.len())
            .map(|i| CostLevel {
                link: self.link(i, bytes),
                ranks: self.specs[i].1,
            })
            .collect()
    }

    /// What the flat algorithms cross for all-reduces of `bytes`: the
    /// slowest of the levels that have several groups. A flat ring has one
    /// flow per node boundary, striped over the NICs as NCCL's channels do.
    pub fn flat(&self, bytes: u64) -> FlatLinks {
        let slower = |a: Link, b: Link| Link {
            alpha: a.alpha.max(b.alpha),
            beta: a.beta.max(b.beta),
        };
        let mut flat = FlatLinks::same(NONE);
        for (i, (spec, ranks)) in self.specs.iter().enumerate() {
            let Some(spec) = spec else { continue };
            if *ranks > 1 {
                let shared = self.link(i, bytes);
                let one_flow = Link {
                    alpha: self.k * spec.alpha_s,
                    beta: self.k / spec.bytes_s_at(bytes, self.host_ranks),
                };
                flat.ring = slower(flat.ring, one_flow);
                flat.others = slower(flat.others, shared);
            }
        }
        flat
    }

    /// The algorithm for `bytes` (the live chooser's, unless forced) and
    /// its predicted time when every rank starts together.
    pub fn choose(&self, forced: Option<Algo>, bytes: u64) -> (Algo, f64) {
        let (levels, flat) = (self.levels(bytes), self.flat(bytes));
        let b = bytes as usize;
        match forced {
            None => model::choose_on(flat, Some(&levels), self.gamma, self.n, b),
            Some(Algo::Hier) => (Algo::Hier, model::predict_levels(&levels, self.gamma, b)),
            Some(a) => (a, model::predict_flat(flat.of(a), self.gamma, self.n, a, b)),
        }
    }

    /// Simulates hier for one bucket of `bytes`: `ready[node]` is when the
    /// slowest device of each node (racks' nodes in order) has the bucket
    /// and its previous bucket is done; returns when each node has the
    /// result.
    pub fn hier_ends(&self, cluster: &Cluster, bytes: u64, ready: &[f64]) -> Vec<f64> {
        let links: Vec<Link> = (0..3).map(|i| self.link(i, bytes)).collect();
        let phases = |level: usize, ranks: usize, share: f64| {
            model::level_phases(
                CostLevel {
                    link: links[level],
                    ranks,
                },
                self.gamma,
                share,
            )
        };
        let s = bytes as f64;
        let mut rack_up = Vec::with_capacity(cluster.racks.len());
        let mut rack_share = Vec::with_capacity(cluster.racks.len());
        let mut i = 0;
        for rack in &cluster.racks {
            let mut start = 0.0f64;
            let mut share = 0.0f64;
            for node in rack {
                let (rs, _) = phases(0, node.devices, s);
                start = start.max(ready[i] + rs);
                share = share.max(s / node.devices as f64);
                i += 1;
            }
            let (rs, _) = phases(1, rack.len(), share);
            rack_up.push(start + rs);
            rack_share.push(share / rack.len() as f64);
        }
        let top_share = rack_share.iter().copied().fold(0.0, f64::max);
        let (rs, ag) = phases(2, cluster.racks.len(), top_share);
        let top = rack_up.iter().copied().fold(0.0, f64::max) + rs + ag;
        let mut ends = Vec::with_capacity(ready.len());
        for (r, rack) in cluster.racks.iter().enumerate() {
            let (_, rack_ag) = phases(1, rack.len(), rack_share[r] * rack.len() as f64);
            for node in rack {
                let (_, node_ag) = phases(0, node.devices, s);
                ends.push(top + rack_ag + node_ag);
            }
        }
        ends
    }
}
