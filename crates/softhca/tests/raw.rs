//! The Raw datagram services on the sim fabric: a Raw Ethertype QP sends and receives whole
//! Ethernet frames (as libibverbs' Raw Packet QP does on a RoCE port), a Raw IPv6 QP whole IPv6
//! datagrams; the post rules of the Raw column, SQE and its recovery, the CQEs, and what a
//! device whose link carries no raw packets answers.

mod common;

use common::poll_all;
use softhca::link::sim::{DeviceId, SimConfig, SimFabric};
use softhca::*;

/// An EtherType for local experiments (IEEE 802 "Local Experimental Ethertype 1").
const LOCAL_EXPERIMENTAL: u16 = 0x88B5;

struct End {
    ctx: Context,
    pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

/// A device on `fabric` with a Raw QP of `qp_type` taken to RTS (the port at Reset → Init,
/// nothing after: MOD-RAW-1) and 8 receives of 2 KiB posted.
fn end(fabric: &mut SimFabric, name: &str, qp_type: QpType) -> End {
    let ctx = fabric.add_device(name).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let qp = pd.create_qp(&QpInitAttr::new(qp_type, &cq, &cq)).unwrap();
    qp.modify(&QpAttr::to_init().port(1)).unwrap();
    qp.modify(&QpAttr::new(QpState::Rtr)).unwrap();
    qp.modify(&QpAttr::to_rts()).unwrap();
    let mr = pd.alloc_mr(64 * 1024, Access::LOCAL_WRITE).unwrap();
    for i in 0..8u64 {
        let at = 32 * 1024 + i as usize * 2048;
        qp.post_recv(&[RecvWr::new(100 + i, &[mr.sge(at..at + 2048)])]).unwrap();
    }
    End { ctx, pd, cq, qp, mr }
}

fn frame(dst: [u8; 6], src: [u8; 6], ethertype: u16, payload: &[u8]) -> Vec<u8> {
    [&dst[..], &src[..], &ethertype.to_be_bytes()[..], payload].concat()
}

/// Writes `bytes` into `e`'s send buffer `wr_id` (of 8, 2 KiB each: the WQE gathers them
/// when its packet goes) and sends them from there.
fn send(e: &End, wr_id: u64, bytes: &[u8], raw: Option<RawFields>) {
    let at = (wr_id % 8) as usize * 2048;
    e.mr.write(at, bytes).unwrap();
    let sge = [e.mr.sge(at..at + bytes.len())];
    let mut wr = SendWr::send(wr_id, &sge).signaled();
    if let Some(r) = raw {
        wr = wr.raw(r);
    }
    e.qp.post_send(&[wr]).unwrap();
}

/// The bytes a receive CQE says landed in `e`'s receive buffer `i` (wr_id 100 + i).
fn received(e: &End, wc: &Wc) -> Vec<u8> {
    let mut out = vec![0u8; wc.byte_len as usize];
    e.mr.read(32 * 1024 + (wc.wr_id - 100) as usize * 2048, &mut out).unwrap();
    out
}

fn statuses(cq: &Cq) -> Vec<(u64, WcStatus)> {
    poll_all(cq).iter().map(|w| (w.wr_id, w.status)).collect()
}

/// A frame to the peer's MAC arrives whole, destination MAC on, in the peer's Raw Ethertype
/// QP; the CQE is a Receive of the frame's length; the send completes. A broadcast frame
/// reaches every other device's Raw Ethertype QP.
/// Rule WR-SQ-1
#[test]
fn an_ethertype_frame_arrives_whole() {
    let mut f = SimFabric::new(SimConfig::default().seed(1));
    let (a, b, c) = (
        end(&mut f, "ra", QpType::RawEthertype),
        end(&mut f, "rb", QpType::RawEthertype),
        end(&mut f, "rc", QpType::RawEthertype),
    );
    let (ma, mb) = (f.mac(DeviceId(0)).unwrap(), f.mac(DeviceId(1)).unwrap());
    let unicast = frame(mb, ma, LOCAL_EXPERIMENTAL, b"to b alone");
    send(&a, 1, &unicast, None);
    let broadcast = frame([0xff; 6], ma, LOCAL_EXPERIMENTAL, &[7u8; 1000]);
    send(&a, 2, &broadcast, None);
    assert!(f.run_until_idle());
    assert_eq!(statuses(&a.cq), vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
    let wb = poll_all(&b.cq);
    assert_eq!(wb.len(), 2);
    for (wc, want) in wb.iter().zip([&unicast, &broadcast]) {
        assert_eq!((wc.status, wc.opcode, wc.byte_len as usize), (WcStatus::Success, WcOpcode::Recv, want.len()));
        assert_eq!(wc.qp_num, b.qp.qp_num());
        assert_eq!(&received(&b, wc), want);
    }
    let wc = poll_all(&c.cq);
    assert_eq!(wc.len(), 1, "the broadcast only");
    assert_eq!(received(&c, &wc[0]), broadcast);
    assert_eq!(a.ctx.counters().rx_packets, 0, "a sender does not hear its own broadcast");
}

/// WR-SEND-8: the WR's EtherType goes into the frame's EtherType field (the RWH's place on
/// Ethernet). WR-SEND-7: the WR's DLID, SL and Source Path Bits have no LRH to go into on a
/// RoCE port: accepted, and the frame on the wire is the message itself.
/// Rule WR-SEND-7, WR-SEND-8
#[test]
fn the_wr_ethertype_is_written_and_the_lrh_fields_go_nowhere() {
    let mut f = SimFabric::new(SimConfig::default().seed(2));
    let (a, b) = (end(&mut f, "ra", QpType::RawEthertype), end(&mut f, "rb", QpType::RawEthertype));
    let (ma, mb) = (f.mac(DeviceId(0)).unwrap(), f.mac(DeviceId(1)).unwrap());
    let msg = frame(mb, ma, 0x0000, b"typed by the WR");
    send(&a, 1, &msg, Some(RawFields { ethertype: Some(LOCAL_EXPERIMENTAL), ..Default::default() }));
    send(&a, 2, &msg, Some(RawFields { dlid: 0x1234, sl: 5, src_path_bits: 3, ethertype: None }));
    assert!(f.run_until_idle());
    assert_eq!(statuses(&a.cq), vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
    let wb = poll_all(&b.cq);
    let mut typed = msg.clone();
    typed[12..14].copy_from_slice(&LOCAL_EXPERIMENTAL.to_be_bytes());
    assert_eq!(received(&b, &wb[0]), typed);
    assert_eq!(received(&b, &wb[1]), msg, "DLID, SL and Source Path Bits leave no trace");
}

/// A Raw IPv6 QP sends its message as the IPv6 datagram it is, routed by its destination
/// address; the peer's Raw IPv6 QP receives it whole. Frames do not reach it, nor IPv6
/// datagrams the Raw Ethertype QPs.
#[test]
fn an_ipv6_datagram_arrives_whole() {
    let mut f = SimFabric::new(SimConfig::default().seed(3));
    let (a, b) = (end(&mut f, "ra", QpType::RawIpv6), end(&mut f, "rb", QpType::RawIpv6));
    let eth = end(&mut f, "rc", QpType::RawEthertype);
    let (src, dst) = (f.gid(DeviceId(0)).unwrap(), f.gid(DeviceId(1)).unwrap());
    let payload = b"no transport header at all";
    let mut d = vec![0x60, 0, 0, 0];
    d.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    d.extend_from_slice(&[253, 64]); // next header 253 (experimentation), hop limit
    d.extend_from_slice(&src.to_ipv6().octets());
    d.extend_from_slice(&dst.to_ipv6().octets());
    d.extend_from_slice(payload);
    send(&a, 1, &d, None);
    assert!(f.run_until_idle());
    assert_eq!(statuses(&a.cq), vec![(1, WcStatus::Success)]);
    let wb = poll_all(&b.cq);
    assert_eq!(wb.len(), 1);
    assert_eq!(received(&b, &wb[0]), d);
    assert!(poll_all(&eth.cq).is_empty());
}

/// The Raw column of the Post Send table: Send only; RDMA, atomics and binds are
/// `InvalidWrType`, and a Send with Immediate an immediate error.
/// Rule WR-SQ-2, WR-SQ-3, WR-SQ-4, WR-SQ-5, WR-SQ-6
#[test]
fn a_raw_qp_posts_sends_only() {
    let mut f = SimFabric::new(SimConfig::default().seed(4));
    for t in [QpType::RawEthertype, QpType::RawIpv6] {
        let e = end(&mut f, if t == QpType::RawIpv6 { "r6" } else { "re" }, t);
        let sge = [e.mr.sge(0..64)];
        let eight = [e.mr.sge(0..8)];
        let mw = e.pd.alloc_mw().unwrap();
        for wr in [
            SendWr::rdma_write(1, &sge, 0, 0),
            SendWr::rdma_read(1, &sge, 0, 0),
            SendWr::atomic_fetch_add(1, &eight, 0, 0, 1),
            SendWr::atomic_cmp_swp(1, &eight, 0, 0, 1, 2),
            SendWr::bind_mw(1, &mw, &e.mr, 0, 64, Access::REMOTE_READ),
            SendWr::send(1, &sge).imm(5),
        ] {
            let err = e.qp.post_send(std::slice::from_ref(&wr)).unwrap_err();
            assert_eq!(err.error, VerbsError::InvalidWrType, "{t:?} {:?}", wr.opcode);
        }
    }
}

/// A Send whose key does not cover its buffer completes with Local Protection Error and
/// takes the QP to SQE (as UD's do); SQE → RTS with nothing else recovers it, and the next
/// Send goes. A frame shorter than its 14-byte header is a Local Length Error.
/// Rule QPT-AUTO-1, ERR-SQ-1, MOD-SQE-RTS-1
#[test]
fn a_failed_send_takes_a_raw_qp_to_sqe_and_back() {
    let mut f = SimFabric::new(SimConfig::default().seed(5));
    let (a, b) = (end(&mut f, "ra", QpType::RawEthertype), end(&mut f, "rb", QpType::RawEthertype));
    let (ma, mb) = (f.mac(DeviceId(0)).unwrap(), f.mac(DeviceId(1)).unwrap());
    let bad = [Sge { addr: a.mr.addr(), length: 64, lkey: a.mr.lkey() ^ 0x100 }];
    a.qp.post_send(&[SendWr::send(1, &bad).signaled()]).unwrap();
    assert!(f.run_until_idle());
    assert_eq!(statuses(&a.cq), vec![(1, WcStatus::LocProtErr)]);
    assert_eq!(a.qp.query().unwrap().qp_state, QpState::Sqe);
    a.qp.modify(&QpAttr::to_rts()).unwrap();
    send(&a, 2, &frame(mb, ma, LOCAL_EXPERIMENTAL, b"after recovery"), None);
    assert!(f.run_until_idle());
    assert_eq!(statuses(&a.cq), vec![(2, WcStatus::Success)]);
    assert_eq!(poll_all(&b.cq).len(), 1);
    send(&a, 3, &[0u8; 13], None);
    assert!(f.run_until_idle());
    assert_eq!(statuses(&a.cq), vec![(3, WcStatus::LocLenErr)]);
}

/// A frame longer than the receive buffer completes that receive with Local Length Error and
/// the QP goes to Error; with no receive posted a frame is dropped and counted, as UD's are.
#[test]
fn receive_errors_and_drops() {
    let mut f = SimFabric::new(SimConfig::default().seed(6));
    let a = end(&mut f, "ra", QpType::RawEthertype);
    let ctx = f.add_device("rb").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8).unwrap();
    let qp = pd.create_qp(&QpInitAttr::new(QpType::RawEthertype, &cq, &cq)).unwrap();
    for s in [QpAttr::to_init().port(1), QpAttr::new(QpState::Rtr)] {
        qp.modify(&s).unwrap();
    }
    let (ma, mb) = (f.mac(DeviceId(0)).unwrap(), f.mac(DeviceId(1)).unwrap());
    send(&a, 1, &frame(mb, ma, LOCAL_EXPERIMENTAL, b"nobody waits"), None);
    assert!(f.run_until_idle());
    assert_eq!(ctx.counters().rx_dropped, 1);
    let small = pd.alloc_mr(16, Access::LOCAL_WRITE).unwrap();
    qp.post_recv(&[RecvWr::new(9, &[small.sge(0..16)])]).unwrap();
    send(&a, 2, &frame(mb, ma, LOCAL_EXPERIMENTAL, b"longer than sixteen bytes"), None);
    assert!(f.run_until_idle());
    assert_eq!(statuses(&cq), vec![(9, WcStatus::LocLenErr)]);
    assert_eq!(qp.query().unwrap().qp_state, QpState::Error);
}

/// A device whose link carries no raw packets (the default `DeviceAttr`, as the UDP link's
/// devices have) refuses Raw QPs at Create QP, never dropping their packets silently later;
/// one that does refuses a QP past its `max_raw_ethy_qp`.
#[test]
fn create_qp_says_when_raw_packets_cannot_go() {
    let ctx = Context::create(DeviceConfig::default().name("no-raw")).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8).unwrap();
    for t in [QpType::RawEthertype, QpType::RawIpv6] {
        assert!(matches!(pd.create_qp(&QpInitAttr::new(t, &cq, &cq)), Err(VerbsError::InvalidServiceType(_))));
    }
    let mut f = SimFabric::new(SimConfig::default());
    let mut cfg = DeviceConfig::default().name("two-raw");
    cfg.attr.max_raw_ethy_qp = 2;
    let ctx = f.add_device_with(cfg).unwrap();
    assert_eq!(ctx.query_device().unwrap().max_raw_ethy_qp, 2);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8).unwrap();
    let init = QpInitAttr::new(QpType::RawEthertype, &cq, &cq);
    let (q1, _q2) = (pd.create_qp(&init).unwrap(), pd.create_qp(&init).unwrap());
    assert_eq!(pd.create_qp(&init).unwrap_err(), VerbsError::InsufficientResources);
    q1.destroy().unwrap();
    pd.create_qp(&init).unwrap();
}

