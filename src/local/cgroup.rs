//! A cgroup v1 `cpu` group with a CFS quota: the CPU limit of local servers in benchmarks.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// Where the cgroup v1 `cpu` controller is mounted.
pub const CPU_CGROUP_ROOT: &str = "/sys/fs/cgroup/cpu";

/// The CFS period this module sets: a quota is a share of it. Not the kernel's default
/// (100 ms): a small quota in a long period runs the group for its share and then freezes
/// it for the rest, so that at 0.05 core a server answers nothing for 95 ms at a time,
/// longer than a lock round's timeout (10-50 ms), and rounds fail on the period's beat,
/// not under load (measured: thousands of round timeouts in 5 s at 0.05 core per primary
/// with 100 ms, none with 20 ms; `benches/README.md`). The same share in a shorter period
/// is spread more evenly.
const PERIOD_US: u64 = 20_000;
/// The longest period this module sets: for quotas below [`MIN_QUOTA_US`] per
/// [`PERIOD_US`] (under 0.05 core), the period grows so the quota is the kernel's least.
const MAX_PERIOD_US: u64 = 100_000;
/// The smallest quota the kernel accepts (1 ms per period).
const MIN_QUOTA_US: u64 = 1_000;
/// How long dropping waits for the group's last processes to leave it.
const REMOVE_TIMEOUT: Duration = Duration::from_secs(2);

/// A cgroup v1 `cpu` group of its own with a CFS quota, for processes that must not use
/// more than a given share of a core (the servers of a benchmark whose rate the servers,
/// not the machine, must bound).
///
/// It is made under the `cpu` cgroup of the calling process (under
/// [`CPU_CGROUP_ROOT`], named `redlock-mux-<pid>-<n>`), with `cpu.cfs_period_us` 20,000
/// (20 ms, not the kernel's 100: a small share in a long period freezes a server longer
/// than a lock round waits; up to 100 ms for shares under 0.05 core) and
/// `cpu.cfs_quota_us` the share of that period. Dropping it moves any process still
/// in it back to the calling process's group and removes the directory.
///
/// Needs the cgroup v1 `cpu` controller mounted and writable (root, or a delegated
/// group): where it is not (a cgroup v2 only system, no privileges), [`create`](Self::create)
/// fails with an error that says so. [`LocalMaster::limit_cpu`](super::LocalMaster::limit_cpu)
/// uses it for a local server.
///
/// # Examples
///
/// ```no_run
/// use redlock_mux::local::CpuCgroup;
///
/// let group = CpuCgroup::create(0.1)?; // 10% of one core: 2 ms in every 20 ms
/// assert_eq!((group.quota_us()?, group.period_us()?), (2_000, 20_000));
/// group.add_process(std::process::id())?; // this very process, from now on
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct CpuCgroup {
    path: PathBuf,
    /// The group processes go back to when this one is removed (ours).
    parent: PathBuf,
    cores: f64,
}

fn cgroup_error(e: io::Error, doing: &str, path: &Path) -> io::Error {
    let hint = match e.kind() {
        io::ErrorKind::PermissionDenied => {
            " (needs root, or write access to a delegated cgroup v1 cpu group)"
        }
        io::ErrorKind::NotFound | io::ErrorKind::ReadOnlyFilesystem => {
            " (is the cgroup v1 cpu controller mounted, and writable, here?)"
        }
        _ => "",
    };
    io::Error::new(e.kind(), format!("{doing} {}: {e}{hint}", path.display()))
}

/// The calling process's group in the `cpu` hierarchy, from `/proc/self/cgroup`.
fn own_cpu_group() -> io::Result<PathBuf> {
    let root = Path::new(CPU_CGROUP_ROOT);
    if !root.join("cgroup.procs").exists() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "no cgroup v1 cpu controller at {CPU_CGROUP_ROOT} (a cgroup v2 only system, \
                 or not mounted): a CPU quota per process needs it"
            ),
        ));
    }
    let text = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    // Lines are `id:controllers:path`; the cpu controller may share a line (`cpu,cpuacct`).
    let own = text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "cpu")
            .then(|| path.trim_start_matches('/').to_string())
    });
    let dir = match own {
        Some(p) if !p.is_empty() && root.join(&p).is_dir() => root.join(p),
        // Not listed, or a path this mount does not show (a container's view): the root of
        // the mount is ours.
        _ => root.to_path_buf(),
    };
    Ok(dir)
}

impl CpuCgroup {
    /// Makes a new group whose processes together may use `cores` of a CPU's time
    /// (`0.1`: 2 ms per 20 ms period; `2.0`: two cores' worth; `0.01`: 1 ms per 100 ms).
    ///
    /// # Errors
    ///
    /// `InvalidInput` when `cores` is not a positive finite number or is below 0.01 (the
    /// kernel's smallest quota); `Unsupported` without a cgroup v1 `cpu` controller;
    /// `PermissionDenied` (with a hint) where the hierarchy is not writable.
    pub fn create(cores: f64) -> io::Result<CpuCgroup> {
        let (period, quota) = period_and_quota_us(cores)?;
        let parent = own_cpu_group()?;
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "redlock-mux-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let path = parent.join(name);
        fs::create_dir(&path).map_err(|e| cgroup_error(e, "creating cgroup", &path))?;
        // From here on, Drop removes the directory if a write fails.
        let group = CpuCgroup {
            path,
            parent,
            cores,
        };
        group.write("cpu.cfs_period_us", &period.to_string())?;
        group.write("cpu.cfs_quota_us", &quota.to_string())?;
        Ok(group)
    }

