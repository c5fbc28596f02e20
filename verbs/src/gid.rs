//! Which GID table entry a port's traffic uses, and reading the table.
//!
//! On InfiniBand a queue pair is addressed by LID and the port's own GID
//! (index 0) is right. On RoCE the GID index *is* the choice of protocol and
//! of source address: a port's table holds, for every IP address of the
//! netdev, one RoCE v1 entry (raw Ethernet, not routable) and one RoCE v2
//! entry (UDP/IP), plus link-local IPv6 ones. Index 0 is usually v1 over a
//! link-local address, which works only inside one L2 segment and is the
//! most common cause of a RoCE job that never connects. So the choice is a
//! pure function with its reasons ([`choose_gid`]), tested without a device,
//! and `GW_IB_GID_INDEX` overrides it.
//!
//! The table is read from sysfs (`/sys/class/infiniband/<dev>/ports/<p>/
//! gids/<i>`, `gid_attrs/types/<i>`, `gid_attrs/ndevs/<i>`): rdma-sys 0.3's
//! bindings leave out `ibv_query_gid_ex` (a static inline around a
//! `_`-prefixed symbol that its allowlist skips), and sysfs has the same
//! data on every kernel that has RoCE v2. [`read_gid_table`] takes the sysfs
//! root, so it is tested on a made-up tree.

use crate::error::{Error, Result};
use crate::port::LinkLayer;
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;

/// The GID type of a table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GidType {
    /// An InfiniBand GID.
    Ib,
    /// RoCE v1: raw Ethernet frames, not routable.
    RoceV1,
    /// RoCE v2: UDP/IP, routable.
    RoceV2,
}

impl fmt::Display for GidType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GidType::Ib => "IB",
            GidType::RoceV1 => "RoCE v1",
            GidType::RoceV2 => "RoCE v2",
        })
    }
}

/// One populated entry of a port's GID table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GidEntry {
    pub index: u32,
    pub gid: [u8; 16],
    pub kind: GidType,
    /// The netdev the entry belongs to, where the kernel says (RoCE).
    pub netdev: Option<String>,
}

/// A port's GID table: how many entries it has room for, and the ones that
/// are populated (all-zero entries are left out).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GidTable {
    pub size: u32,
    pub entries: Vec<GidEntry>,
}

/// The entry chosen, and why, for the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GidChoice {
    pub index: u32,
    pub gid: [u8; 16],
    pub kind: GidType,
    pub reason: String,
}

/// The GID as an IPv6 address (an IPv4 one is IPv4-mapped, `::ffff:a.b.c.d`).
pub fn gid_addr(gid: &[u8; 16]) -> Ipv6Addr {
    Ipv6Addr::from(*gid)
}

/// The IPv4 address in an IPv4-mapped GID.
pub fn ipv4_mapped(gid: &[u8; 16]) -> Option<Ipv4Addr> {
    if gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff {
        Some(Ipv4Addr::new(gid[12], gid[13], gid[14], gid[15]))
    } else {
        None
    }
}

/// Whether the GID is an IPv6 address of global scope: not IPv4-mapped,
/// unspecified, loopback, link-local (`fe80::/10`) or multicast.
pub fn is_ipv6_global(gid: &[u8; 16]) -> bool {
    let a = gid_addr(gid);
    ipv4_mapped(gid).is_none()
        && !a.is_unspecified()
        && !a.is_loopback()
        && !a.is_multicast()
        && (a.segments()[0] & 0xffc0) != 0xfe80
}

/// How a GID prints in a log line: its address, and for IPv4-mapped ones the
/// IPv4 address.
pub fn describe_gid(gid: &[u8; 16]) -> String {
    match ipv4_mapped(gid) {
        Some(v4) => format!("IPv4-mapped {v4}"),
        None if is_ipv6_global(gid) => format!("IPv6 global {}", gid_addr(gid)),
        None => format!("{}", gid_addr(gid)),
    }
}

fn describe(e: &GidEntry) -> String {
    let on = match &e.netdev {
        Some(n) => format!(" on {n}"),
        None => String::new(),
    };
    format!(
        "GID index {}: {}, {}{on}",
        e.index,
        e.kind,
        describe_gid(&e.gid)
    )
}

fn chosen(e: &GidEntry, why: &str) -> GidChoice {
    GidChoice {
        index: e.index,
        gid: e.gid,
        kind: e.kind,
        reason: format!("{} ({why})", describe(e)),
    }
}

