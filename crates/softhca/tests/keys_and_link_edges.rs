//! Edge cases of the UDP link's receive path and of the key table, from a review: every
//! segment of a raw-mode superpacket has its ICRC checked, empty datagrams are counted, a window
//! dealloc racing an R_Key check cannot deadlock, a dropped region's key stops working, and a
//! nonsense SGE range does not panic.

mod common;

use std::net::{Ipv4Addr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::pair::*;
use common::poll_all;
use softhca::link::udp::{sys, RxMode, UdpConfig, UdpCounters, UdpDevice};
use softhca::transport::MAX_DATAGRAM;
use softhca::*;

const QKEY: u32 = 0x1111;

fn ud_qp(pd: &Pd, cq: &Cq) -> Qp {
    let qp = pd.create_qp(&QpInitAttr::new(QpType::Ud, cq, cq).max_send_wr(16).max_recv_wr(16)).unwrap();
    qp.modify(&QpAttr::to_init().port(1).pkey_index(0).qkey(QKEY)).unwrap();
    qp.modify(&QpAttr::new(QpState::Rtr)).unwrap();
    qp.modify(&QpAttr::to_rts().sq_psn(0)).unwrap();
    qp
}

/// A UD Send Only datagram (IPv4 header on, ICRC sealed for Identification 0 + DF) from a
/// sans-IO device at `from` to QP `qpn` at `to`.
fn ud_datagram(from: Ipv4Addr, to: Gid, qpn: u32) -> Vec<u8> {
    let ctx = Context::create(DeviceConfig::default().name("review4-src").gid0(Gid::from_ipv4(from))).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let qp = ud_qp(&pd, &cq);
    let ah = pd.create_ah(&AhAttr::roce(to, 0)).unwrap();
    let mr = pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let g = [mr.sge(0..32)];
    qp.post_send(&[SendWr::send(1, &g).ud(&ah, qpn, QKEY)]).unwrap();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let n = ctx.transmit(0, &mut buf).expect("a datagram");
    buf.truncate(n);
    assert_eq!(buf[0], 0x45, "IPv4 datagram expected");
    buf
}

/// A UDP socket at `addr:port` that sends with DF and Identification 0 (unconnected,
/// IP_PMTUDISC_DO), as the link's own send sockets do.
fn df_socket(addr: Ipv4Addr, port: u16) -> UdpSocket {
    let s = UdpSocket::bind((addr, port)).unwrap();
    // IPPROTO_IP = 0, IP_MTU_DISCOVER = 10, IP_PMTUDISC_DO = 2.
    sys::setsockopt_int(s.as_raw_fd(), 0, 10, 2).unwrap();
    s
}

/// Raw receive mode: a datagram whose ICRC does not verify whole is taken for a GSO
/// superpacket, and every segment is verified over its own header. Here segment 1 is a copy of
/// segment 0 with one payload byte flipped and its ICRC left stale: it is dropped as a bad
/// ICRC, not completed into the receive queue.
#[test]
fn raw_mode_superpacket_later_segments_have_their_icrc_checked() {
    let dev_addr = Ipv4Addr::new(127, 0, 77, 1);
    let peer = Ipv4Addr::new(127, 0, 77, 2);
    let dev = match UdpDevice::open(UdpConfig::default().addr(dev_addr).rx_mode(RxMode::Raw).name("review4-raw")) {
        Ok(d) => d,
        Err(e) => panic!("raw mode needs CAP_NET_RAW (run as root): {e}"),
    };
    assert!(dev.raw_rx());
    let ctx = dev.context().clone();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let qp = ud_qp(&pd, &cq);
    let land = pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    qp.post_recv(&[RecvWr::new(10, &[land.sge(0..1024)]), RecvWr::new(11, &[land.sge(1024..2048)])]).unwrap();

    let d = ud_datagram(peer, dev.gid(), qp.qp_num());
    let sport = u16::from_be_bytes([d[20], d[21]]);
    let seg0 = d[28..].to_vec();
    let mut seg1 = seg0.clone();
    let at = seg1.len() - 8; // a payload byte, before the ICRC
    seg1[at] ^= 0x80;
    let mut superpacket = seg0.clone();
    superpacket.extend_from_slice(&seg1);

    let s = df_socket(peer, sport);
    s.send_to(&superpacket, (dev_addr, 4791)).unwrap();

    // Until both segments are accounted for: segment 0 completed and segment 1 counted as a
    // bad ICRC (delivered instead, it would never be counted, and the deadline, a hang guard,
    // ends the wait). Then one more poll: nothing may follow.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut wcs = Vec::new();
    while (wcs.is_empty() || dev.counters().drop_bad_icrc == 0) && Instant::now() < deadline {
        wcs.extend(poll_all(&cq));
        std::thread::yield_now();
    }
    wcs.extend(poll_all(&cq));
    let c = dev.counters();
    assert!(!wcs.is_empty(), "setup: segment 0 (valid ICRC) should complete; counters {c:?}");
    assert_eq!(
        wcs.len(),
        1,
        "segment 1 with a stale ICRC was delivered as if verified: {:?}; counters {c:?}",
        wcs.iter().map(|w| (w.wr_id, w.status, w.byte_len)).collect::<Vec<_>>()
    );
    assert_eq!(c.drop_bad_icrc, 1, "{c:?}");
}

/// Socket mode: a zero-length UDP datagram to port 4791 is counted as a malformed drop.
#[test]
fn empty_datagram_is_counted_as_a_drop() {
    let dev_addr = Ipv4Addr::new(127, 0, 77, 3);
    let dev = UdpDevice::open(UdpConfig::default().addr(dev_addr).name("review4-empty")).unwrap();
    let s = UdpSocket::bind((Ipv4Addr::new(127, 0, 77, 4), 0)).unwrap();
    for _ in 0..3 {
        s.send_to(&[], (dev_addr, 4791)).unwrap();
    }
    // Until the three are counted (the deadline is a hang guard: were they not, it ends the
    // wait and the count below says so).
    let dropped =
        |c: &UdpCounters| c.drop_malformed + c.drop_truncated + c.drop_family + c.drop_bad_icrc + c.drop_not_ours;
    let deadline = Instant::now() + Duration::from_secs(20);
    while dropped(&dev.counters()) < 3 && Instant::now() < deadline {
        std::thread::yield_now();
    }
    let c = dev.counters();
    assert!(c.rx_syscalls > 0, "setup: the datagrams were received: {c:?}");
    assert_eq!(dropped(&c), 3, "three empty datagrams arrived and none was counted: {c:?}");
}

/// `Mw::dealloc` takes the key table and the window's state in the same order as
/// `check_access` (every remote access, on the engine) and `bind`: an R_Key check racing a
/// dealloc of that window cannot deadlock. The receive deadlines only turn a hang into a
/// failure.
#[test]
fn dealloc_mw_racing_an_rkey_check_does_not_deadlock() {
    let ctx = Context::create(DeviceConfig::default().name("review4-mw")).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let key = Arc::new(AtomicU32::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();

    let checker = {
        let (ctx, pd, key, stop, tx) = (ctx.clone(), pd.clone(), key.clone(), stop.clone(), tx.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let k = key.load(Ordering::Relaxed);
                let _ = ctx.check_access(k, &pd, 0, 0, Access::REMOTE_WRITE);
            }
            let _ = tx.send("checker");
        })
    };
    let deallocer = {
        let (pd, key, tx) = (pd.clone(), key.clone(), tx.clone());
        std::thread::spawn(move || {
            for _ in 0..50_000 {
                let mw = pd.alloc_mw().unwrap();
                key.store(mw.rkey(), Ordering::Relaxed);
                mw.dealloc().unwrap();
            }
            let _ = tx.send("deallocer");
        })
    };
    let first = rx.recv_timeout(Duration::from_secs(15));
    stop.store(true, Ordering::Relaxed);
    let second = rx.recv_timeout(Duration::from_secs(5));
    assert!(
        first.is_ok() && second.is_ok(),
        "dealloc and check_access deadlocked (lock order state→keys vs keys→state): {first:?} {second:?}"
    );
    let _ = (checker.join(), deallocer.join());
}

