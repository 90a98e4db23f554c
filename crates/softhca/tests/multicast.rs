//! UD multicast on the sim fabric (IBA 10.5, Attach/Detach QP to/from Multicast Group): a
//! Send to a multicast GID with DestQP 0xFFFFFF reaches every UD QP attached to the group, on
//! every device, the sender's own included, each checked as a unicast packet would be; the
//! verbs' checks and errors are Linux's (`ib_attach_mcast`, uverbs, rxe's limits).

mod common;

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

use common::poll_all;
use softhca::link::sim::ip_between;
use softhca::link::{DeviceId, SimConfig, SimFabric};
use softhca::transport::MAX_DATAGRAM;
use softhca::wire::roce::UdpRepr;
use softhca::wire::{BthRepr, DethRepr, Opcode, PacketRepr, Psn, RoceRepr, UdpChecksum};
use softhca::*;

const MULTICAST_QPN: u32 = 0xFF_FFFF;
const QKEY: u32 = 0x1111;

fn group(last: u8) -> Gid {
    Gid::from_ipv4(Ipv4Addr::new(224, 1, 2, last))
}

struct Node {
    ctx: Context,
    pd: Pd,
    cq: Cq,
}

impl Node {
    fn new(ctx: Context) -> Node {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(256).unwrap();
        Node { ctx, pd, cq }
    }

    /// A UD QP in RTS with Q_Key `qkey` and `n` receives of 256 bytes posted.
    fn ud(&self, qkey: u32, n: u64) -> (Qp, Mr) {
        let qp = self.pd.create_qp(&QpInitAttr::ud(&self.cq, &self.cq).max_send_wr(64).max_recv_wr(64)).unwrap();
        qp.modify(&QpAttr::to_init().port(1).pkey_index(0).qkey(qkey)).unwrap();
        qp.modify(&QpAttr::new(QpState::Rtr)).unwrap();
        qp.modify(&QpAttr::to_rts().sq_psn(0)).unwrap();
        let mr = self.pd.alloc_mr(256 * n as usize, Access::LOCAL_WRITE).unwrap();
        let wrs: Vec<_> = (0..n).map(|i| (i, [mr.sge(i as usize * 256..(i as usize + 1) * 256)])).collect();
        qp.post_recv(&wrs.iter().map(|(i, s)| RecvWr::new(*i, s)).collect::<Vec<_>>()).unwrap();
        (qp, mr)
    }
}

/// The receive completions `cq` holds, as (QP, source QP, byte count).
fn received(cq: &Cq) -> Vec<(u32, u32, u32)> {
    let mut v: Vec<_> = poll_all(cq)
        .iter()
        .filter(|w| w.opcode == WcOpcode::Recv)
        .map(|w| {
            assert_eq!(w.status, WcStatus::Success);
            (w.qp_num, w.src_qp, w.byte_len)
        })
        .collect();
    v.sort();
    v
}

