//! `softhca trace FILE.pcap`: one line per RoCEv2 packet, then a ladder diagram per QP pair
//! (requester on the left, responder on the right), with retransmitted requests marked RETX.
//!
//! QP pairs are found from the headers alone. A request names its responder (destination IP
//! and DestQP); a response names its requester. The two are joined by PSN: a response from B
//! to (A, qa) whose PSN matches a request A sent to (B, qb) ties qa to qb. UD requests carry
//! the source QP in the DETH. UC has no responses, so a lone UC flow each way between two
//! addresses is taken as one pair.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::io::{BufReader, Write};
use std::net::{IpAddr, Ipv6Addr};
use std::path::{Path, PathBuf};

use softhca::wire::opcode::{Direction, Operation, ServiceType};
use softhca::wire::pcap::PcapReader;
use softhca::wire::{roce, NakCode, Syndrome};

use crate::net::{err, Res};

#[derive(clap::Args, Debug)]
pub struct TraceArgs {
    /// A pcap of RoCEv2 traffic (Ethernet, raw IP, IPv4 or IPv6 link types).
    pub file: PathBuf,
    /// Skip the per-packet summary.
    #[arg(long)]
    pub no_summary: bool,
    /// Skip the ladder diagrams.
    #[arg(long)]
    pub no_ladder: bool,
    /// Show at most this many lines per section (0 = all).
    #[arg(long, default_value_t = 0)]
    pub max: usize,
    /// Accepted for symmetry with the other subcommands; trace writes no traffic.
    #[arg(long, value_name = "FILE", hide = true)]
    pub pcap: Option<PathBuf>,
}

/// A QP endpoint: an address and a QPN.
pub type Endpoint = (IpAddr, u32);

/// One decoded packet.
#[derive(Debug, Clone)]
pub struct Pkt {
    /// Record number in the file, from 1.
    pub index: usize,
    /// Seconds since the first record.
    pub time: f64,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub opcode: &'static str,
    pub service: Option<ServiceType>,
    pub request: bool,
    pub read_request: bool,
    pub dest_qp: u32,
    pub psn: u32,
    pub ack_req: bool,
    pub aeth: Option<(Syndrome, u32)>,
    pub src_qp: Option<u32>,
    pub payload_len: usize,
    pub icrc_ok: bool,
    pub retx: bool,
}

/// A decoded capture.
pub struct Trace {
    pub packets: Vec<Pkt>,
    /// Lines for records that are not RoCEv2.
    pub skipped: Vec<String>,
    pub pairs: Vec<Pair>,
}

/// One end of a pair as far as the headers tell: an address and, if known, a QPN.
pub type Side = (IpAddr, Option<u32>);

/// Packets of one QP pair.
pub struct Pair {
    pub left: (IpAddr, Option<u32>),
    pub right: (IpAddr, Option<u32>),
    /// Indexes into `Trace::packets`.
    pub packets: Vec<usize>,
    pub retx: usize,
}

fn addr(ip: Ipv6Addr) -> IpAddr {
    match ip.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(ip),
    }
}

/// The IP datagram of a record for the capture's link type.
fn ip_of(linktype: u32, data: &[u8]) -> Result<&[u8], String> {
    match linktype {
        1 => roce::ip_datagram_of_frame(data).map_err(|e| e.to_string()),
        // Raw IP (DLT_RAW 12 and 14 on some systems, LINKTYPE_RAW 101, IPv4 228, IPv6 229).
        12 | 14 | 101 | 228 | 229 => Ok(data),
        // Linux cooked capture: 16-byte header.
        113 => data.get(16..).ok_or_else(|| "short SLL header".to_string()),
        other => Err(format!("link type {other} not supported")),
    }
}

