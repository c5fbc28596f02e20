//! The `GW_IB_*` settings, read once and checked before any device is
//! touched.
//!
//! Read through a lookup function rather than the process environment, so
//! that tests (and the transport backend, which may take them from its own
//! `Config`) supply values without setting variables in a threaded process.

use crate::error::{Error, Result};
use crate::port::HcaChoice;
use std::path::PathBuf;

/// Which device, port and GID the verbs layer uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// `GW_IB_HCA`: a device name, optionally `:port`; the first device and
    /// its first ACTIVE port by default.
    pub hca: HcaChoice,
    /// `GW_IB_GID_INDEX`: the GID table entry to use instead of the
    /// automatic choice ([`crate::gid::choose_gid`]).
    pub gid_index: Option<u32>,
    /// Where sysfs is mounted (`/sys`); tests point it elsewhere.
    pub sysfs: PathBuf,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            hca: HcaChoice::default(),
            gid_index: None,
            sysfs: PathBuf::from("/sys"),
        }
    }
}

impl Config {
    /// The settings in this process's environment.
    pub fn from_env() -> Result<Config> {
        Config::from_lookup(|k| std::env::var(k).ok())
    }

    /// The settings `lookup` gives for each variable name.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let hca = match lookup("GW_IB_HCA") {
            Some(v) => HcaChoice::parse(&v)?,
            None => HcaChoice::default(),
        };
        let gid_index = match lookup("GW_IB_GID_INDEX") {
            None => None,
            Some(v) if v.trim().is_empty() => None,
            Some(v) => Some(v.trim().parse::<u8>().map(u32::from).map_err(|_| Error::Config {
                var: "GW_IB_GID_INDEX",
                value: v.clone(),
                why: "expected a GID table index from 0 to 255 (see show_gids, or /sys/class/infiniband/<dev>/ports/<port>/gids)".into(),
            })?),
        };
        Ok(Config {
            hca,
            gid_index,
            ..Config::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(vars: &[(&str, &str)]) -> Result<Config> {
        Config::from_lookup(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn defaults() {
        assert_eq!(cfg(&[]).unwrap(), Config::default());
        assert_eq!(cfg(&[("GW_IB_GID_INDEX", " ")]).unwrap().gid_index, None);
    }

    #[test]
    fn reads_both_variables() {
        let c = cfg(&[("GW_IB_HCA", "mlx5_2:1"), ("GW_IB_GID_INDEX", "3")]).unwrap();
        assert_eq!(c.hca.device.as_deref(), Some("mlx5_2"));
        assert_eq!(c.hca.port, Some(1));
        assert_eq!(c.gid_index, Some(3));
    }

    #[test]
    fn bad_values_name_the_variable() {
        for bad in ["-1", "x", "256", "3.0"] {
            let e = cfg(&[("GW_IB_GID_INDEX", bad)]).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("GW_IB_GID_INDEX={bad}: expected")),
                "{e}"
            );
        }
        let e = cfg(&[("GW_IB_HCA", "mlx5_0:zero")])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("GW_IB_HCA=mlx5_0:zero: "), "{e}");
    }
}
