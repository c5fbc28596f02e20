//! Cluster files: device types, the links of each level of the network,
//! and which devices sit in which node and rack.
//!
//! ```text
//! cluster name=reference
//! device type=a100 tflops=125 memory_gib=80 mem_gbytes_s=2039 h2d_gbytes_s=25 price_per_hour=4.1
//! link level=node alpha_us=3 gbit_s=2400
//! link level=rack alpha_us=5 gbit_s=200 nics=8
//! link level=spine alpha_us=8 gbit_s=200 nics=8 oversubscription=2
//! storage gbytes_s=5
//! racks count=16 nodes=8 devices=8 type=a100
//! node rack=16 devices=4 type=v100
//! ```
//!
//! `tflops` is the sustained training rate of one device (not its peak);
//! `reduce_gbytes_s` (default a third of `mem_gbytes_s`) how fast it sums
//! gradients; `launch_ms` a fixed cost per step.
//! A `link`'s `gbit_s` is per device at level `node` (the NVLink or PCIe
//! share one device sends at) and per NIC above it, a node having `nics` of
//! them; `oversubscription` divides what a node gets through that level.
//! `curve=BYTES:GBIT_S,…` gives the bandwidth measured at some all-reduce
//! sizes (as `gwbench calibrate` measures β by size); between them it is
//! interpolated as the live model does. `storage` is each node's read
//! bandwidth. `racks` appends `count` racks
//! of `nodes` equal nodes; `node` appends one node to rack `rack` (a new
//! rack when `rack` is the next number). Either may say `cores=C` when the
//! devices are CPU processes sharing C processors (as gradwire's own ranks
//! on one machine are): α, β and γ then grow by ⌈devices / C⌉, as in the
//! live communicator's model.

use crate::lines::{FileError, split};
use gw_collectives::model::Curve;
use std::collections::BTreeMap;

#[derive(Clone, Debug, PartialEq)]
pub struct Device {
    pub name: String,
    /// Sustained FLOP/s in training.
    pub flops: f64,
    pub memory_bytes: f64,
    /// Device memory bandwidth, bytes/s (the optimizer step and reductions).
    pub mem_bytes_s: f64,
    /// Host-to-device copy bandwidth, bytes/s.
    pub h2d_bytes_s: f64,
    pub price_per_hour: f64,
    /// Fixed seconds per step (kernel launches, framework overhead).
    pub launch_s: f64,
    /// Seconds per byte of a reduction (γ): `reduce_gbytes_s` if given,
    /// else three memory accesses per byte (two reads, one write).
    pub gamma: f64,
}

/// The three levels a cluster's links sit at, innermost first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Node,
    Rack,
    Spine,
}

impl Level {
    pub const ALL: [Level; 3] = [Level::Node, Level::Rack, Level::Spine];