/// On a lossy, duplicating, reordering and corrupting fabric, Raw frames are unreliable as
/// UD datagrams are: every send completes successfully, each frame arrives whole or not at all
/// (a corrupted one is discarded by the receiving port's FCS check, never delivered with
/// flipped bits), a duplicate may arrive twice, and the fabric's books balance.
#[test]
fn raw_frames_on_a_faulty_fabric_arrive_whole_or_not_at_all() {
    let mut f = SimFabric::new(SimConfig::default().seed(9).loss(0.2).dup(0.1).reorder(0.2).corrupt(0.2));
    let (a, b) = (end(&mut f, "ra", QpType::RawEthertype), end(&mut f, "rb", QpType::RawEthertype));
    let (ma, mb) = (f.mac(DeviceId(0)).unwrap(), f.mac(DeviceId(1)).unwrap());
    let mut wcs = Vec::new();
    for round in 0..50u64 {
        for i in 0..8u64 {
            b.qp.post_recv(&[RecvWr::new(
                100 + i,
                &[b.mr.sge(32 * 1024 + i as usize * 2048..32 * 1024 + (i as usize + 1) * 2048)],
            )])
            .unwrap();
        }
        let wr = round % 8;
        send(&a, wr, &frame(mb, ma, LOCAL_EXPERIMENTAL, &[round as u8; 200]), None);
        assert!(f.run_until_idle());
        assert_eq!(statuses(&a.cq), vec![(wr, WcStatus::Success)]);
        for wc in poll_all(&b.cq) {
            assert_eq!(received(&b, &wc), frame(mb, ma, LOCAL_EXPERIMENTAL, &[round as u8; 200]), "whole");
            wcs.push(round);
        }
        // Unused receives are flushed off by a reset, ready for the next round.
        b.qp.modify(&QpAttr::new(QpState::Reset)).unwrap();
        for s in [QpAttr::to_init().port(1), QpAttr::new(QpState::Rtr)] {
            b.qp.modify(&s).unwrap();
        }
    }
    let c = f.counters();
    assert!(c.lost > 0 && c.fcs_dropped > 0 && c.duplicated > 0, "{c:?}");
    assert_eq!(c.sent - c.filtered - c.dropped_no_route - c.lost - c.fcs_dropped + c.duplicated, c.delivered);
    assert!(!wcs.is_empty() && wcs.len() < 50 + c.duplicated as usize);
}

