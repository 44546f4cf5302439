//! Network namespaces for the tests, built one way: two namespaces joined by a veth
//! pair ([`Net`]), deleted on drop. Needs root (`ip netns`).
//!
//! The demo's namespaces are `scripts/lib/netns.sh`'s (shell, for the demo's nodes).

use std::process::Command;

/// Two network namespaces joined by a veth pair: `node` (10.253.0.1/30,
/// fd00:7e::1/64 on [`Net::NODE_DEV`]) and `peer` (10.253.0.2/30, fd00:7e::2/64 on
/// [`Net::PEER_DEV`]), each with its loopback up: a node and another host on its
/// network, or two hosts. Both are deleted on drop (with the veth).
///
/// The addresses and the devices' names are the same in every `Net`: they only
/// exist inside its namespaces, which are named after the test and the process.
pub struct Net {
    pub node: String,
    pub peer: String,
}

/// `ip <args>`; panics with its stderr if it fails.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("running ip (iproute2)");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether a namespace of that name exists (`ip netns list`).
pub fn exists(name: &str) -> bool {
    let list = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&list.stdout)
        .lines()
        .any(|l| l.split_whitespace().next() == Some(name))
}

impl Net {
    pub const NODE4: &'static str = "10.253.0.1";
    pub const NODE6: &'static str = "fd00:7e::1";
    pub const PEER4: &'static str = "10.253.0.2";
    pub const PEER6: &'static str = "fd00:7e::2";
    /// The node's end of the veth (interface names are at most 15 bytes).
    pub const NODE_DEV: &'static str = "thnet0";
    /// The peer's end.
    pub const PEER_DEV: &'static str = "thnet1";

    /// Creates `th-<name>-<pid>-node` and `-peer` and the veth between them.
    pub fn create(name: &str) -> Net {
        let pid = std::process::id();
        let net = Net {
            node: format!("th-{name}-{pid}-node"),
            peer: format!("th-{name}-{pid}-peer"),
        };
        for n in [&net.node, &net.peer] {
            ip(&["netns", "add", n]);
            ip(&["-n", n, "link", "set", "lo", "up"]);
        }
        ip(&[
            "link",
            "add",
            Self::NODE_DEV,
            "netns",
            &net.node,
            "type",
            "veth",
            "peer",
            "name",
            Self::PEER_DEV,
            "netns",
            &net.peer,
        ]);
        for (ns, dev, v4, v6) in [
            (&net.node, Self::NODE_DEV, Self::NODE4, Self::NODE6),
            (&net.peer, Self::PEER_DEV, Self::PEER4, Self::PEER6),
        ] {
            ip(&["-n", ns, "addr", "add", &format!("{v4}/30"), "dev", dev]);
            // nodad: usable at once, no duplicate address detection to wait for.
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{v6}/64"),
                "dev",
                dev,
                "nodad",
            ]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
        }
        net
    }

    /// Takes the peer's end of the link down (`up: false`) or up again.
    pub fn set_peer_link(&self, up: bool) {
        let state = if up { "up" } else { "down" };
        ip(&["-n", &self.peer, "link", "set", Self::PEER_DEV, state]);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for n in [&self.node, &self.peer] {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

/// A network namespace with nothing but its loopback, up, carrying extra addresses:
/// many sources on one host (e.g. a whole IPv6 /64) without touching the host's own
/// interfaces. Deleted on drop. Needs root.
pub struct Alone {
    pub name: String,
}

impl Alone {
    /// Creates `th-<name>-<pid>` with `addresses` (CIDR, e.g. `fd00:64::2/64`) on `lo`.
    pub fn create(name: &str, addresses: &[String]) -> Alone {
        let alone = Alone {
            name: format!("th-{name}-{}", std::process::id()),
        };
        ip(&["netns", "add", &alone.name]);
        ip(&["-n", &alone.name, "link", "set", "lo", "up"]);
        for address in addresses {
            // nodad: usable at once, no duplicate address detection to wait for.
            ip(&[
                "-n",
                &alone.name,
                "addr",
                "add",
                address,
                "dev",
                "lo",
                "nodad",
            ]);
        }
        alone
    }

    /// Moves the calling thread into the namespace: the sockets it opens from now on
    /// are there. Meant for a thread of its own, which ends there.
    pub fn enter(&self) {
        let path = format!("/var/run/netns/{}", self.name);
        let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        // SAFETY: setns(2) on a descriptor we own; it changes only this thread.
        let done =
            unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&file), libc::CLONE_NEWNET) };
        assert_eq!(done, 0, "setns {path}: {}", std::io::Error::last_os_error());
    }
}

impl Drop for Alone {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}
