//! Two `OfiTransport`s in one process over real libfabric providers
//! (`tcp;ofi_rxm` and `shm`, which need no hardware).

use super::*;
use crate::nic::test_support::{
    messages_of_every_size_both_ways, pattern, reg, run, small_config, tag,
};
use crate::nic::{name_from_hex, name_to_hex};
use crate::seam::Outstanding;
use crate::seam::{ReadFrom, Readiness, RemoteRegion, Transport, WriteImm};
use crate::test_drive::Messages;
use crate::test_tags;
use crate::wire::HEADER_LEN;
use std::time::{Duration, Instant};

const PROVIDERS: [&str; 2] = ["tcp;ofi_rxm", "shm"];

fn cfg(provider: &str) -> OfiConfig {
    OfiConfig {
        provider: Some(provider.into()),
        nic: small_config(),
    }
}

/// Ranks 0 and 1, connected; `None` (with the reason printed) where
/// libfabric or the provider is missing.
fn pair(c: &OfiConfig) -> Option<(OfiTransport, OfiTransport)> {
    let mut a = match OfiTransport::open(0, 2, c.clone()) {
        Ok(t) => t,
        Err(e) => {
            let text = e.to_string();
            // This machine installs libfabric (scripts/test.sh): only a
            // missing provider is a reason to skip, never a broken one.
            assert!(
                text.contains("not available") || text.contains("libfabric not found"),
                "{text}"
            );
            eprintln!("skipped: {text}");
            return None;
        }
    };
    let mut b = OfiTransport::open(1, 2, c.clone()).unwrap();
    let names = vec![a.name_hex().unwrap(), b.name_hex().unwrap()];
    a.set_peer_names(&names).unwrap();
    b.set_peer_names(&names).unwrap();
    assert_eq!(a.connect(1).unwrap(), Readiness::Ready);
    assert_eq!(b.connect(0).unwrap(), Readiness::Ready);
    Some((a, b))
}

#[test]
fn messages_of_every_size_both_ways_on_each_provider() {
    for prov in PROVIDERS {
        let Some((mut a, mut b)) = pair(&cfg(prov)) else {
            continue;
        };
        messages_of_every_size_both_ways(&mut a, &mut b, prov);
    }
}

/// The exchange whose receives wait for their own sends (see
/// `test_drive::exchange_waiting_for_sends`): eager messages, announced
/// ones waiting for a grant, and many-segment ones, in random mixes and
/// rhythms, on each provider.
#[test]
fn exchanges_whose_receives_wait_for_their_sends_finish_on_each_provider() {
    use rand::{Rng, SeedableRng, rngs::StdRng};
    for prov in PROVIDERS {
        for seed in 1..=6u64 {
            let Some((a, b)) = pair(&cfg(prov)) else {
                break;
            };
            let mut rng = StdRng::seed_from_u64(seed);
            let sizes: Vec<usize> = (0..rng.random_range(1..12))
                .map(|_| [0, 10, 4096, 5000, 70_000, 200_000][rng.random_range(0..6)])
                .collect();
            let (window, ahead) = (rng.random_range(1..4), rng.random_range(1..12));
            let turns: Vec<bool> = (0..rng.random_range(1..24)).map(|_| rng.random()).collect();
            let r = crate::test_drive::exchange_waiting_for_sends(
                a,
                b,
                &sizes,
                (window, ahead),
                &turns,
                |k| tag(9, k),
            );
            assert!(
                r.is_ok(),
                "{prov}, seed {seed}, sizes {sizes:?}: {}",
                r.unwrap_err()
            );
        }
    }
}

