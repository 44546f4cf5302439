//! cgroup v2 trees for tests that place processes in cgroups (as pods are), and the
//! bpffs the capture programs are pinned in. Needs root.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A tree of cgroups `<cgroup2 mount>/themis-test-<name>-<pid>/<dirs>`, removed on
/// drop (deepest first; the processes in them must have exited).
pub struct Tree {
    pub root: PathBuf,
    dirs: Vec<PathBuf>,
}

impl Tree {
    /// Creates the tree's root and every directory of `dirs` (relative, with their
    /// parents).
    pub fn new(name: &str, dirs: &[&str]) -> Tree {
        let mount = cgroup2_mount();
        let root = mount.join(format!("themis-test-{name}-{}", std::process::id()));
        let mut all = vec![PathBuf::new()];
        for dir in dirs {
            std::fs::create_dir_all(root.join(dir))
                .unwrap_or_else(|e| panic!("creating cgroup {}: {e}", root.join(dir).display()));
            for sub in Path::new(dir).ancestors() {
                if !all.iter().any(|d| d == sub) {
                    all.push(sub.to_owned());
                }
            }
        }
        // Children before their parents.
        all.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        Tree { root, dirs: all }
    }

    /// A cgroup of the tree (relative to its root; `""` is the root).
    pub fn cgroup(&self, which: &str) -> PathBuf {
        self.root.join(which)
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        for dir in &self.dirs {
            let _ = std::fs::remove_dir(self.root.join(dir));
        }
    }
}

/// Where cgroup v2 is mounted.
pub fn cgroup2_mount() -> PathBuf {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    mounts
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&"cgroup2")).then(|| PathBuf::from(f[1]))
        })
        .expect("cgroup v2 is mounted")
}

/// Mounts bpffs on `/sys/fs/bpf` unless it is there.
pub fn ensure_bpffs() {
    let mounted = Command::new("mountpoint")
        .args(["-q", "/sys/fs/bpf"])
        .status()
        .unwrap();
    if !mounted.success() {
        let status = Command::new("mount")
            .args(["-t", "bpf", "bpf", "/sys/fs/bpf"])
            .status()
            .unwrap();
        assert!(status.success(), "cannot mount bpffs");
    }
}
