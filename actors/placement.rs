//! Where the engine's executors run: the CPUs the process may use and the order executors take
//! them in.
//!
//! The allowed CPUs are the calling thread's affinity (`sched_getaffinity`): what `taskset`,
//! a container's cpuset or a parent's `sched_setaffinity` left the process. `Engine::start`
//! reads them on the thread that calls it; by default it starts one executor per allowed CPU.
//!
//! With fewer executors than allowed CPUs, [`spread`] orders the CPUs so that the first ones
//! are as far apart as the machine allows: over NUMA nodes first (a node's memory bandwidth
//! and last-level cache are shared by its cores), then over physical cores before the second
//! hyperthread of any core (two executors on sibling threads share one core's pipelines and
//! L1/L2 caches). The topology comes from sysfs ([`read_topology`]); where it is missing (a
//! container without `/sys`, an exotic kernel) the allowed CPUs are taken in increasing order.
//! With more executors than allowed CPUs, executor `i` takes the `i % n`-th CPU of that order
//! (`n` allowed CPUs): executors share CPUs, round-robin.
//!
//! An explicit list (`EngineOptions::cpus`) is used as given, but every CPU in it must be
//! allowed: pinning a thread outside its cpuset fails in the kernel (`EINVAL`), and outside a
//! mere `taskset` mask it succeeds but runs where the process was told not to.

use std::collections::BTreeMap;
use std::path::Path;

use crate::actor_interface::{Error, Result};

/// One CPU's place in the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CpuPlace {
    /// The CPU's number.
    pub cpu: usize,
    /// Its NUMA node (the physical package where the kernel lists no nodes).
    pub node: usize,
    /// Its physical core, as the smallest CPU number among the core's hardware threads
    /// (unique across packages, unlike sysfs's `core_id`).
    pub core: usize,
}

/// The CPUs the calling thread may run on (its `sched_getaffinity` mask), in increasing order.
///
/// Errors: [`Error::Io`] when the kernel refuses the call (not expected on Linux).
pub fn allowed_cpus() -> Result<Vec<usize>> {
    let set = rustix::thread::sched_getaffinity(None).map_err(|e| Error::Io {
        op: "sched_getaffinity",
        path: "/proc/thread-self".into(),
        source: e.into(),
    })?;
    Ok((0..rustix::thread::CpuSet::MAX_CPU)
        .filter(|&c| set.is_set(c))
        .collect())
}

/// The CPU each of the engine's executors is pinned to, in executor order: `cpus` as given
/// (each one checked against `allowed`), or else `executors` (default: one per allowed CPU)
/// taken from `allowed` in the order [`spread`] gives over `topology`, round-robin when there
/// are more executors than allowed CPUs.
///
/// Errors: [`Error::InvalidOptions`] for an empty `cpus`, a CPU of `cpus` not in `allowed`
/// (naming it and the allowed list), or an empty `allowed`.
pub(crate) fn choose(
    cpus: Option<&[usize]>,
    executors: Option<usize>,
    allowed: &[usize],
    topology: Option<&[CpuPlace]>,
) -> Result<Vec<usize>> {
    if allowed.is_empty() {
        return Err(Error::InvalidOptions(
            "this thread may run on no CPU (empty affinity mask)".into(),
        ));
    }
    match cpus {
        Some([]) => Err(Error::InvalidOptions("empty CPU set".into())),
        Some(cpus) => {
            if let Some(cpu) = cpus.iter().find(|c| !allowed.contains(c)) {
                return Err(Error::InvalidOptions(format!(
                    "cpus: CPU {cpu} is not one this process may run on (allowed: {}; see taskset or the container's cpuset)",
                    cpu_list(allowed)
                )));
            }
            Ok(cpus.to_vec())
        }
        None => {
            let order = spread(allowed, topology);
            let n = executors.unwrap_or(order.len()).max(1);
            Ok((0..n).map(|i| order[i % order.len()]).collect())
        }
    }
}

/// The allowed CPUs in the order executors take them: one per NUMA node in turn, and within
/// each node one thread per physical core before any core's second thread (cores in order of
/// their smallest CPU, a core's threads in increasing order). Without a topology, or with one
/// that does not place every allowed CPU, the allowed CPUs in increasing order.
pub(crate) fn spread(allowed: &[usize], topology: Option<&[CpuPlace]>) -> Vec<usize> {
    let mut plain = allowed.to_vec();
    plain.sort_unstable();
    plain.dedup();
    let Some(topology) = topology else {
        return plain;
    };
    // node -> core -> the core's allowed threads.
    let mut nodes: BTreeMap<usize, BTreeMap<usize, Vec<usize>>> = BTreeMap::new();
    for &cpu in &plain {
        let Some(p) = topology.iter().find(|p| p.cpu == cpu) else {
            return plain;
        };
        nodes
            .entry(p.node)
            .or_default()
            .entry(p.core)
            .or_default()
            .push(cpu);
    }
    let nodes: Vec<Vec<Vec<usize>>> = nodes
        .into_values()
        .map(|cores| cores.into_values().collect())
        .collect();
    let threads = nodes.iter().flatten().map(Vec::len).max().unwrap_or(0);
    let cores = nodes.iter().map(Vec::len).max().unwrap_or(0);
    let mut order = Vec::with_capacity(plain.len());
    for t in 0..threads {
        for c in 0..cores {
            for node in &nodes {
                if let Some(&cpu) = node.get(c).and_then(|core| core.get(t)) {
                    order.push(cpu);
                }
            }
        }
    }
    order
}

