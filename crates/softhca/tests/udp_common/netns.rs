//! Two hosts on one machine: two network namespaces joined by a veth pair, an address on each
//! end (in 198.18.0.0/15, the benchmarking range, existing only inside the namespaces), jumbo
//! frames for RoCE's 4096-byte path MTU, loopback up. Needs root and iproute2. Used by
//! `udp_netns.rs` and, by path, by softhca-rdmacm's `libfabric.rs`.

use std::process::Command;

/// A pair: the two namespaces, the veth end in each, and each end's address with its prefix.
pub struct VethPair {
    pub ns: [&'static str; 2],
    pub dev: [&'static str; 2],
    pub addr: [&'static str; 2],
}

/// `ip ARGS`; Err with what it printed when it fails.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
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