pub fn syndrome_text(s: Syndrome) -> String {
    match s {
        Syndrome::Ack { .. } => "ACK".into(),
        Syndrome::RnrNak { timer_code } => format!("RNR_NAK(t={timer_code})"),
        Syndrome::Nak(code) => match code {
            NakCode::PsnSeqErr => "NAK_PSN_SEQ_ERR".into(),
            NakCode::InvalidRequest => "NAK_INV_REQ".into(),
            NakCode::RemoteAccessError => "NAK_REM_ACCESS".into(),
            NakCode::RemoteOperationalError => "NAK_REM_OP".into(),
            NakCode::InvalidRdRequest => "NAK_INV_RD_REQ".into(),
        },
        Syndrome::Reserved(b) => format!("RESERVED({b:#04x})"),
    }
}

/// Reads and decodes `path`.
pub fn analyze(path: &Path) -> Res<Trace> {
    let file = File::open(path).map_err(|e| err(format!("cannot open {}: {e}", path.display())))?;
    let mut reader = PcapReader::new(BufReader::new(file)).map_err(|e| match e {
        // Wireshark's default format: the same packets, another container.
        softhca::wire::pcap::PcapError::BadMagic(0x0a0d_0d0a) => err(format!(
            "{} is a pcapng file; softhca reads classic pcap: convert it with `editcap -F pcap {} out.pcap`",
            path.display(),
            path.display()
        )),
        e => err(format!("{}: {e}", path.display())),
    })?;
    let linktype = reader.linktype();
    let mut packets = Vec::new();
    let mut skipped = Vec::new();
    let mut t0 = None;
    let mut index = 0;
    loop {
        let rec = match reader.next_record() {
            Ok(Some(rec)) => rec,
            Ok(None) => break,
            Err(e) => {
                // A capture cut short (a writer killed mid-record): show what came before it.
                skipped.push(format!("#{}: {e}; the records before it are shown", index + 1));
                break;
            }
        };
        index += 1;
        let t = rec.timestamp.as_secs_f64();
        let t0 = *t0.get_or_insert(t);
        let ip = match ip_of(linktype, &rec.data) {
            Ok(ip) => ip,
            Err(e) => {
                skipped.push(format!("#{index}: not RoCEv2 ({e})"));
                continue;
            }
        };
        let d = match roce::parse_ip_unverified(ip) {
            Ok(d) => d,
            Err(e) => {
                skipped.push(format!("#{index}: not RoCEv2 ({e})"));
                continue;
            }
        };
        let icrc_ok = roce::parse_ip(ip).is_ok();
        let p = &d.packet;
        let info = p.bth.opcode.info();
        packets.push(Pkt {
            index,
            time: t - t0,
            src: addr(d.ip.src_gid()),
            dst: addr(d.ip.dst_gid()),
            opcode: p.bth.opcode.name(),
            service: info.map(|i| i.service),
            request: info.is_none_or(|i| i.direction == Direction::Request),
            read_request: info.is_some_and(|i| i.operation == Operation::RdmaReadRequest),
            dest_qp: p.bth.dest_qp,
            psn: p.bth.psn.value(),
            ack_req: p.bth.ack_req,
            aeth: p.aeth.map(|a| (a.syndrome, a.msn)),
            src_qp: p.deth.map(|d| d.src_qp),
            payload_len: p.payload.len(),
            icrc_ok,
            retx: false,
        });
    }
    mark_retx(&mut packets);
    let pairs = pair_up(&packets);
    Ok(Trace { packets, skipped, pairs })
}

/// A request PSN seen again on the same flow (source address → responder QP) is a
/// retransmission.
fn mark_retx(packets: &mut [Pkt]) {
    let mut seen: HashMap<(IpAddr, IpAddr, u32), HashSet<u32>> = HashMap::new();
    for p in packets.iter_mut() {
        if !p.request || p.service == Some(ServiceType::Ud) || p.service == Some(ServiceType::Cnp) {
            continue;
        }
        let set = seen.entry((p.src, p.dst, p.dest_qp)).or_default();
        if !set.insert(p.psn) {
            p.retx = true;
        }
        // A 24-bit PSN space wraps; forget old PSNs rather than call a wrapped one RETX.
        if set.len() > 1 << 22 {
            set.clear();
        }
    }
}

