//! What a task started by `srun` learns from Slurm about where its job's
//! ranks are, in Slurm's own compact notations.
//!
//! srun hands each task its node list as a hostlist (`node[01-04,07],gpu3`)
//! and the tasks on each node as a run-length list (`2(x3),1`), and starts
//! no store: rank 0, on the step's first node, hosts one, and every rank
//! must work out the same address and port from these variables alone.

use crate::error::{Error, Result};
use crate::launch_env::{Lookup, fnv1a, num};

/// Most host names a node list may expand to: far past any cluster, and
/// small enough that a malformed `node[0-4294967295]` costs nothing.
const MAX_HOSTS: usize = 1 << 20;

/// Store ports derived from the job and step ids fall in
/// `PORT_BASE..PORT_BASE + PORT_SPAN`: below Linux's ephemeral range
/// (32768-60999), where outgoing connections take their ports.
const PORT_BASE: u32 = 10000;
const PORT_SPAN: u32 = 22768;

/// Expands a Slurm hostlist: comma-separated names, each with any number of
/// bracketed groups of numbers and ranges (`a[1-3,7]b[01-02]`), zero
/// padding kept as written.
pub fn expand_hostlist(list: &str) -> std::result::Result<Vec<String>, String> {
    let mut hosts = Vec::new();
    for item in split_top(list)? {
        if item.is_empty() {
            continue;
        }
        let mut names = vec![String::new()];
        let mut rest = item;
        while !rest.is_empty() {
            let Some(open) = rest.find('[') else {
                names.iter_mut().for_each(|n| n.push_str(rest));
                break;
            };
            let (prefix, tail) = rest.split_at(open);
            names.iter_mut().for_each(|n| n.push_str(prefix));
            let close = tail
                .find(']')
                .ok_or_else(|| format!("'{item}' has a '[' without its ']'"))?;
            let numbers = expand_ranges(&tail[1..close], item)?;
            if names.len().saturating_mul(numbers.len()) + hosts.len() > MAX_HOSTS {
                return Err(format!("'{list}' names more than {MAX_HOSTS} hosts"));
            }
            names = names
                .iter()
                .flat_map(|n| numbers.iter().map(move |x| format!("{n}{x}")))
                .collect();
            rest = &tail[close + 1..];
        }
        hosts.extend(names);
    }
    if hosts.is_empty() {
        return Err(format!("'{list}' names no host"));
    }
    Ok(hosts)
}

