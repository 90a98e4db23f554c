//! Fuzzes what a device does with what a peer sends: each input is a transport packet
//! (BTH onward) that arrives, in a sealed RoCEv2 datagram from the peer's address, at a
//! device whose RC, UC and UD QPs are connected and mid-conversation, with receives posted and
//! a region that grants every remote right (every other device, its RC and UC QPs on a shared
//! receive queue), and whose QP1 runs the connection manager
//! (`CmAgent`, listening on rping's service; requests it gets are accepted or rejected by the
//! input), and an XRC target QP whose domain has an XRC SRQ of the open region's PD (another
//! domain has one of another PD's, and a basic SRQ is there too). The first byte steers it
//! toward a QP (and may put the QP's own number, the open region's R_Key or the GSI's Q_Key,
//! and an expected PSN in place) so that the fuzzer reaches past the address checks into the
//! transport and the CM; a RETH or AtomicETH it steers names the open region or one of three
//! that must stay shut to this peer (the packet's byte 20 picks, byte 24 after an XRCETH): a
//! region of another PD that grants every right, one that grants remote reads only, and a
//! type 2 window bound to another QP; an XRCETH it steers names one of the three SRQs. Nothing
//! may panic (DESIGN rule 6); no region but the open one ever changes (rule 5), whatever
//! arrives; the device keeps answering Query QP.

#![no_main]

use std::cell::RefCell;

use libfuzzer_sys::fuzz_target;
use softhca::link::sim::reseal;
use softhca::transport::cm::CmEvent;
use softhca::transport::MAX_DATAGRAM;
use softhca::wire::roce::{self, UdpRepr};
use softhca::wire::{IpRepr, Ipv4Repr, UdpChecksum};
use softhca::*;

const PSN: u32 = 100;
const GUARD: u8 = 0x5A;
/// rdma_cm's service ID for TCP port 7174 (rping's default), which the seeds' REQs name.
const SERVICE: u64 = 0x0000_0001_0600_1C06;

struct Target {
    ctx: Context,
    cm: CmAgent,
    qps: Vec<Qp>,
    open: Mr,
    /// Regions that nothing the peer sends may change, each filled with GUARD: one without
    /// remote rights, one of another PD with all of them, one with remote reads only, and
    /// the one under `window`.
    shut: [Mr; 4],
    /// A type 2 window over `shut[3]` granting every remote right, bound to a QP of the same
    /// PD that is not one the packets are steered to (and is in Error).
    window: Mw,
    peer: Gid,
    buf: Vec<u8>,
    inputs: u32,
    /// The XRC target QP, and the SRQ numbers an XRCETH is steered to: its domain's (the open
    /// PD's), another domain's (another PD's), and a basic SRQ's.
    xrc: (Qp, [u32; 3]),
    _xrc_keep: (Xrcd, Xrcd, [Srq; 3]),
    // Dropped with the target: the device's own objects and the peer's.
    _keep: (Pd, Cq, Vec<Ah>, Context, Pd, Cq, Vec<Qp>, (Pd, Qp, Qp, Option<Srq>)),
}