/// Chooses the GID entry for a port whose link is `link`:
///
/// - `override_index` (`GW_IB_GID_INDEX`) wins; past the table's size or on
///   an empty entry it is an error;
/// - on InfiniBand, index 0 (the port GID; traffic is routed by LID);
/// - on Ethernet, the first RoCE v2 entry with an IPv4-mapped address, then
///   the first RoCE v2 entry with a global IPv6 address, then any RoCE v2
///   entry, and only then RoCE v1 (which stays inside one L2 segment).
pub fn choose_gid(
    link: LinkLayer,
    table: &GidTable,
    override_index: Option<u32>,
) -> Result<GidChoice> {
    let mut entries: Vec<&GidEntry> = table.entries.iter().collect();
    entries.sort_by_key(|e| e.index);
    if let Some(index) = override_index {
        if index >= table.size {
            return Err(Error::GidIndexOutOfRange {
                index,
                size: table.size,
            });
        }
        return match entries.iter().find(|e| e.index == index) {
            Some(e) => Ok(chosen(e, &format!("GW_IB_GID_INDEX={index}"))),
            None => Err(Error::NoGid {
                why: format!(
                    "GW_IB_GID_INDEX={index} names an empty entry of the port's GID table"
                ),
            }),
        };
    }
    match link {
        LinkLayer::Infiniband => match entries.iter().find(|e| e.index == 0) {
            Some(e) => Ok(chosen(
                e,
                "InfiniBand link: the port GID; traffic is routed by LID",
            )),
            None => Err(Error::NoGid {
                why: "InfiniBand port without a GID at index 0".into(),
            }),
        },
        LinkLayer::Ethernet => {
            let v2 = || entries.iter().filter(|e| e.kind == GidType::RoceV2);
            if let Some(e) = v2().find(|e| ipv4_mapped(&e.gid).is_some()) {
                return Ok(chosen(e, "RoCE v2 with an IPv4 address: routable"));
            }
            if let Some(e) = v2().find(|e| is_ipv6_global(&e.gid)) {
                return Ok(chosen(e, "RoCE v2 with a global IPv6 address: routable"));
            }
            if let Some(e) = v2().next() {
                return Ok(chosen(
                    e,
                    "RoCE v2, but only with a link-local address: peers must share the L2 segment; set GW_IB_GID_INDEX to override",
                ));
            }
            if let Some(e) = entries.iter().find(|e| e.kind == GidType::RoceV1) {
                return Ok(chosen(
                    e,
                    "no RoCE v2 entry, so RoCE v1: not routable, peers must share the L2 segment",
                ));
            }
            Err(Error::NoGid {
                why: if entries.is_empty() {
                    "the port's GID table is empty: does its netdev have an IP address?".into()
                } else {
                    "no RoCE entry in the port's GID table".into()
                },
            })
        }
    }
}

/// Reads a GID as sysfs prints it (`fe80:0000:0000:0000:0202:c9ff:fe00:0001`).
pub fn parse_gid_text(s: &str) -> Option<[u8; 16]> {
    let s = s.trim();
    let mut out = [0u8; 16];
    let mut groups = 0;
    for (i, g) in s.split(':').enumerate() {
        if i >= 8 || g.len() != 4 || !g.bytes().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        let v = u16::from_str_radix(g, 16).ok()?;
        out[2 * i..2 * i + 2].copy_from_slice(&v.to_be_bytes());
        groups += 1;
    }
    (groups == 8).then_some(out)
}

/// Reads a GID type as sysfs prints it ("IB/RoCE v1", "RoCE v2"); the first
/// means IB on an InfiniBand port and RoCE v1 on an Ethernet one.
pub fn parse_gid_type(s: &str, link: LinkLayer) -> Option<GidType> {
    match s.trim() {
        "IB/RoCE v1" | "IB" | "RoCE v1" => Some(match link {
            LinkLayer::Infiniband => GidType::Ib,
            LinkLayer::Ethernet => GidType::RoceV1,
        }),
        "RoCE v2" => Some(GidType::RoceV2),
        _ => None,
    }
}

