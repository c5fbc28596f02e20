//! Two `VerbsTransport`s in one process on a real RDMA device: bring-up
//! through published names, then the message test every NIC passes (eager
//! frames, announced messages written with immediates into granted
//! receives). Ignored without a device; on a machine with one run
//! `GW_TEST_RDMA_DEVICE=mlx5_0 cargo test -p gw-transport --features verbs -- --ignored`.

use super::VerbsTransport;
use crate::nic::test_support::{messages_of_every_size_both_ways, small_config};
use crate::seam::Transport;
use gw_verbs::port::HcaChoice;

fn device() -> gw_verbs::Config {
    let name = std::env::var("GW_TEST_RDMA_DEVICE")
        .expect("set GW_TEST_RDMA_DEVICE to the RDMA device to test (ibv_devices lists them)");
    let mut cfg = gw_verbs::Config::from_env().unwrap();
    cfg.hca = HcaChoice::parse(&name).unwrap();
    cfg
}

#[test]
#[ignore = "needs an RDMA device: set GW_TEST_RDMA_DEVICE"]
fn messages_of_every_size_both_ways_on_the_device() {
    let dev = device();
    let cfg = small_config();
    let mut a = VerbsTransport::open(0, 2, &dev, cfg.clone()).unwrap();
    let mut b = VerbsTransport::open(1, 2, &dev, cfg).unwrap();
    let names = vec![a.name_hex().unwrap(), b.name_hex().unwrap()];
    a.set_peer_names(&names).unwrap();
    b.set_peer_names(&names).unwrap();
    a.connect_all().unwrap();
    b.connect_all().unwrap();
    assert!(a.properties().offloaded_writes);
    messages_of_every_size_both_ways(&mut a, &mut b, "verbs");
}
