//! `softhca`: the command line of the software HCA.
//!
//! - `softhca` / `softhca demo`: two devices on the simulated fabric, an RC pingpong, a
//!   write/read/atomic burst over a lossy link, the counters and a trace excerpt of the pcap.
//! - `softhca devinfo`: like `ibv_devinfo`.
//! - `softhca pingpong`: like `ibv_rc_pingpong` (RC, UC or UD).
//! - `softhca perf send|write|read|atomic`: like perftest.
//! - `softhca trace FILE.pcap`: per-packet summary and per-QP-pair ladder diagrams.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod demo;
mod devinfo;
mod net;
mod perf;
mod perf_remote;
mod pingpong;
mod trace;

#[derive(Parser, Debug)]
#[command(name = "softhca", version, about = "softhca: a software InfiniBand HCA (verbs, RC/UC/UD, RoCEv2)")]
#[command(after_help = "\
With no subcommand, runs the demo. `softhca help COMMAND` or `softhca COMMAND --help` explains
each command's flags.

Environment (udp link):
  SOFTHCA_ADDR       the IP address a udp device binds (UDP port 4791); default: the first
                     free address in 127.0.0.1-127.0.0.254
  SOFTHCA_ALT_ADDR   a second address for a udp device (GID 1): alternate paths, Automatic
                     Path Migration
  SOFTHCA_WAIT_SECS  how long to wait for progress before giving up (default 60)")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Two devices on the simulated fabric: RC pingpong, a write/read/atomic burst over a
    /// lossy link, retransmission counters and a trace of the pcap (the default).
    Demo(demo::DemoArgs),
    /// Show the device and its port, like ibv_devinfo.
    Devinfo(devinfo::DevinfoArgs),
    /// Ping-pong Sends between two QPs, like ibv_rc_pingpong (RC, UC or UD; both ends in this
    /// process on the sim link, two processes over udp).
    Pingpong(pingpong::PingpongArgs),
    /// Bandwidth, message rate and latency of Send, RDMA Write, RDMA Read or Atomic, like
    /// perftest (sim link, udp in one process, or udp between two processes).
    Perf(perf::PerfArgs),
    /// Decode a RoCEv2 pcap: one line per packet and a ladder diagram per QP pair.
    Trace(trace::TraceArgs),
}

/// The `--pcap` flag every subcommand takes.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PcapArg {
    /// Record the traffic in this pcap file (Ethernet link type; Wireshark and `softhca
    /// trace` read it). On the udp link: what this process's first device sends and receives.
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<PathBuf>,
}

/// `softhca perf`: both ends here, or one of two processes (the server, the client).
fn run_perf(args: &perf::PerfArgs) -> net::Res<()> {
    perf::check_link_flags(args)?;
    match &args.connect {
        _ if args.server => perf_remote::serve(args),
        Some(host) => perf_remote::client(args, host),
        None => perf::run_local(args),
    }
}

fn main() -> ExitCode {
    // `softhca demo | head`: a reader that leaves ends the program quietly, as it ends any
    // Unix filter, instead of a panic in println (Rust starts programs with SIGPIPE ignored).
    // The TCP side channel sends with MSG_NOSIGNAL, so a peer gone is still an error.
    // SAFETY: restores the default disposition of one signal before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = Cli::parse();
    let result = match cli.command {
        None => demo::run(&demo::DemoArgs::default()),
        Some(Command::Demo(a)) => demo::run(&a),
        Some(Command::Devinfo(a)) => devinfo::run(&a),
        Some(Command::Pingpong(a)) => pingpong::run(&a),
        Some(Command::Perf(a)) => run_perf(&a),
        Some(Command::Trace(a)) => trace::run(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // `softhca trace x.pcap | head`: the reader left; not an error.
        Err(e) if e.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) => {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("softhca: error: {e}");
            ExitCode::FAILURE
        }
    }
}
