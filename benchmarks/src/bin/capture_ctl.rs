//! Attaches and detaches Themis's eBPF capture for the benchmarks in `benchmarks/ebpf/`
//! (`themis-capture` is a library). Capture lives on in bpffs after this exits;
//! `detach`, or removing the pin directory, ends it.
//!
//! ```text
//! capture_ctl attach --pins DIR --cgroup CG [--proxy-cgroup CG] [--outbound ADDR]
//!                    [--workload NAME] [--fast-path] [--no-exclude]
//! capture_ctl detach --pins DIR [--workload NAME]
//! ```
//!
//! Each prints one JSON line: `attach` the workload's status, `detach` the counters
//! as they were just before detaching (`Capture::status`).

use std::{path::PathBuf, process::ExitCode};

use themis_capture::{Capture, CaptureSpec};

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("capture_ctl: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Vec<String>) -> Result<(), String> {
    let (command, rest) = args
        .split_first()
        .ok_or("usage: capture_ctl attach|detach ...")?;
    let mut pins = None;
    let mut cgroup = None;
    let mut proxy_cgroup = None;
    let mut outbound = "127.0.0.1:15001".to_string();
    let mut workload = "workload".to_string();
    let (mut fast_path, mut no_exclude) = (false, false);
    let mut flags = rest.iter();
    while let Some(flag) = flags.next() {
        let mut value = || flags.next().cloned().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--pins" => pins = Some(PathBuf::from(value()?)),
            "--cgroup" => cgroup = Some(PathBuf::from(value()?)),
            "--proxy-cgroup" => proxy_cgroup = Some(PathBuf::from(value()?)),
            "--outbound" => outbound = value()?,
            "--workload" => workload = value()?,
            "--fast-path" => fast_path = true,
            "--no-exclude" => no_exclude = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let pins = pins.ok_or("--pins is required")?;

    match command.as_str() {
        "attach" => {
            let mut capture = Capture::start(&pins, fast_path).map_err(|e| e.to_string())?;
            let mut spec = CaptureSpec::new(cgroup.ok_or("--cgroup is required")?);
            spec.proxy_cgroup = proxy_cgroup;
            spec.outbound = outbound
                .parse()
                .map_err(|e| format!("--outbound {outbound}: {e}"))?;
            if no_exclude {
                spec.exclude_cidrs.clear();
            }
            let status = capture
                .attach(&workload, &spec)
                .map_err(|e| e.to_string())?;
            if !status.missing.is_empty() {
                return Err(format!("attached only partly: {status:?}"));
            }
            println!("{}", serde_json::to_string(&status).expect("serializable"));
        }
        "detach" => {
            // Capture::start sets the fast-path setting; it is about to stop anyway.
            let mut capture = Capture::start(&pins, false).map_err(|e| e.to_string())?;
            let status = capture.status().map_err(|e| e.to_string())?;
            if !capture.detach(&workload).map_err(|e| e.to_string())? {
                return Err(format!("workload {workload} was not attached"));
            }
            println!(
                "{}",
                serde_json::to_string(&status.counters).expect("serializable")
            );
        }
        other => return Err(format!("unknown command {other} (attach or detach)")),
    }
    Ok(())
}
