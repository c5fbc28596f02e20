//! The α-β(-γ) cost model that picks the all-reduce algorithm.
//!
//! A message of `m` bytes over a link costs `α + m·β`; reducing `m` bytes
//! costs `m·γ`. Each algorithm's time follows from how many messages of what
//! size it sends in sequence (Thakur, Rabenseifner and Gropp's analysis):
//! - ring (reduce-scatter + all-gather, n ranks): 2(n−1) steps of S/n bytes,
//!   `2(n−1)α + 2(n−1)/n·Sβ + (n−1)/n·Sγ`;
//! - recursive halving-doubling (power-of-two n): 2·log₂n steps whose sizes
//!   halve then double, `2·log₂n·α + 2(n−1)/n·Sβ + (n−1)/n·Sγ`;
//! - tree (reduce up then broadcast down a binary tree of depth d, whole
//!   message per hop, as it runs for the small sizes it is chosen for),
//!   `2d(α + Sβ) + d·Sγ`;
//! - hierarchical (H hosts of L ranks): ring reduce-scatter and all-gather
//!   within each host over the intra-host link, and a ring all-reduce of
//!   each rank's S/L share across hosts over the inter-host link,
//!   `2(L−1)(αᵢ + S/L·βᵢ) + (L−1)/L·Sγ + 2(H−1)αₒ + 2(H−1)/H·S/L·βₒ + (H−1)/H·S/L·γ`.
//!
//! The flat algorithms are costed over the slowest link the communicator
//! uses (a flat ring across hosts is only as fast as its TCP hops), hier over
//! both. The phases are added although the schedule pipelines them, as the
//! flat formulas ignore pipelining too, so the comparison stays like for like.
//!
//! The parameters are measured (`gwbench calibrate` writes them to a file);
//! rank 0 reads them and publishes them through the store at init, so every
//! rank computes the same choice from the same numbers, even when the ranks
//! run on different hardware.

use crate::algo::Algo;
pub use crate::size_curve::Curve;
use gw_transport::{Error, Result};
use std::path::PathBuf;

/// Cost of one link type.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Link {
    /// Seconds per message.
    pub alpha: f64,
    /// Seconds per byte.
    pub beta: f64,
}

/// Measured parameters of both transports and of the reduction kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostModel {
    pub tcp: Link,
    pub shm: Link,
    /// Seconds per byte reduced (f32 sum, three operands).
    pub gamma: f64,
    /// β of each link by message size, where calibration measured it;
    /// empty: the link's `beta` at every size.
    pub tcp_curve: Curve,
    pub shm_curve: Curve,
}

/// The version of [`CostModel::encode`]'s format.
const MODEL_VERSION: u32 = 1;

/// A calibration file (and rank 0's published model).
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelFile {
    gradwire_model: u32,
    tcp: Link,
    shm: Link,
    gamma: f64,
    /// `[[bytes, β], …]`; absent in files written before curves existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    tcp_curve: Vec<(u64, f64)>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    shm_curve: Vec<(u64, f64)>,
}

impl std::fmt::Display for CostModel {
    /// The model for people: what log lines and benchmark headers show.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "tcp_alpha={:e} tcp_beta={:e} shm_alpha={:e} shm_beta={:e} gamma={:e}",
            self.tcp.alpha, self.tcp.beta, self.shm.alpha, self.shm.beta, self.gamma
        )
    }
}

/// Which link a communicator's collectives are bound by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkKind {
    Tcp,
    Shm,
}

/// Where a communicator's ranks are, as far as the cost model cares.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    /// World size.
    pub n: usize,
    /// The slowest link between two ranks; flat algorithms are bound by it.
    pub link: LinkKind,
    /// The link between ranks of one host.
    pub intra: LinkKind,
    /// Ranks per host when the ranks are grouped host by host in equal
    /// numbers (`n / local` hosts), else `None` (no hierarchical algorithm).
    pub local: Option<usize>,
    /// Ranks on the busiest processor of the most crowded host (⌈ranks /
    /// processors⌉, at least 1): every step of a collective waits for its
    /// slowest rank, and ranks that share a processor take turns at moving
    /// bytes, reducing them and answering messages, so α, β and γ all grow
    /// by this factor.
    pub oversubscription: f64,
}

