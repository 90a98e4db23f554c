//! Two processes on the UDP link: the benchmark of issue 5 ("Speed"), and a peer for tests.
//!
//! ```sh
//! cargo run --release -p softhca --example udp_peer -- bw  [--secs 3] [--size 65536] [--busy]
//! cargo run --release -p softhca --example udp_peer -- lat [--iters 20000] [--no-busy] [--signaled]
//! ```
//!
//! The command spawns itself as the second process (`serve`), which opens its own device on
//! the next free 127.0.0.x; the two exchange (GID, QPN, VA, R_Key) as one line each over the
//! child's stdin/stdout, then run RC traffic: `bw` posts RDMA Writes of `--size` bytes with
//! 64 outstanding and reports GB/s; `lat` ping-pongs 8-byte Sends and reports one-way latency
//! (half the round trip) percentiles, in busy-poll mode unless `--no-busy`. In busy-poll mode
//! the application threads spin on their CQs and the engine runs inline on them.
//!
//! Like perftest's `ib_send_lat`, both sides post unsignaled Sends and a round trip ends when
//! the reply's receive completes; the ACKs travel but are off the measured path. With
//! `--signaled` the client's Sends are signaled and a round trip also waits for the Send's
//! completion (the ACK), like `ibv_rc_pingpong`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use softhca::link::udp::{UdpConfig, UdpDevice};
use softhca::*;

struct End {
    pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
    dev: UdpDevice,
}

fn end(busy: bool, len: usize) -> End {
    let dev = UdpDevice::open(UdpConfig::default().name("udp_peer").busy_poll(busy)).expect("open udp device");
    let ctx = dev.context().clone();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4096).unwrap();
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq).max_send_wr(1024).max_recv_wr(1024)).unwrap();
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let mr = pd.reg_mr((0..len).map(|i| i as u8).collect(), all).unwrap();
    End { pd, cq, qp, mr, dev }
}

impl End {
    fn info(&self) -> String {
        format!("INFO {} {} {} {}", self.dev.addr(), self.qp.qp_num(), self.mr.addr(), self.mr.rkey())
    }

