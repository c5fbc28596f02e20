//! Which processors each of gwrun's ranks may run on.
//!
//! A rank's caller polls its operations for a while before it sleeps, as an
//! MPI library does in `MPI_Wait`. That polling assumes the peer it waits
//! for is running on another processor. Left to the scheduler, two ranks can
//! end up on one processor while something else (another job, a build, a
//! data loader) occupies the other: each then polls for its whole spin
//! while the peer it waits for cannot run. On the 2-core development VM, one
//! busy process pinned to one core made 2-rank all-reduces 5-140× slower
//! (16 MiB to 8 bytes) when the ranks were free to move, and about 2×
//! slower (as OpenMPI's, which binds) when each rank had a core of its own
//! (docs/performance.md, "Binding ranks").
//!
//! So gwrun binds, as mpirun does by default, but to an equal share of the
//! processors it was given rather than to one core each: a rank of a
//! training job runs its framework's compute threads on its share, and two
//! ranks on a 64-processor host should get 32 each, not one. A share is a
//! run of consecutive processors from gwrun's own affinity mask (so
//! `taskset` and cgroups are respected); processors left over when the
//! count does not divide stay unused, so that every rank computes at the
//! same speed. With more ranks than processors nothing is bound: ranks must
//! take turns anyway, and the scheduler places them better than a fixed
//! map would.

use std::io;

/// Value of `--bind-to` (and `GW_BIND_TO`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BindTo {
    /// Each rank gets an equal run of consecutive processors.
    Share,
    /// Ranks inherit gwrun's affinity mask.
    None,
}

impl BindTo {
    /// Parses `GW_BIND_TO` with the spellings `--bind-to` accepts.
    pub fn parse(v: &str) -> Result<BindTo, String> {
        use clap::ValueEnum;
        let v = v.trim();
        BindTo::from_str(v, false).map_err(|_| {
            let names: Vec<String> = BindTo::value_variants()
                .iter()
                .filter_map(|b| b.to_possible_value())
                .map(|p| p.get_name().to_owned())
                .collect();
            format!("bind policy {v:?} is not one of {}", names.join(", "))
        })
    }
}

/// The processors of each of `ranks` ranks, given the processors gwrun may
/// use (`allowed`, in the order to hand them out); `None` where ranks are
/// not bound (`none`, more ranks than processors, or no processors known).
pub fn shares(policy: BindTo, allowed: &[u32], ranks: usize) -> Option<Vec<Vec<u32>>> {
    if policy == BindTo::None || ranks == 0 || ranks > allowed.len() {
        return None;
    }
    let each = allowed.len() / ranks;
    Some(
        allowed
            .chunks_exact(each)
            .take(ranks)
            .map(<[u32]>::to_vec)
            .collect(),
    )
}

/// OpenMP threads for each of `ranks` ranks sharing `allowed` processors
/// (the `OMP_NUM_THREADS` gwrun sets where none is inherited): the rank's
/// share, at least one; `None` where the processors are not known. OpenMP
/// (PyTorch's CPU kernels, BLAS) otherwise starts a thread per processor in
/// every rank, and threads that spin in its barriers then outnumber the
/// cores: on a 2-core machine, 4 ranks of examples/torch/train_ddp.py took
/// 9.9 s for 30 steps with 2 threads each and 0.25 s with 1. torchrun sets
/// 1 (where it starts more than one process) for the same reason.
pub fn threads_per_rank(allowed: usize, ranks: usize) -> Option<usize> {
    (allowed > 0).then(|| (allowed / ranks.max(1)).max(1))
}

/// A CPU set holding `cpus`, built before a fork so that the child only
/// has to hand it to the kernel. Fails for a processor number the set
/// cannot hold.
pub fn cpu_set(cpus: &[u32]) -> io::Result<libc::cpu_set_t> {
    // SAFETY: cpu_set_t is plain bits; all zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        if c as usize >= libc::CPU_SETSIZE as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "processor {c} is beyond the {} a CPU set holds",
                    libc::CPU_SETSIZE
                ),
            ));
        }
        // SAFETY: `c` is below CPU_SETSIZE, checked above.
        unsafe { libc::CPU_SET(c as usize, &mut set) };
    }
    Ok(set)
}

/// Restricts the calling process to `set`.
///
/// # Safety
/// Safe to call between fork and exec (in `pre_exec`): it is one system
/// call on memory the caller owns.
pub unsafe fn apply(set: &libc::cpu_set_t) -> io::Result<()> {
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `0-3,8,10-11`: the processor list as `taskset -c` and
/// `/proc/self/status` write it.
pub fn list(cpus: &[u32]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_runs_of_consecutive_processors_and_leftovers_unused() {
        let all: Vec<u32> = (0..8).collect();
        assert_eq!(
            shares(BindTo::Share, &all, 2),
            Some(vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]])
        );
        assert_eq!(
            shares(BindTo::Share, &all, 3),
            Some(vec![vec![0, 1], vec![2, 3], vec![4, 5]])
        );
        assert_eq!(
            shares(BindTo::Share, &all, 8),
            Some((0..8).map(|c| vec![c]).collect())
        );
        // gwrun's own mask, gaps and all, is what is shared out.
        assert_eq!(
            shares(BindTo::Share, &[1, 3, 5, 7], 2),
            Some(vec![vec![1, 3], vec![5, 7]])
        );
    }

    #[test]
    fn each_rank_gets_its_share_of_threads_and_at_least_one() {
        assert_eq!(threads_per_rank(64, 2), Some(32));
        assert_eq!(threads_per_rank(8, 3), Some(2));
        assert_eq!(threads_per_rank(2, 2), Some(1));
        assert_eq!(threads_per_rank(2, 4), Some(1));
        assert_eq!(threads_per_rank(1, 1), Some(1));
        assert_eq!(threads_per_rank(0, 2), None);
    }

    #[test]
    fn no_binding_when_oversubscribed_asked_not_to_or_blind() {
        let two = [0, 1];
        assert_eq!(shares(BindTo::Share, &two, 3), None);
        assert_eq!(shares(BindTo::None, &two, 2), None);
        assert_eq!(shares(BindTo::Share, &[], 1), None);
        assert_eq!(shares(BindTo::Share, &two, 0), None);
    }

    #[test]
    fn policy_spellings() {
        assert_eq!(BindTo::parse("share"), Ok(BindTo::Share));
        assert_eq!(BindTo::parse(" none "), Ok(BindTo::None));
        let e = BindTo::parse("core").unwrap_err();
        assert!(e.contains("\"core\"") && e.contains("share, none"), "{e}");
    }

    #[test]
    fn lists_read_as_taskset_writes_them() {
        assert_eq!(list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(list(&[5]), "5");
        assert_eq!(list(&[]), "");
    }

    #[test]
    fn sets_hold_exactly_the_processors_given() {
        let set = cpu_set(&[0, 2, 63]).unwrap();
        let held: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            // SAFETY: below CPU_SETSIZE.
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
            .collect();
        assert_eq!(held, [0, 2, 63]);
        let e = cpu_set(&[libc::CPU_SETSIZE as u32]).unwrap_err();
        assert!(e.to_string().contains("beyond"), "{e}");
    }
}