impl Shape {
    /// `n` ranks on one kind of link, without a host layout.
    pub fn flat(link: LinkKind, n: usize) -> Shape {
        Shape {
            n,
            link,
            intra: link,
            local: None,
            oversubscription: 1.0,
        }
    }

    /// `(hosts, ranks per host)` when hier can run, whatever it costs.
    pub fn grid(&self) -> Option<(usize, usize)> {
        self.local
            .filter(|&l| l > 0 && self.n.is_multiple_of(l))
            .map(|l| (self.n / l, l))
    }
}

impl Default for CostModel {
    /// Medians of 60 runs of `gwbench calibrate` (2 ranks, back-to-back
    /// loops) on the 2-core development VM, 2026-12-02; used until a
    /// calibration file exists. No curves: those are machine-specific.
    fn default() -> Self {
        CostModel {
            tcp: Link {
                alpha: 11e-6,
                beta: 1.0 / 2.1e9,
            },
            shm: Link {
                alpha: 1.2e-6,
                beta: 1.0 / 10.5e9,
            },
            gamma: 1.0 / 7.8e9,
            tcp_curve: Curve::default(),
            shm_curve: Curve::default(),
        }
    }
}

fn ceil_log2(n: usize) -> u32 {
    usize::BITS - (n.max(1) - 1).leading_zeros()
}

/// One level of a hierarchy: groups of `ranks` ranks joined by `link`
/// (innermost level first: the ranks of a host, then the hosts of a rack, …).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Level {
    pub link: Link,
    pub ranks: usize,
}

/// Predicted seconds of a flat all-reduce (ring, rhd, tree or rd) of `bytes`
/// over `n` ranks on `link`; hier is not flat and costs infinity here.
pub fn predict_flat(link: Link, gamma: f64, n: usize, algo: Algo, bytes: usize) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let Link { alpha, beta } = link;
    let s = bytes as f64;
    let nf = n as f64;
    let spread = (nf - 1.0) / nf;
    match algo {
        Algo::Ring => 2.0 * (nf - 1.0) * alpha + 2.0 * spread * s * beta + spread * s * gamma,
        Algo::Rhd => {
            let steps = ceil_log2(n) as f64;
            2.0 * steps * alpha + 2.0 * spread * s * beta + spread * s * gamma
        }
        Algo::Tree => {
            let d = ceil_log2(n) as f64;
            2.0 * d * (alpha + s * beta) + d * s * gamma
        }
        Algo::Rd => {
            // log2 p exchanges of everything, plus a fold and a
            // hand-back when n is not a power of two.
            let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
            let rounds = p.trailing_zeros() as f64;
            let fold = if p == n {
                0.0
            } else {
                2.0 * (alpha + s * beta) + s * gamma
            };
            rounds * (alpha + s * beta + s * gamma) + fold
        }
        Algo::Hier => f64::INFINITY,
    }
}

/// Predicted seconds of a hierarchical all-reduce of `bytes` over `levels`
/// (innermost first). Every level but the last reduce-scatters its share
/// in rings of `ranks` and all-gathers it again at the end; the last level
/// all-reduces what is left, which is the same ring cost. A level of `g`
/// ranks holding a share `s` costs `2(g−1)(α + s/g·β) + (g−1)/g·s·γ`, and
/// passes `s/g` up. With two levels this is the module comment's hier.
pub fn predict_levels(levels: &[Level], gamma: f64, bytes: usize) -> f64 {
    let mut share = bytes as f64;
    let mut total = 0.0;
    for &l in levels {
        let (rs, ag) = level_phases(l, gamma, share);
        total += rs + ag;
        share /= l.ranks.max(1) as f64;
    }
    total
}

