//! Where the kubelet and the runtime put a pod: its cgroup v2 directory, found by the
//! pod's uid wherever the node's cgroup driver placed it, and its network namespace,
//! through a process in it.

use std::path::{Path, PathBuf};

/// How deep below the cgroup v2 root a pod's directory may be
/// (`kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice` is 3,
/// a cgroup root of the kubelet's own adds one).
const MAX_DEPTH: usize = 5;

/// The names the kubelet gives a pod's cgroup: `pod<uid>` (cgroupfs driver) or
/// `kubepods-<qos>-pod<uid with _ for ->.slice` (systemd driver).
pub fn is_pods_dir(name: &str, uid: &str) -> bool {
    name.strip_prefix("pod") == Some(uid)
        || (name.starts_with("kubepods")
            && name.ends_with(&format!("-pod{}.slice", uid.replace('-', "_"))))
}

/// The pod's cgroup directory under `root` (the cgroup v2 mount), searched breadth
/// first: the kubelet's `--cgroup-root` and QoS classes vary by node.
pub fn find_pod(root: &Path, uid: &str) -> Option<PathBuf> {
    let mut level = vec![root.to_owned()];
    for _ in 0..MAX_DEPTH {
        let mut next = Vec::new();
        for dir in level {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                let path = entry.path();
                if entry
                    .file_name()
                    .to_str()
                    .is_some_and(|n| is_pods_dir(n, uid))
                {
                    return Some(path);
                }
                next.push(path);
            }
        }
        level = next;
    }
    None
}

/// A process of the pod (its sandbox's, or any container's): its network namespace
/// is the pod's.
pub fn a_process_of(pod: &Path) -> Option<u32> {
    let mut dirs = vec![pod.to_owned()];
    while let Some(dir) = dirs.pop() {
        if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            if let Some(pid) = procs.lines().find_map(|l| l.trim().parse().ok()) {
                return Some(pid);
            }
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        dirs.extend(
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path()),
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pods_cgroup_is_found_under_either_driver() {
        let root = tempfile::tempdir().unwrap();
        let uid = "5e6f-77";
        let cgroupfs = root
            .path()
            .join("themis-k8s/kubepods/besteffort/pod5e6f-77");
        std::fs::create_dir_all(cgroupfs.join("c0ffee")).unwrap();
        std::fs::create_dir_all(
            root.path()
                .join("themis-k8s/kubepods/burstable/pod5e6f-770"),
        )
        .unwrap();
        assert_eq!(find_pod(root.path(), uid), Some(cgroupfs.clone()));
        assert_eq!(
            find_pod(root.path(), "5e6f"),
            None,
            "a prefix of a uid is not the pod"
        );

        let systemd = root
            .path()
            .join("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod9a_b1.slice");
        std::fs::create_dir_all(&systemd).unwrap();
        assert_eq!(find_pod(root.path(), "9a-b1"), Some(systemd));

        // The process comes from a container's cgroup below the pod's.
        assert_eq!(a_process_of(&cgroupfs), None);
        std::fs::write(cgroupfs.join("c0ffee/cgroup.procs"), "4242\n4243\n").unwrap();
        assert_eq!(a_process_of(&cgroupfs), Some(4242));
    }
}