/// A device for the next 256 inputs; every other one has its RC and UC QPs draw their
/// receives from one shared receive queue instead of queues of their own.
fn target(on_srq: bool) -> Target {
    let gid = |n: u8| Gid::from_ipv4([127, 9, 0, n].into());
    let (me, peer) = (gid(2), gid(1));
    let ctx = Context::create(DeviceConfig::default().name("fuzz").gid0(me).seed(7)).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4096).unwrap();
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let open = pd.alloc_mr(8192, all).unwrap();
    let other_pd = ctx.alloc_pd().unwrap();
    let shut = [
        pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap(),
        other_pd.alloc_mr(4096, all).unwrap(),
        pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap(),
        pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::MW_BIND).unwrap(),
    ];
    for mr in &shut {
        mr.write(0, &[GUARD; 4096]).unwrap();
    }
    // The peer's QPs exist only as numbers (the device checks the source address and QPN).
    let peer_ctx = Context::create(DeviceConfig::default().name("peer").gid0(peer).seed(8)).unwrap();
    let peer_pd = peer_ctx.alloc_pd().unwrap();
    let peer_cq = peer_ctx.create_cq(16).unwrap();
    let mut qps = Vec::new();
    let mut peers = Vec::new();
    let mut ahs = Vec::new();
    let srq = on_srq.then(|| pd.create_srq(&SrqInitAttr { max_wr: 64, max_sge: 2, srq_limit: 0 }).unwrap());
    for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
        let attr = |cq| QpInitAttr::new(t, cq, cq).max_send_wr(64).max_recv_wr(64).max_recv_sge(2);
        let shared = srq.as_ref().filter(|_| t != QpType::Ud);
        let qp = match shared {
            Some(srq) => pd.create_qp(&attr(&cq).max_recv_wr(0).srq(srq)).unwrap(),
            None => pd.create_qp(&attr(&cq)).unwrap(),
        };
        let other = peer_pd.create_qp(&attr(&peer_cq)).unwrap();
        let av = AddressVector::new(AhAttr::roce(peer, 0), Mtu::Mtu256);
        match t {
            QpType::Ud => {
                qp.modify(&QpAttr::to_init().port(1).pkey_index(0).qkey(0x1111)).unwrap();
                qp.modify(&QpAttr::new(QpState::Rtr)).unwrap();
                qp.modify(&QpAttr::to_rts().sq_psn(PSN)).unwrap();
            }
            QpType::Uc => {
                qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(Access::REMOTE_WRITE)).unwrap();
                qp.modify(&QpAttr::to_rtr(av, other.qp_num()).rq_psn(PSN)).unwrap();
                qp.modify(&QpAttr::to_rts().sq_psn(PSN)).unwrap();
            }
            _ => {
                qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(all)).unwrap();
                qp.modify(&QpAttr::to_rtr(av, other.qp_num()).rq_psn(PSN).max_dest_rd_atomic(4).min_rnr_timer(1))
                    .unwrap();
                qp.modify(&QpAttr::to_rts().sq_psn(PSN).timeout(10).retry_cnt(2).rnr_retry(2).max_rd_atomic(4))
                    .unwrap();
            }
        }
        let sges: Vec<[Sge; 1]> = (0..8usize).map(|i| [open.sge(1024 * i..1024 * (i + 1))]).collect();
        let wrs: Vec<RecvWr> = sges.iter().enumerate().map(|(i, s)| RecvWr::new(i as u64, s)).collect();
        match shared {
            Some(srq) if t == QpType::Rc => srq.post_recv(&wrs).unwrap(),
            Some(_) => {} // the SRQ's WQEs are posted once, for both QPs
            None => qp.post_recv(&wrs).unwrap(),
        }
        // Something in flight, so that responses (ACKs, Read responses) have a request to match.
        let (read, send) = ([open.sge(0..512)], [open.sge(0..64)]);
        match t {
            QpType::Rc => qp.post_send(&[SendWr::rdma_read(1, &read, 0x1000, 0x1234)]).unwrap(),
            QpType::Uc => qp.post_send(&[SendWr::send(1, &send)]).unwrap(),
            _ => {
                let ah = pd.create_ah(&AhAttr::roce(peer, 0)).unwrap();
                qp.post_send(&[SendWr::send(1, &send).ud(&ah, other.qp_num(), 0x1111)]).unwrap();
                ahs.push(ah);
            }
        }
        qps.push(qp);
        peers.push(other);
    }
    let mut cm = CmAgent::new(&ctx, &pd, 9).unwrap();
    cm.cm().listen(SERVICE);
    let mut buf = vec![0u8; MAX_DATAGRAM];
    // The window: bound by a fourth RC QP, which then goes to Error (its packets are dropped;
    // the window stays bound to it).
    let binder = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    let binder_peer = peer_pd.create_qp(&QpInitAttr::rc(&peer_cq, &peer_cq)).unwrap();
    let av = AddressVector::new(AhAttr::roce(peer, 0), Mtu::Mtu256);
    binder.modify(&QpAttr::to_init().port(1).pkey_index(0).access(Access::MW_BIND)).unwrap();
    binder
        .modify(&QpAttr::to_rtr(av, binder_peer.qp_num()).rq_psn(PSN).max_dest_rd_atomic(1).min_rnr_timer(1))
        .unwrap();
    binder.modify(&QpAttr::to_rts().sq_psn(PSN).timeout(10).retry_cnt(2).rnr_retry(2).max_rd_atomic(1)).unwrap();
    let window = pd.alloc_mw_of(MwType::Type2).unwrap();
    let key = (window.rkey() as u8).wrapping_add(1);
    let remote = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    binder.post_send(&[SendWr::bind_mw(1, &window, &shut[3], shut[3].addr(), 4096, remote).new_key(key)]).unwrap();
    while ctx.transmit(0, &mut buf).is_some() {}
    assert_eq!(window.rkey() as u8, key, "the window is bound");
    binder.modify(&QpAttr::new(QpState::Error)).unwrap();
    while ctx.transmit(0, &mut buf).is_some() {}
    // XRC: a target QP toward a peer's initiator, its domain's SRQ stocked with receives into
    // the open region.
    let (xa, xb) = (ctx.open_xrcd().unwrap(), ctx.open_xrcd().unwrap());
    let srqs = [
        pd.create_xrc_srq(&xa, &cq, &SrqInitAttr { max_wr: 64, max_sge: 2, srq_limit: 0 }).unwrap(),
        other_pd.create_xrc_srq(&xb, &cq, &SrqInitAttr { max_wr: 64, max_sge: 2, srq_limit: 0 }).unwrap(),
        other_pd.create_srq(&SrqInitAttr { max_wr: 64, max_sge: 2, srq_limit: 0 }).unwrap(),
    ];
    let sges: Vec<[Sge; 1]> = (0..8usize).map(|i| [open.sge(1024 * i..1024 * (i + 1))]).collect();
    let wrs: Vec<RecvWr> = sges.iter().enumerate().map(|(i, s)| RecvWr::new(i as u64, s)).collect();
    srqs[0].post_recv(&wrs).unwrap();
    let tgt = xa.create_tgt_qp().unwrap();
    tgt.modify(&QpAttr::to_init().port(1).pkey_index(0).access(all)).unwrap();
    tgt.modify(&QpAttr::to_rtr(av, 0x4242).rq_psn(PSN).max_dest_rd_atomic(4).min_rnr_timer(1)).unwrap();
    tgt.modify(&QpAttr::to_rts().sq_psn(PSN).timeout(10)).unwrap();
    let srqns = [srqs[0].srq_num(), srqs[1].srq_num(), srqs[2].srq_num()];
    let keep = (pd, cq, ahs, peer_ctx, peer_pd, peer_cq, peers, (other_pd, binder, binder_peer, srq));
    Target {
        ctx,
        cm,
        qps,
        open,
        shut,
        window,
        peer,
        buf,
        inputs: 0,
        xrc: (tgt, srqns),
        _xrc_keep: (xa, xb, srqs),
        _keep: keep,
    }
}