/// The two halves of one level of [`predict_levels`] for a group holding
/// `share` bytes: the reduce-scatter, `(g−1)(α + s/g·β) + (g−1)/g·s·γ`,
/// and the all-gather, `(g−1)(α + s/g·β)`.
pub fn level_phases(level: Level, gamma: f64, share: f64) -> (f64, f64) {
    let g = level.ranks.max(1) as f64;
    let hop = (g - 1.0) * (level.link.alpha + share / g * level.link.beta);
    (hop + (g - 1.0) / g * share * gamma, hop)
}

/// The links a flat algorithm crosses. A ring sends one flow over each
/// host boundary; rhd, tree and rd pair ranks across hosts at once, so every
/// rank of a host may share its network link. The live communicator, whose
/// model has one link per kind, passes the same link for both.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FlatLinks {
    pub ring: Link,
    pub others: Link,
}

impl FlatLinks {
    pub fn same(link: Link) -> FlatLinks {
        FlatLinks {
            ring: link,
            others: link,
        }
    }

    pub fn of(&self, algo: Algo) -> Link {
        if algo == Algo::Ring {
            self.ring
        } else {
            self.others
        }
    }
}

/// The fastest algorithm for `bytes` over `n` ranks and its predicted time:
/// the flat algorithms costed over `flat` (the slowest links they cross),
/// hier over `levels` when given. Ties go to the earlier of rd, rhd, tree,
/// ring; the tree never on two ranks (it only adds a hop to the ring), rhd
/// only on powers of two from 4 ranks up. Hier competes only where at least
/// two levels have several ranks each (elsewhere it is a flat ring), and
/// wins only when strictly faster. The live communicator and `gwbench
/// model` both choose through here.
pub fn choose_on(
    flat: FlatLinks,
    levels: Option<&[Level]>,
    gamma: f64,
    n: usize,
    bytes: usize,
) -> (Algo, f64) {
    let mut best = (
        Algo::Ring,
        predict_flat(flat.ring, gamma, n, Algo::Ring, bytes),
    );
    let mut candidates = if n <= 2 {
        vec![Algo::Rd]
    } else {
        vec![Algo::Rd, Algo::Tree]
    };
    if n >= 4 && n.is_power_of_two() {
        candidates.insert(1, Algo::Rhd);
    }
    for a in candidates.into_iter().rev() {
        let t = predict_flat(flat.of(a), gamma, n, a, bytes);
        if t <= best.1 {
            best = (a, t);
        }
    }
    if let Some(levels) = levels
        && levels.iter().filter(|l| l.ranks > 1).count() > 1
    {
        let t = predict_levels(levels, gamma, bytes);
        if t < best.1 {
            best = (Algo::Hier, t);
        }
    }
    best
}

impl CostModel {
    pub fn link(&self, kind: LinkKind) -> Link {
        match kind {
            LinkKind::Tcp => self.tcp,
            LinkKind::Shm => self.shm,
        }
    }

    /// The model as `shape`'s ranks see it for a message of `bytes`: each
    /// β read off its curve at the host's footprint ([`Curve::beta_for`];
    /// ranks per host unknown: as calibrated), α, β and γ scaled by the
    /// oversubscription.
    fn on(&self, shape: Shape, bytes: usize) -> CostModel {
        let k = shape.oversubscription.max(1.0);
        let host_ranks = shape.local.unwrap_or(2);
        let scale = |l: Link, c: &Curve| Link {
            alpha: l.alpha * k,
            beta: c.beta_for(l.beta, bytes, host_ranks) * k,
        };
        CostModel {
            tcp: scale(self.tcp, &self.tcp_curve),
            shm: scale(self.shm, &self.shm_curve),
            gamma: self.gamma * k,
            ..*self
        }
    }

    /// Hier's two levels on `shape`: the ranks of a host over the intra-host
    /// link, then the hosts over the slowest link; None without a layout.
    fn levels(&self, shape: Shape) -> Option<[Level; 2]> {
        shape.grid().map(|(hosts, local)| {
            [
                Level {
                    link: self.link(shape.intra),
                    ranks: local,
                },
                Level {
                    link: self.link(shape.link),
                    ranks: hosts,
                },
            ]
        })
    }