/// Three devices on one fabric, a sender on the first: every QP attached to the group gets the
/// packet, the sender itself and its neighbour on the same device included; a QP not attached,
/// one with another Q_Key, and one attached to another group do not. After a detach, and
/// after a Destroy QP, the QP no longer gets them. Rule CRT-QP-15, PKT-VAL-10, PKT-ROCE-11
#[test]
fn a_send_to_a_group_reaches_every_attached_qp() {
    let mut f = SimFabric::new(SimConfig::default());
    let nodes: Vec<Node> = (0..3).map(|i| Node::new(f.add_device(&format!("mc{i}")).unwrap())).collect();
    let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
    let (sender, _m0) = a.ud(QKEY, 4);
    let (a2, _m1) = a.ud(QKEY, 4);
    let (b1, b1_mem) = b.ud(QKEY, 4);
    let (b2, _m3) = b.ud(QKEY, 4);
    let (c1, _m4) = c.ud(0x2222, 4);
    let (c2, _m5) = c.ud(QKEY, 4);
    for qp in [&sender, &a2, &b1, &c1] {
        qp.attach_mcast(group(3), 0).unwrap();
    }
    c2.attach_mcast(group(4), 0).unwrap();
    assert_eq!(b2.mcast_groups(), vec![]);
    assert_eq!(b1.mcast_groups(), vec![group(3)]);

    let ah = a.pd.create_ah(&AhAttr::roce(group(3), 0)).unwrap();
    let src = a.pd.reg_mr(b"to the group".to_vec(), Access::LOCAL_WRITE).unwrap();
    let send = |id| sender.post_send(&[SendWr::send(id, &[src.sge(0..12)]).ud(&ah, MULTICAST_QPN, QKEY).signaled()]);
    send(1).unwrap();
    f.run_until_idle();
    let s = sender.qp_num();
    assert_eq!(received(&a.cq), vec![(s, s, 52), (a2.qp_num(), s, 52)]);
    assert_eq!(received(&b.cq), vec![(b1.qp_num(), s, 52)]);
    assert_eq!(received(&c.cq), vec![]);
    assert_eq!(c.ctx.counters().qkey_violations, 1);
    // The GRH area: the IPv4 header, from the sender's address to the group's.
    let got = b1_mem.to_vec().unwrap();
    assert_eq!(&got[20 + 12..20 + 16], &f.gid(DeviceId(0)).unwrap().to_ipv4().unwrap().octets());
    assert_eq!(&got[20 + 16..20 + 20], &[224, 1, 2, 3]);
    assert_eq!(&got[40..52], b"to the group");

    b1.detach_mcast(group(3), 0).unwrap();
    a2.destroy().unwrap();
    send(2).unwrap();
    f.run_until_idle();
    assert_eq!(received(&a.cq), vec![(s, s, 52)]);
    assert_eq!(received(&b.cq), vec![]);
}

/// Linux's answers: only UD QPs and multicast GIDs (EINVAL), the LID ignored on a RoCE port,
/// attaching twice is one membership, detaching what is not attached is EINVAL, a destroyed
/// QP's handle is invalid, and the device's limits give insufficient resources (ENOMEM).
#[test]
fn attach_and_detach_check_like_linux() {
    let mut cfg = DeviceConfig::default().name("mc-limits");
    cfg.attr.max_mcast_grp = 2;
    cfg.attr.max_mcast_qp_attach = 2;
    cfg.attr.max_total_mcast_qp_attach = 3;
    let n = Node::new(Context::create(cfg).unwrap());
    let (q1, _) = n.ud(QKEY, 0);
    let (q2, _) = n.ud(QKEY, 0);
    let (q3, _) = n.ud(QKEY, 0);
    let rc = n.pd.create_qp(&QpInitAttr::rc(&n.cq, &n.cq)).unwrap();
    let invalid = |r: Result<()>| matches!(r, Err(VerbsError::InvalidArgument(_)));
    assert!(invalid(rc.attach_mcast(group(1), 0)), "a UD QP only");
    assert!(invalid(q1.attach_mcast(Gid::from_ipv4(Ipv4Addr::new(10, 0, 0, 1)), 0)), "a multicast GID only");
    let ipv6_group = Gid(*b"\xff\x0e\0\0\0\0\0\0\0\0\0\0\0\0\0\x07");
    q1.attach_mcast(ipv6_group, 0xBEEF).unwrap();
    q1.attach_mcast(ipv6_group, 0).unwrap();
    assert_eq!(q1.mcast_groups(), vec![ipv6_group], "one membership");
    q2.attach_mcast(ipv6_group, 0).unwrap();
    assert_eq!(q3.attach_mcast(ipv6_group, 0), Err(VerbsError::InsufficientResources), "QPs per group");
    q3.attach_mcast(group(1), 0).unwrap();
    assert_eq!(q3.attach_mcast(group(2), 0), Err(VerbsError::InsufficientResources), "attachments in all");
    q1.detach_mcast(ipv6_group, 0).unwrap();
    assert!(invalid(q1.detach_mcast(ipv6_group, 0)), "not attached any more");
    assert_eq!(q2.attach_mcast(group(2), 0), Err(VerbsError::InsufficientResources), "groups");
    q2.destroy().unwrap();
    assert_eq!(q2.attach_mcast(group(1), 0), Err(VerbsError::InvalidQpHandle));
    q3.attach_mcast(group(2), 0).unwrap();

    let mut none = DeviceConfig::default().name("mc-none");
    none.attr.max_mcast_grp = 0;
    let n = Node::new(Context::create(none).unwrap());
    let (q, _) = n.ud(QKEY, 0);
    assert!(matches!(q.attach_mcast(group(1), 0), Err(VerbsError::NotSupported(_))));
}

