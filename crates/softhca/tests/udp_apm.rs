//! Automatic Path Migration over the UDP link: each device has a second address (GID 1,
//! `UdpConfig::alt_addr`), the QPs load the alternate path GID 1 ↔ GID 1 and rearm, and then the
//! peer's primary address stops answering (a tap on each device drops what arrives from it).
//! The requester runs out of retries on the primary path, migrates, and everything carries on
//! between the second addresses: no completion lost or repeated, Path Migrated on both ends.

mod udp_common;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use softhca::link::udp::{RxMode, UdpConfig, UdpDevice};
use softhca::link::{Fate, Tap, TapHandle};
use softhca::wire::roce;
use softhca::*;
use udp_common::{end, wait, End};

fn v4(a: [u8; 4]) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(a))
}

fn gid(ip: IpAddr) -> Gid {
    match ip {
        IpAddr::V4(v) => Gid::from_ipv4(v),
        IpAddr::V6(v) => Gid::from_ipv6(v),
    }
}

/// Drops, once `cut` is set, whatever arrives from `from`; counts what arrives from `alt`.
struct Blackhole {
    from: IpAddr,
    alt: IpAddr,
    cut: Arc<AtomicBool>,
    via_alt: Arc<std::sync::atomic::AtomicU64>,
}

impl Tap for Blackhole {
    fn arriving(&mut self, _now: u64, datagram: &[u8]) -> Fate {
        let Ok(d) = roce::parse_ip(datagram) else { return Fate::Deliver };
        let src = gid(self.from).to_ipv6();
        if d.ip.src_gid() == gid(self.alt).to_ipv6() {
            self.via_alt.fetch_add(1, Ordering::Relaxed);
        }
        if self.cut.load(Ordering::Relaxed) && d.ip.src_gid() == src {
            Fate::Drop
        } else {
            Fate::Deliver
        }
    }
}

struct Side {
    e: End,
    via_alt: Arc<std::sync::atomic::AtomicU64>,
}

fn side(addr: IpAddr, alt: IpAddr, peer: IpAddr, peer_alt: IpAddr, cut: &Arc<AtomicBool>, mode: RxMode) -> Side {
    let via_alt = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let tap = Blackhole { from: peer, alt: peer_alt, cut: cut.clone(), via_alt: via_alt.clone() };
    let e = end(UdpConfig::default().addr(addr).alt_addr(alt).rx_mode(mode).tap(TapHandle::new(tap)));
    Side { e, via_alt }
}

fn connect(x: &End, peer: &UdpDevice, peer_qpn: u32) {
    let av = AddressVector::new(AhAttr::roce(peer.gid(), 0), Mtu::Mtu1024);
    let alt = AltPath {
        av: AddressVector::new(AhAttr::roce(gid(peer.alt_addr().unwrap()), 1), Mtu::Mtu1024),
        pkey_index: 0,
        port_num: 1,
        timeout: 12,
    };
    x.qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(Access::LOCAL_WRITE)).unwrap();
    x.qp.modify(&QpAttr::to_rtr(av, peer_qpn).rq_psn(0).max_dest_rd_atomic(1).min_rnr_timer(1)).unwrap();
    x.qp.modify(
        // The primary path is given up once its retries are spent: at timeout 15 (134 ms a
        // try, 0.4 s in all) a thread a loaded machine holds back before the cut cannot make
        // the QP migrate early, as it could at 12 (50 ms in all).
        &QpAttr::to_rts()
            .sq_psn(0)
            .timeout(15)
            .retry_cnt(2)
            .rnr_retry(7)
            .max_rd_atomic(1)
            .alt_path(alt)
            .path_mig_state(MigState::Rearm),
    )
    .unwrap();
}

fn events(ctx: &Context) -> Vec<AsyncEventType> {
    std::iter::from_fn(|| ctx.get_async_event()).map(|e| e.event_type).collect()
}

/// Rule EVT-PM-1, MOD-GEN-9
#[test]
fn a_dead_primary_address_migrates_both_ends_to_the_second() {
    migrate(RxMode::Socket, 10);
}

/// The same with the raw receive mode where the process may use it (the second address is
/// received from its socket in either mode).
#[test]
fn a_dead_primary_address_migrates_with_raw_receive_too() {
    migrate(RxMode::Auto, 20);
}

