//! Connected flow sockets on the UDP link: an RC or UC flow sends through a socket connected to
//! its peer, whose IPv4 Identifications come from a per-socket counter the link learns with a
//! probe and follows, so every ICRC is still sealed over exactly the header on the wire.

mod udp_common;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use softhca::link::udp::{IcrcPolicy, RxMode, UdpConfig, UdpCounters, UdpDevice, MAX_PORT_SOCKETS};
use softhca::wire::icrc;
use softhca::wire::pcap::PcapReader;
use softhca::*;
use udp_common::*;

fn clean(c: &UdpCounters) {
    assert_eq!((c.drop_bad_icrc, c.drop_malformed, c.tx_errors, c.tx_port_fallback), (0, 0, 0, 0), "{c:?}");
    assert!(c.rx_datagrams > 0, "{c:?}");
}

fn raw_refused() -> bool {
    match UdpDevice::open(UdpConfig::default().rx_mode(RxMode::Raw)) {
        Ok(_) => false,
        Err(e) => {
            eprintln!("SKIP: raw sockets refused here ({e})");
            true
        }
    }
}

/// Rule PKT-ROCE-7, PKT-ROCE-10: a receiver that sees the real IPv4 header (raw socket)
/// checks every ICRC exactly; connected flows pass it, single datagrams and GSO segments alike.
#[test]
fn connected_flows_seal_the_identification_on_the_wire() {
    if raw_refused() {
        return;
    }
    let cfg = || UdpConfig::default().rx_mode(RxMode::Raw);
    let (a, b) = (end(cfg()), end(cfg()));
    traffic(&a, &b);
    for d in [&a.dev, &b.dev] {
        let c = d.counters();
        clean(&c);
        assert_eq!((c.tx_connected_flows, c.tx_unconnected_flows), (1, 0), "{c:?}");
        assert_eq!(c.rx_icrc_exact, c.rx_datagrams, "{c:?}");
        assert!(c.rx_gro_buffers > 0 || c.rx_datagrams > 100, "{c:?}");
    }
    assert!(a.dev.counters().tx_gso_messages > 0 && b.dev.counters().tx_gso_messages > 0);
}

/// Reads the IPv4 datagrams of a pcap the link wrote (Ethernet framing).
fn datagrams(path: &std::path::Path) -> Vec<Vec<u8>> {
    let mut r = PcapReader::new(std::fs::File::open(path).unwrap()).unwrap();
    let mut out = Vec::new();
    while let Some(rec) = r.next_record().unwrap() {
        out.push(rec.data[14..].to_vec());
    }
    out
}

