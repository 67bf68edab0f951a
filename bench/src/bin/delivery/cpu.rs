//! CPU time by process group over the measured window, from `/proc` (Linux).

use super::Args;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

pub struct Snapshot {
    pub(super) at: Instant,
    /// pid → (group, user + system ticks).
    pub(super) procs: HashMap<u32, (String, u64)>,
    /// Busy and total jiffies of the whole machine (`/proc/stat`).
    pub(super) machine: Option<(u64, u64)>,
    pub(super) cpus: usize,
}

pub fn snapshot(args: &Args) -> Snapshot {
    let me = std::process::id();
    let mut procs = HashMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let Some((comm, ticks)) = stat(pid) else {
                continue;
            };
            let group = if let Some((name, _)) = args.watch.iter().find(|(_, p)| *p == pid) {
                name.clone()
            } else if pid == me {
                "this driver".to_string()
            } else if comm == "postgres" {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
                    .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
                    .unwrap_or_default();
                match &args.pg_db {
                    // A backend's title is `postgres: <user> <database> <client> <state>`.
                    Some(db) if cmdline.contains(&format!(" {db} ")) => {
                        "postgres (this run's database)".to_string()
                    }
                    _ => "postgres (background, other databases)".to_string(),
                }
            } else if comm == "nats-server" || comm == "redis-server" {
                comm
            } else {
                "other processes".to_string()
            };
            procs.insert(pid, (group, ticks));
        }
    }
    Snapshot {
        at: Instant::now(),
        procs,
        machine: machine(),
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
    }
}

/// (comm, utime + stime) of a process.
fn stat(pid: u32) -> Option<(String, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text[open + 1..close].to_string();
    // After the command: state (field 3), ..., utime (14), stime (15).
    let fields: Vec<&str> = text[close + 2..].split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((comm, utime + stime))
}

fn machine() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    let busy = v.first()? + v.get(1)? + v.get(2)? + v.get(5)? + v.get(6)? + v.get(7)?;
    let total = busy + v.get(3)? + v.get(4)?;
    Some((busy, total))
}

/// CPU seconds and average cores per group between two snapshots, and what each of
/// `messages` cost (µs), to set beside the CPU a target leaves a message. A process
/// that started in between counts from zero; one that ended in between is missed.
pub fn report(before: &Snapshot, after: &Snapshot, clk_tck: u64, messages: u64) -> Value {
    let window = (after.at - before.at).as_secs_f64();
    let mut groups: BTreeMap<String, u64> = BTreeMap::new();
    for (pid, (group, ticks)) in &after.procs {
        let was = before
            .procs
            .get(pid)
            .filter(|(g, _)| g == group)
            .map_or(0, |(_, t)| *t);
        *groups.entry(group.clone()).or_default() += ticks.saturating_sub(was);
    }
    let hz = clk_tck.max(1) as f64;
    let per_message = |secs: f64| -> Value {
        if messages == 0 {
            Value::Null
        } else {
            json!((secs * 1e6 / messages as f64).round())
        }
    };
    let groups: BTreeMap<String, Value> = groups
        .into_iter()
        .map(|(g, ticks)| {
            let secs = ticks as f64 / hz;
            (
                g,
                json!({
                    "cpu_s": super::round1(secs),
                    "cores": super::round3(if window > 0.0 { secs / window } else { 0.0 }),
                    "us_per_message": per_message(secs),
                }),
            )
        })
        .collect();
    let machine = match (before.machine, after.machine) {
        (Some((b0, t0)), Some((b1, t1))) if t1 > t0 => {
            let share = (b1 - b0) as f64 / (t1 - t0) as f64;
            let cores = share * after.cpus as f64;
            json!({
                "busy_share": super::round3(share),
                "busy_cores": super::round3(cores),
                "busy_us_per_message": per_message(cores * window),
            })
        }
        _ => Value::Null,
    };
    json!({
        "window_s": super::round3(window),
        "cpus": after.cpus,
        "groups": groups,
        "machine": machine,
    })
}
