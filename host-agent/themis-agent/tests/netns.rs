//! Two "hosts": network namespaces joined by a veth pair, an agent in each, talking
//! over the link between them (not loopback). Needs root (CI runs as root).

mod common;

use std::process::Command;
use std::time::Duration;

use common::{wait_stable, Agent, Spawn, FAST};

/// Namespaces and the veth pair of one test; deleted on drop (deleting a namespace
/// deletes its end of the pair, and with it the other end).
struct Hosts {
    names: [String; 2],
}

fn ip(args: &[&str]) {
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

impl Hosts {
    /// Creates `thm-<pid>-a` and `-b` with 10.251.<n>.1/30 and .2/30 on a veth pair.
    fn create() -> (Hosts, [String; 2]) {
        let pid = std::process::id();
        let names = [format!("thm-{pid}-a"), format!("thm-{pid}-b")];
        let hosts = Hosts {
            names: names.clone(),
        };
        let (veth_a, veth_b) = (format!("thm{pid}a"), format!("thm{pid}b"));
        let subnet = pid % 250;
        let addrs = [format!("10.251.{subnet}.1"), format!("10.251.{subnet}.2")];
        for ns in &names {
            ip(&["netns", "add", ns]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        ip(&[
            "link", "add", &veth_a, "netns", &names[0], "type", "veth", "peer", "name", &veth_b,
            "netns", &names[1],
        ]);
        for (ns, (dev, addr)) in names
            .iter()
            .zip([(&veth_a, &addrs[0]), (&veth_b, &addrs[1])])
        {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/30"), "dev", dev]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
        }
        (hosts, addrs)
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for ns in &self.names {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

#[test]
fn agents_on_two_hosts_joined_by_a_veth_pair() {
    assert!(
        Command::new("id").arg("-u").output().unwrap().stdout == b"0\n",
        "this test creates network namespaces and needs root (scripts/test.sh runs as root)"
    );
    let root = common::workdir();
    let (hosts, addrs) = Hosts::create();
    let listen = [format!("{}:7400", addrs[0]), format!("{}:7400", addrs[1])];
    let mut a = Agent::spawn(
        root.path(),
        "host-a",
        Spawn {
            listen: &listen[0],
            netns: Some(&hosts.names[0]),
            ..Spawn::default()
        },
    );
    let mut b = Agent::spawn(
        root.path(),
        "host-b",
        Spawn {
            listen: &listen[1],
            join: Some(&a.contact),
            extra: FAST,
            netns: Some(&hosts.names[1]),
        },
    );
    a.wait_joined();
    b.wait_joined();
    wait_stable(&[&a, &b], Duration::from_secs(30));

    // Each sees the other at its address on the link.
    let (_, ring) = a.get("/v1/ring").unwrap();
    assert_eq!(ring["successors"][0]["addr"], listen[1].as_str(), "{ring}");
    let (_, ring) = b.get("/v1/ring").unwrap();
    assert_eq!(ring["successors"][0]["addr"], listen[0].as_str(), "{ring}");

    b.register("check", "check-1", &format!("{}:15006", addrs[1]));
    assert_eq!(
        a.endpoints("check"),
        Some(vec![format!("{}:15006", addrs[1])])
    );
    a.register("handler", "handler-1", &format!("{}:15006", addrs[0]));
    assert_eq!(
        b.endpoints("handler"),
        Some(vec![format!("{}:15006", addrs[0])])
    );

    // The link goes down: each side detects the failure by timeouts and drops the
    // other. When it comes back, b joins again through a and the ring heals.
    let veth_b = format!("thm{}b", std::process::id());
    ip(&["-n", &hosts.names[1], "link", "set", &veth_b, "down"]);
    b.wait_for("failure detection", Duration::from_secs(30), |b| {
        let (_, ring) = b.get("/v1/ring")?;
        (ring["successors"][0]["addr"] != listen[0].as_str()).then_some(())
    });
    ip(&["-n", &hosts.names[1], "link", "set", &veth_b, "up"]);
    wait_stable(&[&a, &b], Duration::from_secs(60));
    for agent in [&a, &b] {
        agent.wait_for(
            "resolution over the restored link",
            Duration::from_secs(30),
            |x| x.endpoints("handler").filter(|e| e.len() == 1),
        );
    }
    assert!(b.log().contains("joined the ring"));

    assert_eq!(b.terminate(), Some(0));
    assert_eq!(a.terminate(), Some(0));
    drop(hosts);
    for ns in [
        format!("thm-{}-a", std::process::id()),
        format!("thm-{}-b", std::process::id()),
    ] {
        let list = Command::new("ip").args(["netns", "list"]).output().unwrap();
        assert!(
            !String::from_utf8_lossy(&list.stdout).contains(&ns),
            "{ns} was not deleted"
        );
    }
}