/// Reads the GID table of `device` port `port` under the sysfs root `sys`
/// (`/sys` on a real system), with room for `size` entries. Entries that
/// are all zero, or whose type the kernel will not say (unpopulated ones
/// answer EINVAL), are left out; an unreadable `gids` directory is an error.
pub fn read_gid_table(
    sys: &Path,
    device: &str,
    port: u8,
    link: LinkLayer,
    size: u32,
) -> Result<GidTable> {
    let base = sys
        .join("class/infiniband")
        .join(device)
        .join("ports")
        .join(port.to_string());
    let gids = base.join("gids");
    let read_dir = std::fs::read_dir(&gids).map_err(|source| Error::GidTable {
        path: gids.display().to_string(),
        source,
    })?;
    let mut entries = Vec::new();
    for dirent in read_dir {
        let dirent = dirent.map_err(|source| Error::GidTable {
            path: gids.display().to_string(),
            source,
        })?;
        let Some(index) = dirent
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(dirent.path()) else {
            continue;
        };
        let Some(gid) = parse_gid_text(&text) else {
            continue;
        };
        if gid == [0u8; 16] {
            continue;
        }
        let attr = |what: &str| {
            std::fs::read_to_string(base.join("gid_attrs").join(what).join(index.to_string())).ok()
        };
        let kind = match attr("types") {
            Some(t) => match parse_gid_type(&t, link) {
                Some(k) => k,
                None => continue,
            },
            // Kernels before RoCE v2 have no types: their entries are v1/IB.
            None if !base.join("gid_attrs/types").exists() => match link {
                LinkLayer::Infiniband => GidType::Ib,
                LinkLayer::Ethernet => GidType::RoceV1,
            },
            None => continue,
        };
        let netdev = attr("ndevs")
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty());
        entries.push(GidEntry {
            index,
            gid,
            kind,
            netdev,
        });
    }
    entries.sort_by_key(|e| e.index);
    let size = size.max(entries.last().map_or(0, |e| e.index + 1));
    Ok(GidTable { size, entries })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(a: [u8; 4]) -> [u8; 16] {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&a);
        g
    }

    fn v6(s: &str) -> [u8; 16] {
        s.parse::<Ipv6Addr>().unwrap().octets()
    }

    fn e(index: u32, gid: [u8; 16], kind: GidType) -> GidEntry {
        GidEntry {
            index,
            gid,
            kind,
            netdev: Some("eth0".into()),
        }
    }

    /// A typical RoCE port: link-local v1/v2, then IPv4 v1/v2, then global
    /// IPv6 v1/v2.
    fn roce_table() -> GidTable {
        GidTable {
            size: 16,
            entries: vec![
                e(0, v6("fe80::1"), GidType::RoceV1),
                e(1, v6("fe80::1"), GidType::RoceV2),
                e(2, v4([10, 0, 0, 5]), GidType::RoceV1),
                e(3, v4([10, 0, 0, 5]), GidType::RoceV2),
                e(4, v6("2001:db8::5"), GidType::RoceV1),
                e(5, v6("2001:db8::5"), GidType::RoceV2),
            ],
        }
    }

    #[test]
    fn roce_prefers_v2_with_ipv4() {
        let c = choose_gid(LinkLayer::Ethernet, &roce_table(), None).unwrap();
        assert_eq!(c.index, 3);
        assert_eq!(c.kind, GidType::RoceV2);
        assert_eq!(
            c.reason,
            "GID index 3: RoCE v2, IPv4-mapped 10.0.0.5 on eth0 (RoCE v2 with an IPv4 address: routable)"
        );
    }

    #[test]
    fn order_in_the_list_does_not_matter() {
        let mut t = roce_table();
        t.entries.reverse();
        assert_eq!(choose_gid(LinkLayer::Ethernet, &t, None).unwrap().index, 3);
    }

    #[test]
    fn then_v2_with_global_ipv6() {
        let mut t = roce_table();
        t.entries.retain(|e| ipv4_mapped(&e.gid).is_none());
        let c = choose_gid(LinkLayer::Ethernet, &t, None).unwrap();
        assert_eq!(c.index, 5);
        assert!(c.reason.contains("IPv6 global 2001:db8::5"), "{}", c.reason);
    }

    #[test]
    fn then_any_v2_over_v1() {
        let t = GidTable {
            size: 4,
            entries: vec![
                e(0, v6("fe80::1"), GidType::RoceV1),
                e(1, v6("fe80::1"), GidType::RoceV2),
            ],
        };
        let c = choose_gid(LinkLayer::Ethernet, &t, None).unwrap();
        assert_eq!(c.index, 1);
        assert!(c.reason.contains("link-local"), "{}", c.reason);
        // v2 wins over v1 even when the v1 entry has the better address.
        let t = GidTable {
            size: 4,
            entries: vec![
                e(0, v4([10, 0, 0, 5]), GidType::RoceV1),
                e(1, v6("fe80::1"), GidType::RoceV2),
            ],
        };
        assert_eq!(choose_gid(LinkLayer::Ethernet, &t, None).unwrap().index, 1);
    }

    #[test]
    fn v1_only_as_a_last_resort() {
        let t = GidTable {
            size: 4,
            entries: vec![
                e(1, v4([10, 0, 0, 5]), GidType::RoceV1),
                e(0, v6("fe80::1"), GidType::RoceV1),
            ],
        };
        let c = choose_gid(LinkLayer::Ethernet, &t, None).unwrap();
        assert_eq!(c.index, 0);
        assert!(c.reason.contains("not routable"), "{}", c.reason);
    }

    #[test]
    fn infiniband_uses_index_0() {
        let t = GidTable {
            size: 128,
            entries: vec![
                e(0, v6("fe80::2:c903:a:1"), GidType::Ib),
                e(1, v6("2001:db8::9"), GidType::Ib),
            ],
        };
        let c = choose_gid(LinkLayer::Infiniband, &t, None).unwrap();
        assert_eq!(c.index, 0);
        assert!(c.reason.contains("routed by LID"), "{}", c.reason);
        // Even where a v2-looking table would tempt the Ethernet rules.
        assert_eq!(
            choose_gid(LinkLayer::Infiniband, &roce_table(), None)
                .unwrap()
                .index,
            0
        );
        let empty = GidTable {
            size: 128,
            entries: vec![],
        };
        assert!(choose_gid(LinkLayer::Infiniband, &empty, None).is_err());
    }

    #[test]
    fn override_wins_and_is_checked() {
        let t = roce_table();
        let c = choose_gid(LinkLayer::Ethernet, &t, Some(2)).unwrap();
        assert_eq!(c.index, 2);
        assert_eq!(c.kind, GidType::RoceV1);
        assert!(c.reason.ends_with("(GW_IB_GID_INDEX=2)"), "{}", c.reason);
        let c = choose_gid(LinkLayer::Infiniband, &t, Some(5)).unwrap();
        assert_eq!(c.index, 5);

        let err = choose_gid(LinkLayer::Ethernet, &t, Some(16)).unwrap_err();
        assert!(matches!(
            err,
            Error::GidIndexOutOfRange {
                index: 16,
                size: 16
            }
        ));
        assert_eq!(
            err.to_string(),
            "GW_IB_GID_INDEX=16 is out of range: the port's GID table has 16 entries (0..16)"
        );
        let err = choose_gid(LinkLayer::Ethernet, &t, Some(9)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no usable GID: GW_IB_GID_INDEX=9 names an empty entry of the port's GID table"
        );
    }

    #[test]
    fn an_empty_roce_table_says_what_to_check() {
        let err = choose_gid(LinkLayer::Ethernet, &GidTable::default(), None).unwrap_err();
        assert!(err.to_string().contains("IP address"), "{err}");
        let t = GidTable {
            size: 2,
            entries: vec![e(0, v6("fe80::1"), GidType::Ib)],
        };
        assert!(choose_gid(LinkLayer::Ethernet, &t, None).is_err());
    }

    #[test]
    fn address_classes() {
        assert_eq!(
            ipv4_mapped(&v4([192, 168, 1, 2])),
            Some(Ipv4Addr::new(192, 168, 1, 2))
        );
        assert_eq!(ipv4_mapped(&v6("fe80::1")), None);
        assert!(!is_ipv6_global(&v4([192, 168, 1, 2])));
        assert!(!is_ipv6_global(&v6("fe80::1")));
        assert!(!is_ipv6_global(&v6("febf::1")));
        assert!(!is_ipv6_global(&v6("::")));
        assert!(!is_ipv6_global(&v6("::1")));
        assert!(!is_ipv6_global(&v6("ff02::1")));
        assert!(is_ipv6_global(&v6("2001:db8::1")));
        assert!(is_ipv6_global(&v6("fd00::1")));
        assert!(is_ipv6_global(&v6("fec0::1")));
    }

    #[test]
    fn sysfs_text() {
        assert_eq!(
            parse_gid_text("fe80:0000:0000:0000:0202:c9ff:fe00:0001\n"),
            Some(v6("fe80::202:c9ff:fe00:1"))
        );
        assert_eq!(
            parse_gid_text("0000:0000:0000:0000:0000:ffff:0a00:0005"),
            Some(v4([10, 0, 0, 5]))
        );
        for bad in [
            "",
            "fe80::1",
            "fe80:0000:0000:0000:0202:c9ff:fe00",
            "fe80:0000:0000:0000:0202:c9ff:fe00:0001:0000",
            "fe80:0000:0000:0000:0202:c9ff:fe00:00g1",
            "fe80:0000:0000:0000:0202:c9ff:fe00:+001",
        ] {
            assert_eq!(parse_gid_text(bad), None, "{bad}");
        }
        assert_eq!(
            parse_gid_type("IB/RoCE v1\n", LinkLayer::Ethernet),
            Some(GidType::RoceV1)
        );
        assert_eq!(
            parse_gid_type("IB/RoCE v1\n", LinkLayer::Infiniband),
            Some(GidType::Ib)
        );
        assert_eq!(
            parse_gid_type("RoCE v2\n", LinkLayer::Ethernet),
            Some(GidType::RoceV2)
        );
        assert_eq!(parse_gid_type("RoCE v3", LinkLayer::Ethernet), None);
    }

    /// A made-up sysfs tree, removed when dropped.
    struct Tree(std::path::PathBuf);

    impl Tree {
        fn new(name: &str) -> Tree {
            let root = std::env::temp_dir().join(format!("gw-verbs-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            Tree(root)
        }

        fn write(&self, rel: &str, text: &str) {
            let p = self.0.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn reads_a_sysfs_table() {
        let t = Tree::new("sysfs");
        let port = "class/infiniband/rxe0/ports/1";
        let zero = "0000:0000:0000:0000:0000:0000:0000:0000\n";
        t.write(
            &format!("{port}/gids/0"),
            "fe80:0000:0000:0000:0202:c9ff:fe00:0001\n",
        );
        t.write(&format!("{port}/gid_attrs/types/0"), "IB/RoCE v1\n");
        t.write(&format!("{port}/gid_attrs/ndevs/0"), "eth0\n");
        t.write(
            &format!("{port}/gids/1"),
            "fe80:0000:0000:0000:0202:c9ff:fe00:0001\n",
        );
        t.write(&format!("{port}/gid_attrs/types/1"), "RoCE v2\n");
        t.write(&format!("{port}/gid_attrs/ndevs/1"), "eth0\n");
        t.write(
            &format!("{port}/gids/2"),
            "0000:0000:0000:0000:0000:ffff:0a00:0005\n",
        );
        t.write(&format!("{port}/gid_attrs/types/2"), "RoCE v2\n");
        // No ndevs file for 2: the kernel did not say.
        t.write(&format!("{port}/gids/3"), zero);
        t.write(&format!("{port}/gids/4"), "garbage\n");
        // An entry whose type the kernel refuses (no types file) is skipped.
        t.write(
            &format!("{port}/gids/5"),
            "0000:0000:0000:0000:0000:ffff:0a00:0006\n",
        );
        t.write(&format!("{port}/gids/not-a-number"), zero);
        let table = read_gid_table(&t.0, "rxe0", 1, LinkLayer::Ethernet, 8).unwrap();
        assert_eq!(table.size, 8);
        assert_eq!(
            table.entries,
            vec![
                GidEntry {
                    index: 0,
                    gid: v6("fe80::202:c9ff:fe00:1"),
                    kind: GidType::RoceV1,
                    netdev: Some("eth0".into())
                },
                GidEntry {
                    index: 1,
                    gid: v6("fe80::202:c9ff:fe00:1"),
                    kind: GidType::RoceV2,
                    netdev: Some("eth0".into())
                },
                GidEntry {
                    index: 2,
                    gid: v4([10, 0, 0, 5]),
                    kind: GidType::RoceV2,
                    netdev: None
                },
            ]
        );
        let c = choose_gid(LinkLayer::Ethernet, &table, None).unwrap();
        assert_eq!(c.index, 2);
        assert_eq!(
            c.reason,
            "GID index 2: RoCE v2, IPv4-mapped 10.0.0.5 (RoCE v2 with an IPv4 address: routable)"
        );
    }

    #[test]
    fn old_kernels_without_types_are_v1() {
        let t = Tree::new("oldsysfs");
        let port = "class/infiniband/mlx4_0/ports/1";
        t.write(
            &format!("{port}/gids/0"),
            "fe80:0000:0000:0000:0202:c9ff:fe00:0001\n",
        );
        let table = read_gid_table(&t.0, "mlx4_0", 1, LinkLayer::Infiniband, 0).unwrap();
        assert_eq!(table.size, 1);
        assert_eq!(table.entries[0].kind, GidType::Ib);
    }

    #[test]
    fn a_missing_table_names_its_path() {
        let t = Tree::new("nosysfs");
        let err = read_gid_table(&t.0, "mlx5_9", 1, LinkLayer::Ethernet, 16).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("reading the GID table at "), "{msg}");
        assert!(
            msg.contains("class/infiniband/mlx5_9/ports/1/gids"),
            "{msg}"
        );
    }
}
