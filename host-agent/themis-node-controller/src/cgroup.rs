//! Where the kubelet and the runtime put a pod: its cgroup v2 directory, found by the
//! pod's uid wherever the node's cgroup driver placed it, and its network namespace,
//! through a process in it.

use std::path::{Path, PathBuf};

/// How deep below the cgroup v2 root a pod's directory may be
/// (`kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice` is 3,
/// a cgroup root of the kubelet's own adds one): how far the controller looks for its
/// own pod, once, as it starts.
const MAX_DEPTH: usize = 5;

/// The names the kubelet gives a pod's cgroup: `pod<uid>` (cgroupfs driver) or
/// `kubepods-<qos>-pod<uid with _ for ->.slice` (systemd driver).
pub fn is_pods_dir(name: &str, uid: &str) -> bool {
    name.strip_prefix("pod") == Some(uid)
        || (name.starts_with("kubepods")
            && name.ends_with(&format!("-pod{}.slice", uid.replace('-', "_"))))
}

/// A pod's cgroup directory under `root` (the cgroup v2 mount), searched breadth
/// first at any depth up to [`MAX_DEPTH`]: only for the controller's own pod, as it
/// starts (its pod exists, so the shallowest match is the kubelet's). Other pods are
/// found only where the kubelet puts them ([`Kubepods::find_pod`]): a directory named
/// after a pod that a writable cgroup subtree made first must never be taken for it.
pub fn search_pod(root: &Path, uid: &str) -> Option<PathBuf> {
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

/// The kubelet's pod cgroups on this node: the `kubepods` directory (cgroupfs driver)
/// or `kubepods.slice` (systemd), under the kubelet's `--cgroup-root`, as the
/// controller's own pod shows it. A pod's directory is in it or in one of its two QoS
/// directories (`burstable`, `besteffort`), nowhere else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kubepods {
    dir: PathBuf,
    systemd: bool,
}

impl Kubepods {
    /// From the cgroup directory of a pod of this node (the controller's own).
    pub fn of(pod: &Path) -> Option<Kubepods> {
        pod.ancestors()
            .find_map(|dir| match dir.file_name()?.to_str()? {
                "kubepods" => Some(Kubepods {
                    dir: dir.to_owned(),
                    systemd: false,
                }),
                "kubepods.slice" => Some(Kubepods {
                    dir: dir.to_owned(),
                    systemd: true,
                }),
                _ => None,
            })
    }

    /// The cgroup directory of the pod `uid`, if the kubelet made it.
    pub fn find_pod(&self, uid: &str) -> Option<PathBuf> {
        // A uid is a UUID: nothing in it climbs out of the directory.
        if uid.contains('/') || uid.contains("..") {
            return None;
        }
        let candidates = match self.systemd {
            false => [
                self.dir.join(format!("pod{uid}")),
                self.dir.join(format!("burstable/pod{uid}")),
                self.dir.join(format!("besteffort/pod{uid}")),
            ],
            true => {
                let uid = uid.replace('-', "_");
                [
                    self.dir.join(format!("kubepods-pod{uid}.slice")),
                    self.dir.join(format!(
                        "kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice"
                    )),
                    self.dir.join(format!(
                        "kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice"
                    )),
                ]
            }
        };
        candidates.into_iter().find(|dir| dir.is_dir())
    }

    /// The uid of the pod whose cgroup directory `dir` is, if it is one where the
    /// kubelet puts pods (not a directory below one, nor anything elsewhere).
    pub fn pod_of(&self, dir: &Path) -> Option<String> {
        let name = dir.file_name()?.to_str()?;
        let uid = match self.systemd {
            false => name.strip_prefix("pod")?.to_owned(),
            true => name
                .strip_suffix(".slice")?
                .rsplit_once("-pod")?
                .1
                .replace('_', "-"),
        };
        (!uid.is_empty() && self.find_pod(&uid).as_deref() == Some(dir)).then_some(uid)
    }

    /// Where it is.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
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
        let own = root.path().join("themis-k8s/kubepods/burstable/pod0wn");
        std::fs::create_dir_all(own.join("agent")).unwrap();
        let kubepods = Kubepods::of(&search_pod(root.path(), "0wn").unwrap()).unwrap();
        assert_eq!(kubepods.dir(), root.path().join("themis-k8s/kubepods"));
        let cgroupfs = root
            .path()
            .join("themis-k8s/kubepods/besteffort/pod5e6f-77");
        std::fs::create_dir_all(cgroupfs.join("c0ffee")).unwrap();
        std::fs::create_dir_all(
            root.path()
                .join("themis-k8s/kubepods/burstable/pod5e6f-770"),
        )
        .unwrap();
        assert_eq!(kubepods.find_pod(uid), Some(cgroupfs.clone()));
        assert_eq!(
            kubepods.find_pod("5e6f"),
            None,
            "a prefix of a uid is not the pod"
        );
        assert_eq!(kubepods.find_pod("../besteffort/pod5e6f-77"), None);

        let slice = root.path().join("kubepods.slice");
        let systemd = slice.join("kubepods-burstable.slice/kubepods-burstable-pod9a_b1.slice");
        std::fs::create_dir_all(systemd.join("cri-containerd-1.scope")).unwrap();
        let kubepods = Kubepods::of(&systemd.join("cri-containerd-1.scope")).unwrap();
        assert_eq!(kubepods.find_pod("9a-b1"), Some(systemd.clone()));

        // A bound workload's owner cgroup names its pod only where the kubelet puts pods.
        assert_eq!(kubepods.pod_of(&systemd), Some("9a-b1".to_owned()));
        assert_eq!(
            kubepods.pod_of(&systemd.join("cri-containerd-1.scope")),
            None
        );
        assert_eq!(
            kubepods.pod_of(&root.path().join("system.slice/pod9a-b1")),
            None
        );
        let kubepods = Kubepods::of(&own).unwrap();
        assert_eq!(kubepods.pod_of(&cgroupfs), Some(uid.to_owned()));
        assert_eq!(kubepods.pod_of(&cgroupfs.join("c0ffee")), None);

        // The process comes from a container's cgroup below the pod's.
        assert_eq!(a_process_of(&cgroupfs), None);
        std::fs::write(cgroupfs.join("c0ffee/cgroup.procs"), "4242\n4243\n").unwrap();
        assert_eq!(a_process_of(&cgroupfs), Some(4242));
    }

    /// A directory named after a pod, made in a subtree a container may write (a
    /// delegated cgroup) before the kubelet made the pod's own: never taken for it.
    #[test]
    fn a_planted_pod_directory_is_not_the_pod() {
        let root = tempfile::tempdir().unwrap();
        let kubepods = root.path().join("kubepods");
        std::fs::create_dir_all(kubepods.join("burstable/pod0wn")).unwrap();
        let planted = kubepods.join("besteffort/podattacker/ctr/podvictim");
        std::fs::create_dir_all(&planted).unwrap();
        let elsewhere = root.path().join("system.slice/podvictim");
        std::fs::create_dir_all(&elsewhere).unwrap();
        let kubepods = Kubepods::of(&kubepods.join("burstable/pod0wn")).unwrap();
        assert_eq!(kubepods.find_pod("victim"), None);
        // The broad search would have taken one of them: the attack this prevents.
        assert!(search_pod(root.path(), "victim").is_some());
        // Once the kubelet makes it, it is the one found.
        let real = root.path().join("kubepods/besteffort/podvictim");
        std::fs::create_dir_all(&real).unwrap();
        assert_eq!(kubepods.find_pod("victim"), Some(real));
    }
}