/// Learns which requester QP talks to which responder QP, then groups packets by pair.
fn pair_up(packets: &[Pkt]) -> Vec<Pair> {
    // peer[endpoint] = the endpoint at the other end of its connection.
    let mut peer: HashMap<Endpoint, Endpoint> = HashMap::new();
    // Latest request per (requester address, responder address) by PSN → responder QPN.
    let mut by_psn: HashMap<(IpAddr, IpAddr, u32), u32> = HashMap::new();
    let mut read_reqs: Vec<(IpAddr, IpAddr, u32, u32)> = Vec::new();
    for p in packets {
        if p.request {
            by_psn.insert((p.src, p.dst, p.psn), p.dest_qp);
            if p.read_request {
                read_reqs.push((p.src, p.dst, p.psn, p.dest_qp));
            }
            if let Some(sqp) = p.src_qp {
                peer.entry((p.src, sqp)).or_insert((p.dst, p.dest_qp));
            }
        } else {
            let requester = (p.dst, p.dest_qp);
            if peer.contains_key(&requester) {
                continue;
            }
            let found = by_psn.get(&(p.dst, p.src, p.psn)).copied().or_else(|| {
                // Read responses after the first carry PSNs after the request's.
                read_reqs
                    .iter()
                    .rev()
                    .find(|r| r.0 == p.dst && r.1 == p.src && p.psn.wrapping_sub(r.2) & 0xFF_FFFF < 1 << 16)
                    .map(|r| r.3)
            });
            if let Some(rqpn) = found {
                let responder = (p.src, rqpn);
                peer.insert(requester, responder);
                peer.entry(responder).or_insert(requester);
            }
        }
    }
    // UC (no responses): a lone flow each way between two addresses is one pair.
    let mut uc_flows: BTreeMap<(IpAddr, IpAddr), HashSet<u32>> = BTreeMap::new();
    for p in packets.iter().filter(|p| p.request && p.service == Some(ServiceType::Uc)) {
        uc_flows.entry((p.src, p.dst)).or_default().insert(p.dest_qp);
    }
    for (&(a, b), qps) in &uc_flows {
        if let (Some(back), 1) = (uc_flows.get(&(b, a)), qps.len()) {
            if back.len() == 1 {
                let (qb, qa) = (*qps.iter().next().unwrap_or(&0), *back.iter().next().unwrap_or(&0));
                peer.entry((a, qa)).or_insert((b, qb));
                peer.entry((b, qb)).or_insert((a, qa));
            }
        }
    }

    let mut pairs: Vec<Pair> = Vec::new();
    let mut index_of: HashMap<(Side, Side), usize> = HashMap::new();
    for (i, p) in packets.iter().enumerate() {
        // (sender endpoint, receiver endpoint)
        let to: (IpAddr, Option<u32>) = (p.dst, Some(p.dest_qp));
        let from: (IpAddr, Option<u32>) = match peer.get(&(p.dst, p.dest_qp)) {
            Some(&(ip, qpn)) if ip == p.src => (ip, Some(qpn)),
            _ => (p.src, p.src_qp),
        };
        let key = if from <= to { (from, to) } else { (to, from) };
        let n = *index_of.entry(key).or_insert_with(|| {
            // The first packet's sender is on the left if it is a request, else on the right.
            let (left, right) = if p.request { (from, to) } else { (to, from) };
            pairs.push(Pair { left, right, packets: Vec::new(), retx: 0 });
            pairs.len() - 1
        });
        pairs[n].packets.push(i);
        pairs[n].retx += usize::from(p.retx);
    }
    pairs
}

fn ep(e: (IpAddr, Option<u32>)) -> String {
    match e.1 {
        Some(q) => format!("{} QP {q:#08x}", e.0),
        None => format!("{} QP ?", e.0),
    }
}

/// One summary line.
pub fn summary_line(p: &Pkt) -> String {
    let mut s = format!(
        "{:>6} {:>11.6} {:>15} -> {:<15} {:<34} QP {:#08x} PSN {:>8}",
        p.index,
        p.time,
        p.src.to_string(),
        p.dst.to_string(),
        p.opcode,
        p.dest_qp,
        p.psn
    );
    if p.ack_req {
        s.push_str(" A");
    } else {
        s.push_str("  ");
    }
    if let Some((syn, msn)) = p.aeth {
        s.push_str(&format!(" {} MSN {msn}", syndrome_text(syn)));
    }
    if let Some(sqp) = p.src_qp {
        s.push_str(&format!(" SrcQP {sqp:#08x}"));
    }
    s.push_str(&format!(" len {}", p.payload_len));
    if p.retx {
        s.push_str(" RETX");
    }
    if !p.icrc_ok {
        s.push_str(" BAD-ICRC");
    }
    s
}

