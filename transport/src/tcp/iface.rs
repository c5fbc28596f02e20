//! Which local address the data plane listens on.
//!
//! `GW_SOCKET_IFNAME` names an interface explicitly (as NCCL_SOCKET_IFNAME
//! does). Otherwise we take the address the kernel would use to reach the
//! rendezvous store: the store is reachable from every rank, so the interface
//! that routes to it is the one peers can reach us on. A UDP `connect` asks the
//! routing table without sending a packet.

use crate::error::{Error, Result};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

/// The chosen address and a sentence saying why, for `GW_DEBUG=info`.
pub fn choose_bind_ip(ifname: Option<&str>, toward: Option<IpAddr>) -> Result<(IpAddr, String)> {
    if let Some(name) = ifname {
        let addrs = interface_addrs()?;
        let found = addrs
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, a)| *a)
            .min_by_key(|a| a.is_ipv6());
        return match found {
            Some(a) => Ok((a, format!("interface {name} from GW_SOCKET_IFNAME"))),
            None => {
                let mut names: Vec<&str> = addrs.iter().map(|(n, _)| n.as_str()).collect();
                names.dedup();
                Err(Error::Config(format!(
                    "GW_SOCKET_IFNAME={name}: no such interface with an IP address (have: {})",
                    names.join(", ")
                )))
            }
        };
    }
    match toward {
        Some(ip) if ip.is_loopback() => Ok((ip, format!("loopback, as the store is at {ip}"))),
        Some(ip) => {
            let unspecified: IpAddr = if ip.is_ipv4() {
                Ipv4Addr::UNSPECIFIED.into()
            } else {
                Ipv6Addr::UNSPECIFIED.into()
            };
            let sock = UdpSocket::bind(SocketAddr::new(unspecified, 0))
                .map_err(|e| Error::sys("bind", "UDP probe socket for route lookup", e))?;
            sock.connect(SocketAddr::new(ip, 9)).map_err(|e| {
                Error::sys("connect", format!("UDP route lookup toward store {ip}"), e)
            })?;
            let local = sock
                .local_addr()
                .map_err(|e| Error::sys("getsockname", "UDP route lookup", e))?;
            Ok((
                local.ip(),
                format!("the interface that routes to the store at {ip}"),
            ))
        }
        None => Ok((
            Ipv4Addr::LOCALHOST.into(),
            "loopback (no store address to route toward)".into(),
        )),
    }
}

/// Every (interface name, address) pair on this host.
pub fn interface_addrs() -> Result<Vec<(String, IpAddr)>> {
    let mut out = Vec::new();
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free with freeifaddrs below.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return Err(Error::last_os("getifaddrs", "listing network interfaces"));
    }
    let mut cur = ifap;
    while !cur.is_null() {
        // SAFETY: cur is a node of the list getifaddrs returned, valid until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: ifa_addr is non-null and points to a sockaddr whose family says its real type.
        let family = unsafe { (*ifa.ifa_addr).sa_family } as i32;
        let ip: IpAddr = match family {
            libc::AF_INET => {
                // SAFETY: family AF_INET means the sockaddr is a sockaddr_in.
                let sa = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr)).into()
            }
            libc::AF_INET6 => {
                // SAFETY: family AF_INET6 means the sockaddr is a sockaddr_in6.
                let sa = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                Ipv6Addr::from(sa.sin6_addr.s6_addr).into()
            }
            _ => continue,
        };
        out.push((name, ip));
    }
    // SAFETY: ifap came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(ifap) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_interface_is_found_by_name() {
        let (ip, why) = choose_bind_ip(Some("lo"), None).unwrap();
        assert!(ip.is_loopback(), "{ip}");
        assert!(why.contains("GW_SOCKET_IFNAME"));
    }

    #[test]
    fn unknown_interface_is_a_clear_error() {
        let e = choose_bind_ip(Some("nosuch0"), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("GW_SOCKET_IFNAME=nosuch0") && e.contains("lo"),
            "{e}"
        );
    }

    #[test]
    fn loopback_store_means_loopback_data_plane() {
        let (ip, _) = choose_bind_ip(None, Some(Ipv4Addr::LOCALHOST.into())).unwrap();
        assert_eq!(ip, IpAddr::from(Ipv4Addr::LOCALHOST));
    }
}