thread_local! {
    static TARGET: RefCell<Option<Target>> = const { RefCell::new(None) };
    /// Devices made so far: odd ones are on an SRQ (see `target`).
    static MADE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fuzz_target!(|data: &[u8]| {
    let Some((&steer, packet)) = data.split_first() else { return };
    TARGET.with(|cell| {
        let mut slot = cell.borrow_mut();
        // A fresh device now and then: QPs that went to Error stop reaching the transport.
        if slot.as_ref().is_none_or(|t| t.inputs >= 256) {
            let made = MADE.with(|m| m.replace(m.get() + 1));
            *slot = Some(target(made % 2 == 1));
        }
        let t = slot.as_mut().unwrap();
        t.inputs += 1;
        let mut packet = packet.to_vec();
        // Steering bits 0-1: which QP (3: the GSI, QP1, or with bit 3 the XRC target).
        let xrc = steer & 3 == 3 && steer & 8 != 0;
        let gsi = steer & 3 == 3 && !xrc;
        if steer & 0x80 != 0 && packet.len() >= 12 {
            let qpn = match steer & 3 {
                _ if xrc => t.xrc.0.qp_num(),
                3 => 1,
                q => t.qps[usize::from(q)].qp_num(),
            };
            packet[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
            packet[2..4].copy_from_slice(&[0xff, 0xff]); // the default P_Key
        }
        if steer & 0x40 != 0 && packet.len() >= 12 {
            let psn = PSN + u32::from(steer >> 2 & 1);
            packet[9..12].copy_from_slice(&psn.to_be_bytes()[1..]);
        }
        // An XRC request: an XRCETH naming one of the SRQs, then the RETH or AtomicETH.
        let key_at = if xrc && steer & 0x20 != 0 && packet.len() >= 16 {
            let srqn = t.xrc.1[usize::from(packet[12] & 3).min(2)];
            packet[12..16].copy_from_slice(&srqn.to_be_bytes());
            16
        } else {
            12
        };
        if steer & 0x20 != 0 && gsi && packet.len() >= 16 {
            // The DETH's Q_Key: the GSI's well-known one.
            packet[12..16].copy_from_slice(&0x8001_0000u32.to_be_bytes());
        } else if steer & 0x20 != 0 && packet.len() >= key_at + 16 {
            // Where a RETH or AtomicETH would be after a plain BTH (or an XRCETH): the open
            // region, or one that must stay shut (the key's first byte picks).
            let (addr, rkey) = match packet[key_at + 8] & 3 {
                0 => (t.open.addr(), t.open.rkey()),
                1 => (t.shut[1].addr(), t.shut[1].rkey()),
                2 => (t.shut[2].addr(), t.shut[2].rkey()),
                _ => (t.shut[3].addr(), t.window.rkey()),
            };
            packet[key_at..key_at + 8].copy_from_slice(&addr.to_be_bytes());
            packet[key_at + 8..key_at + 12].copy_from_slice(&rkey.to_be_bytes());
        }
        let me = t.ctx.query_gid(1, 0).unwrap();
        let ip = IpRepr::V4(Ipv4Repr::new(t.peer.to_ipv4().unwrap(), me.to_ipv4().unwrap()));
        let udp = UdpRepr::for_qp(0x11, UdpChecksum::Zero);
        let mut d = vec![0u8; 28 + packet.len() + 4];
        if roce::emit_ip_udp(&ip, &udp, packet.len() + 4, &mut d).is_err() {
            return;
        }
        d[28..28 + packet.len()].copy_from_slice(&packet);
        let _ = reseal(&mut d);
        let now = u64::from(t.inputs) * 1_000_000;
        t.ctx.receive(now, &d);
        t.ctx.handle_timeout(now);
        // The connection manager takes what reached QP1 and answers: a request accepted onto
        // the RC QP or rejected, as the steering byte's bit 4 says.
        let _ = t.cm.receive(now);
        let rc = t.qps[0].qp_num();
        while let Some(event) = t.cm.cm().poll_event() {
            match event {
                CmEvent::ConnectRequest { id, .. } if steer & 0x10 != 0 => {
                    t.cm.cm().accept(now, id, rc, PSN);
                }
                CmEvent::ConnectRequest { id, .. } | CmEvent::SidrRequest { id, .. } => {
                    t.cm.cm().reject(id, 28);
                }
                _ => {}
            }
        }
        t.cm.transmit();
        while t.ctx.transmit(now, &mut t.buf).is_some() {}
        let mut guard = [0u8; 4096];
        let names = ["no remote rights", "another PD's", "remote reads only", "the window's"];
        for (which, mr) in names.iter().zip(&t.shut) {
            mr.read(0, &mut guard).unwrap();
            assert!(guard.iter().all(|&b| b == GUARD), "a region that must stay shut changed: {which}");
        }
        for qp in t.qps.iter().chain([&t.xrc.0]) {
            let _ = qp.query().unwrap();
        }
    });
});
