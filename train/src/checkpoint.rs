//! The worker's checkpoint: everything a preempted job needs to go on as if
//! it had never stopped.
//!
//! A live scheduling policy takes a job off its nodes by answering a step's
//! `begin` with "checkpoint" (see docs/scheduler.md). The worker then holds
//! the parameters after the last finished step and the position in the data
//! stream; those two, with the flags that made them (seed, shape), are the
//! whole state of this SGD (no momentum, no optimiser state), so restoring
//! them makes the resumed run bit-identical to an uninterrupted one.
//!
//! The file is written to a temporary name and renamed, so a reader sees the
//! old checkpoint or the new one, never half of one; a checksum catches a
//! file damaged on disk or one that is not a checkpoint at all.

use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"GWCKPT01";
/// magic, step, base, seed, count, then the params, then the checksum.
const HEADER: usize = 8 + 4 * 8;

/// A training state between two steps.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    /// The first step not yet taken (the resumed run starts here).
    pub step: u64,
    /// Index of the first sample of `step`'s global batch.
    pub base: u64,
    /// The seed of the run (data stream and initial parameters).
    pub seed: u64,
    pub params: Vec<f64>,
}

/// Where the checkpoint lives in `dir`.
pub fn path(dir: &Path) -> PathBuf {
    dir.join("checkpoint.bin")
}

fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The file's bytes.
pub fn encode(c: &Checkpoint) -> Vec<u8> {
    let mut b = Vec::with_capacity(HEADER + c.params.len() * 8 + 8);
    b.extend_from_slice(MAGIC);
    for v in [c.step, c.base, c.seed, c.params.len() as u64] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    for p in &c.params {
        b.extend_from_slice(&p.to_le_bytes());
    }
    let sum = fnv(&b);
    b.extend_from_slice(&sum.to_le_bytes());
    b
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Parses a checkpoint file's bytes; `what` names it in errors.
pub fn decode(b: &[u8], what: &str) -> Result<Checkpoint, String> {
    if b.len() < HEADER + 8 || &b[..8] != MAGIC {
        return Err(format!(
            "{what} is not a gwtrain checkpoint (bad magic or too short)"
        ));
    }
    let count = u64_at(b, 32);
    let want = count
        .checked_mul(8)
        .and_then(|n| n.checked_add((HEADER + 8) as u64));
    if want != Some(b.len() as u64) {
        return Err(format!(
            "{what}: {} bytes, but a checkpoint of {count} parameters has {}",
            b.len(),
            want.map_or("more than fit in memory".into(), |n| n.to_string())
        ));
    }
    let end = b.len() - 8;
    if fnv(&b[..end]) != u64_at(b, end) {
        return Err(format!("{what}: checksum mismatch (the file is damaged)"));
    }
    Ok(Checkpoint {
        step: u64_at(b, 8),
        base: u64_at(b, 16),
        seed: u64_at(b, 24),
        params: b[HEADER..end]
            .chunks_exact(8)
            .map(|c| {
                let mut a = [0u8; 8];
                a.copy_from_slice(c);
                f64::from_le_bytes(a)
            })
            .collect(),
    })
}

/// Writes `c` to `dir` atomically (temporary file, sync, rename).
pub fn write(dir: &Path, c: &Checkpoint) -> Result<(), String> {
    use std::io::Write;
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let tmp = dir.join(format!("checkpoint.bin.tmp{}", std::process::id()));
    let to = path(dir);
    let mut f =
        std::fs::File::create(&tmp).map_err(|e| format!("creating {}: {e}", tmp.display()))?;
    f.write_all(&encode(c))
        .and_then(|_| f.sync_all())
        .map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, &to).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("renaming {} to {}: {e}", tmp.display(), to.display())
    })
}