    /// Predicted seconds of an all-reduce of `bytes` on `shape`; infinite for
    /// hier where the shape has no host layout.
    pub fn predict(&self, shape: Shape, algo: Algo, bytes: usize) -> f64 {
        let m = self.on(shape, bytes);
        match algo {
            Algo::Hier => match m.levels(shape) {
                Some(_) if shape.n <= 1 => 0.0,
                Some(l) => predict_levels(&l, m.gamma, bytes),
                None => f64::INFINITY,
            },
            flat => predict_flat(m.link(shape.link), m.gamma, shape.n, flat, bytes),
        }
    }

    /// The fastest algorithm for `bytes` on `shape` and its predicted time
    /// (see [`choose_on`]).
    pub fn choose(&self, shape: Shape, bytes: usize) -> (Algo, f64) {
        let m = self.on(shape, bytes);
        let levels = m.levels(shape);
        choose_on(
            FlatLinks::same(m.link(shape.link)),
            levels.as_ref().map(|l| &l[..]),
            m.gamma,
            shape.n,
            bytes,
        )
    }
    /// What calibration files hold and rank 0 publishes at init: JSON,
    /// `{"gradwire_model":1,"tcp":{"alpha":…,"beta":…},"shm":{…},"gamma":…}`,
    /// with every number written so that it reads back bit for bit.
    pub fn encode(&self) -> String {
        let file = ModelFile {
            gradwire_model: MODEL_VERSION,
            tcp: self.tcp,
            shm: self.shm,
            gamma: self.gamma,
            tcp_curve: self.tcp_curve.points(),
            shm_curve: self.shm_curve.points(),
        };
        // Serialising plain numbers cannot fail; the fallback keeps the
        // error visible to whoever reads the text.
        serde_json::to_string(&file).unwrap_or_else(|e| format!("unencodable cost model: {e}"))
    }

    /// Parses [`CostModel::encode`]'s JSON, or the one-line text that
    /// calibration files of earlier versions hold (`gradwire-model v1
    /// tcp_alpha=… …`); every field must be present, finite and
    /// non-negative.
    pub fn decode(text: &str) -> Result<CostModel> {
        let bad = |why: String| Error::Config(format!("cost model {text:?}: {why}"));
        if text.trim_start().starts_with('{') {
            let f: ModelFile =
                serde_json::from_str(text).map_err(|e| bad(format!("not a model file: {e}")))?;
            if f.gradwire_model != MODEL_VERSION {
                return Err(bad(format!(
                    "format version {} (this gradwire reads {MODEL_VERSION})",
                    f.gradwire_model
                )));
            }
            let curve = |name: &str, pts: &[(u64, f64)]| {
                Curve::new(pts).map_err(|e| bad(format!("{name}: {e}")))
            };
            let m = CostModel {
                tcp: f.tcp,
                shm: f.shm,
                gamma: f.gamma,
                tcp_curve: curve("tcp_curve", &f.tcp_curve)?,
                shm_curve: curve("shm_curve", &f.shm_curve)?,
            };
            for (k, x) in [
                ("tcp.alpha", m.tcp.alpha),
                ("tcp.beta", m.tcp.beta),
                ("shm.alpha", m.shm.alpha),
                ("shm.beta", m.shm.beta),
                ("gamma", m.gamma),
            ] {
                if !x.is_finite() || x < 0.0 {
                    return Err(bad(format!("{k}={x} is not a finite non-negative number")));
                }
            }
            return Ok(m);
        }
        let mut words = text.split_whitespace();
        if words.next() != Some("gradwire-model") || words.next() != Some("v1") {
            return Err(bad("does not start with \"gradwire-model v1\"".into()));
        }
        let mut vals = [None::<f64>; 5];
        const NAMES: [&str; 5] = ["tcp_alpha", "tcp_beta", "shm_alpha", "shm_beta", "gamma"];
        for w in words {
            let (k, v) = w
                .split_once('=')
                .ok_or_else(|| bad(format!("{w:?} is not key=value")))?;
            let i = NAMES
                .iter()
                .position(|n| *n == k)
                .ok_or_else(|| bad(format!("unknown key {k:?}")))?;
            let x: f64 = v
                .parse()
                .map_err(|_| bad(format!("{k}={v:?} is not a number")))?;
            if !x.is_finite() || x < 0.0 {
                return Err(bad(format!("{k}={v} is not a finite non-negative number")));
            }
            vals[i] = Some(x);
        }
        let get = |i: usize| vals[i].ok_or_else(|| bad(format!("{} is missing", NAMES[i])));
        Ok(CostModel {
            tcp: Link {
                alpha: get(0)?,
                beta: get(1)?,
            },
            shm: Link {
                alpha: get(2)?,
                beta: get(3)?,
            },
            gamma: get(4)?,
            ..CostModel::default()
        })
    }