    pub fn name(self) -> &'static str {
        match self {
            Level::Node => "node",
            Level::Rack => "rack",
            Level::Spine => "spine",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct LinkSpec {
    pub alpha_s: f64,
    /// Bytes/s of the link: per device at the node level, per node (all
    /// its NICs, after oversubscription) above.
    pub node_bytes_s: f64,
    pub per_device: bool,
    /// The same link measured at some message sizes (`curve=`), as seconds
    /// per byte by size; empty: `node_bytes_s` at every size.
    pub curve: Curve,
}

impl LinkSpec {
    /// Bytes/s for all-reduces of `bytes` among `host_ranks` devices per
    /// node, off the curve when there is one (read as gw_collectives reads
    /// its β curves: at the node's footprint, see `Curve::beta_for`).
    pub fn bytes_s_at(&self, bytes: u64, host_ranks: usize) -> f64 {
        1.0 / self
            .curve
            .beta_for(1.0 / self.node_bytes_s, bytes as usize, host_ranks)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// Index into [`Cluster::devices`].
    pub device: usize,
    pub devices: usize,
    /// Processors its devices share, when they are CPU ranks (`cores=`).
    pub cores: Option<usize>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Cluster {
    pub name: String,
    pub devices: Vec<Device>,
    /// Indexed by [`Level`] as usize; None where the file has no such link.
    pub links: [Option<LinkSpec>; 3],
    /// Per node, bytes/s.
    pub storage_bytes_s: f64,
    pub racks: Vec<Vec<Node>>,
}

impl Cluster {
    pub fn device_count(&self) -> usize {
        self.racks.iter().flatten().map(|n| n.devices).sum()
    }

    /// γ of the all-reduce: a reduction runs at the pace of the slowest
    /// device that takes part.
    pub fn gamma(&self) -> f64 {
        self.racks
            .iter()
            .flatten()
            .map(|n| self.devices[n.device].gamma)
            .fold(0.0, f64::max)
    }

    /// Devices on the busiest processor of the most crowded node,
    /// ⌈devices / cores⌉, at least 1 (as the live communicator counts).
    pub fn oversubscription(&self) -> f64 {
        self.racks
            .iter()
            .flatten()
            .filter_map(|n| n.cores.map(|c| n.devices.div_ceil(c) as f64))
            .fold(1.0, f64::max)
    }

    pub fn link(&self, level: Level) -> Option<&LinkSpec> {
        self.links[level as usize].as_ref()
    }

    /// Parses a cluster file; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<Cluster, FileError> {
        let whole = |field: &str, why: String| FileError {
            file: file.into(),
            line: 0,
            field: field.into(),
            why,
        };
        let mut c = Cluster {
            name: String::new(),
            devices: Vec::new(),
            links: [None, None, None],
            storage_bytes_s: f64::INFINITY,
            racks: Vec::new(),
        };
        let mut by_name = BTreeMap::new();
        let mut named = false;
        for mut l in split(file, text)? {
            match l.keyword {
                "cluster" => {
                    if std::mem::replace(&mut named, true) {
                        return Err(l.error("cluster", "a second `cluster` line"));
                    }
                    c.name = l.text("name")?.to_string();
                }
                "device" => {
                    let name = l.text("type")?.to_string();
                    if by_name.contains_key(&name) {
                        return Err(l.error("type", format!("device type {name:?} defined twice")));
                    }
                    let mem = l.number("mem_gbytes_s", None, true)? * 1e9;
                    let reduce = l.number("reduce_gbytes_s", Some(mem / 3e9), true)? * 1e9;
                    let d = Device {
                        gamma: 1.0 / reduce,
                        flops: l.number("tflops", None, true)? * 1e12,
                        memory_bytes: l.number("memory_gib", None, true)? * (1u64 << 30) as f64,
                        mem_bytes_s: mem,
                        h2d_bytes_s: l.number("h2d_gbytes_s", Some(f64::INFINITY), true)? * 1e9,
                        price_per_hour: l.number("price_per_hour", Some(0.0), false)?,
                        launch_s: l.number("launch_ms", Some(0.0), false)? * 1e-3,
                        name: name.clone(),
                    };
                    by_name.insert(name, c.devices.len());
                    c.devices.push(d);
                }
                "link" => {
                    let level = l.text("level")?;
                    let Some(lv) = Level::ALL.into_iter().find(|x| x.name() == level) else {
                        return Err(
                            l.error("level", format!("{level:?} is not node, rack or spine"))
                        );
                    };
                    if c.links[lv as usize].is_some() {
                        return Err(l.error("level", format!("a second `{level}` link")));
                    }
                    let alpha_s = l.number("alpha_us", None, false)? * 1e-6;
                    let bytes_s = l.number("gbit_s", None, true)? * 1e9 / 8.0;
                    let (nics, over) = if lv == Level::Node {
                        (1.0, 1.0)
                    } else {
                        (
                            l.count("nics", Some(1), 1)? as f64,
                            l.number("oversubscription", Some(1.0), true)?,
                        )
                    };
                    let mut points = Vec::new();
                    if let Some(text) = l.optional_text("curve") {
                        for point in text.split(',') {
                            let parsed = point.split_once(':').and_then(|(b, g)| {
                                Some((b.parse::<u64>().ok()?, g.parse::<f64>().ok()?))
                            });
                            match parsed {
                                Some((b, g)) if b > 0 && g.is_finite() && g > 0.0 => {
                                    points.push((b, 8.0 / (g * 1e9 * nics / over)));
                                }
                                _ => {
                                    return Err(l.error(
                                        "curve",
                                        format!("{point:?} is not BYTES:GBIT_S with both > 0"),
                                    ));
                                }
                            }
                        }
                    }
                    let curve = Curve::new(&points).map_err(|e| l.error("curve", e))?;
                    c.links[lv as usize] = Some(LinkSpec {
                        alpha_s,
                        node_bytes_s: bytes_s * nics / over,
                        per_device: lv == Level::Node,
                        curve,
                    });
                }
                "storage" => {
                    c.storage_bytes_s = l.number("gbytes_s", None, true)? * 1e9;
                }
                "racks" | "node" => {
                    let ty = l.text("type")?;
                    let Some(&device) = by_name.get(ty) else {
                        return Err(l.error(
                            "type",
                            format!("device type {ty:?} has no `device` line above"),
                        ));
                    };
                    let devices = l.count("devices", None, 1)? as usize;
                    let cores = l.optional_count("cores", 1)?.map(|c| c as usize);
                    if l.keyword == "racks" {
                        let count = l.count("count", Some(1), 1)?;
                        let nodes = l.count("nodes", None, 1)? as usize;
                        for _ in 0..count {
                            c.racks.push(vec![
                                Node {
                                    device,
                                    devices,
                                    cores
                                };
                                nodes
                            ]);
                        }
                    } else {
                        let rack = l.count("rack", None, 0)? as usize;
                        match rack.cmp(&c.racks.len()) {
                            std::cmp::Ordering::Less => c.racks[rack].push(Node {
                                device,
                                devices,
                                cores,
                            }),
                            std::cmp::Ordering::Equal => c.racks.push(vec![Node {
                                device,
                                devices,
                                cores,
                            }]),
                            std::cmp::Ordering::Greater => {
                                return Err(l.error(
                                    "rack",
                                    format!(
                                        "rack {rack} skips ahead: the next rack is {}",
                                        c.racks.len()
                                    ),
                                ));
                            }
                        }
                    }
                    if c.device_count() > 1 << 22 {
                        return Err(l.error("count", "more than 4,194,304 devices"));
                    }
                }
                other => {
                    return Err(l.error(
                        other,
                        "unknown line (cluster, device, link, storage, racks or node)",
                    ));
                }
            }
            l.finish()?;
        }
        if !named {
            return Err(whole("cluster", "no `cluster name=…` line".into()));
        }
        if c.racks.is_empty() {
            return Err(whole(
                "racks",
                "no `racks` or `node` line: the cluster has no devices".into(),
            ));
        }
        let needs = [
            c.racks.iter().flatten().any(|n| n.devices > 1),
            c.racks.iter().any(|r| r.len() > 1),
            c.racks.len() > 1,
        ];
        for (lv, need) in Level::ALL.into_iter().zip(needs) {
            if need && c.link(lv).is_none() {
                return Err(whole(
                    "link",
                    format!(
                        "no `link level={}` line, but devices talk across that level",
                        lv.name()
                    ),
                ));
            }
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: &str = "cluster name=small\n\
        device type=v100 tflops=8 memory_gib=16 mem_gbytes_s=900 price_per_hour=3\n\
        device type=k80 tflops=2 memory_gib=12 mem_gbytes_s=240\n\
        link level=node alpha_us=2 gbit_s=800\n\
        link level=rack alpha_us=10 gbit_s=100 nics=2 oversubscription=2\n\
        racks count=1 nodes=2 devices=4 type=v100\n\
        node rack=0 devices=2 type=k80\n";

    #[test]
    fn layout_and_units() {
        let c = Cluster::parse("small", SMALL).expect("parses");
        assert_eq!(c.device_count(), 10);
        assert_eq!(c.racks.len(), 1);
        assert_eq!(c.racks[0].len(), 3);
        let rack = c.link(Level::Rack).expect("rack link");
        // 2 NICs of 100 Gb/s halved by oversubscription: 12.5 GB/s a node.
        assert_eq!(rack.node_bytes_s, 12.5e9);
        assert!((rack.alpha_s - 10e-6).abs() < 1e-18);
        assert_eq!(c.devices[0].memory_bytes, 16.0 * 1073741824.0);
        assert_eq!(c.devices[1].price_per_hour, 0.0);
    }

    #[test]
    fn curves_and_shared_processors() {
        let text = "cluster name=vm\n\
            device type=cpu tflops=1 memory_gib=1 mem_gbytes_s=10\n\
            link level=node alpha_us=1 gbit_s=8 curve=1024:80,1048576:8\n\
            racks nodes=1 devices=3 type=cpu cores=2\n";
        let c = Cluster::parse("vm", text).expect("parses");
        // Three ranks on two processors: one processor runs two.
        assert_eq!(c.oversubscription(), 2.0);
        let node = c.link(Level::Node).expect("node link");
        let near = |a: f64, b: f64| (a - b).abs() < 1e-9 * b;
        assert!(near(node.bytes_s_at(1024, 2), 10e9));
        assert!(near(node.bytes_s_at(1 << 30, 2), 1e9));
        // Half way in log size between 1 KiB and 1 MiB: β half way too.
        let mid = node.bytes_s_at(32 << 10, 2);
        assert!(
            (1.0 / mid - 0.5 * (1.0 / 10e9 + 1.0 / 1e9)).abs() < 1e-21,
            "{mid}"
        );
        // Four devices a node: 16 KiB all-reduces fill the node's caches as
        // 32 KiB ones do between the two ranks the curve was measured with.
        assert!(near(node.bytes_s_at(16 << 10, 4), mid));
        assert!(near(node.bytes_s_at(32 << 10, 1), mid), "never below two");
        for (bad, want) in [
            ("curve=1024:80,512:8", "sizes must increase"),
            ("curve=1024", "is not BYTES:GBIT_S"),
            ("curve=0:8", "is not BYTES:GBIT_S"),
        ] {
            let e =
                Cluster::parse("vm", &text.replace("curve=1024:80,1048576:8", bad)).expect_err(bad);
            assert_eq!((e.line, e.field.as_str()), (3, "curve"), "{e}");
            assert!(e.why.contains(want), "{e}");
        }
        let e = Cluster::parse("vm", &text.replace("cores=2", "cores=0")).expect_err("0 cores");
        assert_eq!((e.line, e.field.as_str()), (4, "cores"));
    }

    #[test]
    fn bad_files_name_line_and_field() {
        for (text, want) in [
            (
                SMALL.replace("type=k80\n", "type=p100\n"),
                "small line 7, field `type`: device type \"p100\" has no `device` line above",
            ),
            (
                SMALL.replace("level=rack", "level=pod"),
                "small line 5, field `level`: \"pod\" is not node, rack or spine",
            ),
            (
                SMALL.replace("tflops=8", "tflops=0"),
                "small line 2, field `tflops`: 0 is not a finite number > 0",
            ),
            (
                SMALL.replace("rack=0", "rack=5"),
                "small line 7, field `rack`: rack 5 skips ahead",
            ),
            (
                SMALL.replace(
                    "link level=rack alpha_us=10 gbit_s=100 nics=2 oversubscription=2\n",
                    "",
                ),
                "small: link: no `link level=rack` line",
            ),
            (
                SMALL.replace("nics=2", "nic=2"),
                "small line 5, field `nic`: unknown field",
            ),
            (
                SMALL.replace("memory_gib=12 ", ""),
                "small line 3, field `memory_gib`: is missing",
            ),
        ] {
            let e = Cluster::parse("small", &text).expect_err(want).to_string();
            assert!(e.starts_with(want), "{e}");
        }
    }
}