/// Dropping a region that has a bound window removes its key all the same, and cuts the window
/// off it: no key reaches memory whose handle is gone (with `reg_mr_raw` the caller may free
/// it then).
#[test]
fn dropping_a_region_with_a_bound_window_does_not_leave_its_key_alive() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::MW_BIND;
    let region = p.b.pd.alloc_mr(4096, all).unwrap();
    let (key, addr) = (region.rkey(), region.addr());
    let mw = p.b.pd.alloc_mw().unwrap();
    p.b.qp.post_send(&[SendWr::bind_mw(1, &mw, &region, addr, 64, Access::REMOTE_WRITE).signaled()]).unwrap();
    p.run(10_000_000_000);
    assert_eq!(poll_all(&p.b.cq)[0].status, WcStatus::Success);
    drop(region);
    mw.dealloc().unwrap();
    let r = p.b.ctx.check_access(key, &p.b.pd, addr, 8, Access::REMOTE_WRITE);
    assert!(r.is_err(), "the dropped region's R_Key still grants remote write: {r:?}");
}

/// `Mr::sge` with a huge offset gives an SGE that the access check refuses, not a panic
/// (DESIGN rule 6: never panic on caller input).
#[test]
fn sge_with_a_huge_offset_does_not_panic() {
    let ctx = Context::create(DeviceConfig::default().name("review4-sge")).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| mr.sge(usize::MAX - 8..usize::MAX)));
    let sge = r.expect("Mr::sge panicked on a caller-supplied range");
    assert!(ctx.check_access(sge.lkey, &pd, sge.addr, u64::from(sge.length), Access::LOCAL_WRITE).is_err());
}