/// The places of `cpus` read from sysfs (`sys` is `/sys` on a real system): each CPU's NUMA
/// node from `devices/system/node/node*/cpulist` (without that directory, its
/// `topology/physical_package_id`, else 0) and its core from `topology/core_cpus_list` (or the
/// older `thread_siblings_list`). None (no topology information) when a CPU's core cannot be
/// read.
pub(crate) fn read_topology(sys: &Path, cpus: &[usize]) -> Option<Vec<CpuPlace>> {
    let mut node_of: BTreeMap<usize, usize> = BTreeMap::new();
    if let Ok(dir) = std::fs::read_dir(sys.join("devices/system/node")) {
        for entry in dir.flatten() {
            let name = entry.file_name();
            let Some(node) = name
                .to_str()
                .and_then(|n| n.strip_prefix("node"))
                .and_then(|n| n.parse::<usize>().ok())
            else {
                continue;
            };
            let Ok(list) = std::fs::read_to_string(entry.path().join("cpulist")) else {
                continue;
            };
            for cpu in parse_cpu_list(&list)? {
                node_of.insert(cpu, node);
            }
        }
    }
    let mut places = Vec::with_capacity(cpus.len());
    for &cpu in cpus {
        let topo = sys.join(format!("devices/system/cpu/cpu{cpu}/topology"));
        let siblings = std::fs::read_to_string(topo.join("core_cpus_list"))
            .or_else(|_| std::fs::read_to_string(topo.join("thread_siblings_list")))
            .ok()?;
        let core = parse_cpu_list(&siblings)?.into_iter().min()?;
        let node = match node_of.get(&cpu) {
            Some(&n) => n,
            None => std::fs::read_to_string(topo.join("physical_package_id"))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0),
        };
        places.push(CpuPlace { cpu, node, core });
    }
    Some(places)
}