#[test]
fn many_messages_posted_late_and_out_of_order() {
    // More messages than credits and slots, receives posted after every
    // send and in reverse: eager ones wait in the early buffers, the rest
    // are announced and granted as slots free.
    for prov in PROVIDERS {
        let Some((mut a, mut b)) = pair(&cfg(prov)) else {
            continue;
        };
        let lens: Vec<usize> = (0..24)
            .map(|i| [10, 4096, 5000, 70_000][i % 4] + i)
            .collect();
        let Messages { src, dst, ms, md } = Messages::new(&mut a, &mut b, &lens, pattern);
        let sends: Vec<Outstanding> = (0..lens.len())
            .map(|i| Outstanding::new(a.isend(1, tag(7, i as u32), ms[i], 0, lens[i]).unwrap()))
            .collect();
        for _ in 0..50 {
            a.progress().unwrap();
            b.progress().unwrap();
        }
        let recvs: Vec<Outstanding> = (0..lens.len())
            .rev()
            .map(|i| Outstanding::new(b.irecv(0, tag(7, i as u32), md[i], 0, lens[i]).unwrap()))
            .collect();
        run(&mut a, &mut b, sends, recvs);
        for i in 0..lens.len() {
            assert!(
                dst[i] == src[i],
                "{prov}: message {i} ({} bytes) landed wrong",
                lens[i]
            );
        }
        let early = b.early_buffers(0);
        assert_eq!(early, 2, "{prov}: early buffers are the configured credits");
    }
}

#[test]
fn a_mismatched_call_is_named_on_the_receiver() {
    for prov in PROVIDERS {
        let Some((mut a, mut b)) = pair(&cfg(prov)) else {
            continue;
        };
        for len in [64usize, 100_000] {
            let mut s = pattern(len, 1);
            let mut d = vec![0u8; len + 8];
            let ms = reg(&mut a, &mut s);
            let md = reg(&mut b, &mut d);
            let sent = test_tags::tag(0x0f1, 9, 100, 0, 0);
            let wanted = test_tags::tag(0x0f1, 9, 101, 0, 0);
            let _s = a.isend(1, sent, ms, 0, len).unwrap();
            let r = b.irecv(0, wanted, md, 0, len + 8).unwrap();
            let deadline = Instant::now() + Duration::from_secs(20);
            let err = loop {
                a.progress().unwrap();
                match b.progress() {
                    Err(e) => break e,
                    Ok(_) => assert!(Instant::now() < deadline, "{prov}: no mismatch reported"),
                }
            };
            let text = err.to_string();
            assert!(
                text.contains("mismatch")
                    && text.contains("count=100")
                    && text.contains("count=101"),
                "{prov} {len} B: {text}"
            );
            drop(r);
            // The pair is spent after a protocol error: start a fresh one.
            let Some(p) = pair(&cfg(prov)) else { return };
            (a, b) = p;
        }
    }
}

