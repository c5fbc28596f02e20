//! What a port is, and which device and port gradwire uses: the pure half of
//! discovery.
//!
//! The device half (`ibv_get_device_list`, `ibv_query_port`) lives in
//! `device.rs` behind the `verbs` feature; it turns what the device says
//! into these types and asks the functions here to choose, so that the
//! choices (`GW_IB_HCA`, which port, the MTU both sides can use) are tested
//! without a device.

use crate::error::{Error, Result};
use std::fmt;

/// A path MTU, as verbs name them (`IBV_MTU_256` = 1 .. `IBV_MTU_4096` = 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mtu {
    B256 = 1,
    B512 = 2,
    B1024 = 3,
    B2048 = 4,
    B4096 = 5,
}

impl Mtu {
    /// The MTU of verbs code `code` (`enum ibv_mtu`), if it is one.
    pub fn from_code(code: u32) -> Option<Mtu> {
        Some(match code {
            1 => Mtu::B256,
            2 => Mtu::B512,
            3 => Mtu::B1024,
            4 => Mtu::B2048,
            5 => Mtu::B4096,
            _ => return None,
        })
    }

    /// Its verbs code (`enum ibv_mtu`).
    pub fn code(self) -> u32 {
        self as u32
    }

    /// Its size in bytes.
    pub fn bytes(self) -> u32 {
        128 << self.code()
    }
}

impl fmt::Display for Mtu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} B", self.bytes())
    }
}

/// The path MTU two ports can both carry: the smaller of the two.
pub fn path_mtu(local: Mtu, remote: Mtu) -> Mtu {
    local.min(remote)
}

/// What a port's link speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinkLayer {
    /// InfiniBand: addressed by LID, the subnet manager assigns it.
    Infiniband,
    /// Ethernet (RoCE): addressed by GID, which needs the right GID index.
    Ethernet,
}

impl LinkLayer {
    /// The link layer of verbs code `code` (`IBV_LINK_LAYER_*`: 0
    /// unspecified, which verbs document as InfiniBand; 1 InfiniBand;
    /// 2 Ethernet).
    pub fn from_code(code: u8) -> Option<LinkLayer> {
        match code {
            0 | 1 => Some(LinkLayer::Infiniband),
            2 => Some(LinkLayer::Ethernet),
            _ => None,
        }
    }
}

impl fmt::Display for LinkLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LinkLayer::Infiniband => "InfiniBand",
            LinkLayer::Ethernet => "Ethernet",
        })
    }
}

/// A port's logical state (`enum ibv_port_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PortState {
    Nop,
    Down,
    Init,
    Armed,
    Active,
    ActiveDefer,
    Other(u32),
}

impl PortState {
    pub fn from_code(code: u32) -> PortState {
        match code {
            0 => PortState::Nop,
            1 => PortState::Down,
            2 => PortState::Init,
            3 => PortState::Armed,
            4 => PortState::Active,
            5 => PortState::ActiveDefer,
            other => PortState::Other(other),
        }
    }
}

impl fmt::Display for PortState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortState::Nop => f.write_str("NOP"),
            PortState::Down => f.write_str("DOWN"),
            PortState::Init => f.write_str("INIT (no subnet manager has configured it)"),
            PortState::Armed => f.write_str("ARMED"),
            PortState::Active => f.write_str("ACTIVE"),
            PortState::ActiveDefer => f.write_str("ACTIVE_DEFER"),
            PortState::Other(c) => write!(f, "state {c}"),
        }
    }
}

/// One port as `ibv_query_port` described it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortInfo {
    /// Port number, from 1.
    pub num: u8,
    pub state: PortState,
    pub link_layer: LinkLayer,
    pub active_mtu: Mtu,
    /// The port's LID (InfiniBand; 0 on Ethernet).
    pub lid: u16,
    /// Entries in the port's GID table.
    pub gid_table_len: u32,
}

/// Where `GW_IB_HCA` points: a device name and, after a colon, a port.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HcaChoice {
    pub device: Option<String>,
    pub port: Option<u8>,
}

impl HcaChoice {
    /// Reads `GW_IB_HCA`'s value: `mlx5_0` or `mlx5_0:1`; empty means any.
    pub fn parse(value: &str) -> Result<HcaChoice> {
        let value = value.trim();
        if value.is_empty() {
            return Ok(HcaChoice::default());
        }
        let bad = |why: &str| Error::Config {
            var: "GW_IB_HCA",
            value: value.to_string(),
            why: why.to_string(),
        };
        let (name, port) = match value.split_once(':') {
            None => (value, None),
            Some((name, port)) => {
                let port: u8 = port
                    .parse()
                    .map_err(|_| bad("the port after ':' must be a number from 1 to 255"))?;
                if port == 0 {
                    return Err(bad("ports are numbered from 1"));
                }
                (name, Some(port))
            }
        };
        if name.is_empty() {
            return Err(bad(
                "expected a device name, as ibv_devices lists them, like mlx5_0 or mlx5_0:1",
            ));
        }
        Ok(HcaChoice {
            device: Some(name.to_string()),
            port,
        })
    }
}

/// Which of the devices `names` (in `ibv_get_device_list`'s order) to open:
/// the one `want` names, or the first.
pub fn select_device(names: &[String], want: Option<&str>) -> Result<usize> {
    if names.is_empty() {
        return Err(Error::NoDevice {
            reason: "no devices found".into(),
        });
    }
    match want {
        None => Ok(0),
        Some(name) => names
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| Error::UnknownDevice {
                name: name.to_string(),
                found: names.join(", "),
            }),
    }
}