/// A link that carries raw packets hears of a device's first Raw QP of a type and of its last
/// (`Context::set_raw_listener`), during Create and Destroy QP and in that order, so that it
/// listens exactly while such QPs exist (the UDP link binds its packet socket then). A link
/// that cannot start listening makes Create QP fail with Insufficient Resources, and nothing
/// is registered: the device still takes as many Raw QPs as before.
#[test]
fn the_link_hears_of_the_first_and_the_last_raw_qp() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let mut f = SimFabric::new(SimConfig::default());
    let mut cfg = DeviceConfig::default().name("listened");
    cfg.attr.max_raw_ethy_qp = 2;
    let ctx = f.add_device_with(cfg).unwrap();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let refuse = Arc::new(AtomicBool::new(true));
    let (seen, refusing) = (calls.clone(), refuse.clone());
    ctx.set_raw_listener(Some(Arc::new(move |qp_type, on| {
        seen.lock().unwrap().push((qp_type, on));
        !(on && refusing.load(Ordering::Relaxed))
    })));
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8).unwrap();
    let init = QpInitAttr::new(QpType::RawEthertype, &cq, &cq);
    assert_eq!(pd.create_qp(&init).unwrap_err(), VerbsError::InsufficientResources);
    refuse.store(false, Ordering::Relaxed);
    let (q1, q2) = (pd.create_qp(&init).unwrap(), pd.create_qp(&init).unwrap());
    assert_eq!(pd.create_qp(&init).unwrap_err(), VerbsError::InsufficientResources, "max_raw_ethy_qp");
    q1.destroy().unwrap();
    assert_eq!(calls.lock().unwrap().len(), 2, "a QP that is not the last changes nothing");
    q2.destroy().unwrap();
    let want = [(QpType::RawEthertype, true), (QpType::RawEthertype, true), (QpType::RawEthertype, false)];
    assert_eq!(*calls.lock().unwrap(), want);
    // The refused QP held nothing: the CQ and the PD go.
    cq.destroy().unwrap();
    pd.dealloc().unwrap();
}