/// Reads the checkpoint in `dir` and checks it is the one a run resuming at
/// `step` with `seed` and `n` parameters needs.
pub fn read_for(dir: &Path, step: u64, seed: u64, n: usize) -> Result<Checkpoint, String> {
    let p = path(dir);
    let what = p.display().to_string();
    let bytes = std::fs::read(&p).map_err(|e| format!("reading the checkpoint {what}: {e}"))?;
    let c = decode(&bytes, &what)?;
    if c.step != step {
        return Err(format!(
            "{what} resumes at step {}, but the job server resumes this job at step {step}",
            c.step
        ));
    }
    if c.seed != seed {
        return Err(format!(
            "{what} was written by a run with --seed {}, not {seed}",
            c.seed
        ));
    }
    if c.params.len() != n {
        return Err(format!(
            "{what} holds {} parameters, but --dims makes {n}",
            c.params.len()
        ));
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn dir(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!("gwtrain-ckpt-{tag}-{}", std::process::id()))
    }

    #[test]
    fn a_checkpoint_round_trips_through_its_file() {
        let d = dir("rt");
        let c = Checkpoint {
            step: 12,
            base: 1536,
            seed: 5,
            params: vec![1.5, -0.0, f64::MIN_POSITIVE, -1e300],
        };
        write(&d, &c).expect("write");
        let back = read_for(&d, 12, 5, 4).expect("read");
        let leftovers: Vec<_> = std::fs::read_dir(&d)
            .expect("dir")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name())
            .collect();
        let _ = std::fs::remove_dir_all(&d);
        assert_eq!(back, c);
        assert_eq!(leftovers, vec![std::ffi::OsString::from("checkpoint.bin")]);
    }

    #[test]
    fn the_wrong_checkpoint_is_refused_with_the_reason() {
        let d = dir("wrong");
        let c = Checkpoint {
            step: 7,
            base: 70,
            seed: 3,
            params: vec![0.25; 6],
        };
        write(&d, &c).expect("write");
        let step = read_for(&d, 8, 3, 6).unwrap_err();
        let seed = read_for(&d, 7, 4, 6).unwrap_err();
        let shape = read_for(&d, 7, 3, 5).unwrap_err();
        let _ = std::fs::remove_dir_all(&d);
        let missing = read_for(&d, 7, 3, 6).unwrap_err();
        assert!(
            step.contains("resumes at step 7") && step.contains("at step 8"),
            "{step}"
        );
        assert!(seed.contains("--seed 3, not 4"), "{seed}");
        assert!(
            shape.contains("holds 6 parameters") && shape.contains("makes 5"),
            "{shape}"
        );
        assert!(missing.starts_with("reading the checkpoint"), "{missing}");
    }

    #[test]
    fn damaged_files_are_refused() {
        let c = Checkpoint {
            step: 1,
            base: 2,
            seed: 3,
            params: vec![4.0, 5.0],
        };
        let good = encode(&c);
        assert_eq!(decode(&good, "f"), Ok(c));
        let mut flipped = good.clone();
        flipped[HEADER + 3] ^= 0x10;
        assert!(decode(&flipped, "f").unwrap_err().contains("checksum"));
        assert!(
            decode(&good[..good.len() - 1], "f")
                .unwrap_err()
                .contains("bytes")
        );
        assert!(
            decode(b"GWCKPT0", "f")
                .unwrap_err()
                .contains("not a gwtrain")
        );
        let mut huge = good.clone();
        huge[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode(&huge, "f").unwrap_err().contains("more than fit"));
    }

    proptest! {
        /// No byte string makes the decoder panic, and whatever it accepts
        /// encodes back to the same bytes.
        #[test]
        fn decoding_never_panics(magic: bool, tail in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut bytes = if magic { MAGIC.to_vec() } else { Vec::new() };
            bytes.extend_from_slice(&tail);
            if let Ok(c) = decode(&bytes, "f") {
                prop_assert_eq!(encode(&c), bytes);
            }
        }

        #[test]
        fn every_checkpoint_round_trips(step: u64, base: u64, seed: u64,
                                        params in proptest::collection::vec(any::<f64>(), 0..50)) {
            let c = Checkpoint { step, base, seed, params };
            let back = decode(&encode(&c), "f").expect("decodes");
            prop_assert_eq!(back.params.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            c.params.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
            prop_assert_eq!((back.step, back.base, back.seed), (step, base, seed));
        }
    }
}