    /// Connects to a peer's `INFO` line; returns its (VA, R_Key).
    fn connect(&self, line: &str) -> (u64, u32) {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f.first(), Some(&"INFO"), "bad peer line {line:?}");
        let ip: std::net::IpAddr = f[1].parse().unwrap();
        let gid = match ip {
            std::net::IpAddr::V4(a) => Gid::from_ipv4(a),
            std::net::IpAddr::V6(a) => Gid::from_ipv6(a),
        };
        let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
        let av = AddressVector::new(AhAttr::roce(gid, 0), Mtu::Mtu4096);
        self.qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(all)).unwrap();
        self.qp
            .modify(&QpAttr::to_rtr(av, f[2].parse().unwrap()).rq_psn(0).max_dest_rd_atomic(16).min_rnr_timer(1))
            .unwrap();
        self.qp.modify(&QpAttr::to_rts().sq_psn(0).timeout(14).retry_cnt(7).rnr_retry(7).max_rd_atomic(16)).unwrap();
        (f[3].parse().unwrap(), f[4].parse().unwrap())
    }

    /// Polls until `n` completions, all successful; panics after 30 s.
    fn wait(&self, n: usize, spin: bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut wcs = [Wc::default(); 64];
        let mut got = 0;
        while got < n {
            let k = self.cq.poll(&mut wcs[..(n - got).min(64)]).unwrap();
            for w in &wcs[..k] {
                assert_eq!(w.status, WcStatus::Success, "{w:?}");
            }
            got += k;
            if k == 0 {
                assert!(Instant::now() < deadline, "timed out: {:?}", self.dev.counters());
                if !spin {
                    std::thread::yield_now();
                }
            }
        }
    }
}

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The second process: answers Sends with Sends (lat) or just hosts the target MR (bw) until
/// its stdin closes.
fn serve(args: &[String]) {
    let busy = args.iter().any(|a| a == "--busy");
    let lat = args.iter().any(|a| a == "--lat");
    let iters: usize = arg(args, "--iters", 0);
    let e = end(busy, 1 << 20);
    println!("{}", e.info());
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    let mut stdin = BufReader::new(std::io::stdin());
    stdin.read_line(&mut line).unwrap();
    e.connect(&line);
    if lat {
        let sge = [e.mr.sge(0..64)];
        let wrs: Vec<RecvWr> = (0..64).map(|i| RecvWr::new(i, &sge)).collect();
        e.qp.post_recv(&wrs).unwrap();
        for i in 0..iters {
            e.wait(1, busy);
            e.qp.post_recv(&[RecvWr::new(i as u64, &[e.mr.sge(0..64)])]).unwrap();
            e.qp.post_send(&[SendWr::send(i as u64, &[e.mr.sge(64..72)])]).unwrap();
        }
    }
    println!("DONE");
    std::io::stdout().flush().unwrap();
    line.clear();
    let _ = stdin.read_line(&mut line);
    eprintln!("serve counters: {:?}\n{:?}", e.dev.counters(), e.dev.context().counters());
    drop(e.pd);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).unwrap_or("bw");
    if mode == "serve" {
        return serve(&args);
    }
    let lat = mode == "lat";
    let busy = if lat { !args.iter().any(|a| a == "--no-busy") } else { args.iter().any(|a| a == "--busy") };
    let iters: usize = arg(&args, "--iters", 20_000);
    let mut child = Command::new(std::env::current_exe().unwrap());
    child.arg("serve");
    if busy {
        child.arg("--busy");
    }
    if lat {
        child.args(["--lat", "--iters", &iters.to_string()]);
    }
    let mut child = child.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("spawn peer");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut cin = child.stdin.take().unwrap();
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let size: usize = arg(&args, "--size", 65536);
    let e = end(busy, size.max(4096) * 2);
    let (va, rkey) = e.connect(&line);
    writeln!(cin, "{}", e.info()).unwrap();
    cin.flush().unwrap();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    println!(
        "machine: {} cpus, {cpu}; devices {} -> {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        e.dev.addr(),
        line.split_whitespace().nth(1).unwrap_or("?")
    );
    if lat {
        let sge = [e.mr.sge(0..64)];
        let wrs: Vec<RecvWr> = (0..64).map(|i| RecvWr::new(i, &sge)).collect();
        e.qp.post_recv(&wrs).unwrap();
        let signaled = args.iter().any(|a| a == "--signaled");
        let mut rtts = Vec::with_capacity(iters);
        for i in 0..iters {
            let t = Instant::now();
            // Inline, like ib_send_lat: the 8 bytes are copied at post time.
            let payload = (i as u64).to_le_bytes();
            let wr = SendWr::send_inline(i as u64, &payload);
            e.qp.post_send(&[if signaled { wr.signaled() } else { wr }]).unwrap();
            e.wait(if signaled { 2 } else { 1 }, busy);
            e.qp.post_recv(&[RecvWr::new(i as u64, &[e.mr.sge(0..64)])]).unwrap();
            rtts.push(t.elapsed().as_nanos() as f64 / 2000.0);
        }
        rtts.sort_by(|a, b| a.total_cmp(b));
        let p = |q: f64| rtts[((rtts.len() as f64 * q) as usize).min(rtts.len() - 1)];
        println!(
            "lat 8 B send, busy_poll={busy}, signaled={signaled}: one-way p50 {:.2} us, p99 {:.2} us, min {:.2} us ({iters} iters)",
            p(0.5),
            p(0.99),
            rtts[0]
        );
    } else {
        let secs: f64 = arg(&args, "--secs", 3.0);
        let depth = 64usize;
        let t = Instant::now();
        let mut posted = 0usize;
        let mut done = 0usize;
        let mut wcs = [Wc::default(); 64];
        while t.elapsed().as_secs_f64() < secs || done < posted {
            while posted - done < depth && t.elapsed().as_secs_f64() < secs {
                let off = (posted % 2 * size) as u64;
                e.qp.post_send(&[
                    SendWr::rdma_write(posted as u64, &[e.mr.sge(0..size)], va + off % (1 << 20), rkey).signaled()
                ])
                .unwrap();
                posted += 1;
            }
            let k = e.cq.poll(&mut wcs).unwrap();
            for w in &wcs[..k] {
                assert_eq!(w.status, WcStatus::Success, "{w:?}");
            }
            done += k;
            if k == 0 && !busy {
                std::thread::yield_now();
            }
        }
        let el = t.elapsed().as_secs_f64();
        println!(
            "bw RC RDMA Write {size} B, busy_poll={busy}: {:.3} GB/s, {:.0} msgs/s ({done} msgs in {el:.2} s)",
            (done * size) as f64 / el / 1e9,
            done as f64 / el
        );
    }
    eprintln!("client counters: {:?}\n{:?}", e.dev.counters(), e.dev.context().counters());
    line.clear();
    out.read_line(&mut line).unwrap();
    drop(cin);
    let _ = child.wait();
}
