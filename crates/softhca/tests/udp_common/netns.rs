//! Two hosts on one machine: two network namespaces joined by a veth pair, an address on each
//! end (in 198.18.0.0/15, the benchmarking range, existing only inside the namespaces), jumbo
//! frames for RoCE's 4096-byte path MTU, loopback up. Needs root and iproute2. Used by
//! `udp_netns.rs` and, by path, by softhca-rdmacm's `libfabric.rs`.

use std::process::Command;
use std::time::{Duration, Instant};

/// A pair: the two namespaces, the veth end in each, and each end's address with its prefix.
pub struct VethPair {
    pub ns: [&'static str; 2],
    pub dev: [&'static str; 2],
    pub addr: [&'static str; 2],
}

/// `ip ARGS`; Err with what it printed when it fails.
pub fn ip(args: &[&str]) -> Result<(), String> {
    ip_output(None, args).map(drop)
}

/// What `ip ARGS` printed, run in namespace `ns` (`ip -n`), else in the caller's.
fn ip_output(ns: Option<&str>, args: &[&str]) -> Result<String, String> {
    let mut all = ns.map_or(vec![], |ns| vec!["-n", ns]);
    all.extend(args);
    let out = Command::new("ip").args(&all).output().map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!("ip {}: {}", all.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// Waits until `dev` (in namespace `ns`, else the caller's) carries datagrams. A veth end's
/// carrier comes on when both ends are up, but the kernel acts on it in a work item of its
/// own, after `ip link set up` has returned: until then IPv4 drops what is sent, and IPv6,
/// whose multicast route (`ff00::/8`) that work item adds, refuses a group's datagram
/// (ENETUNREACH). A UD Send is not retried, so a test that sent in that window lost it (CI,
/// 2026-11-30). Ready: the link's state is UP and, where this kernel has IPv6, the route is
/// there (the route comes after the queue is attached). Err after 20 s.
pub fn wait_until_carrying(ns: Option<&str>, dev: &str) -> Result<(), String> {
    let ipv6 = std::path::Path::new("/proc/sys/net/ipv6").exists();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let up = ip_output(ns, &["-o", "link", "show", "dev", dev])?.contains("state UP");
        let routed =
            !ipv6 || ip_output(ns, &["-6", "route", "show", "table", "local", "dev", dev])?.contains("ff00::/8");
        if up && routed {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{dev}: no carrier (state UP and the ff00::/8 route) within 20 s"));
        }
        std::thread::yield_now();
    }
}

impl VethPair {
    /// Removes both namespaces (the veth goes with them), where they are.
    pub fn cleanup(&self) {
        for ns in self.ns {
            let _ = ip(&["netns", "del", ns]);
        }
    }

    /// Makes the pair afresh (what an earlier run left is removed first). Err: namespaces or
    /// veth devices are refused here (not root).
    pub fn setup(&self) -> Result<(), String> {
        self.cleanup();
        let [a, b] = self.ns;
        ip(&["netns", "add", a])?;
        ip(&["netns", "add", b])?;
        ip(&["link", "add", self.dev[0], "netns", a, "type", "veth", "peer", "name", self.dev[1], "netns", b])?;
        for i in 0..2 {
            let (ns, dev) = (self.ns[i], self.dev[i]);
            ip(&["-n", ns, "addr", "add", self.addr[i], "dev", dev])?;
            // RoCE needs the path MTU (4096 here) to fit the link: jumbo frames, as RoCE
            // fabrics use.
            ip(&["-n", ns, "link", "set", dev, "mtu", "9000", "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        for i in 0..2 {
            wait_until_carrying(Some(self.ns[i]), self.dev[i])?;
        }
        Ok(())
    }

    /// Runs `test` on the pair and removes it afterwards, whether `test` panicked or not.
    /// Where the pair cannot be made, says why (`name`'s SKIP line) and passes.
    pub fn run(&self, name: &str, test: impl FnOnce() + std::panic::UnwindSafe) {
        if let Err(e) = self.setup() {
            self.cleanup();
            eprintln!("SKIP {name}: network namespaces unavailable here: {e}");
            return;
        }
        let result = std::panic::catch_unwind(test);
        self.cleanup();
        if let Err(p) = result {
            std::panic::resume_unwind(p);
        }
    }
}
