//! Two "hosts" on one machine for the multi-host tests: network namespaces
//! joined by a veth pair, each with its own address, so traffic really
//! crosses interfaces and the namespaces have different host ids.

use std::process::Command;

/// Runs `ip ARGS`; the error names the command and what it printed.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Two namespaces at 198.18.<net>.1 and .2 (the benchmarking range, never
/// routed), removed on drop.
pub struct Namespaces {
    pub names: [String; 2],
}

impl Namespaces {
    /// `tag` keeps the names of tests that run at once apart.
    pub fn create(tag: &str, net: u8) -> Result<Namespaces, String> {
        let id = std::process::id();
        let ns = Namespaces {
            names: [format!("gw{tag}a{id}"), format!("gw{tag}b{id}")],
        };
        let [a, b] = &ns.names;
        let (va, vb) = (format!("gw{tag}va{id}"), format!("gw{tag}vb{id}"));
        ip(&["netns", "add", a])?;
        ip(&["netns", "add", b])?;
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
        ip(&["link", "set", &va, "netns", a])?;
        ip(&["link", "set", &vb, "netns", b])?;
        for (n, v, addr) in [
            (a, &va, format!("198.18.{net}.1/24")),
            (b, &vb, format!("198.18.{net}.2/24")),
        ] {
            ip(&["-n", n, "addr", "add", &addr, "dev", v])?;
            ip(&["-n", n, "link", "set", v, "up"])?;
            ip(&["-n", n, "link", "set", "lo", "up"])?;
        }
        Ok(ns)
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = ip(&["netns", "del", n]);
        }
    }
}