const LADDER_W: usize = 60;

/// The ladder of one pair: header lines, then one line per packet.
pub fn ladder(t: &Trace, pair: &Pair) -> Vec<String> {
    let mut out = Vec::new();
    out.push(format!(
        "QP pair {}  <->  {}   ({} packets, {} retransmitted)",
        ep(pair.left),
        ep(pair.right),
        pair.packets.len(),
        pair.retx
    ));
    out.push(format!(
        "{:>11}  {:<w$}{}",
        "time",
        ep(pair.left),
        ep(pair.right),
        w = LADDER_W - ep(pair.right).len() + 2
    ));
    for &i in &pair.packets {
        let p = &t.packets[i];
        let rightward =
            if pair.left.0 != pair.right.0 { p.dst == pair.right.0 } else { Some(p.dest_qp) == pair.right.1 };
        let mut label = format!("{} {}", p.opcode, p.psn);
        if p.ack_req {
            label.push_str(" A");
        }
        if let Some((syn, msn)) = p.aeth {
            label.push_str(&format!(" {} msn={msn}", syndrome_text(syn)));
        }
        if p.payload_len > 0 {
            label.push_str(&format!(" {}B", p.payload_len));
        }
        if p.retx {
            label.push_str(" RETX");
        }
        if !p.icrc_ok {
            label.push_str(" BAD-ICRC");
        }
        let inner = LADDER_W - 4;
        let label = format!(" {label} ");
        let dashes = inner.saturating_sub(label.chars().count());
        let (l, r) = (dashes / 2, dashes - dashes / 2);
        let arrow = if rightward {
            format!("|-{}{}{}>|", "-".repeat(l), label, "-".repeat(r))
        } else {
            format!("|<{}{}{}-|", "-".repeat(l), label, "-".repeat(r))
        };
        out.push(format!("{:>11.6}  {arrow}", p.time));
    }
    out
}

pub fn run(args: &TraceArgs) -> Res<()> {
    let t = analyze(&args.file)?;
    let mut o = std::io::BufWriter::new(std::io::stdout().lock());
    let cap = |n: usize| if args.max == 0 { n } else { n.min(args.max) };
    writeln!(
        o,
        "{}: {} RoCEv2 packets, {} other records, {} QP pair{}, {} retransmissions",
        args.file.display(),
        t.packets.len(),
        t.skipped.len(),
        t.pairs.len(),
        if t.pairs.len() == 1 { "" } else { "s" },
        t.packets.iter().filter(|p| p.retx).count()
    )?;
    if !args.no_summary {
        writeln!(o)?;
        writeln!(
            o,
            "{:>6} {:>11} {:>15}    {:<15} {:<34} {:<9} {:>12}",
            "#", "time", "source", "destination", "opcode", "DestQP", "PSN"
        )?;
        for p in &t.packets[..cap(t.packets.len())] {
            writeln!(o, "{}", summary_line(p))?;
        }
        if cap(t.packets.len()) < t.packets.len() {
            writeln!(o, "   ... {} more", t.packets.len() - cap(t.packets.len()))?;
        }
        for s in &t.skipped[..cap(t.skipped.len())] {
            writeln!(o, "{s}")?;
        }
    }
    if !args.no_ladder {
        for pair in &t.pairs {
            writeln!(o)?;
            let lines = ladder(&t, pair);
            let n = cap(lines.len().saturating_sub(2)) + 2;
            for l in &lines[..n.min(lines.len())] {
                writeln!(o, "{l}")?;
            }
            if n < lines.len() {
                writeln!(o, "   ... {} more", lines.len() - n)?;
            }
        }
    }
    o.flush()?;
    Ok(())
}
