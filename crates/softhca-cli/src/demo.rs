//! The main job: two devices on the simulated fabric, an RC pingpong, then RDMA Write, RDMA
//! Read and Atomic bursts over a lossy link (loss, duplication, reordering, corruption), the
//! results and retransmission counters, the pcap's path and an excerpt of its trace.

use std::path::PathBuf;
use std::time::Instant;

use softhca::link::SimCounters;
use softhca::transport::DeviceCounters;
use softhca::Context;

use crate::net::{self, err, Faults, LinkKind, Net, Res};
use crate::perf::{self, Op, PerfArgs};
use crate::pingpong::{self, PingpongArgs, QpKind};
use crate::{trace, PcapArg};

#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// Where to write the pcap (default: softhca-demo.pcap in the system temp directory).
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<PathBuf>,
    /// Seed of the lossy phase's random faults; one seed always gives the same run.
    #[arg(long, default_value_t = 7, value_name = "S")]
    pub seed: u64,
    /// Probability that a datagram is lost in the lossy phase (duplication 1%, reordering 2%
    /// and corruption 1% stay as they are).
    #[arg(long, default_value_t = 0.02, value_name = "P")]
    pub loss: f64,
}

impl Default for DemoArgs {
    fn default() -> Self {
        DemoArgs { pcap: None, seed: 7, loss: 0.02 }
    }
}

pub fn run(args: &DemoArgs) -> Res<()> {
    // Checked before anything runs, not when the lossy phase starts.
    if !(0.0..1.0).contains(&args.loss) {
        return Err(crate::net::err("--loss must be a probability in [0, 1)"));
    }
    let started = Instant::now();
    let (pcap, mut net) = open_fabric(args)?;
    println!("softhca demo: two software HCAs on the deterministic simulated fabric");
    println!("==========================================================================");
    let (ca, cb) = (net.add_device("softhca0")?, net.add_device("softhca1")?);
    show_devices(&[&ca, &cb])?;
    clean_pingpong(&mut net, &ca, &cb)?;
    let before = (net::add_counters(ca.counters(), cb.counters()), net.sim_counters().unwrap_or_default());
    let all_ok = lossy_bursts(&mut net, &ca, &cb, args)?;
    show_recovery(&net, &ca, &cb, before, all_ok);
    println!();
    println!("4. pcap written to {}", pcap.display());
    show_trace(&pcap)?;
    println!();
    println!(
        "done in {:.2} s. Next: softhca perf write --loss 0.02, softhca trace {}",
        started.elapsed().as_secs_f64(),
        pcap.display()
    );
    if !all_ok {
        return Err(err("a burst failed its data check"));
    }
    Ok(())
}

/// The simulated fabric, recording to the pcap (the temp dir's by default; if another user's
/// file is in the way, one named after this process).
fn open_fabric(args: &DemoArgs) -> Res<(PathBuf, Net)> {
    let faults = Faults { seed: args.seed, ..Faults::default() };
    Ok(match &args.pcap {
        Some(p) => (p.clone(), Net::sim(&faults, Some(p))?),
        None => {
            let p = std::env::temp_dir().join("softhca-demo.pcap");
            match Net::sim(&faults, Some(&p)) {
                Ok(net) => (p, net),
                Err(_) => {
                    let p = std::env::temp_dir().join(format!("softhca-demo-{}.pcap", std::process::id()));
                    (p.clone(), Net::sim(&faults, Some(&p))?)
                }
            }
        }
    })
}

/// One line per device: GID, node GUID, port state and MTU.
fn show_devices(devices: &[&Context]) -> Res<()> {
    for ctx in devices {
        let a = ctx.query_device()?;
        let p = ctx.query_port(1)?;
        println!(
            "  {}  GID {}  node_guid {:#018x}  port 1 {:?}, MTU {}, RoCEv2",
            ctx.name(),
            net::display_gid(ctx.query_gid(1, 0)?),
            a.node_guid,
            p.state,
            p.active_mtu.bytes()
        );
    }
    Ok(())
}

/// Step 1: an RC pingpong on a clean link, its payloads checked.
fn clean_pingpong(net: &mut Net, ca: &Context, cb: &Context) -> Res<()> {
    let pp = PingpongArgs {
        qp: QpKind::Rc,
        size: 4096,
        iters: 200,
        rx_depth: 64,
        mtu: 1024,
        link: LinkKind::Sim,
        server: false,
        connect: None,
        port: 18515,
        busy_poll: false,
        faults: Faults::default(),
        pcap: PcapArg::default(),
    };
    println!();
    println!("1. RC pingpong: {} round trips of {} bytes, MTU {} (clean link)", pp.iters, pp.size, pp.mtu);
    let r = pingpong::run_pair(net, ca, cb, &pp)?;
    println!("   local address:  {}", r.local.describe());
    println!("   remote address: {}", r.remote.describe());
    let bytes = pp.size as u64 * pp.iters * 2;
    println!(
        "   {bytes} bytes in {:.3} seconds = {:.2} Mbit/sec (wall-clock)",
        r.wall_s,
        bytes as f64 * 8.0 / (r.wall_s * 1e6).max(1e-9)
    );
    println!(
        "   {} iters in {:.3} seconds = {:.2} usec/iter (wall-clock); {:.2} usec/iter of virtual time",
        pp.iters,
        r.wall_s,
        r.wall_s * 1e6 / pp.iters as f64,
        r.virtual_s * 1e6 / pp.iters as f64
    );
    println!("   payloads checked: {}", if r.bad_payloads == 0 { "all correct" } else { "MISMATCH" });
    if r.bad_payloads > 0 {
        return Err(err("pingpong payload mismatch"));
    }
    Ok(())
}

