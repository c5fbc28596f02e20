//! On a machine without an RDMA device, opening one fails with `NoDevice`
//! and the system's own reason, not a panic or a bare errno. CI runs this
//! (its machines have no device); on a machine that has one it checks
//! nothing and says so.

#![cfg(feature = "verbs")]

use gw_verbs::{Config, Error};
use std::path::Path;

#[test]
fn no_device_gives_the_systems_reason() {
    if std::env::var_os("GW_TEST_RDMA_DEVICE").is_some() {
        eprintln!("GW_TEST_RDMA_DEVICE is set: this machine has a device, nothing to check");
        return;
    }
    let err = match gw_verbs::open(&Config::default()) {
        Ok(hca) => {
            eprintln!(
                "an RDMA device is present ({}): nothing to check",
                hca.name()
            );
            return;
        }
        Err(e) => e,
    };
    let msg = err.to_string();
    let Error::NoDevice { reason } = &err else {
        panic!("expected NoDevice, got: {msg}");
    };
    assert!(msg.starts_with("no RDMA device: "), "{msg}");
    assert_eq!(msg, format!("no RDMA device: {reason}"));
    // libibverbs reads the uverbs ABI version from sysfs first; a kernel
    // without InfiniBand support has none, and the list call fails with
    // ENOSYS. A kernel with it but no device gives an empty list.
    if Path::new("/sys/class/infiniband_verbs/abi_version").exists() {
        assert_eq!(msg, "no RDMA device: no devices found");
    } else {
        assert_eq!(msg, "no RDMA device: Function not implemented");
    }
    assert_eq!(gw_verbs::device_names().unwrap_err().to_string(), msg);
}

#[test]
fn an_unknown_device_name_is_refused_before_or_at_the_device_list() {
    if std::env::var_os("GW_TEST_RDMA_DEVICE").is_some() {
        return;
    }
    let cfg = Config::from_lookup(|k| (k == "GW_IB_HCA").then(|| "nosuch0".to_string()))
        .expect("GW_IB_HCA=nosuch0 parses");
    match gw_verbs::open(&cfg) {
        // No device at all: the list fails first.
        Err(Error::NoDevice { .. }) => {}
        // Devices, but not that one: they are listed.
        Err(e @ Error::UnknownDevice { .. }) => {
            assert!(
                e.to_string()
                    .starts_with("GW_IB_HCA=nosuch0: no such RDMA device (found: ")
            );
        }
        Err(e) => panic!("unexpected error: {e}"),
        Ok(hca) => panic!("opened {} for GW_IB_HCA=nosuch0", hca.name()),
    }
}
