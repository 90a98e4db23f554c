//! Process and tool helpers shared by the tests of softhca-ibverbs and softhca-vendor (the
//! latter includes this file by path): what must be installed, TCP listeners seen without
//! connecting, and waiting for a child with a hang guard only.

use std::io::Read;
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

/// Whether tools are required (CI): then a missing one fails the test instead of skipping it.
pub fn required() -> bool {
    std::env::var_os("CI").is_some()
}

/// `ok`, or a skip (a failure under CI) naming `what` is missing.
pub fn have(ok: bool, what: &str) -> bool {
    if !ok {
        assert!(!required(), "{what} is required in CI");
        eprintln!("SKIPPED: {what} not available");
    }
    ok
}

/// Whether the command `name` is installed (see [`have`]).
pub fn tool(name: &str) -> bool {
    have(
        Command::new("sh").arg("-c").arg(format!("command -v {name}")).output().is_ok_and(|o| o.status.success()),
        name,
    )
}

/// Whether a TCP socket listens on `port` (from /proc/net/tcp*, without connecting to it:
/// the pingpong and perftest servers accept exactly one connection).
pub fn listening(port: u16) -> bool {
    listening_at("/proc/net", port)
}

/// [`listening`] in the network namespace of process `pid` (a server started by
/// `ip netns exec`, which runs the program in its own process).
pub fn listening_in(pid: u32, port: u16) -> bool {
    listening_at(&format!("/proc/{pid}/net"), port)
}

fn listening_at(net: &str, port: u16) -> bool {
    [format!("{net}/tcp"), format!("{net}/tcp6")].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3
                    && cols[3] == "0A"
                    && cols[1].rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok()) == Some(port)
            })
        })
    })
}

/// Waits up to `secs` for the server `child` to listen on TCP `port`. A server that exits
/// first, or never listens, fails the test with what it printed (a refused bind, a device
/// that would not open), not only the port it missed.
pub fn await_listening(child: &mut Child, port: u16, secs: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !listening(port) {
        let exited = child.try_wait().unwrap();
        if exited.is_some() || Instant::now() > deadline {
            let _ = child.kill();
            let status = child.wait().unwrap();
            let mut out = Vec::new();
            child.stdout.take().map(|mut s| s.read_to_end(&mut out));
            child.stderr.take().map(|mut s| s.read_to_end(&mut out));
            let how = if exited.is_some() { format!("exited ({status})") } else { format!("stalled for {secs} s") };
            panic!("{what} server never listened on {port}: it {how}: {}", String::from_utf8_lossy(&out));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A child killed if the test fails before it is taken back ([`Reaped::take`]): a server
/// left running would hold its address's port 4791 for the tests after.
pub struct Reaped(pub Option<Child>);

impl Reaped {
    pub fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("not taken yet")
    }

    pub fn take(mut self) -> Child {
        self.0.take().expect("taken once")
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits for a child at most `secs` (a hang guard), then returns its output.
pub fn finish(mut child: Child, secs: u64, what: &str) -> Output {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stdout = Vec::new();
            let mut stderr = Vec::new();
            child.stdout.take().map(|mut s| s.read_to_end(&mut stdout));
            child.stderr.take().map(|mut s| s.read_to_end(&mut stderr));
            return Output { status, stdout, stderr };
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what} did not finish in {secs} s: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