/// Step 2: RDMA Write, Read and Fetch & Add bursts over a lossy link; whether every one
/// completed with its data verified.
fn lossy_bursts(net: &mut Net, ca: &Context, cb: &Context, args: &DemoArgs) -> Res<bool> {
    let faults = Faults { loss: args.loss, dup: 0.01, reorder: 0.02, corrupt: 0.01, seed: args.seed };
    net.set_faults(&faults)?;
    println!();
    println!(
        "2. Bursts over a lossy link: loss {}%, duplication {}%, reordering {}%, corruption {}% (seed {})",
        faults.loss * 100.0,
        faults.dup * 100.0,
        faults.reorder * 100.0,
        faults.corrupt * 100.0,
        faults.seed
    );
    println!(
        "   {:<18} {:>6} {:>9} {:>10} {:>10} {:>11} {:>6} {:>7}  data",
        "operation", "QPs", "messages", "bytes", "wall [ms]", "virtual[ms]", "retx", "errors"
    );
    let mut all_ok = true;
    for (op, name, size, iters) in [
        (Op::Write, "RDMA Write 16 KiB", 16384, 150),
        (Op::Read, "RDMA Read 16 KiB", 16384, 150),
        (Op::Atomic, "Fetch&Add 8 B", 8, 300),
    ] {
        let a = PerfArgs::burst(op, size, iters, 2);
        let mut st = perf::setup(ca, cb, &a)?;
        let res = perf::measure(net, &mut st, &a, None)?;
        all_ok &= res.data_verified && res.errors == 0;
        println!(
            "   {:<18} {:>6} {:>9} {:>10} {:>10.2} {:>11.3} {:>6} {:>7}  {}",
            name,
            res.qps,
            res.completions,
            res.bytes,
            res.wall_s * 1e3,
            res.virtual_s.unwrap_or(0.0) * 1e3,
            res.retransmits,
            res.errors,
            if res.data_verified { "verified" } else { "MISMATCH" }
        );
    }
    net.settle();
    net.finish()?;
    Ok(all_ok)
}

/// Step 3: what the lossy phase did, the fabric's faults and the devices' recovery.
fn show_recovery(net: &Net, ca: &Context, cb: &Context, before: (DeviceCounters, SimCounters), all_ok: bool) {
    let (c0, s0) = before;
    let c = net::sub_counters(net::add_counters(ca.counters(), cb.counters()), c0);
    let s1 = net.sim_counters().unwrap_or_default();
    println!();
    println!("3. What the lossy phase did");
    println!(
        "   fabric:  {} datagrams sent, {} lost, {} duplicated, {} reordered, {} corrupted",
        s1.sent - s0.sent,
        s1.lost - s0.lost,
        s1.duplicated - s0.duplicated,
        s1.reordered - s0.reordered,
        s1.corrupted - s0.corrupted
    );
    println!(
        "   devices: {} retransmission rounds (go-back-N), {} retry timeouts, {} PSN sequence NAKs, {} implied NAKs,",
        c.retransmits, c.timeouts, c.seq_naks_received, c.implied_naks
    );
    println!(
        "            {} inbound datagrams dropped ({} with a bad ICRC), every WR completed successfully: {}",
        c.rx_dropped,
        c.rx_bad_icrc,
        if all_ok { "yes" } else { "NO" }
    );
}

/// Step 5: the pcap's summary and the ladder diagram around its first retransmission.
fn show_trace(pcap: &std::path::Path) -> Res<()> {
    let t = trace::analyze(pcap)?;
    println!(
        "   {} packets, {} QP pairs, {} retransmitted request packets; full decode: softhca trace {}",
        t.packets.len(),
        t.pairs.len(),
        t.packets.iter().filter(|p| p.retx).count(),
        pcap.display()
    );
    println!();
    println!("5. Trace excerpt");
    if let Some(first) = t.packets.first() {
        println!("   {}", trace::summary_line(first));
    }
    let retx = t.packets.iter().position(|p| p.retx);
    if let Some(ri) = retx {
        if let Some(pair) = t.pairs.iter().find(|pr| pr.packets.contains(&ri)) {
            let lines = trace::ladder(&t, pair);
            let pos = pair.packets.iter().position(|&i| i == ri).unwrap_or(0) + 2;
            println!("   ladder around the first retransmission:");
            for l in &lines[..2] {
                println!("   {l}");
            }
            let from = pos.saturating_sub(8).max(2);
            let to = (pos + 4).min(lines.len());
            if from > 2 {
                println!("   {:>11}  ...", "");
            }
            for l in &lines[from..to] {
                println!("   {l}");
            }
            if to < lines.len() {
                println!("   {:>11}  ... {} more", "", lines.len() - to);
            }
        }
    } else if let Some(pair) = t.pairs.first() {
        for l in trace::ladder(&t, pair).iter().take(12) {
            println!("   {l}");
        }
    }
    Ok(())
}