/// Which port of `device` to use: the one `want` names, which must be
/// ACTIVE, or the first ACTIVE one.
pub fn choose_port<'a>(
    device: &str,
    ports: &'a [PortInfo],
    want: Option<u8>,
) -> Result<&'a PortInfo> {
    let listing = || {
        if ports.is_empty() {
            "the device reports no ports".to_string()
        } else {
            ports
                .iter()
                .map(|p| format!("port {} is {} ({})", p.num, p.state, p.link_layer))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    let found = match want {
        Some(n) => match ports.iter().find(|p| p.num == n) {
            Some(p) if p.state == PortState::Active => Some(p),
            Some(_) | None => {
                return Err(Error::NoActivePort {
                    device: device.to_string(),
                    ports: format!("GW_IB_HCA asks for port {n}, but {}", listing()),
                });
            }
        },
        None => ports.iter().find(|p| p.state == PortState::Active),
    };
    found.ok_or_else(|| Error::NoActivePort {
        device: device.to_string(),
        ports: format!("{}; a port must be ACTIVE (see ibv_devinfo)", listing()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(num: u8, state: PortState) -> PortInfo {
        PortInfo {
            num,
            state,
            link_layer: LinkLayer::Ethernet,
            active_mtu: Mtu::B4096,
            lid: 0,
            gid_table_len: 16,
        }
    }

    #[test]
    fn mtu_codes_and_sizes() {
        for code in 1..=5 {
            let m = Mtu::from_code(code).unwrap();
            assert_eq!(m.code(), code);
        }
        assert_eq!(Mtu::B256.bytes(), 256);
        assert_eq!(Mtu::B1024.bytes(), 1024);
        assert_eq!(Mtu::B4096.bytes(), 4096);
        assert_eq!(Mtu::from_code(0), None);
        assert_eq!(Mtu::from_code(6), None);
        assert_eq!(path_mtu(Mtu::B4096, Mtu::B1024), Mtu::B1024);
        assert_eq!(path_mtu(Mtu::B512, Mtu::B2048), Mtu::B512);
        assert_eq!(path_mtu(Mtu::B2048, Mtu::B2048), Mtu::B2048);
    }

    #[test]
    fn link_layer_codes() {
        assert_eq!(LinkLayer::from_code(0), Some(LinkLayer::Infiniband));
        assert_eq!(LinkLayer::from_code(1), Some(LinkLayer::Infiniband));
        assert_eq!(LinkLayer::from_code(2), Some(LinkLayer::Ethernet));
        assert_eq!(LinkLayer::from_code(3), None);
    }

    #[test]
    fn gw_ib_hca_forms() {
        assert_eq!(HcaChoice::parse("").unwrap(), HcaChoice::default());
        assert_eq!(
            HcaChoice::parse("mlx5_0").unwrap(),
            HcaChoice {
                device: Some("mlx5_0".into()),
                port: None
            }
        );
        assert_eq!(
            HcaChoice::parse("mlx5_1:2").unwrap(),
            HcaChoice {
                device: Some("mlx5_1".into()),
                port: Some(2)
            }
        );
        for bad in ["mlx5_0:", "mlx5_0:0", "mlx5_0:x", ":1", "mlx5_0:300"] {
            let e = HcaChoice::parse(bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("GW_IB_HCA={bad}: ")), "{e}");
        }
    }

    #[test]
    fn device_by_name_or_first() {
        let names = vec!["mlx5_0".to_string(), "mlx5_1".to_string()];
        assert_eq!(select_device(&names, None).unwrap(), 0);
        assert_eq!(select_device(&names, Some("mlx5_1")).unwrap(), 1);
        let e = select_device(&names, Some("rxe0")).unwrap_err().to_string();
        assert_eq!(
            e,
            "GW_IB_HCA=rxe0: no such RDMA device (found: mlx5_0, mlx5_1)"
        );
        let e = select_device(&[], None).unwrap_err().to_string();
        assert_eq!(e, "no RDMA device: no devices found");
    }

    #[test]
    fn first_active_port_or_the_one_asked_for() {
        let ports = vec![port(1, PortState::Down), port(2, PortState::Active)];
        assert_eq!(choose_port("mlx5_0", &ports, None).unwrap().num, 2);
        assert_eq!(choose_port("mlx5_0", &ports, Some(2)).unwrap().num, 2);
        let e = choose_port("mlx5_0", &ports, Some(1))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "mlx5_0: no usable port: GW_IB_HCA asks for port 1, but port 1 is DOWN (Ethernet), port 2 is ACTIVE (Ethernet)"
        );
        let e = choose_port("mlx5_0", &ports, Some(3))
            .unwrap_err()
            .to_string();
        assert!(e.contains("asks for port 3"), "{e}");
        let down = vec![port(1, PortState::Down), port(2, PortState::Init)];
        let e = choose_port("mlx5_0", &down, None).unwrap_err().to_string();
        assert!(e.contains("port 1 is DOWN"), "{e}");
        assert!(e.contains("port 2 is INIT (no subnet manager"), "{e}");
        assert!(
            e.ends_with("a port must be ACTIVE (see ibv_devinfo)"),
            "{e}"
        );
        let e = choose_port("mlx5_0", &[], None).unwrap_err().to_string();
        assert!(e.contains("reports no ports"), "{e}");
    }
}
