//! Loopback TCP between two processes: ping-pong round trips and one-way throughput,
//! for `benchmarks/ebpf/run.sh`, which runs it in a cgroup with Themis's capture
//! attached, once with the sk_msg fast path on and once with it off.
//!
//! ```text
//! fastpath_bench [--label L] [--sizes 1024,65536] [--iterations N] [--warmup N] [--bytes B]
//! ```
//!
//! It starts its server as a child process (same cgroup), then per message size:
//! `pingpong` (send `size` bytes, read them back, N times after a discarded warm-up)
//! and `throughput` (send B bytes in `size`-byte writes, until the server has read and
//! checked all of them). Every byte is checked on arrival against a pseudo-random
//! stream, so reordered, lost or stale data fails the run (exit 1). One JSON line per
//! test goes to stdout, with `tcp_bytes_in`: what the two sockets received through TCP
//! (`TCP_INFO` `tcpi_bytes_received`), about 0 when sk_msg carried the data instead.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    os::fd::AsRawFd,
    process::{Command, ExitCode, Stdio},
    time::{Duration, Instant},
};

/// The stream repeats with this period (a prime, so it never lines up with a size).
const PERIOD: usize = 65521;
/// The largest read or write; `STREAM` is long enough for a slice of it at any phase.
const MAX_CHUNK: usize = 256 * 1024;

fn stream() -> Vec<u8> {
    let mut x: u32 = 0x9e37_79b9;
    let period: Vec<u8> = (0..PERIOD)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect();
    period
        .iter()
        .cycle()
        .take(PERIOD + MAX_CHUNK)
        .copied()
        .collect()
}

/// The `len` bytes of the stream at `offset`.
fn at(stream: &[u8], offset: u64, len: usize) -> &[u8] {
    let start = (offset % PERIOD as u64) as usize;
    &stream[start..start + len]
}

/// What the kernel's TCP received on this socket (`tcpi_bytes_received`, offset 128).
fn tcp_bytes_received(socket: &TcpStream) -> u64 {
    let mut info = [0u8; 232];
    let mut len = info.len() as libc::socklen_t;
    // SAFETY: a valid buffer and its length.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 || len < 136 {
        return u64::MAX;
    }
    u64::from_ne_bytes(info[128..136].try_into().expect("8 bytes"))
}

const PINGPONG: u64 = 1;
const THROUGHPUT: u64 = 2;
const QUIT: u64 = 3;

/// The server: one connection at a time; a header `[kind, size, count, offset]` (u64 LE)
/// says what to do; it answers `[intact (0/1), tcp_bytes_received]`.
fn serve() -> std::io::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    println!("{}", listener.local_addr()?.port());
    std::io::stdout().flush()?;
    let stream = stream();
    let mut buf = vec![0u8; MAX_CHUNK];
    for connection in listener.incoming() {
        let mut c = connection?;
        c.set_nodelay(true)?;
        let mut header = [0u8; 32];
        c.read_exact(&mut header)?;
        let field = |i: usize| u64::from_le_bytes(header[i * 8..i * 8 + 8].try_into().unwrap());
        let (kind, size, count, mut offset) = (field(0), field(1), field(2), field(3));
        let mut intact = true;
        match kind {
            PINGPONG => {
                let msg = &mut buf[..size as usize];
                for _ in 0..count {
                    c.read_exact(msg)?;
                    intact &= msg == at(&stream, offset, msg.len());
                    c.write_all(msg)?;
                    offset += size;
                }
            }
            THROUGHPUT => {
                let mut left = size * count;
                while left > 0 {
                    let want = left.min(MAX_CHUNK as u64) as usize;
                    let n = c.read(&mut buf[..want])?;
                    if n == 0 {
                        intact = false;
                        break;
                    }
                    intact &= buf[..n] == *at(&stream, offset, n);
                    offset += n as u64;
                    left -= n as u64;
                }
            }
            _ => return Ok(()),
        }
        let mut report = [0u8; 16];
        report[..8].copy_from_slice(&u64::from(intact).to_le_bytes());
        report[8..].copy_from_slice(&tcp_bytes_received(&c).to_le_bytes());
        c.write_all(&report)?;
    }
    Ok(())
}

struct Session {
    socket: TcpStream,
    offset: u64,
}

impl Session {
    fn open(port: u16, kind: u64, size: usize, count: u64, offset: u64) -> std::io::Result<Self> {
        let mut socket = TcpStream::connect(("127.0.0.1", port))?;
        socket.set_nodelay(true)?;
        socket.set_read_timeout(Some(Duration::from_secs(60)))?;
        let mut header = Vec::with_capacity(32);
        for v in [kind, size as u64, count, offset] {
            header.extend_from_slice(&v.to_le_bytes());
        }
        socket.write_all(&header)?;
        Ok(Session { socket, offset })
    }