    fn write(&self, file: &str, value: &str) -> io::Result<()> {
        let path = self.path.join(file);
        fs::write(&path, value).map_err(|e| cgroup_error(e, &format!("writing {value} to"), &path))
    }

    fn read(&self, file: &str) -> io::Result<String> {
        let path = self.path.join(file);
        fs::read_to_string(&path).map_err(|e| cgroup_error(e, "reading", &path))
    }

    /// Changes the quota to `cores` of a CPU's time (see [`create`](Self::create)).
    pub fn set_cores(&mut self, cores: f64) -> io::Result<()> {
        let (period, quota) = period_and_quota_us(cores)?;
        // No quota while the period changes: a quota above a new, shorter period would be
        // refused for a group limited to one CPU's share by its parent.
        self.write("cpu.cfs_quota_us", "-1")?;
        self.write("cpu.cfs_period_us", &period.to_string())?;
        self.write("cpu.cfs_quota_us", &quota.to_string())?;
        self.cores = cores;
        Ok(())
    }

    /// Moves the process `pid` (all its threads) into the group. Its later threads and
    /// children start in it too.
    pub fn add_process(&self, pid: u32) -> io::Result<()> {
        self.write("cgroup.procs", &pid.to_string())
    }

    /// The group's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The share of a core given at creation (or by [`set_cores`](Self::set_cores)).
    pub fn cores(&self) -> f64 {
        self.cores
    }

    /// `cpu.cfs_quota_us` as the kernel reports it now.
    pub fn quota_us(&self) -> io::Result<i64> {
        parse_number(&self.read("cpu.cfs_quota_us")?, &self.path)
    }

    /// `cpu.cfs_period_us` as the kernel reports it now.
    pub fn period_us(&self) -> io::Result<i64> {
        parse_number(&self.read("cpu.cfs_period_us")?, &self.path)
    }

    /// The PIDs of the processes in the group now.
    pub fn processes(&self) -> io::Result<Vec<u32>> {
        Ok(self
            .read("cgroup.procs")?
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect())
    }

    /// `nr_throttled` of `cpu.stat`: how many periods the quota held the group back.
    pub fn throttled_periods(&self) -> io::Result<u64> {
        let stat = self.read("cpu.stat")?;
        Ok(stat
            .lines()
            .find_map(|l| l.strip_prefix("nr_throttled "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0))
    }
}

/// The period and quota (µs) that give `cores` of a CPU's time: [`PERIOD_US`], or a longer
/// period (up to [`MAX_PERIOD_US`]) where the quota would be below the kernel's least.
fn period_and_quota_us(cores: f64) -> io::Result<(u64, u64)> {
    if !cores.is_finite() || cores <= 0.0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a CPU quota must be a positive number of cores, not {cores}"),
        ));
    }
    let period = if cores * (PERIOD_US as f64) < MIN_QUOTA_US as f64 {
        ((MIN_QUOTA_US as f64 / cores).ceil() as u64).min(MAX_PERIOD_US)
    } else {
        PERIOD_US
    };
    let quota = (cores * period as f64).round();
    if quota < MIN_QUOTA_US as f64 || quota > 1e12 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a CPU quota of {cores} cores is out of range: at least 0.01 (1 ms per \
                 100 ms period)"
            ),
        ));
    }
    Ok((period, quota as u64))
}

fn parse_number(text: &str, path: &Path) -> io::Result<i64> {
    text.trim().parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: not a number: {text:?}", path.display()),
        )
    })
}

impl Drop for CpuCgroup {
    /// Moves any process left in the group back to the caller's group, then removes the
    /// group (waiting up to 2 s for exiting processes to leave it). Never panics.
    fn drop(&mut self) {
        let deadline = Instant::now() + REMOVE_TIMEOUT;
        for _ in 0..200 {
            for pid in self.processes().unwrap_or_default() {
                let _ = fs::write(self.parent.join("cgroup.procs"), pid.to_string());
            }
            match fs::remove_dir(&self.path) {
                Ok(()) => return,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return,
                Err(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(10)),
                Err(_) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas_are_checked() {
        assert_eq!(period_and_quota_us(0.1).unwrap(), (20_000, 2_000));
        assert_eq!(period_and_quota_us(0.05).unwrap(), (20_000, 1_000));
        assert_eq!(period_and_quota_us(2.0).unwrap(), (20_000, 40_000));
        // Under 0.05 core the period grows, so that the quota is still the kernel's least.
        assert_eq!(period_and_quota_us(0.04).unwrap(), (25_000, 1_000));
        assert_eq!(period_and_quota_us(0.01).unwrap(), (100_000, 1_000));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 0.001, 0.009] {
            assert_eq!(
                period_and_quota_us(bad).unwrap_err().kind(),
                io::ErrorKind::InvalidInput,
                "{bad}"
            );
        }
    }
}
