//! Executors run only on the CPUs the process may use (the starting thread's affinity, as
//! `taskset` or a container's cpuset leave it), and an explicit CPU outside them is a typed
//! error.
//!
//! The story: `Engine::start` pinned executor `i` to CPU `i` modulo the CPU count, so under
//! `taskset -c 4-7` the executors ran on CPUs 0-3 (outside a cpuset, glommio's pinning fails
//! and the executor thread panics), and an explicit `cpus` outside the mask was obeyed
//! silently.
//!
//! Here the test restricts its own thread (`sched_setaffinity`, which a thread's children
//! inherit and which touches no other test) to the highest CPU it may use, starts engines from
//! that thread and reads each executor thread's `Cpus_allowed_list` from
//! `/proc/self/task/<tid>/status`, by the thread ids the engine reports. On a 2-CPU machine:
//! restricted to CPU 1, the executors must be on CPU 1 (before the change they were on 0).

use std::collections::BTreeSet;

use omnibus::actors::{allowed_cpus, Engine, EngineOptions};
use omnibus::Error;

/// The kernel's CPU list format (`0-3,8`).
fn parse_cpu_list(s: &str) -> BTreeSet<usize> {
    let mut out = BTreeSet::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap()),
            None => {
                out.insert(part.parse().unwrap());
            }
        }
    }
    out
}

/// Each executor thread's name and the CPUs the kernel lets it run on.
fn executor_threads(engine: &Engine) -> Vec<(String, BTreeSet<usize>)> {
    engine
        .executor_thread_ids()
        .iter()
        .map(|tid| {
            let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
            let field = |name: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .unwrap_or_else(|| panic!("no {name} in the status of thread {tid}"))
                    .trim()
                    .to_string()
            };
            (field("Name:"), parse_cpu_list(&field("Cpus_allowed_list:")))
        })
        .collect()
}

/// Every executor thread is named as one and may run only on CPUs of `allowed`; returns the
/// CPUs they run on.
fn assert_within(engine: &Engine, allowed: &BTreeSet<usize>) -> BTreeSet<usize> {
    let threads = executor_threads(engine);
    assert_eq!(threads.len(), engine.executors());
    let mut used = BTreeSet::new();
    for (name, cpus) in threads {
        assert!(name.starts_with("omnibus-exec-"), "{name}");
        assert!(
            !cpus.is_empty() && cpus.is_subset(allowed),
            "executor thread {name} may run on {cpus:?}, outside the allowed {allowed:?}"
        );
        used.extend(cpus);
    }
    used
}

/// Runs `f` on a thread of its own whose affinity is only `cpu`.
fn restricted_to(cpu: usize, f: impl FnOnce() + Send + 'static) {
    std::thread::spawn(move || {
        let mut set = rustix::thread::CpuSet::new();
        set.set(cpu);
        rustix::thread::sched_setaffinity(None, &set).unwrap();
        assert_eq!(allowed_cpus().unwrap(), [cpu]);
        f()
    })
    .join()
    .unwrap();
}

/// The highest CPU this process may use (CPU 1 on a 2-CPU machine), and one outside a mask of
/// that CPU alone: another allowed one (CPU 0 there), else one past it.
fn target_and_other() -> (usize, usize) {
    let all = allowed_cpus().unwrap();
    let target = *all.iter().max().unwrap();
    let other = all
        .iter()
        .copied()
        .find(|&c| c != target)
        .unwrap_or(target + 1);
    (target, other)
}

#[test]
fn executors_run_on_the_allowed_cpus_only() {
    let all: BTreeSet<usize> = allowed_cpus().unwrap().into_iter().collect();
    // The default: one executor per allowed CPU, each on one of them, all of them used.
    let engine = Engine::start(EngineOptions::default()).unwrap();
    assert_eq!(engine.executors(), all.len());
    assert_eq!(assert_within(&engine, &all), all);
    engine.shutdown().unwrap();

    let (target, _) = target_and_other();
    restricted_to(target, move || {
        let only = BTreeSet::from([target]);
        let engine = Engine::start(EngineOptions::default()).unwrap();
        // What the kernel says first, then what the engine says.
        assert_eq!(assert_within(&engine, &only), only);
        assert_eq!(engine.executors(), 1, "one executor per allowed CPU");
        assert_eq!(engine.executor_cpus(), [target]);
        engine.shutdown().unwrap();

        // More executors than allowed CPUs: they share the one allowed CPU.
        let engine = Engine::start(EngineOptions {
            executors: Some(3),
            ..EngineOptions::default()
        })
        .unwrap();
        assert_eq!(assert_within(&engine, &only), only);
        assert_eq!(engine.executor_cpus(), [target, target, target]);
        engine.shutdown().unwrap();

        // An explicit CPU inside the mask is used.
        let engine = Engine::start(EngineOptions {
            cpus: Some(vec![target]),
            ..EngineOptions::default()
        })
        .unwrap();
        assert_eq!(assert_within(&engine, &only), only);
        engine.shutdown().unwrap();
    });
}

#[test]
fn an_explicit_cpu_outside_the_allowed_ones_is_invalid_options() {
    let (target, other) = target_and_other();
    restricted_to(target, move || {
        match Engine::start(EngineOptions {
            cpus: Some(vec![target, other]),
            ..EngineOptions::default()
        }) {
            Err(Error::InvalidOptions(m)) => assert!(
                m.contains(&format!("CPU {other} ")) && m.contains(&format!("allowed: {target}")),
                "{m}"
            ),
            Err(e) => panic!("expected InvalidOptions, got {e}"),
            Ok(engine) => panic!(
                "started with CPU {other} outside the allowed {target}: executors on {:?}",
                executor_threads(&engine)
            ),
        }
    });
}

#[test]
fn counts_of_zero_are_invalid_options_not_raised_to_one() {
    let zero = |o: EngineOptions, name: &str| match Engine::start(o) {
        Err(Error::InvalidOptions(m)) => assert!(m.contains(name), "{m}"),
        Err(e) => panic!("{name}: expected InvalidOptions, got {e}"),
        Ok(_) => panic!("{name}: an engine started with 0"),
    };
    zero(
        EngineOptions {
            executors: Some(0),
            ..EngineOptions::default()
        },
        "executors",
    );
    zero(
        EngineOptions {
            mailbox_capacity: 0,
            ..EngineOptions::default()
        },
        "mailbox_capacity",
    );
    zero(
        EngineOptions {
            max_requests_per_txn: 0,
            ..EngineOptions::default()
        },
        "max_requests_per_txn",
    );
    zero(
        EngineOptions {
            index_queue_capacity: 0,
            ..EngineOptions::default()
        },
        "index_queue_capacity",
    );
}
