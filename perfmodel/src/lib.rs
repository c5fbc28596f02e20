//! The S-SGD performance model behind `gwbench model`: how long one
//! synchronized training step of a model takes on a cluster, what limits
//! it, and what an epoch costs, before anyone books the hardware.
//!
//! Pure computation over two text files (a [`Workload`] and a
//! [`Cluster`]); the all-reduce costs and the algorithm choice are the live
//! communicator's (`gw_collectives::model`) and the local batches come from
//! the job server's OptPerf planner (`gw_planner`), so the model and the
//! running system share one source of truth.

pub mod bucket;
pub mod cluster;
// The line format is shared with the scheduler's trace and cluster files.
use gw_linefile as lines;
pub mod network;
pub mod predict;
pub mod report;
pub mod workload;

pub use cluster::Cluster;
pub use lines::FileError;
pub use predict::{Options, Planner, Prediction, Unfit, predict};
pub use workload::Workload;

/// The model and cluster files the repository ships (perfmodel/data),
/// built in so that `gwbench model --model resnet50` works from anywhere.
pub const SHIPPED: [(&str, &str); 9] = [
    ("resnet50.model", include_str!("../data/resnet50.model")),
    ("resnet101.model", include_str!("../data/resnet101.model")),
    ("vgg16.model", include_str!("../data/vgg16.model")),
    ("bert-base.model", include_str!("../data/bert-base.model")),
    ("gpt2-small.model", include_str!("../data/gpt2-small.model")),
    (
        "cluster-reference.cluster",
        include_str!("../data/cluster-reference.cluster"),
    ),
    (
        "cluster-10k.cluster",
        include_str!("../data/cluster-10k.cluster"),
    ),
    (
        "cluster-gavel.cluster",
        include_str!("../data/cluster-gavel.cluster"),
    ),
    (
        "cluster-goyal.cluster",
        include_str!("../data/cluster-goyal.cluster"),
    ),
];

/// A shipped file by its name without the extension (`resnet50`,
/// `cluster-reference`, or `reference` for a cluster).
pub fn shipped(name: &str, ext: &str) -> Option<&'static str> {
    let full = format!("{name}.{ext}");
    let alt = format!("cluster-{name}.{ext}");
    SHIPPED
        .iter()
        .find(|(n, _)| *n == full || *n == alt)
        .map(|(_, t)| *t)
}

/// The names [`shipped`] knows for `ext`, for error messages.
pub fn shipped_names(ext: &str) -> Vec<&'static str> {
    SHIPPED
        .iter()
        .filter_map(|(n, _)| n.strip_suffix(ext).and_then(|s| s.strip_suffix('.')))
        .collect()
}
