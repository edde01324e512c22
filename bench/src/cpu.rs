//! CPU time per program, from `/proc/<pid>/stat`: what explains a ratio on a machine
//! where the load, the origin and the backend share the cores.

use std::collections::HashMap;
use std::time::Instant;

/// Programs whose CPU time the bench follows.
pub const FOLLOWED: &[&str] = &[
    "idem-origin",
    "idem-bench",
    "postgres",
    "redis-server",
    "pgbench",
    "redis-benchmark",
    crate::proxy::PROGRAM,
    crate::peer::PROGRAM,
    crate::proxy::IPX_PROGRAM,
    crate::proxy::NGINX_PROGRAM,
    "floor-http",
    "floor-store",
    "floor-proxy",
    "python3",
];

/// CPU seconds used so far by every live process of the followed programs.
#[derive(Clone, Debug)]
pub struct Snapshot {
    taken: Instant,
    /// pid → (program, CPU seconds). Per process, because a process that exits in
    /// between (an autovacuum worker, say) must not make a program's total shrink.
    processes: HashMap<u32, (&'static str, f64)>,
}

/// CPU used between two snapshots, per program, over `wall` seconds.
#[derive(Clone, Debug, Default)]
pub struct Usage {
    pub seconds: HashMap<String, f64>,
    pub wall: f64,
}

impl Usage {
    /// Cores in use on average.
    pub fn cores_of(&self, program: &str) -> f64 {
        if self.wall > 0.0 {
            self.seconds_of(program) / self.wall
        } else {
            0.0
        }
    }
    pub fn seconds_of(&self, program: &str) -> f64 {
        self.seconds.get(program).copied().unwrap_or(0.0)
    }
}

/// Snapshots taken at an interval while a benchmark tool runs: its processes and the
/// server processes it drives exit with it, so a snapshot after the run misses them.
pub struct Sampler {
    task: tokio::task::JoinHandle<Vec<Snapshot>>,
    stop: tokio::sync::oneshot::Sender<()>,
}

impl Sampler {
    pub fn start(every: std::time::Duration) -> Sampler {
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut samples = vec![snapshot()];
            loop {
                tokio::select! {
                    _ = &mut stopped => return samples,
                    _ = tokio::time::sleep(every) => samples.push(snapshot()),
                }
            }
        });
        Sampler { task, stop }
    }

    pub async fn stop(self) -> Samples {
        let _ = self.stop.send(());
        Samples(self.task.await.unwrap_or_default())
    }
}

pub struct Samples(Vec<Snapshot>);

impl Samples {
    /// Usage over the longest stretch of samples in which `tool` ran throughout and
    /// its CPU time only grew: one run of it, with its server processes alive.
    pub fn while_running(&self, tool: &str) -> Usage {
        let time = |s: &Snapshot| s.program_seconds(tool);
        let (mut best, mut start) = ((0, 0), None);
        for i in 0..self.0.len() {
            let continues = i > 0
                && matches!((time(&self.0[i - 1]), time(&self.0[i])), (Some(a), Some(b)) if b >= a);
            match (time(&self.0[i]), continues) {
                (Some(_), true) => {}
                (Some(_), false) => start = Some(i),
                (None, _) => start = None,
            }
            if let Some(st) = start {
                let span = |(a, b): (usize, usize)| self.0[b].taken.duration_since(self.0[a].taken);
                if span((st, i)) > span(best) {
                    best = (st, i);
                }
            }
        }
        if best.1 > best.0 {
            self.0[best.0].until(&self.0[best.1])
        } else {
            Usage::default()
        }
    }
}

/// Clock ticks per second of `/proc` times (USER_HZ, 100 on Linux everywhere).
const TICKS_PER_S: f64 = 100.0;

pub fn snapshot() -> Snapshot {
    let mut processes = HashMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            if let Some((comm, secs)) = parse_stat(&stat) {
                if let Some(p) = FOLLOWED.iter().find(|p| comm.starts_with(**p)) {
                    processes.insert(pid, (*p, secs));
                }
            }
        }
    }
    Snapshot {
        taken: Instant::now(),
        processes,
    }
}