/// Without privilege the receiver follows each flow's counter: only a flow's first datagram
/// needs solving, every later one matches a hypothesis (full 32-bit check), GSO message starts
/// included. The pcap holds what went on the wire: Identifications and ICRCs that match.
#[test]
fn an_unprivileged_receiver_follows_each_flows_counter() {
    let dir = std::env::temp_dir().join(format!("softhca-connected-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pa = dir.join("a.pcap");
    let a = end(UdpConfig::default().pcap(&pa));
    let b = end(UdpConfig::default());
    traffic(&a, &b);
    for d in [&a.dev, &b.dev] {
        let c = d.counters();
        clean(&c);
        // The first datagram is solved; a later one only where loopback lost or reordered
        // one before it (a loaded machine defers the receive to ksoftirqd), a few at most.
        assert_eq!(c.tx_connected_flows, 1, "{c:?}");
        assert!((1..=3).contains(&c.rx_icrc_solved), "{c:?}");
        assert_eq!(c.rx_icrc_hypothesis + c.rx_icrc_solved, c.rx_datagrams, "{c:?}");
    }
    drop(a);
    let sent = datagrams(&pa);
    let ours = |d: &&Vec<u8>| IpAddr::from([d[12], d[13], d[14], d[15]]) != b.dev.addr();
    let ids: Vec<u16> = sent.iter().filter(ours).map(|d| u16::from_be_bytes([d[4], d[5]])).collect();
    assert!(ids.len() > 100, "{}", ids.len());
    for d in sent.iter().filter(ours) {
        icrc::verify_datagram(d).unwrap();
    }
    assert!(ids.iter().any(|&id| id != 0), "a connected flow's Identifications count");
    std::fs::remove_dir_all(&dir).ok();
}

/// Rule PKT-ROCE-10: a receiver under the exact policy takes only what it checked with all 32
/// bits of the ICRC. A connected flow's first datagram (its Identification counts from a
/// random start) is dropped, and the Identification solving would have found becomes the
/// hypothesis the flow's next datagram, the retransmission included, matches: the flow goes
/// on after one ACK timeout, nothing solved and taken. (Before, no datagram of the flow ever
/// matched, and the sender's retries ran out.)
#[test]
fn an_exact_receiver_learns_a_connected_flows_start() {
    let a = end(UdpConfig::default());
    let b = end(UdpConfig::default().icrc_policy(IcrcPolicy::Exact));
    traffic(&a, &b);
    let c = b.dev.counters();
    assert_eq!((c.rx_icrc_solved, c.drop_malformed, c.tx_errors), (0, 0, 0), "{c:?}");
    // The first datagram; a later one only where loopback lost or reordered one before it.
    assert!((1..=3).contains(&c.drop_bad_icrc), "{c:?}");
    assert!(c.rx_icrc_hypothesis > 100, "{c:?}");
    assert_eq!(a.dev.counters().tx_connected_flows, 1, "{:?}", a.dev.counters());
}

/// With `connected(false)` every socket stays unconnected: Identification 0 (and the GSO
/// segment index), no solving at the receiver.
#[test]
fn unconnected_flows_send_identification_zero() {
    let cfg = || UdpConfig::default().connected(false);
    let (a, b) = (end(cfg()), end(cfg()));
    traffic(&a, &b);
    for d in [&a.dev, &b.dev] {
        let c = d.counters();
        clean(&c);
        assert_eq!((c.tx_connected_flows, c.rx_icrc_solved), (0, 0), "{c:?}");
    }
}

/// A connected flow whose peer went away (ICMP port unreachable: the next send is refused)
/// drops that datagram, dissolves the association and goes on unconnected. The QP reset and
/// connected to a new peer at the address gets a fresh socket, connected to it: the reset
/// closed the old one (its flow ended), and the new peer checks every ICRC.
#[test]
fn a_refused_connected_flow_goes_on_unconnected() {
    // Addresses outside the automatic range (127.0.0.x): a device of a test running meanwhile
    // must not take the peer's address while it is free.
    let (aaddr, baddr): (IpAddr, IpAddr) = ([127, 0, 1, 1].into(), [127, 0, 1, 2].into());
    let a = uc_end(UdpConfig::default().addr(aaddr));
    let buf = a.pd.reg_mr(vec![7u8; 64], Access::LOCAL_WRITE).unwrap();
    {
        let b = uc_end(UdpConfig::default().addr(baddr));
        uc_connect(&a.qp, b.dev.gid(), b.qp.qp_num());
        uc_connect(&b.qp, a.dev.gid(), a.qp.qp_num());
        let rbuf = b.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
        b.qp.post_recv(&[RecvWr::new(1, &[rbuf.sge(0..64)])]).unwrap();
        a.qp.post_send(&[SendWr::send(1, &[buf.sge(0..32)]).signaled()]).unwrap();
        wait(&a.cq, 1, 10);
        assert_eq!(wait(&b.cq, 1, 10)[0].status, WcStatus::Success);
        assert_eq!(a.dev.counters().tx_connected_flows, 1);
    }
    // The peer's port is closed now: keep sending until a send is refused.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut id = 2;
    while a.dev.counters().tx_unconnected_flows == 0 {
        assert!(Instant::now() < deadline, "{:?}", a.dev.counters());
        a.qp.post_send(&[SendWr::send(id, &[buf.sge(0..32)]).signaled()]).unwrap();
        wait(&a.cq, 1, 10);
        id += 1;
    }
    assert!(a.dev.counters().tx_errors >= 1, "{:?}", a.dev.counters());
    // A new device at the same address: the flow reaches it unconnected (Identification 0).
    let b2 = uc_end(UdpConfig::default().addr(baddr));
    uc_connect(&a.qp, b2.dev.gid(), b2.qp.qp_num());
    uc_connect(&b2.qp, a.dev.gid(), a.qp.qp_num());
    let rbuf = b2.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    b2.qp.post_recv(&[RecvWr::new(9, &[rbuf.sge(0..64)])]).unwrap();
    a.qp.post_send(&[SendWr::send(9, &[buf.sge(0..32)]).signaled()]).unwrap();
    wait(&a.cq, 1, 10);
    let w = wait(&b2.cq, 1, 10);
    assert_eq!((w[0].status, w[0].byte_len), (WcStatus::Success, 32));
    let c = b2.dev.counters();
    assert_eq!((c.rx_datagrams, c.drop_bad_icrc), (1, 0), "{c:?}");
    let c = a.dev.counters();
    assert_eq!((c.tx_connected_flows, c.tx_unconnected_flows, c.tx_flows_closed), (2, 1, 1), "{c:?}");
}

/// A QP reset and connected to another peer gets its flow socket connected anew (to the new
/// peer, with a freshly learned Identification counter), not left connected to the old one.
/// Rule PKT-ROCE-6
#[test]
fn a_qp_connected_anew_reconnects_its_flow() {
    let addr = |last| UdpConfig::default().addr(IpAddr::from([127, 0, 1, last]));
    let a = end(addr(11));
    let b1 = end(addr(12));
    let b2 = end(addr(13));
    let mr = a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    for (round, b) in [&b1, &b2].into_iter().enumerate() {
        a.qp.modify(&QpAttr::to_reset()).unwrap();
        connect(&a.qp, b.dev.gid(), b.qp.qp_num(), Mtu::Mtu4096);
        connect(&b.qp, a.dev.gid(), a.qp.qp_num(), Mtu::Mtu4096);
        let rmr = b.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
        b.qp.post_recv(&[RecvWr::new(1, &[rmr.sge(0..64)])]).unwrap();
        a.qp.post_send(&[SendWr::send(1, &[mr.sge(0..8)]).signaled()]).unwrap();
        assert_eq!(wait(&a.cq, 1, 10)[0].status, WcStatus::Success);
        assert_eq!(wait(&b.cq, 1, 10)[0].status, WcStatus::Success);
        assert_eq!(a.dev.counters().tx_connected_flows, round as u64 + 1, "{:?}", a.dev.counters());
        clean(&b.dev.counters());
    }
}

/// A QP's flow socket is opened and connected when Modify QP sets the QP's path, before any
/// of its packets is written: the first packet's Local ACK timer must not run while the link
/// opens the socket and probes its Identification (under emulation that took 25-90 ms of a
/// 67 ms timeout). Both ends connected and nothing sent yet, each flow is connected; traffic
/// then connects no other.
#[test]
fn a_flow_is_connected_when_modify_qp_sets_its_path() {
    let (a, b) = (end(UdpConfig::default()), end(UdpConfig::default()));
    connect(&a.qp, b.dev.gid(), b.qp.qp_num(), Mtu::Mtu4096);
    connect(&b.qp, a.dev.gid(), a.qp.qp_num(), Mtu::Mtu4096);
    for d in [&a.dev, &b.dev] {
        // The link's turn that Modify QP's doorbell runs (its own thread's, or the engine
        // thread's when that one held the link) opens the flow.
        let deadline = Instant::now() + Duration::from_secs(10);
        while d.counters().tx_connected_flows == 0 {
            assert!(Instant::now() < deadline, "{:?}", d.counters());
            std::thread::yield_now();
        }
        let c = d.counters();
        assert_eq!((c.tx_connected_flows, c.tx_unconnected_flows, c.tx_datagrams), (1, 0, 0), "{c:?}");
    }
    traffic_connected(&a, &b);
    for d in [&a.dev, &b.dev] {
        let c = d.counters();
        clean(&c);
        assert_eq!((c.tx_connected_flows, c.tx_unconnected_flows), (1, 0), "{c:?}");
    }
}

/// What the core announces (`Context::announce_flows`): an RC or UC QP's flow opened when Modify
/// QP sets its path (Init → RTR), with the QP's UDP source port and both GIDs, and closed when
/// the QP is reset or destroyed; a UD QP has none; nothing at all for a link that did not ask.
#[test]
fn the_core_announces_connected_flows_at_init_to_rtr() {
    let (local, peer) = (Gid::from_ipv4([10, 0, 0, 1].into()), Gid::from_ipv4([10, 0, 0, 2].into()));
    let make = |announce: bool| {
        let ctx = Context::create(DeviceConfig::default().name("flows").gid0(local)).unwrap();
        if announce {
            ctx.announce_flows();
        }
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16).unwrap();
        (ctx, pd, cq)
    };
    let to_rtr = |qp: &Qp| {
        qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(Access::LOCAL_WRITE)).unwrap();
        let av = AddressVector::new(AhAttr::roce(peer, 0), Mtu::Mtu1024);
        let rtr = QpAttr::to_rtr(av, 0x42).rq_psn(0);
        let rtr = if qp.qp_type() == QpType::Rc { rtr.max_dest_rd_atomic(1).min_rnr_timer(1) } else { rtr };
        qp.modify(&rtr).unwrap();
    };
    let mut flows = Vec::new();
    let (ctx, pd, cq) = make(true);
    let rc = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    let uc = pd.create_qp(&QpInitAttr::new(QpType::Uc, &cq, &cq)).unwrap();
    rc.modify(&QpAttr::to_init().port(1).pkey_index(0).access(Access::LOCAL_WRITE)).unwrap();
    ctx.take_flows(&mut flows);
    assert!(flows.is_empty(), "Init has no path: {flows:?}");
    to_rtr(&rc);
    to_rtr(&uc);
    let ud = pd.create_qp(&QpInitAttr::new(QpType::Ud, &cq, &cq)).unwrap();
    ud.modify(&QpAttr::to_init().port(1).pkey_index(0).qkey(1)).unwrap();
    ud.modify(&QpAttr::new(QpState::Rtr)).unwrap();
    ctx.take_flows(&mut flows);
    let want = |qp: &Qp| softhca::transport::Flow {
        src_gid: local.to_ipv6(),
        dst_gid: peer.to_ipv6(),
        src_port: softhca::wire::roce::udp_src_port(qp.qp_num()),
    };
    use softhca::transport::FlowChange::{Closed, Opened};
    assert_eq!(flows, [Opened(want(&rc)), Opened(want(&uc))]);
    ctx.take_flows(&mut flows);
    assert!(flows.is_empty(), "taken once: {flows:?}");
    // Reset closes the flow (once: a second reset has nothing to close), a new path opens
    // it again, and destroying the QP closes it; a QP that never reached RTR closes nothing.
    let (rc_flow, uc_flow) = (want(&rc), want(&uc));
    rc.modify(&QpAttr::to_reset()).unwrap();
    rc.modify(&QpAttr::to_reset()).unwrap();
    to_rtr(&rc);
    uc.modify(&QpAttr::new(QpState::Error)).unwrap();
    uc.destroy().unwrap();
    rc.destroy().unwrap();
    ud.destroy().unwrap();
    pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap().destroy().unwrap();
    ctx.take_flows(&mut flows);
    assert_eq!(flows, [Closed(rc_flow), Opened(rc_flow), Closed(uc_flow), Closed(rc_flow)]);

    let (ctx, pd, cq) = make(false);
    let rc = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    to_rtr(&rc);
    ctx.take_flows(&mut flows);
    assert!(flows.is_empty(), "not asked for: {flows:?}");
}

