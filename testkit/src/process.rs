//! Child processes the tests start (Envoy, tcpdump): output to a log file, stopped by
//! their own pid when dropped (SIGTERM, a bounded wait, then SIGKILL).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long a process gets to exit after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// How often the waits poll.
const POLL: Duration = Duration::from_millis(50);

/// The tests' one wait: polls `check` every 50 ms until it gives a value; panics
/// after `limit` naming `what` (at the caller's line).
#[track_caller]
pub fn wait_until<T>(what: &str, limit: Duration, check: impl FnMut() -> Option<T>) -> T {
    wait_until_or(what, limit, check, String::new)
}

/// [`wait_until`], whose failure message goes on with what `explain` says at the
/// time (the last value seen, logs).
#[track_caller]
pub fn wait_until_or<T>(
    what: &str,
    limit: Duration,
    check: impl FnMut() -> Option<T>,
    explain: impl FnOnce() -> String,
) -> T {
    match poll_until(limit, check) {
        Some(value) => value,
        None => {
            let explained = explain();
            let sep = if explained.is_empty() { "" } else { ": " };
            panic!("timed out after {limit:?} waiting for {what}{sep}{explained}")
        }
    }
}

/// [`wait_until`] for a caller that acts on the timeout itself (kills a process,
/// says what it saw): `None` once `limit` has passed. `check` is called at least
/// once, and once more at the deadline.
pub fn poll_until<T>(limit: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check() {
            return Some(value);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        std::thread::sleep(POLL.min(deadline - now));
    }
}

/// Finds an executable on `PATH`.
pub fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    })
}

/// A program `scripts/setup.sh` installs from Debian: on `PATH`, else in `/usr/bin`
/// (which a test runner's `PATH` may lack).
pub fn installed(name: &str) -> PathBuf {
    on_path(name)
        .or_else(|| Some(PathBuf::from("/usr/bin").join(name)).filter(|p| p.is_file()))
        .unwrap_or_else(|| panic!("{name} is not installed: run scripts/setup.sh"))
}

/// One running child process.
pub struct Process {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl Process {
    /// Starts `command` with stdout and stderr going to `log`.
    pub fn spawn(name: &str, mut command: Command, log: &Path) -> Process {
        // Appending: a process that opens its own stdout again (Envoy's access log at
        // /dev/stdout) writes through another file offset, and without O_APPEND its
        // stderr's next line would overwrite what that one wrote.
        let out = File::create(log)
            .and_then(|_| std::fs::OpenOptions::new().append(true).open(log))
            .unwrap_or_else(|e| panic!("creating {}: {e}", log.display()));
        let err = out.try_clone().unwrap();
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name} ({command:?}): {e}"));
        Process {
            name: name.to_owned(),
            child: Some(child),
            log: log.to_owned(),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The exit status if the process has exited (it stays reaped-able until then,
    /// so its pid cannot be reused under us).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.as_mut()?.try_wait().unwrap()
    }

    /// Waits up to `limit` for the process to exit on its own.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        poll_until(limit, || self.exited())
    }

    /// [`wait_until`] `check` gives a value, failing at once (with the end of the
    /// log) if the process exits meanwhile, rather than after the whole `limit`.
    pub fn wait_running<T>(
        &mut self,
        what: &str,
        limit: Duration,
        mut check: impl FnMut(&Process) -> Option<T>,
    ) -> T {
        wait_until(what, limit, || {
            if let Some(status) = self.exited() {
                panic!(
                    "{} exited ({status}) while waiting for {what}:\n{}",
                    self.name,
                    self.log_tail(40)
                );
            }
            check(self)
        })
    }

    /// SIGTERM, a bounded wait, then SIGKILL; returns how it exited.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        // SAFETY: kill(2) on the pid of our own child, which is not reaped yet.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        if let Some(status) = poll_until(STOP_GRACE, || child.try_wait().unwrap()) {
            return Some(status);
        }
        eprintln!(
            "{} did not stop within {STOP_GRACE:?} of SIGTERM: SIGKILL",
            self.name
        );
        let _ = child.kill();
        child.wait().ok()
    }

    /// Everything the process wrote.
    /// The file its output goes to.
    pub fn log_path(&self) -> &std::path::Path {
        &self.log
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `n` lines it wrote.
    pub fn log_tail(&self, n: usize) -> String {
        let text = self.log();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop();
    }
}