    /// Where calibration is kept: `GW_MODEL_FILE`, else
    /// `$XDG_CACHE_HOME/gradwire/model` or `~/.cache/gradwire/model`.
    pub fn default_path() -> Option<PathBuf> {
        if let Ok(p) = std::env::var("GW_MODEL_FILE") {
            return Some(PathBuf::from(p));
        }
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
        Some(base.join("gradwire").join("model"))
    }

    /// The calibrated model if a calibration file exists, else the defaults;
    /// a file that exists but cannot be read or parsed is an error.
    pub fn load() -> Result<(CostModel, String)> {
        let Some(path) = Self::default_path() else {
            return Ok((CostModel::default(), "built-in defaults".into()));
        };
        match std::fs::read_to_string(&path) {
            Ok(t) => Ok((Self::decode(t.trim())?, path.display().to_string())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok((
                CostModel::default(),
                format!("built-in defaults ({} not found)", path.display()),
            )),
            Err(e) => Err(Error::sys("read", path.display().to_string(), e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_ranks_use_one_exchange_for_small_messages_and_the_ring_for_large() {
        let m = CostModel::default();
        for kind in [LinkKind::Tcp, LinkKind::Shm] {
            for bytes in [0, 8, 4096] {
                assert_eq!(
                    m.choose(Shape::flat(kind, 2), bytes).0,
                    Algo::Rd,
                    "{bytes} B"
                );
            }
            for bytes in [1 << 20, 1 << 28] {
                assert_eq!(
                    m.choose(Shape::flat(kind, 2), bytes).0,
                    Algo::Ring,
                    "{bytes} B"
                );
            }
            // Never the tree on two ranks: it only adds a hop to the ring.
            for bytes in [0, 8, 4096, 1 << 20, 1 << 28] {
                assert_ne!(m.choose(Shape::flat(kind, 2), bytes).0, Algo::Tree);
            }
        }
    }

    #[test]
    fn rd_prediction_counts_rounds_and_the_fold() {
        let m = CostModel::default();
        let Link { alpha, beta } = m.tcp;
        let s = 1000.0;
        let round = alpha + s * beta + s * m.gamma;
        let t4 = m.predict(Shape::flat(LinkKind::Tcp, 4), Algo::Rd, 1000);
        assert!((t4 - 2.0 * round).abs() < 1e-15, "{t4}");
        // 6 = 4 + 2 folded: two rounds plus a fold and a hand-back.
        let t6 = m.predict(Shape::flat(LinkKind::Tcp, 6), Algo::Rd, 1000);
        let fold = 2.0 * (alpha + s * beta) + s * m.gamma;
        assert!((t6 - (2.0 * round + fold)).abs() < 1e-15, "{t6}");
    }

    #[test]
    fn latency_bound_sizes_avoid_the_ring_on_many_ranks() {
        let m = CostModel::default();
        // log2 n messages in sequence (rd) against 2 log2 n (rhd, tree).
        assert_eq!(m.choose(Shape::flat(LinkKind::Tcp, 8), 8).0, Algo::Rd);
        assert_eq!(m.choose(Shape::flat(LinkKind::Tcp, 6), 8).0, Algo::Rd);
        // Mid sizes: rd's log2 n full copies cost more than rhd's halving.
        assert_eq!(
            m.choose(Shape::flat(LinkKind::Tcp, 8), 256 << 10).0,
            Algo::Rhd
        );
        // Large messages: the tree sends the whole message d times.
        assert_eq!(
            m.choose(Shape::flat(LinkKind::Tcp, 6), 64 << 20).0,
            Algo::Ring
        );
        let (a, t) = m.choose(Shape::flat(LinkKind::Shm, 3), 64 << 20);
        assert_eq!(a, Algo::Ring);
        assert!((t - m.predict(Shape::flat(LinkKind::Shm, 3), Algo::Ring, 64 << 20)).abs() < 1e-15);
    }

    #[test]
    fn ring_prediction_matches_the_formula() {
        let m = CostModel {
            tcp: Link {
                alpha: 1e-5,
                beta: 1e-9,
            },
            shm: Link {
                alpha: 0.0,
                beta: 0.0,
            },
            gamma: 1e-10,
            ..CostModel::default()
        };
        let t = m.predict(Shape::flat(LinkKind::Tcp, 4), Algo::Ring, 4_000_000);
        let want = 6.0 * 1e-5 + 2.0 * 0.75 * 4e6 * 1e-9 + 0.75 * 4e6 * 1e-10;
        assert!((t - want).abs() < 1e-12, "{t} vs {want}");
        assert_eq!(
            m.predict(Shape::flat(LinkKind::Tcp, 1), Algo::Tree, 100),
            0.0
        );
    }

    /// `hosts` hosts of `local` ranks, shm within and TCP across.
    fn grid(hosts: usize, local: usize) -> Shape {
        Shape {
            n: hosts * local,
            link: if hosts > 1 {
                LinkKind::Tcp
            } else {
                LinkKind::Shm
            },
            intra: LinkKind::Shm,
            local: Some(local),
            oversubscription: 1.0,
        }
    }

    #[test]
    fn hier_prediction_matches_the_formula() {
        let m = CostModel {
            tcp: Link {
                alpha: 2e-5,
                beta: 1e-9,
            },
            shm: Link {
                alpha: 1e-6,
                beta: 2e-10,
            },
            gamma: 1e-10,
            ..CostModel::default()
        };
        let s = 6_000_000.0;
        let t = m.predict(grid(2, 3), Algo::Hier, 6_000_000);
        let within = 4.0 * (1e-6 + s / 3.0 * 2e-10) + 2.0 / 3.0 * s * 1e-10;
        let across = 2.0 * 2e-5 + (s / 3.0) * 1e-9 + 0.5 * (s / 3.0) * 1e-10;
        assert!((t - (within + across)).abs() < 1e-12, "{t}");
        // Without a host layout hier cannot run.
        assert_eq!(
            m.predict(Shape::flat(LinkKind::Tcp, 4), Algo::Hier, 100),
            f64::INFINITY
        );
    }

    #[test]
    fn measured_curves_set_beta_by_size_and_survive_encoding() {
        let m = CostModel {
            shm_curve: Curve::new(&[(1 << 10, 1e-11), (1 << 20, 1e-10)]).expect("curve"),
            ..CostModel::default()
        };
        let at = |beta: f64| CostModel {
            shm: Link {
                alpha: m.shm.alpha,
                beta,
            },
            shm_curve: Curve::default(),
            ..m
        };
        let shape = Shape::flat(LinkKind::Shm, 4);
        // Below the first point the first β, above the last the last.
        assert_eq!(
            m.predict(shape, Algo::Ring, 512),
            at(1e-11).predict(shape, Algo::Ring, 512)
        );
        assert_eq!(
            m.predict(shape, Algo::Ring, 1 << 26),
            at(1e-10).predict(shape, Algo::Ring, 1 << 26)
        );
        assert_eq!(m.choose(shape, 1 << 26), at(1e-10).choose(shape, 1 << 26));
        // TCP has no curve: its one β.
        let tcp = Shape::flat(LinkKind::Tcp, 4);
        assert_eq!(
            m.predict(tcp, Algo::Ring, 1 << 26),
            CostModel::default().predict(tcp, Algo::Ring, 1 << 26)
        );
        let text = m.encode();
        assert!(text.contains("\"shm_curve\":[[1024,"), "{text}");
        assert!(!text.contains("tcp_curve"), "{text}");
        assert_eq!(CostModel::decode(&text).ok(), Some(m));
        let bad = text.replace("[[1024,", "[[4194304,");
        let e = CostModel::decode(&bad)
            .expect_err("decreasing sizes")
            .to_string();
        assert!(e.contains("shm_curve") && e.contains("increase"), "{e}");
    }

    #[test]
    fn oversubscribed_ranks_pay_twice_per_byte_and_per_message() {
        let m = CostModel::default();
        let crowded = Shape {
            oversubscription: 2.0,
            ..Shape::flat(LinkKind::Shm, 4)
        };
        let doubled = CostModel {
            shm: Link {
                alpha: 2.0 * m.shm.alpha,
                beta: 2.0 * m.shm.beta,
            },
            gamma: 2.0 * m.gamma,
            ..m
        };
        for bytes in [8, 1 << 20] {
            for algo in [Algo::Ring, Algo::Rhd, Algo::Rd] {
                let want = doubled.predict(Shape::flat(LinkKind::Shm, 4), algo, bytes);
                assert_eq!(m.predict(crowded, algo, bytes), want, "{algo:?} {bytes}");
            }
            assert_eq!(
                m.choose(crowded, bytes),
                doubled.choose(Shape::flat(LinkKind::Shm, 4), bytes)
            );
        }
        // Below 1 means spare processors, which do not make bytes cheaper.
        let roomy = Shape {
            oversubscription: 0.25,
            ..Shape::flat(LinkKind::Shm, 4)
        };
        assert_eq!(
            m.predict(roomy, Algo::Ring, 1 << 20),
            m.predict(Shape::flat(LinkKind::Shm, 4), Algo::Ring, 1 << 20)
        );
    }

    #[test]
    fn three_levels_cost_what_a_hand_worked_case_says() {
        let l = |alpha: f64, beta: f64, ranks| Level {
            link: Link { alpha, beta },
            ranks,
        };
        // 8 per node, 4 nodes per rack, 2 racks, 64 MB: each level rings
        // over its share and passes an 1/g of it up.
        let levels = [l(1e-6, 1e-11, 8), l(5e-6, 1e-10, 4), l(2e-5, 4e-10, 2)];
        let (s, g) = (64e6, 1e-11);
        let node = 14.0 * (1e-6 + s / 8.0 * 1e-11) + 7.0 / 8.0 * s * g;
        let s2 = s / 8.0;
        let rack = 6.0 * (5e-6 + s2 / 4.0 * 1e-10) + 3.0 / 4.0 * s2 * g;
        let s3 = s2 / 4.0;
        let spine = 2.0 * (2e-5 + s3 / 2.0 * 4e-10) + 0.5 * s3 * g;
        let t = predict_levels(&levels, g, 64_000_000);
        assert!((t - (node + rack + spine)).abs() < 1e-12, "{t}");
        // Two levels are the communicator's hier, exactly.
        let m = CostModel::default();
        let two = [
            Level {
                link: m.shm,
                ranks: 3,
            },
            Level {
                link: m.tcp,
                ranks: 2,
            },
        ];
        assert_eq!(
            predict_levels(&two, m.gamma, 6_000_000),
            m.predict(grid(2, 3), Algo::Hier, 6_000_000)
        );
        // 64 ranks: hier beats every flat algorithm over the slowest link.
        assert_eq!(
            choose_on(
                FlatLinks::same(levels[2].link),
                Some(&levels),
                g,
                64,
                64_000_000
            )
            .0,
            Algo::Hier
        );
        // A single level with ranks is no hierarchy.
        let flat = [l(1e-6, 1e-11, 8), l(5e-6, 1e-10, 1)];
        assert_ne!(
            choose_on(FlatLinks::same(flat[0].link), Some(&flat), g, 8, 64_000_000).0,
            Algo::Hier
        );
    }

    #[test]
    fn hier_is_chosen_across_hosts_when_cheaper() {
        let m = CostModel::default();
        // 2 hosts × 2 ranks, default numbers (shm faster than TCP in α and
        // β): hier beats every flat algorithm from 1 MiB on; for the
        // smallest messages rd's two TCP messages beat hier's two shm and
        // two TCP ones (from a few KiB on, hier's halved TCP bytes win).
        for bytes in [1 << 20, 64 << 20] {
            let (a, t) = m.choose(grid(2, 2), bytes);
            assert_eq!(a, Algo::Hier, "{bytes} B");
            assert_eq!(t, m.predict(grid(2, 2), Algo::Hier, bytes));
        }
        for bytes in [0, 8, 256] {
            assert_eq!(m.choose(grid(2, 2), bytes).0, Algo::Rd, "{bytes} B");
        }
        assert_eq!(m.choose(grid(3, 4), 64 << 20).0, Algo::Hier);
        // One host, or one rank per host: hier is a flat ring, never chosen.
        for (hosts, local) in [(1, 4), (4, 1)] {
            for bytes in [8, 64 << 20] {
                assert_ne!(m.choose(grid(hosts, local), bytes).0, Algo::Hier);
            }
        }
        // No regular layout: the flat choice over TCP.
        let uneven = Shape {
            local: None,
            ..grid(2, 2)
        };
        assert_eq!(
            m.choose(uneven, 64 << 20),
            m.choose(Shape::flat(LinkKind::Tcp, 4), 64 << 20)
        );
        // Shared memory with a huge per-message cost: small messages go flat
        // (rd's 2 TCP messages beat 2 slow shm and 2 TCP ones), large ones
        // still hier, which sends half the bytes over TCP.
        let slow_shm = CostModel {
            shm: Link {
                alpha: 1e-3,
                beta: 1.0 / 2.4e9,
            },
            ..m
        };
        assert_eq!(slow_shm.choose(grid(2, 2), 8).0, Algo::Rd);
        assert_eq!(slow_shm.choose(grid(2, 2), 256 << 20).0, Algo::Hier);
    }

    #[test]
    fn encoding_round_trips_and_bad_text_is_named() {
        let m = CostModel::default();
        assert_eq!(CostModel::decode(&m.encode()).ok(), Some(m));
        // Numbers survive exactly, and files of earlier versions still read.
        let odd = CostModel {
            tcp: Link {
                alpha: 1.0 / 3.0,
                beta: 7.1e-10,
            },
            ..m
        };
        assert_eq!(CostModel::decode(&odd.encode()).ok(), Some(odd));
        let legacy = format!("gradwire-model v1 {odd}");
        assert_eq!(CostModel::decode(&legacy).ok(), Some(odd));
        for (text, needle) in [
            (
                r#"{"gradwire_model":2,"tcp":{"alpha":0,"beta":0},"shm":{"alpha":0,"beta":0},"gamma":0}"#,
                "format version 2",
            ),
            (
                r#"{"gradwire_model":1,"tcp":{"alpha":-1,"beta":0},"shm":{"alpha":0,"beta":0},"gamma":0}"#,
                "tcp.alpha=-1",
            ),
            (
                r#"{"gradwire_model":1,"tcp":{"alpha":0,"beta":0},"gamma":0}"#,
                "missing field `shm`",
            ),
            (
                r#"{"gradwire_model":1,"tcp":{"alpha":0,"beta":0,"x":1},"shm":{"alpha":0,"beta":0},"gamma":0}"#,
                "unknown field",
            ),
        ] {
            let e = CostModel::decode(text).expect_err(text).to_string();
            assert!(e.contains(needle), "{text:?}: {e}");
        }
        for (text, needle) in [
            ("", "does not start"),
            ("gradwire-model v1 tcp_alpha=1", "tcp_beta is missing"),
            ("gradwire-model v1 tcp_alpha=x", "not a number"),
            ("gradwire-model v1 tcp_alpha=-1", "non-negative"),
            ("gradwire-model v1 zeta=1", "unknown key"),
            ("gradwire-model v1 tcp_alpha", "not key=value"),
        ] {
            let e = CostModel::decode(text).expect_err(text).to_string();
            assert!(e.contains(needle), "{text:?}: {e}");
        }
    }
}