/// The link hears a group from its first member's attach to its last member's detach or
/// destroy, and a link that cannot join makes the attach fail (nothing attached).
#[test]
fn the_link_joins_with_the_first_member_and_leaves_with_the_last() {
    let n = Node::new(Context::create(DeviceConfig::default().name("mc-link")).unwrap());
    let calls = Arc::new(Mutex::new(Vec::new()));
    let log = calls.clone();
    n.ctx.set_group_listener(Some(Arc::new(move |g: Gid, on| {
        log.lock().unwrap().push((g.0[15], on));
        g != group(9)
    })));
    let (q1, _) = n.ud(QKEY, 0);
    let (q2, _) = n.ud(QKEY, 0);
    q1.attach_mcast(group(1), 0).unwrap();
    q2.attach_mcast(group(1), 0).unwrap();
    q2.attach_mcast(group(2), 0).unwrap();
    assert!(matches!(q1.attach_mcast(group(9), 0), Err(VerbsError::NotSupported(_))));
    assert_eq!(q1.mcast_groups(), vec![group(1)]);
    q1.detach_mcast(group(1), 0).unwrap();
    q2.destroy().unwrap();
    let mut got = calls.lock().unwrap().clone();
    got[3..].sort();
    // Group 1 stays joined after q1's detach (q2 is still a member); q2's destroy leaves both.
    assert_eq!(got, vec![(1, true), (2, true), (9, true), (1, false), (2, false)]);
}

/// A UD Send Only datagram from `src` to `dst` for QP `dest_qp` with Q_Key `qkey`.
fn ud_datagram(src: Gid, dst: Gid, dest_qp: u32, qkey: u32) -> Vec<u8> {
    let ip = ip_between(src.to_ipv6(), dst.to_ipv6());
    let repr = RoceRepr {
        ip,
        udp: UdpRepr::for_qp(0x11, UdpChecksum::default_for(&ip)),
        packet: PacketRepr {
            deth: Some(DethRepr { q_key: qkey, src_qp: 0x33 }),
            payload: b"hi",
            ..PacketRepr::new(BthRepr::new(Opcode::UdSendOnly, 0xffff, dest_qp, Psn::new(0)))
        },
    };
    let mut buf = vec![0; MAX_DATAGRAM];
    let len = repr.emit(&mut buf).unwrap();
    buf.truncate(len);
    buf
}

/// IBA 10.5: a multicast packet is one addressed to a multicast GID with DestQP 0xFFFFFF;
/// either without the other is dropped, even where a QP would otherwise take it.
#[test]
fn a_group_address_and_the_multicast_qpn_come_together() {
    let n = Node::new(Context::create(DeviceConfig::default().name("mc-mixed")).unwrap());
    let (q, _mem) = n.ud(QKEY, 4);
    q.attach_mcast(group(1), 0).unwrap();
    let me = n.ctx.query_gid(1, 0).unwrap();
    let peer = Gid::from_ipv4(Ipv4Addr::new(127, 1, 0, 9));
    let dropped = || n.ctx.counters().rx_dropped;
    let before = dropped();
    n.ctx.receive(0, &ud_datagram(peer, me, MULTICAST_QPN, QKEY));
    n.ctx.receive(0, &ud_datagram(peer, group(1), q.qp_num(), QKEY));
    assert_eq!(dropped(), before + 2);
    assert_eq!(received(&n.cq), vec![]);
    n.ctx.receive(0, &ud_datagram(peer, group(1), MULTICAST_QPN, QKEY));
    assert_eq!(received(&n.cq), vec![(q.qp_num(), 0x33, 42)]);
}