/// A flow socket closes with the last QP on its port (destroyed or reset), so that a process
/// that makes and ends connections one after another gives each its own connected socket: far
/// more connections than `MAX_PORT_SOCKETS` over the device's life, none sent from port 4791.
/// (Before, the first eight QPs kept the eight sockets for good.) Rule PKT-ROCE-6
#[test]
fn a_flows_socket_closes_with_its_qp() {
    let (a, b) = (end(UdpConfig::default()), end(UdpConfig::default()));
    let n = 3 * MAX_PORT_SOCKETS;
    let mr = a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let rmr = b.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let mk = |e: &End| e.pd.create_qp(&QpInitAttr::rc(&e.cq, &e.cq)).unwrap();
    for i in 0..n {
        let (x, y) = (mk(&a), mk(&b));
        connect(&x, b.dev.gid(), y.qp_num(), Mtu::Mtu1024);
        connect(&y, a.dev.gid(), x.qp_num(), Mtu::Mtu1024);
        y.post_recv(&[RecvWr::new(1, &[rmr.sge(0..64)])]).unwrap();
        x.post_send(&[SendWr::send(1, &[mr.sge(0..8)]).signaled()]).unwrap();
        assert_eq!(wait(&a.cq, 1, 10)[0].status, WcStatus::Success);
        assert_eq!(wait(&b.cq, 1, 10)[0].status, WcStatus::Success);
        if i % 2 == 1 {
            for q in [&x, &y] {
                q.modify(&QpAttr::to_reset()).unwrap();
            }
        }
        x.destroy().unwrap();
        y.destroy().unwrap();
    }
    for d in [&a.dev, &b.dev] {
        let c = d.counters();
        clean(&c);
        assert_eq!((c.tx_connected_flows, c.tx_unconnected_flows), (n as u64, 0), "{c:?}");
        assert!(c.tx_flows_closed >= (n - MAX_PORT_SOCKETS) as u64, "{c:?}");
    }
}

