//! Packet captures (tcpdump) of what travels between the sidecars, and what a
//! capture holds. Needs root and tcpdump.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::process::{installed, Process};

/// A tcpdump on `lo` of the TCP traffic of some ports, written to a file.
pub struct Capture {
    pub path: PathBuf,
    process: Process,
}

impl Capture {
    /// Starts capturing (and waits until tcpdump listens).
    pub fn start(dir: &Path, name: &str, ports: &[u16]) -> Capture {
        let tcpdump = installed("tcpdump");
        let path = dir.join(format!("{name}.pcap"));
        let filter = ports
            .iter()
            .map(|p| format!("tcp port {p}"))
            .collect::<Vec<_>>()
            .join(" or ");
        let mut command = Command::new(tcpdump);
        // -B: a 64 MiB kernel buffer, so a fast stream is captured without drops.
        command
            .args([
                "-i",
                "lo",
                "-U",
                "--immediate-mode",
                "-n",
                "-s",
                "0",
                "-B",
                "65536",
                "-w",
            ])
            .arg(&path)
            .arg(filter);
        let mut process = Process::spawn(name, command, &dir.join(format!("{name}.log")));
        process.wait_running(&format!("{name} to listen"), Duration::from_secs(15), |p| {
            p.log().contains("listening on").then_some(())
        });
        Capture { path, process }
    }

    /// Stops tcpdump (it writes out what it holds); returns what it captured and how
    /// many packets the kernel dropped.
    pub fn finish(mut self) -> Captured {
        // Packets written with -U, but give the last ones a moment to arrive.
        std::thread::sleep(Duration::from_millis(300));
        let status = self.process.stop().expect("tcpdump ran");
        let log = self.process.log();
        assert!(
            status.success() || status.code().is_none(),
            "tcpdump: {status}: {log}"
        );
        let number_before = |what: &str| -> u64 {
            log.lines()
                .find(|l| l.contains(what))
                .and_then(|l| l.split_whitespace().next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        };
        Captured {
            bytes: std::fs::metadata(&self.path).map_or(0, |m| m.len()),
            packets: number_before("packets captured"),
            dropped: number_before("packets dropped by kernel"),
            path: self.path,
        }
    }
}

/// A finished capture.
pub struct Captured {
    pub path: PathBuf,
    pub bytes: u64,
    pub packets: u64,
    pub dropped: u64,
}

impl Captured {
    /// How many packets hold `marker` as it is (grep -c: lines of the binary file,
    /// 0 exactly when it is nowhere).
    pub fn count(&self, marker: &str) -> usize {
        let out = Command::new("grep")
            .args(["-c", "-a", "-F", "-e", marker])
            .arg(&self.path)
            .env("LC_ALL", "C")
            .output()
            .expect("running grep");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or(0)
    }

    /// Asserts the capture holds real traffic (at least `min_bytes`, nothing dropped)
    /// and none of the markers.
    pub fn assert_sealed(&self, min_bytes: u64, markers: &[&str]) {
        assert!(
            self.bytes >= min_bytes,
            "the capture {} holds {} bytes ({} packets), less than the {min_bytes} that travelled",
            self.path.display(),
            self.bytes,
            self.packets
        );
        assert_eq!(
            self.dropped, 0,
            "tcpdump dropped packets: the capture proves nothing"
        );
        for marker in markers {
            assert_eq!(
                self.count(marker),
                0,
                "{marker} is readable on the wire between the Envoys ({})",
                self.path.display()
            );
        }
    }

    /// Asserts the markers are readable (the positive control: the app's side of
    /// the sidecar carries plaintext, and the capture method sees it).
    pub fn assert_plain(&self, markers: &[&str]) {
        for marker in markers {
            assert!(
                self.count(marker) > 0,
                "{marker} is not in the app-side capture {}: the capture method is broken",
                self.path.display()
            );
        }
    }
}