/// The kernel's CPU list format (`0-3,8,10-11`; empty for no CPU). None when malformed.
pub(crate) fn parse_cpu_list(s: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if a > b {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    Some(out)
}

/// `cpus` in the kernel's CPU list format (`0-3,8`), runs of consecutive CPUs joined.
pub(crate) fn cpu_list(cpus: &[usize]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            sorted[i].to_string()
        } else {
            format!("{}-{}", sorted[i], sorted[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `nodes` x `cores` x `threads`, numbered as Linux numbers most x86 machines: the first
    /// threads of every core first (node by node), then the second threads (CPU `c` and
    /// `c + nodes * cores` are siblings).
    fn threads_last(nodes: usize, cores: usize, threads: usize) -> Vec<CpuPlace> {
        let per_round = nodes * cores;
        (0..per_round * threads)
            .map(|cpu| CpuPlace {
                cpu,
                node: (cpu % per_round) / cores,
                core: cpu % per_round,
            })
            .collect()
    }

    /// The same machine numbered with a core's threads adjacent (CPU 0 and 1 are siblings).
    fn threads_adjacent(nodes: usize, cores: usize, threads: usize) -> Vec<CpuPlace> {
        (0..nodes * cores * threads)
            .map(|cpu| CpuPlace {
                cpu,
                node: cpu / (cores * threads),
                core: cpu - cpu % threads,
            })
            .collect()
    }

    #[test]
    fn two_nodes_four_cores_two_threads() {
        let topo = threads_last(2, 4, 2);
        let all: Vec<usize> = (0..16).collect();
        assert_eq!(
            spread(&all, Some(&topo)),
            [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15]
        );
        // Two executors: one per node; eight: every physical core, no sibling.
        assert_eq!(choose(None, Some(2), &all, Some(&topo)).unwrap(), [0, 4]);
        assert_eq!(
            choose(None, Some(8), &all, Some(&topo)).unwrap(),
            [0, 4, 1, 5, 2, 6, 3, 7]
        );
    }

    #[test]
    fn siblings_numbered_adjacent() {
        let topo = threads_adjacent(2, 4, 2);
        let all: Vec<usize> = (0..16).collect();
        assert_eq!(
            spread(&all, Some(&topo)),
            [0, 8, 2, 10, 4, 12, 6, 14, 1, 9, 3, 11, 5, 13, 7, 15]
        );
        // One node, siblings adjacent: every even CPU (a core each) before any odd one.
        let one = threads_adjacent(1, 4, 2);
        assert_eq!(
            spread(&(0..8).collect::<Vec<_>>(), Some(&one)),
            [0, 2, 4, 6, 1, 3, 5, 7]
        );
    }

    #[test]
    fn a_cpuset_subset() {
        // CPUs 2-5 of one node with adjacent siblings: cores {2,3} and {4,5}.
        let topo = threads_adjacent(1, 4, 2);
        assert_eq!(spread(&[2, 3, 4, 5], Some(&topo)), [2, 4, 3, 5]);
        // Both threads of core 0 and one of core 1 on node 0, one thread on node 1: the
        // nodes alternate while they have cores, then the second threads.
        let topo = threads_last(2, 4, 2);
        assert_eq!(spread(&[0, 8, 1, 4], Some(&topo)), [0, 4, 1, 8]);
        // Default count: one executor per allowed CPU, only allowed CPUs.
        assert_eq!(
            choose(None, None, &[5, 6, 13], Some(&topo)).unwrap(),
            [5, 6, 13]
        );
    }

    #[test]
    fn more_executors_than_cpus_wrap_around() {
        let topo = threads_adjacent(1, 2, 2);
        assert_eq!(
            choose(None, Some(6), &[0, 1, 2, 3], Some(&topo)).unwrap(),
            [0, 2, 1, 3, 0, 2]
        );
        assert_eq!(choose(None, Some(3), &[1], None).unwrap(), [1, 1, 1]);
        assert_eq!(choose(None, Some(0), &[7], None).unwrap(), [7]);
    }

    #[test]
    fn no_topology_keeps_the_allowed_order() {
        assert_eq!(spread(&[6, 4, 5], None), [4, 5, 6]);
        // A topology that misses an allowed CPU is not used.
        let topo = threads_last(1, 2, 1);
        assert_eq!(spread(&[0, 1, 2], Some(&topo)), [0, 1, 2]);
    }

    #[test]
    fn explicit_cpus_must_be_allowed() {
        assert_eq!(
            choose(Some(&[5, 4, 5]), Some(1), &[4, 5, 6, 7], None).unwrap(),
            [5, 4, 5]
        );
        match choose(Some(&[4, 0]), None, &[4, 5, 6, 7, 9], None) {
            Err(Error::InvalidOptions(m)) => {
                assert!(m.contains("CPU 0 ") && m.contains("4-7,9"), "{m}")
            }
            other => panic!("expected InvalidOptions, got {other:?}"),
        }
        assert!(matches!(
            choose(Some(&[]), None, &[0], None),
            Err(Error::InvalidOptions(_))
        ));
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(
            parse_cpu_list("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpu_list("\n"), Some(vec![]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
        assert_eq!(cpu_list(&[9, 0, 1, 2, 3, 5, 6]), "0-3,5-6,9");
        assert_eq!(cpu_list(&[1]), "1");
    }

    /// A synthetic sysfs: 2 nodes, siblings adjacent; then without nodes (packages used),
    /// and without the core files (no topology).
    #[test]
    fn reads_a_sysfs_tree() {
        let sys = std::env::temp_dir().join(format!("omnibus-sysfs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&sys);
        let write = |rel: &str, text: &str| {
            let p = sys.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        write("devices/system/node/node0/cpulist", "0-3\n");
        write("devices/system/node/node1/cpulist", "4-7\n");
        write("devices/system/node/possible", "0-1\n");
        for cpu in 0..8 {
            let core = cpu - cpu % 2;
            let t = format!("devices/system/cpu/cpu{cpu}/topology");
            write(
                &format!("{t}/core_cpus_list"),
                &format!("{core}-{}\n", core + 1),
            );
            write(
                &format!("{t}/physical_package_id"),
                &format!("{}\n", cpu / 4),
            );
        }
        let all: Vec<usize> = (0..8).collect();
        let topo = read_topology(&sys, &all).unwrap();
        assert_eq!(
            topo[5],
            CpuPlace {
                cpu: 5,
                node: 1,
                core: 4
            }
        );
        assert_eq!(spread(&all, Some(&topo)), [0, 4, 2, 6, 1, 5, 3, 7]);
        std::fs::remove_dir_all(sys.join("devices/system/node")).unwrap();
        let topo = read_topology(&sys, &all).unwrap();
        assert_eq!(
            topo[5],
            CpuPlace {
                cpu: 5,
                node: 1,
                core: 4
            }
        );
        std::fs::remove_file(sys.join("devices/system/cpu/cpu3/topology/core_cpus_list")).unwrap();
        assert_eq!(read_topology(&sys, &all), None);
        assert_eq!(read_topology(&sys, &[0, 1]).map(|t| t.len()), Some(2));
        std::fs::remove_dir_all(&sys).unwrap();
    }
}
