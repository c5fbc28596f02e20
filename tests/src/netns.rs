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

/// Set to `required` by the test script when this machine can make network
/// namespaces: then a test that cannot make them fails instead of skipping.
pub const REQUIRE_VAR: &str = "GW_TEST_NETNS";

impl Namespaces {
    /// The namespaces, or `None` where this machine cannot make them (no
    /// privileges, no `ip`) and the script did not say it can: then the
    /// test is skipped with a line saying so. Where the script found that it
    /// can ([`REQUIRE_VAR`]`=required`), failing to make them panics, so a
    /// broken set-up is a failure rather than a quiet pass.
    pub fn create_or_skip(test: &str, tag: &str, net: u8) -> Option<Namespaces> {
        match Namespaces::create(tag, net) {
            Ok(ns) => Some(ns),
            Err(why) if std::env::var(REQUIRE_VAR).is_ok_and(|v| v == "required") => {
                panic!(
                    "{test}: {REQUIRE_VAR}=required, but the namespaces could not be made: {why}"
                )
            }
            Err(why) => {
                println!(
                    "SKIPPED {test}: cannot create network namespaces here ({why}); \
                     set {REQUIRE_VAR}=required to make this a failure"
                );
                None
            }
        }
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = ip(&["netns", "del", n]);
        }
    }
}