/// XRC over the UDP link: an initiator's Sends, Writes and Reads to a target QP (whose messages
/// take their WQEs, PD and CQ from the XRC SRQ they name) go through connected flow sockets,
/// as RC's do: one flow per QP each way, no datagram sent from port 4791 instead. Before, the
/// link took XRC's opcodes for a many-peer service and sent every XRC datagram from 4791, its
/// ICRC sealed again.
#[test]
fn xrc_flows_are_connected_like_rcs() {
    let (a, b) = (end(UdpConfig::default()), end(UdpConfig::default()));
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let ini = a.pd.create_qp(&QpInitAttr::new(QpType::XrcSend, &a.cq, &a.cq).max_send_wr(256)).unwrap();
    let ctx = b.dev.context();
    let xrcd = ctx.open_xrcd().unwrap();
    let tgt = xrcd.create_tgt_qp().unwrap();
    let srq = b.pd.create_xrc_srq(&xrcd, &b.cq, &SrqInitAttr { max_wr: 256, max_sge: 1, srq_limit: 0 }).unwrap();
    for (qp, gid, peer, ini_side) in [(&ini, b.dev.gid(), tgt.qp_num(), true), (&tgt, a.dev.gid(), ini.qp_num(), false)]
    {
        let av = AddressVector::new(AhAttr::roce(gid, 0), Mtu::Mtu4096);
        qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(all)).unwrap();
        let rtr = QpAttr::to_rtr(av, peer).rq_psn(0);
        let rts = QpAttr::to_rts().sq_psn(0).timeout(14);
        if ini_side {
            qp.modify(&rtr).unwrap();
            qp.modify(&rts.retry_cnt(7).rnr_retry(7).max_rd_atomic(16)).unwrap();
        } else {
            qp.modify(&rtr.max_dest_rd_atomic(16).min_rnr_timer(1)).unwrap();
            qp.modify(&rts).unwrap();
        }
    }
    let n = 100_000usize;
    let src = a.pd.reg_mr((0..n).map(|i| (i * 7) as u8).collect(), all).unwrap();
    let dst = b.pd.alloc_mr(n, all).unwrap();
    let rsge = [dst.sge(0..64)];
    srq.post_recv(&(0..20).map(|i| RecvWr::new(i, &rsge)).collect::<Vec<_>>()).unwrap();
    let ssge = [src.sge(0..8)];
    let srqn = srq.srq_num();
    ini.post_send(&(0..20).map(|i| SendWr::send(i, &ssge).xrc(srqn).signaled()).collect::<Vec<_>>()).unwrap();
    assert!(wait(&a.cq, 20, 10).iter().all(|w| w.status == WcStatus::Success));
    assert!(wait(&b.cq, 20, 10).iter().all(|w| w.status == WcStatus::Success && w.qp_num == tgt.qp_num()));
    ini.post_send(&[SendWr::rdma_write(100, &[src.sge(0..n)], dst.addr(), dst.rkey()).xrc(srqn).signaled()]).unwrap();
    assert_eq!(wait(&a.cq, 1, 10)[0].status, WcStatus::Success);
    let back = a.pd.alloc_mr(n, Access::LOCAL_WRITE).unwrap();
    ini.post_send(&[SendWr::rdma_read(200, &[back.sge(0..n)], dst.addr(), dst.rkey()).xrc(srqn).signaled()]).unwrap();
    assert_eq!(wait(&a.cq, 1, 10)[0].status, WcStatus::Success);
    assert_eq!(back.to_vec().unwrap(), src.to_vec().unwrap());
    for d in [&a.dev, &b.dev] {
        let c = d.counters();
        clean(&c);
        assert_eq!((c.tx_connected_flows, c.tx_unconnected_flows), (1, 0), "{c:?}");
    }
}