/// The items of a hostlist: commas inside brackets separate ranges, not
/// names.
fn split_top(list: &str) -> std::result::Result<Vec<&str>, String> {
    let (mut items, mut depth, mut start) = (Vec::new(), 0u32, 0);
    for (i, c) in list.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err(format!("'{list}' nests brackets")),
            ']' if depth == 1 => depth = 0,
            ']' => return Err(format!("'{list}' has a ']' without its '['")),
            ',' if depth == 0 => {
                items.push(list[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(list[start..].trim());
    Ok(items)
}

/// `1-3,07` → `1 2 3 07`: a range keeps the width of its first bound.
fn expand_ranges(ranges: &str, item: &str) -> std::result::Result<Vec<String>, String> {
    let mut out = Vec::new();
    for r in ranges.split(',') {
        let r = r.trim();
        let (lo, hi) = r.split_once('-').unwrap_or((r, r));
        let bad = || format!("'{item}': '{r}' is not a number or a range of numbers");
        if lo.is_empty() || !lo.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let a: u64 = lo.parse().map_err(|_| bad())?;
        let b: u64 = hi.parse().map_err(|_| bad())?;
        if b < a {
            return Err(format!("'{item}': the range '{r}' runs backwards"));
        }
        if (b - a) as usize >= MAX_HOSTS - out.len().min(MAX_HOSTS) {
            return Err(format!("'{item}' names more than {MAX_HOSTS} hosts"));
        }
        let width = lo.len();
        out.extend((a..=b).map(|x| format!("{x:0width$}")));
    }
    Ok(out)
}

/// Expands Slurm's tasks-per-node notation: `2(x3),1` → `[2, 2, 2, 1]`.
pub fn expand_tasks_per_node(list: &str) -> std::result::Result<Vec<u32>, String> {
    let mut out = Vec::new();
    for item in list.split(',').map(str::trim) {
        let bad = || format!("'{list}': '{item}' is not N or N(xM)");
        let (n, times) = match item.split_once("(x") {
            Some((n, t)) => (n, t.strip_suffix(')').ok_or_else(bad)?),
            None => (item, "1"),
        };
        let n: u32 = n.trim().parse().map_err(|_| bad())?;
        let times: usize = times.trim().parse().map_err(|_| bad())?;
        if times > MAX_HOSTS - out.len().min(MAX_HOSTS) {
            return Err(format!("'{list}' counts more than {MAX_HOSTS} nodes"));
        }
        out.extend(std::iter::repeat_n(n, times));
    }
    Ok(out)
}

/// The first variable of `names` that is set, with its name.
fn first_set(env: Lookup<'_>, names: &[&'static str]) -> Option<(&'static str, String)> {
    names
        .iter()
        .find_map(|n| env(n).filter(|v| !v.trim().is_empty()).map(|v| (*n, v)))
}

/// How many of the step's tasks run on this task's node: the entry of
/// `SLURM_STEP_TASKS_PER_NODE` (srun's, for the step) or
/// `SLURM_TASKS_PER_NODE` (the allocation's) at `SLURM_NODEID`, else
/// `SLURM_NTASKS_PER_NODE` (set only when the user asked for it).
pub fn local_size(env: Lookup<'_>) -> Result<Option<u32>> {
    let Some((name, list)) = first_set(env, &["SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"])
    else {
        return num(env, "SLURM_NTASKS_PER_NODE");
    };
    let counts = expand_tasks_per_node(&list).map_err(|e| Error::Config(format!("{name}: {e}")))?;
    let node = num(env, "SLURM_NODEID")?.unwrap_or(0);
    counts.get(node as usize).copied().map(Some).ok_or_else(|| {
        Error::Config(format!(
            "SLURM_NODEID={node}, but {name}={list:?} counts only {} node(s)",
            counts.len()
        ))
    })
}

/// Where rank 0 hosts the store when nothing names it (`MASTER_ADDR` is
/// unset): the step's first node, which Slurm's block and cyclic
/// distributions both give task 0; and `MASTER_PORT`, or a port every task
/// derives from the job and step ids, so that two steps of a job running at
/// once use different ports.
pub fn store_from_nodelist(env: Lookup<'_>, rank: u32) -> Result<String> {
    let lists = [
        "SLURM_STEP_NODELIST",
        "SLURM_JOB_NODELIST",
        "SLURM_NODELIST",
    ];
    let (name, list) = first_set(env, &lists).ok_or_else(|| {
        Error::Config(format!(
            "under slurm, the store's address comes from MASTER_ADDR or the node list, \
             and neither MASTER_ADDR nor {} is set",
            lists.join(", ")
        ))
    })?;
    let hosts = expand_hostlist(&list).map_err(|e| Error::Config(format!("{name}: {e}")))?;
    let host = &hosts[0];
    if rank == 0
        && let Some(node) = num(env, "SLURM_NODEID")?
        && node != 0
    {
        return Err(Error::Config(format!(
            "rank 0 runs on node {node} of the step, not on its first node {host}, where every \
             rank looks for the store ({name}={list}); use a block or cyclic distribution, or \
             set MASTER_ADDR to rank 0's host"
        )));
    }
    let port = match num(env, "MASTER_PORT")? {
        Some(p) if p == 0 || p > 65535 => {
            return Err(Error::Config(format!("MASTER_PORT={p} is not a TCP port")));
        }
        Some(p) => p,
        None => {
            let job = env("SLURM_JOB_ID").unwrap_or_default();
            let step = env("SLURM_STEP_ID").unwrap_or_default();
            PORT_BASE + (fnv1a(&[job.trim(), step.trim()]) % PORT_SPAN as u64) as u32
        }
    };
    Ok(format!("{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch_env::tests::lookup;

    #[test]
    fn hostlists_expand_as_slurm_writes_them() {
        let cases: &[(&str, &[&str])] = &[
            ("gwnode1", &["gwnode1"]),
            ("gwnode[1-2]", &["gwnode1", "gwnode2"]),
            ("n[01-03,07]", &["n01", "n02", "n03", "n07"]),
            ("a,b[8-10],c", &["a", "b8", "b9", "b10", "c"]),
            ("r[1-2]-n[0-1]", &["r1-n0", "r1-n1", "r2-n0", "r2-n1"]),
            ("n[9-11].ib", &["n9.ib", "n10.ib", "n11.ib"]),
            ("n[007]", &["n007"]),
            ("10.0.0.[1-2]", &["10.0.0.1", "10.0.0.2"]),
        ];
        for (list, want) in cases {
            assert_eq!(
                expand_hostlist(list).unwrap_or_else(|e| panic!("{list}: {e}")),
                *want,
                "{list}"
            );
        }
    }

    #[test]
    fn malformed_hostlists_are_named() {
        for (list, want) in [
            ("n[1-2", "without its ']'"),
            ("n1-2]", "without its '['"),
            ("n[[1]]", "nests"),
            ("n[2-1]", "runs backwards"),
            ("n[a-b]", "'a-b' is not a number"),
            ("n[-1]", "'-1' is not a number"),
            ("n[]", "'' is not a number"),
            ("", "names no host"),
            ("n[0-4294967295]", "more than"),
            ("a[0-1023]b[0-1023]c[0-1]", "more than"),
        ] {
            let e = expand_hostlist(list).expect_err(list);
            assert!(e.contains(want), "{list}: {e}");
        }
    }

    #[test]
    fn tasks_per_node_expand() {
        assert_eq!(expand_tasks_per_node("2(x2)").unwrap(), [2, 2]);
        assert_eq!(expand_tasks_per_node("3,1").unwrap(), [3, 1]);
        assert_eq!(expand_tasks_per_node("2(x3),1").unwrap(), [2, 2, 2, 1]);
        for bad in ["", "x", "2(x", "2(3)", "2(x-1)", "1(x4294967295)"] {
            assert!(expand_tasks_per_node(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn local_size_is_this_nodes_entry() {
        let at = |pairs: &[(&str, &str)]| local_size(&lookup(pairs));
        let step = ("SLURM_STEP_TASKS_PER_NODE", "3,1");
        assert_eq!(at(&[step, ("SLURM_NODEID", "0")]).unwrap(), Some(3));
        assert_eq!(at(&[step, ("SLURM_NODEID", "1")]).unwrap(), Some(1));
        // The step's counts win over the allocation's.
        assert_eq!(
            at(&[
                ("SLURM_TASKS_PER_NODE", "4(x2)"),
                step,
                ("SLURM_NODEID", "1")
            ])
            .unwrap(),
            Some(1)
        );
        assert_eq!(
            at(&[("SLURM_TASKS_PER_NODE", "4(x2)"), ("SLURM_NODEID", "1")]).unwrap(),
            Some(4)
        );
        assert_eq!(at(&[("SLURM_NTASKS_PER_NODE", "2")]).unwrap(), Some(2));
        assert_eq!(at(&[]).unwrap(), None);
        let e = at(&[step, ("SLURM_NODEID", "2")]).unwrap_err().to_string();
        assert!(
            e.contains("SLURM_NODEID=2") && e.contains("only 2 node"),
            "{e}"
        );
    }

    #[test]
    fn the_store_is_on_the_first_node_at_a_port_of_the_step() {
        let at = |pairs: &[(&str, &str)], rank| store_from_nodelist(&lookup(pairs), rank);
        let step = |id: &'static str| {
            [
                ("SLURM_STEP_NODELIST", "gwnode[1-2]"),
                ("SLURM_JOB_NODELIST", "other[1-4]"),
                ("SLURM_JOB_ID", "17"),
                ("SLURM_STEP_ID", id),
            ]
        };
        let a = at(&step("0"), 1).unwrap();
        let (host, port) = a.rsplit_once(':').unwrap();
        assert_eq!(host, "gwnode1");
        let port: u32 = port.parse().unwrap();
        assert!((PORT_BASE..PORT_BASE + PORT_SPAN).contains(&port), "{port}");
        // Every task of the step derives the same; another step another.
        assert_eq!(at(&step("0"), 3).unwrap(), a);
        assert_ne!(at(&step("1"), 3).unwrap(), a);
        let mut given = step("0").to_vec();
        given.push(("MASTER_PORT", "29500"));
        assert_eq!(at(&given, 0).unwrap(), "gwnode1:29500");
        // Without a step list (a program run by the batch script itself).
        assert!(
            at(&[("SLURM_JOB_NODELIST", "b[3-4]")], 0)
                .unwrap()
                .starts_with("b3:")
        );
        let e = at(&[], 0).unwrap_err().to_string();
        assert!(e.contains("SLURM_STEP_NODELIST"), "{e}");
        // Rank 0 elsewhere than the first node: the others would wait for a
        // store that is not there.
        let mut moved = step("0").to_vec();
        moved.push(("SLURM_NODEID", "1"));
        let e = at(&moved, 0).unwrap_err().to_string();
        assert!(
            e.contains("rank 0 runs on node 1") && e.contains("MASTER_ADDR"),
            "{e}"
        );
        assert!(at(&moved, 2).is_ok());
        let mut bad = step("0").to_vec();
        bad[0] = ("SLURM_STEP_NODELIST", "gwnode[1-");
        let e = at(&bad, 0).unwrap_err().to_string();
        assert!(e.contains("SLURM_STEP_NODELIST: 'gwnode[1-'"), "{e}");
    }
}