    /// The server's `[intact, tcp_bytes_received]`, plus what this side's TCP received.
    fn report(mut self) -> std::io::Result<(bool, u64)> {
        let mut report = [0u8; 16];
        self.socket.read_exact(&mut report)?;
        let server_tcp = u64::from_le_bytes(report[8..].try_into().unwrap());
        let ours = tcp_bytes_received(&self.socket);
        Ok((report[0] == 1, server_tcp.saturating_add(ours)))
    }
}

struct Options {
    label: String,
    sizes: Vec<usize>,
    iterations: u64,
    warmup: u64,
    bytes: u64,
}

fn pingpong(o: &Options, port: u16, size: usize, stream: &[u8]) -> std::io::Result<bool> {
    let count = o.warmup + o.iterations;
    let mut s = Session::open(port, PINGPONG, size, count, size as u64 * 7919)?;
    let mut back = vec![0u8; size];
    let mut rtts = Vec::with_capacity(o.iterations as usize);
    let mut intact = true;
    for i in 0..count {
        let msg = at(stream, s.offset, size);
        let start = Instant::now();
        s.socket.write_all(msg)?;
        s.socket.read_exact(&mut back)?;
        let rtt = start.elapsed();
        intact &= back == msg;
        if i >= o.warmup {
            rtts.push(rtt.as_secs_f64() * 1e6);
        }
        s.offset += size as u64;
    }
    let (server_intact, tcp_in) = s.report()?;
    rtts.sort_by(f64::total_cmp);
    let q = |p: usize| rtts[(rtts.len() * p / 100).min(rtts.len() - 1)];
    let intact = intact && server_intact;
    println!(
        r#"{{"label":"{}","test":"pingpong","size":{size},"iterations":{},"p50_us":{:.2},"p90_us":{:.2},"p99_us":{:.2},"payload_bytes":{},"tcp_bytes_in":{tcp_in},"intact":{intact}}}"#,
        o.label,
        o.iterations,
        q(50),
        q(90),
        q(99),
        2 * size as u64 * count
    );
    Ok(intact)
}

fn throughput(o: &Options, port: u16, size: usize, stream: &[u8]) -> std::io::Result<bool> {
    let count = o.bytes.div_ceil(size as u64);
    let start = Instant::now();
    let mut s = Session::open(port, THROUGHPUT, size, count, size as u64 * 104_729)?;
    for _ in 0..count {
        s.socket.write_all(at(stream, s.offset, size))?;
        s.offset += size as u64;
    }
    let (intact, tcp_in) = s.report()?;
    let seconds = start.elapsed().as_secs_f64();
    let total = count * size as u64;
    println!(
        r#"{{"label":"{}","test":"throughput","size":{size},"bytes":{total},"seconds":{seconds:.4},"mb_per_s":{:.1},"payload_bytes":{total},"tcp_bytes_in":{tcp_in},"intact":{intact}}}"#,
        o.label,
        total as f64 / seconds / 1e6
    );
    Ok(intact)
}

fn parse() -> Result<Options, String> {
    let mut o = Options {
        label: "run".into(),
        sizes: vec![1024, 65536],
        iterations: 10_000,
        warmup: 1000,
        bytes: 256 << 20,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let number = |v: &str| v.parse::<u64>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--label" => o.label = value,
            "--sizes" => {
                o.sizes = value
                    .split(',')
                    .map(|v| number(v).map(|n| n as usize))
                    .collect::<Result<_, _>>()?
            }
            "--iterations" => o.iterations = number(&value)?.max(1),
            "--warmup" => o.warmup = number(&value)?,
            "--bytes" => o.bytes = number(&value)?.max(1),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if let Some(bad) = o.sizes.iter().find(|&&s| s == 0 || s > MAX_CHUNK) {
        return Err(format!("size {bad}: must be 1..={MAX_CHUNK}"));
    }
    Ok(o)
}

fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some("serve") {
        return match serve() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("fastpath_bench server: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let options = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("fastpath_bench: {e}");
            return ExitCode::from(2);
        }
    };
    let exe = std::env::current_exe().expect("own path");
    let mut server = Command::new(exe)
        .arg("serve")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the server");
    let mut line = String::new();
    let port = BufReader::new(server.stdout.take().expect("piped"))
        .read_line(&mut line)
        .ok()
        .and_then(|_| line.trim().parse::<u16>().ok());
    let result = port
        .ok_or_else(|| std::io::Error::other("the server did not print its port"))
        .and_then(|port| {
            let stream = stream();
            let mut intact = true;
            for &size in &options.sizes {
                intact &= pingpong(&options, port, size, &stream)?;
                intact &= throughput(&options, port, size, &stream)?;
            }
            Session::open(port, QUIT, 0, 0, 0)?;
            Ok(intact)
        });
    stop(&mut server);
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("fastpath_bench: data arrived corrupted, reordered or incomplete");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("fastpath_bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Up to 5 s for the server to exit after QUIT, then SIGKILL.
fn stop(server: &mut std::process::Child) {
    for _ in 0..50 {
        if matches!(server.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = server.kill();
    let _ = server.wait();
}