#[test]
fn bad_input_is_refused_with_errors_that_name_it() {
    let e = OfiTransport::open(
        0,
        2,
        OfiConfig {
            provider: Some("nosuch".into()),
            ..OfiConfig::default()
        },
    )
    .unwrap_err()
    .to_string();
    if e.contains("libfabric not found") {
        eprintln!("skipped: {e}");
        return;
    }
    assert!(e.contains("nosuch") && e.contains("tcp"), "{e}");
    let e = OfiTransport::open(2, 2, cfg("tcp;ofi_rxm"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("outside a world of 2"), "{e}");
    let Some((mut a, _b)) = pair(&cfg("tcp;ofi_rxm")) else {
        return;
    };
    let mut buf = [0u8; 16];
    let m = reg(&mut a, &mut buf);
    assert!(
        a.isend(0, tag(1, 0), m, 0, 1)
            .unwrap_err()
            .to_string()
            .contains("not a peer")
    );
    assert!(
        a.isend(1, tag(1, 0), m, 8, 9)
            .unwrap_err()
            .to_string()
            .contains("outside registered region")
    );
    assert!(
        name_from_hex(3, "ofi", "abc")
            .unwrap_err()
            .to_string()
            .contains("rank 3")
    );
    assert_eq!(
        name_from_hex(3, "ofi", &name_to_hex(&[0, 255, 7])).unwrap(),
        vec![0, 255, 7]
    );
    let mut c = OfiTransport::open(0, 2, cfg("tcp;ofi_rxm")).unwrap();
    let e = c.connect(1).unwrap_err().to_string();
    assert!(e.contains("published no ofi endpoint name"), "{e}");
}

#[test]
fn an_announced_send_whose_receive_never_comes_is_named_after_the_timeout() {
    let mut c = cfg("tcp;ofi_rxm");
    c.nic.grant_timeout = Duration::from_millis(200);
    let Some((mut a, mut b)) = pair(&c) else {
        return;
    };
    let mut s = pattern(100_000, 3);
    let ms = reg(&mut a, &mut s);
    let _r = a.isend(1, tag(2, 0), ms, 0, 100_000).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let e = loop {
        a.progress().unwrap();
        b.progress().unwrap();
        if let Err(e) = a.check_peers() {
            break e.to_string();
        }
        assert!(Instant::now() < deadline, "no timeout");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(e.contains("rank 1") && e.contains("100000 bytes"), "{e}");
}

#[test]
fn only_hardware_providers_count_as_offloaded_writes() {
    for p in ["verbs;ofi_rxm", "efa", "psm3", "cxi"] {
        assert!(offloaded(p), "{p}");
    }
    for p in ["tcp;ofi_rxm", "shm", "sockets", "udp;ofi_rxd", "net"] {
        assert!(!offloaded(p), "{p}");
    }
}

/// `write_imm` lands bytes in a published region (at an offset, in
/// several writes, one of them empty) and the peer takes each immediate
/// from `next_imm` once they are in place; bad targets are refused before
/// anything moves.
#[test]
fn one_sided_writes_land_with_their_immediates() {
    for prov in PROVIDERS {
        let Some((mut a, mut b)) = pair(&cfg(prov)) else {
            continue;
        };
        assert!(a.properties().one_sided_write);
        let len = 200_000;
        let mut dst = vec![0u8; len + 64];
        let md = reg(&mut b, &mut dst);
        let region = b.remote_region(md).unwrap().unwrap();
        assert_eq!((region.rank, region.len), (1, (len + 64) as u64));
        let mut src = pattern(len, 5);
        let ms = reg(&mut a, &mut src);
        let seg = 64 << 10;
        let mut reqs = Vec::new();
        let mut imms = Vec::new();
        for (k, off) in (0..len).step_by(seg).enumerate() {
            let n = seg.min(len - off);
            let w = WriteImm {
                mem: ms,
                offset: off,
                len: n,
                remote: region,
                remote_offset: (32 + off) as u64,
                imm: 0x8000_0000 | k as u32,
            };
            reqs.push(Outstanding::new(a.write_imm(1, &w).unwrap()));
            imms.push(w.imm);
        }
        let empty = WriteImm {
            mem: ms,
            offset: 0,
            len: 0,
            remote: region,
            remote_offset: 0,
            imm: 0x8000_7777,
        };
        reqs.push(Outstanding::new(a.write_imm(1, &empty).unwrap()));
        imms.push(empty.imm);
        run(&mut a, &mut b, reqs, Vec::new());
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while got.len() < imms.len() {
            assert!(
                Instant::now() < deadline,
                "{prov}: immediates {got:?} of {imms:?}"
            );
            a.progress().unwrap();
            b.progress().unwrap();
            while let Some(v) = b.next_imm().unwrap() {
                assert_eq!(v.from, None, "libfabric completions do not name the writer");
                got.push(v.imm);
            }
        }
        got.sort_unstable();
        imms.sort_unstable();
        assert_eq!(got, imms, "{prov}");
        assert!(
            dst[..32].iter().all(|&x| x == 0),
            "{prov}: bytes before the offset"
        );
        assert!(dst[32..32 + len] == src[..], "{prov}: the written bytes");
        assert!(
            dst[32 + len..].iter().all(|&x| x == 0),
            "{prov}: bytes past the end"
        );
        for (w, want) in [
            (
                WriteImm {
                    remote_offset: (len + 64 - 8) as u64,
                    len: 16,
                    ..empty
                },
                "outside its published region",
            ),
            (
                WriteImm {
                    remote: RemoteRegion { rank: 0, ..region },
                    len: 8,
                    ..empty
                },
                "rank 0 published",
            ),
            (
                WriteImm {
                    len: (64 << 10) + 1,
                    ..empty
                },
                "at most",
            ),
        ] {
            let e = a.write_imm(1, &w).unwrap_err().to_string();
            assert!(e.contains(want), "{prov}: {e}");
        }
    }
}

/// `read` fetches a published region's bytes (at offsets, in segments,
/// one empty) into local memory with fi_read; the owner gets no
/// completion; bad targets are refused before anything moves.
#[test]
fn one_sided_reads_fetch_the_published_bytes() {
    for prov in PROVIDERS {
        let Some((mut a, mut b)) = pair(&cfg(prov)) else {
            continue;
        };
        assert!(a.properties().one_sided_read);
        let len = 200_000;
        let mut src = pattern(len + 64, 7);
        let ms = reg(&mut b, &mut src);
        let region = b.remote_region(ms).unwrap().unwrap();
        let mut dst = vec![0u8; len + 16];
        let md = reg(&mut a, &mut dst);
        let seg = 64 << 10;
        let mut reqs = Vec::new();
        for off in (0..len).step_by(seg) {
            let r = ReadFrom {
                mem: md,
                offset: 16 + off,
                len: seg.min(len - off),
                remote: region,
                remote_offset: (32 + off) as u64,
            };
            reqs.push(Outstanding::new(a.read(1, &r).unwrap()));
        }
        let empty = ReadFrom {
            mem: md,
            offset: 0,
            len: 0,
            remote: region,
            remote_offset: 0,
        };
        reqs.push(Outstanding::new(a.read(1, &empty).unwrap()));
        run(&mut a, &mut b, reqs, Vec::new());
        assert!(
            dst[..16].iter().all(|&x| x == 0),
            "{prov}: bytes before the offset"
        );
        assert!(dst[16..] == src[32..32 + len], "{prov}: the bytes read");
        assert_eq!(b.next_imm().unwrap(), None, "{prov}: a read told its owner");
        for (r, want) in [
            (
                ReadFrom {
                    remote_offset: (len + 64 - 8) as u64,
                    len: 16,
                    ..empty
                },
                "outside its published region",
            ),
            (
                ReadFrom {
                    remote: RemoteRegion { rank: 0, ..region },
                    len: 8,
                    ..empty
                },
                "rank 0 published",
            ),
            (
                ReadFrom {
                    len: (64 << 10) + 1,
                    ..empty
                },
                "at most",
            ),
            (
                ReadFrom {
                    offset: len + 10,
                    len: 8,
                    ..empty
                },
                "outside registered region",
            ),
        ] {
            let e = a.read(1, &r).unwrap_err().to_string();
            assert!(e.contains(want) && e.contains("read"), "{prov}: {e}");
        }
    }
}

#[test]
fn an_abort_carries_its_whole_reason_to_the_peer() {
    for prov in PROVIDERS {
        let Some((mut a, mut b)) = pair(&cfg(prov)) else {
            continue;
        };
        // Connections come up on first use: one message first.
        let mut s = pattern(8, 1);
        let mut d = vec![0u8; 8];
        let (ms, md) = (reg(&mut a, &mut s), reg(&mut b, &mut d));
        let sent = Outstanding::new(a.isend(1, tag(1, 0), ms, 0, 8).unwrap());
        let got = Outstanding::new(b.irecv(0, tag(1, 0), md, 0, 8).unwrap());
        run(&mut a, &mut b, vec![sent], vec![got]);
        let reason = "rank 7 (somehost): process 4242 died while this rank waited for it";
        assert!(
            reason.len() + HEADER_LEN > 64,
            "longer than tcp;ofi_rxm's inject size"
        );
        a.abort(reason);
        let deadline = Instant::now() + Duration::from_secs(20);
        let e = loop {
            match b.progress() {
                Err(e) => break e.to_string(),
                Ok(_) => assert!(Instant::now() < deadline, "{prov}: no abort arrived"),
            }
        };
        assert!(e.contains("rank 0") && e.contains(reason), "{prov}: {e}");
    }
}