impl Snapshot {
    /// CPU used from `self` to `later`, by the processes alive at `later` (one that
    /// started in between counts from its start; one that ended is not seen).
    pub fn until(&self, later: &Snapshot) -> Usage {
        let wall = later
            .taken
            .duration_since(self.taken)
            .as_secs_f64()
            .max(1e-9);
        let mut usage = Usage {
            seconds: HashMap::new(),
            wall,
        };
        for (pid, &(program, after)) in &later.processes {
            let before = match self.processes.get(pid) {
                Some(&(p, s)) if p == program => s,
                _ => 0.0,
            };
            *usage.seconds.entry(program.to_string()).or_insert(0.0) += (after - before).max(0.0);
        }
        usage
    }

    /// CPU seconds of `program`'s live processes, or `None` if none is running.
    fn program_seconds(&self, program: &str) -> Option<f64> {
        let mut found = None;
        for (p, s) in self.processes.values() {
            if *p == program {
                *found.get_or_insert(0.0) += s;
            }
        }
        found
    }
}

/// (command name, user + system CPU seconds) from one `/proc/<pid>/stat` line. The
/// name is in parentheses and may itself hold spaces and parentheses.
pub fn parse_stat(stat: &str) -> Option<(&str, f64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?;
    let rest: Vec<&str> = stat.get(close + 2..)?.split_whitespace().collect();
    // After the name: state is field 3, utime field 14, stime field 15 (1-based).
    let utime: f64 = rest.get(11)?.parse().ok()?;
    let stime: f64 = rest.get(12)?.parse().ok()?;
    Some((comm, (utime + stime) / TICKS_PER_S))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_proc_stat() {
        let line = "5756 (idem-origin) S 5751 5751 1234 0 -1 4194560 9000 0 0 0 1500 250 0 0 20 0 3 0 12345 1000000 2000 18446744073709551615";
        assert_eq!(parse_stat(line), Some(("idem-origin", 17.5)));
        let odd = "77 (a (b) c) R 1 1 1 0 -1 0 0 0 0 0 7 3 0 0";
        assert_eq!(parse_stat(odd), Some(("a (b) c", 0.1)));
        assert_eq!(parse_stat("garbage"), None);
    }

    fn snap(ms: u64, tool: Option<f64>) -> Snapshot {
        let base = Instant::now();
        let mut processes = HashMap::new();
        if let Some(t) = tool {
            processes.insert(10, ("pgbench", t));
        }
        processes.insert(20, ("postgres", ms as f64 / 1000.0));
        Snapshot {
            taken: base + std::time::Duration::from_millis(ms),
            processes,
        }
    }

    #[test]
    fn a_process_that_exits_takes_nothing_away() {
        let mut before = snap(0, None);
        before.processes.insert(30, ("postgres", 50.0)); // an autovacuum worker, say
        let after = snap(1000, None); // it has exited; pid 20 used 1 s
        assert!((before.until(&after).seconds_of("postgres") - 1.0).abs() < 1e-9);
    }

    #[test]
    fn samples_pick_the_longest_run_of_the_tool() {
        // A short calibration run (0-200 ms), a gap, then the real run (400-1000 ms).
        let samples = Samples(vec![
            snap(0, Some(0.0)),
            snap(100, Some(0.05)),
            snap(200, Some(0.1)),
            snap(300, None),
            snap(400, Some(0.0)),
            snap(700, Some(0.3)),
            snap(1000, Some(0.6)),
        ]);
        let u = samples.while_running("pgbench");
        assert!((u.cores_of("pgbench") - 1.0).abs() < 0.01, "{u:?}");
        assert!((u.seconds_of("postgres") - 0.6).abs() < 1e-9, "{u:?}");
        assert_eq!(
            Samples(vec![snap(0, None)])
                .while_running("pgbench")
                .cores_of("pgbench"),
            0.0
        );
    }

    #[test]
    fn this_process_is_seen_using_cpu() {
        let before = snapshot();
        let mut x = 0u64;
        let t = Instant::now();
        while t.elapsed().as_millis() < 300 {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        let after = snapshot();
        // The test binary is named idem_bench-<hash>: not followed, so nothing shows.
        let usage = before.until(&after);
        assert!(usage
            .seconds
            .keys()
            .all(|p| (0.0..=64.0).contains(&usage.cores_of(p))));
        let me = std::fs::read_to_string("/proc/self/stat").unwrap();
        assert!(parse_stat(&me).unwrap().1 > 0.2, "{me}");
    }
}