fn migrate(mode: RxMode, net: u8) {
    let (a0, a1) = (v4([127, 21, net, 1]), v4([127, 21, net + 1, 1]));
    let (b0, b1) = (v4([127, 21, net, 2]), v4([127, 21, net + 1, 2]));
    let cut = Arc::new(AtomicBool::new(false));
    let a = side(a0, a1, b0, b1, &cut, mode);
    let b = side(b0, b1, a0, a1, &cut, mode);
    for s in [&a, &b] {
        let ctx = s.e.dev.context();
        assert!(ctx.query_device().unwrap().auto_path_mig, "a second address brings APM");
        assert_eq!(ctx.query_gid(1, 1).unwrap(), gid(s.e.dev.alt_addr().unwrap()));
    }
    connect(&a.e, &b.e.dev, b.e.qp.qp_num());
    connect(&b.e, &a.e.dev, a.e.qp.qp_num());
    assert_eq!(a.e.qp.query().unwrap().path_mig_state, MigState::Armed);

    let n = 5usize;
    let src = a.e.pd.reg_mr((0..n * 1024).map(|i| (i * 7) as u8).collect(), Access::LOCAL_WRITE).unwrap();
    let dst = b.e.pd.alloc_mr(n * 1024, Access::LOCAL_WRITE).unwrap();
    for i in 0..n {
        b.e.qp.post_recv(&[RecvWr::new(i as u64, &[dst.sge(i * 1024..(i + 1) * 1024)])]).unwrap();
    }
    // One Send over the primary path, then the peer's primary address goes silent.
    a.e.qp.post_send(&[SendWr::send(0, &[src.sge(0..1024)]).signaled()]).unwrap();
    assert_eq!(wait(&a.e.cq, 1, 30)[0].status, WcStatus::Success);
    assert_eq!(wait(&b.e.cq, 1, 30)[0].status, WcStatus::Success);
    assert_eq!(a.via_alt.load(Ordering::Relaxed) + b.via_alt.load(Ordering::Relaxed), 0);
    cut.store(true, Ordering::Relaxed);
    let wrs: Vec<_> = (1..n).map(|i| [src.sge(i * 1024..(i + 1) * 1024)]).collect();
    let sends: Vec<_> = wrs.iter().enumerate().map(|(i, s)| SendWr::send(i as u64 + 1, s).signaled()).collect();
    a.e.qp.post_send(&sends).unwrap();
    let got_a: Vec<_> = wait(&a.e.cq, n - 1, 60).iter().map(|w| (w.wr_id, w.status)).collect();
    let got_b: Vec<_> = wait(&b.e.cq, n - 1, 60).iter().map(|w| (w.wr_id, w.status)).collect();
    let want: Vec<_> = (1..n as u64).map(|i| (i, WcStatus::Success)).collect();
    assert_eq!((got_a, got_b), (want.clone(), want));
    let mut bytes = vec![0u8; n * 1024];
    dst.read(0, &mut bytes).unwrap();
    assert!(bytes.iter().enumerate().all(|(i, &x)| x == (i * 7) as u8), "every Send's bytes arrived once");
    // Both migrated to the second addresses and said so; the traffic went there.
    for (s, peer_alt) in [(&a, b1), (&b, a1)] {
        let q = s.e.qp.query().unwrap();
        assert_eq!((q.qp_state, q.path_mig_state, q.alt), (QpState::Rts, MigState::Migrated, None));
        assert_eq!(q.av.unwrap().ah.grh.dgid, Some(gid(peer_alt)));
        assert_eq!(q.av.unwrap().ah.grh.sgid_index, Some(1));
        assert_eq!(events(s.e.dev.context()), vec![AsyncEventType::PathMig]);
        assert!(s.via_alt.load(Ordering::Relaxed) > 0);
    }
}

/// Without a second address the device has no APM: an alternate path is NotSupported
/// (MOD-GEN-9), and an alternate address of the other family is refused at open.
#[test]
fn one_address_means_no_alternate_path() {
    let e = end(UdpConfig::default().addr(v4([127, 21, 2, 1])));
    assert!(!e.dev.context().query_device().unwrap().auto_path_mig);
    let bad =
        UdpDevice::open(UdpConfig::default().addr(v4([127, 21, 2, 2])).alt_addr("::1".parse::<IpAddr>().unwrap()));
    assert_eq!(bad.map(|_| ()).unwrap_err().kind(), std::io::ErrorKind::InvalidInput);
}
