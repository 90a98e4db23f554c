//! The shared-memory link (`link::shm`): RC traffic between two devices through their rings
//! (blocking and busy-poll), the rendezvous (a second attach to an address, a ring left by a
//! process that died), and a peer that goes away in the middle of a transfer.

mod udp_common;

use std::net::Ipv4Addr;
use std::time::Duration;

use softhca::link::shm::{Cores, ShmConfig, ShmDevice};
use softhca::link::{PcapTap, SharedBuf, TapHandle};
use softhca::*;
use udp_common::wait;

struct End {
    pd: Pd,
    cq: Cq,
    qp: Qp,
    dev: ShmDevice,
}

fn end(cfg: ShmConfig) -> End {
    let dev = ShmDevice::open(cfg).expect("open shm device");
    let ctx = dev.context().clone();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4096).unwrap();
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq).max_send_wr(256).max_recv_wr(256)).unwrap();
    End { pd, cq, qp, dev }
}

fn connect(qp: &Qp, gid: Gid, qpn: u32, timeout: u8, retry: u8) {
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let av = AddressVector::new(AhAttr::roce(gid, 0), Mtu::Mtu4096);
    qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(all)).unwrap();
    qp.modify(&QpAttr::to_rtr(av, qpn).rq_psn(0).max_dest_rd_atomic(16).min_rnr_timer(1)).unwrap();
    qp.modify(&QpAttr::to_rts().sq_psn(0).timeout(timeout).retry_cnt(retry).rnr_retry(7).max_rd_atomic(16)).unwrap();
}

fn traffic(a: &End, b: &End) {
    connect(&a.qp, b.dev.gid(), b.qp.qp_num(), 14, 7);
    connect(&b.qp, a.dev.gid(), a.qp.qp_num(), 14, 7);
    let n = 200_000usize;
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let src = a.pd.reg_mr((0..n).map(|i| (i * 13) as u8).collect(), all).unwrap();
    let dst = b.pd.alloc_mr(n, all).unwrap();
    let (rsge, ssge) = ([dst.sge(0..64)], [src.sge(0..8)]);
    for round in 0..3u64 {
        b.qp.post_recv(&(0..20).map(|i| RecvWr::new(i, &rsge)).collect::<Vec<_>>()).unwrap();
        a.qp.post_send(&(0..20).map(|i| SendWr::send(i, &ssge).signaled()).collect::<Vec<_>>()).unwrap();
        assert!(wait(&a.cq, 20, 10).iter().all(|w| w.status == WcStatus::Success));
        assert!(wait(&b.cq, 20, 10).iter().all(|w| w.status == WcStatus::Success));
        a.qp.post_send(&[SendWr::rdma_write(100 + round, &[src.sge(0..n)], dst.addr(), dst.rkey()).signaled()])
            .unwrap();
        assert_eq!(wait(&a.cq, 1, 10)[0].status, WcStatus::Success);
        let back = a.pd.alloc_mr(n, Access::LOCAL_WRITE).unwrap();
        a.qp.post_send(&[SendWr::rdma_read(200 + round, &[back.sge(0..n)], dst.addr(), dst.rkey()).signaled()])
            .unwrap();
        assert_eq!(wait(&a.cq, 1, 10)[0].status, WcStatus::Success);
        assert_eq!(back.to_vec().unwrap(), src.to_vec().unwrap());
        a.qp.post_send(&[
            SendWr::atomic_fetch_add(300 + round, &[back.sge(0..8)], dst.addr(), dst.rkey(), 1).signaled()
        ])
        .unwrap();
        assert_eq!(wait(&a.cq, 1, 10)[0].status, WcStatus::Success);
    }
}

/// Sends, 200 KB Writes and Reads and atomics through the rings, blocking and busy-poll; the
/// device checked every datagram's ICRC (none failed) and a capture tap saw them all.
/// Rule PKT-ROCE-10
///
/// With the peers' cores pinned near or far the datagrams built in place take the fused pass
/// or the CRC first and the copy after (`Cores`); the bytes and the ICRCs are the same.
#[test]
fn rc_traffic_over_shared_memory() {
    for (busy, cores) in [(false, Cores::Measure), (true, Cores::Measure), (true, Cores::Near), (false, Cores::Far)] {
        let capture = SharedBuf::new();
        let a = end(ShmConfig::default()
            .busy_poll(busy)
            .cores(cores)
            .tap(TapHandle::new(PcapTap::new(capture.clone()).unwrap())));
        let b = end(ShmConfig::default().busy_poll(busy).cores(cores));
        assert_ne!(a.dev.addr(), b.dev.addr());
        assert_eq!(a.dev.context().query_gid(1, 0).unwrap(), a.dev.gid());
        traffic(&a, &b);
        for d in [&a.dev, &b.dev] {
            let c = d.counters();
            assert!(c.rx_datagrams > 0 && c.tx_datagrams > 0, "{c:?}");
            // Not `rx_stalled_slots`: a producer a loaded machine holds off its core for
            // `STALL_NS` between its ticket and its publication is skipped, as it must be (the
            // transport's retry then resends), so the count says how busy the machine was.
            assert_eq!(c.tx_no_peer, 0, "{c:?}");
            assert!(c.tx_in_place > 0, "the 200 KB Writes and Read responses were built in place: {c:?}");
            match cores {
                Cores::Far => assert_eq!(c.tx_in_place_far, c.tx_in_place, "{c:?}"),
                Cores::Near => assert_eq!(c.tx_in_place_far, 0, "{c:?}"),
                Cores::Measure => assert!(c.tx_in_place_far <= c.tx_in_place, "{c:?}"),
            }
            assert_eq!(d.context().counters().rx_bad_icrc, 0);
        }
        assert!(capture.len() > 24, "the capture tap saw the datagrams");
    }
}

/// One device sends long Writes to one peer while a second peer writes to it, so that its
/// runs of long datagrams to the first peer (built in that peer's ring) are interleaved with
/// ACKs to the second, all while two other processes' worth of traffic crosses its own ring.
/// Every byte lands where it should, in both blocking and busy-poll mode; every datagram sent
/// is one received (no void slot is ever delivered), none failed its ICRC. (The bets lost on
/// the next peer are pinned by `a_lost_bet_on_the_next_peer_goes_to_the_right_one`.)
#[test]
fn datagram_runs_cut_by_another_peer_land_whole() {
    for busy in [false, true] {
        let a = end(ShmConfig::default().busy_poll(busy));
        let b = end(ShmConfig::default().busy_poll(busy));
        let c = end(ShmConfig::default().busy_poll(busy));
        let from_c = a.pd.create_qp(&QpInitAttr::rc(&a.cq, &a.cq).max_send_wr(256)).unwrap();
        connect(&a.qp, b.dev.gid(), b.qp.qp_num(), 14, 7);
        connect(&b.qp, a.dev.gid(), a.qp.qp_num(), 14, 7);
        connect(&from_c, c.dev.gid(), c.qp.qp_num(), 14, 7);
        connect(&c.qp, a.dev.gid(), from_c.qp_num(), 14, 7);
        let n = 4 << 20;
        let data = |seed: usize| (0..n).map(|i| (i * 31 + i / 4093 + seed) as u8).collect::<Vec<u8>>();
        let remote = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let (sa, sc) = (a.pd.reg_mr(data(0), Access::LOCAL_WRITE).unwrap(), c.pd.reg_mr(data(7), remote).unwrap());
        let (db, da) = (b.pd.alloc_mr(n, remote).unwrap(), a.pd.alloc_mr(n, remote).unwrap());
        let chunk = 64 << 10;
        for k in 0..n / chunk {
            let r = k * chunk..(k + 1) * chunk;
            let at = (k * chunk) as u64;
            c.qp.post_send(&[SendWr::rdma_write(k as u64, &[sc.sge(r.clone())], da.addr() + at, da.rkey()).signaled()])
                .unwrap();
            a.qp.post_send(&[SendWr::rdma_write(k as u64, &[sa.sge(r)], db.addr() + at, db.rkey()).signaled()])
                .unwrap();
        }
        for cq in [&a.cq, &c.cq] {
            let w = wait(cq, n / chunk, 20);
            assert!(w.iter().all(|w| w.status == WcStatus::Success), "{w:?}");
        }
        assert!(db.to_vec().unwrap() == sa.to_vec().unwrap(), "busy {busy}: a's Writes landed wrong");
        assert!(da.to_vec().unwrap() == sc.to_vec().unwrap(), "busy {busy}: c's Writes landed wrong");
        let (ca, cb, cc) = (a.dev.counters(), b.dev.counters(), c.dev.counters());
        assert_eq!(ca.tx_datagrams, cb.rx_datagrams + cc.rx_datagrams, "{ca:?} {cb:?} {cc:?}");
        assert_eq!(cb.tx_datagrams + cc.tx_datagrams, ca.rx_datagrams, "{ca:?} {cb:?} {cc:?}");
        // Not tx_ring_full: a receiver the scheduler holds back for PATIENCE_NS (50 ms) on a
        // loaded machine makes the sender drop into its full ring, which RC's retransmission
        // repairs; what is published is still received, as the sums above say.
        assert_eq!(ca.tx_no_peer, 0, "{ca:?}");
        assert!(ca.tx_in_place > 0, "{ca:?}");
        for d in [&a.dev, &b.dev, &c.dev] {
            assert_eq!(d.context().counters().rx_bad_icrc, 0);
        }
    }
}

/// One UD QP sends long datagrams to two peers in runs, B B B C C C B B (one post): after two
/// long datagrams to a peer the next is built in that peer's ring, so the switches to C and
/// back to B are bets lost, which go to the right peer by copy and leave a void slot behind.
/// Each receiver gets exactly its messages, whole and in order; voids are never delivered.
/// When the eight go out in one flush (the engine could start on the first before the post
/// has queued the rest), exactly two bets are won and two lost: one of five tries must show
/// it.
#[test]
fn a_lost_bet_on_the_next_peer_goes_to_the_right_one() {
    const QKEY: u32 = 0x1111;
    let ud = |e: &End| -> Qp {
        let qp = e.pd.create_qp(&QpInitAttr::new(QpType::Ud, &e.cq, &e.cq).max_send_wr(16).max_recv_wr(16)).unwrap();
        qp.modify(&QpAttr::to_init().port(1).pkey_index(0).qkey(QKEY)).unwrap();
        qp.modify(&QpAttr::new(QpState::Rtr)).unwrap();
        qp.modify(&QpAttr::to_rts().sq_psn(0)).unwrap();
        qp
    };
    for busy in [false, true] {
        let exact = (0..5).any(|_| lost_bets_in_runs(busy, ud));
        assert!(exact, "busy {busy}: five tries, never two bets won and two lost");
    }
}

/// One try of `a_lost_bet_on_the_next_peer_goes_to_the_right_one`: whether the bets were
/// exactly two won and two lost (every message checked either way).
fn lost_bets_in_runs(busy: bool, ud: impl Fn(&End) -> Qp) -> bool {
    const QKEY: u32 = 0x1111;
    {
        // Addresses of their own: a device another test just closed may still have a
        // datagram (an ACK held for its program's next post) for the address a new device
        // of this test would take, and the counts below are exact.
        let at = |d| ShmConfig::default().addr(Ipv4Addr::new(127, 0, 0, d)).busy_poll(busy);
        let (a, b, c) = (end(at(211)), end(at(212)), end(at(213)));
        let (qa, qb, qc) = (ud(&a), ud(&b), ud(&c));
        let len = 2048;
        let to = ["B", "B", "B", "C", "C", "C", "B", "B"];
        let src = a.pd.reg_mr((0..to.len() * len).map(|i| (i / len * 41 + i * 7) as u8).collect(), Access::LOCAL_WRITE);
        let src = src.unwrap();
        let mut landed = Vec::new();
        for (e, qp, n) in [(&b, &qb, 5), (&c, &qc, 3)] {
            let m = e.pd.alloc_mr(n * (len + 40), Access::LOCAL_WRITE).unwrap();
            let sges: Vec<_> = (0..n).map(|i| [m.sge(i * (len + 40)..(i + 1) * (len + 40))]).collect();
            qp.post_recv(&sges.iter().enumerate().map(|(i, g)| RecvWr::new(i as u64, g)).collect::<Vec<_>>()).unwrap();
            landed.push(m);
        }
        let (ah_b, ah_c) = (
            a.pd.create_ah(&AhAttr::roce(b.dev.gid(), 0)).unwrap(),
            a.pd.create_ah(&AhAttr::roce(c.dev.gid(), 0)).unwrap(),
        );
        let sges: Vec<_> = (0..to.len()).map(|i| [src.sge(i * len..(i + 1) * len)]).collect();
        let wrs: Vec<_> = to
            .iter()
            .zip(&sges)
            .enumerate()
            .map(|(i, (&p, g))| {
                let (ah, qpn) = if p == "B" { (&ah_b, qb.qp_num()) } else { (&ah_c, qc.qp_num()) };
                SendWr::send(i as u64, g).ud(ah, qpn, QKEY).signaled()
            })
            .collect();
        qa.post_send(&wrs).unwrap();
        assert!(wait(&a.cq, to.len(), 10).iter().all(|w| w.status == WcStatus::Success));
        let src = src.to_vec().unwrap();
        for (k, (e, peer)) in [(&b, "B"), (&c, "C")].into_iter().enumerate() {
            let mine: Vec<usize> = (0..to.len()).filter(|&i| to[i] == peer).collect();
            let w = wait(&e.cq, mine.len(), 10);
            let got = landed[k].to_vec().unwrap();
            for (j, (wc, &i)) in w.iter().zip(&mine).enumerate() {
                assert_eq!((wc.status, wc.wr_id, wc.byte_len as usize), (WcStatus::Success, j as u64, len + 40));
                let at = j * (len + 40) + 40; // after the GRH
                assert!(got[at..at + len] == src[i * len..(i + 1) * len], "busy {busy}: message {i} to {peer}");
            }
        }
        let ca = a.dev.counters();
        assert_eq!(ca.tx_datagrams, to.len() as u64, "{ca:?}");
        assert_eq!(b.dev.counters().rx_datagrams + c.dev.counters().rx_datagrams, to.len() as u64);
        (ca.tx_in_place, ca.tx_in_place_missed) == (2, 2)
    }
}

/// An address whose ring a live device owns cannot be taken again; once that device is gone
/// it can.
#[test]
fn a_second_attach_to_an_address_is_refused() {
    // An address of its own: the other tests, running beside it, take the first free ones.
    let a = ShmDevice::open(ShmConfig::default().addr(Ipv4Addr::new(127, 0, 0, 201))).unwrap();
    let err = ShmDevice::open(ShmConfig::default().addr(a.addr())).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse, "{err}");
    let addr = a.addr();
    drop(a);
    let again = ShmDevice::open(ShmConfig::default().addr(addr)).unwrap();
    assert_eq!(again.addr(), addr);
}

/// A ring file left behind by a process that died (whole, naming a pid that no longer runs,
/// or cut short before its creator sized it) is reclaimed by the next device of the address;
/// one that another process is creating right now is not.
#[test]
fn a_stale_rendezvous_is_reclaimed() {
    let a = ShmDevice::open(ShmConfig::default().addr(Ipv4Addr::new(127, 0, 0, 202))).unwrap();
    let addr = a.addr();
    let path = format!("/dev/shm/softhca-shm-{addr}");
    // Keep a copy of a live ring, then make it a dead process's: a child that has exited.
    let bytes = std::fs::read(&path).unwrap();
    drop(a);
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let mut stale = bytes.clone();
    stale[16..20].copy_from_slice(&dead.to_ne_bytes()); // the header's owner pid
    write_private(&path, &stale);
    let b = ShmDevice::open(ShmConfig::default().addr(addr)).expect("a dead owner's ring is reclaimed");
    drop(b);
    // Cut short: a creator sizes and stamps its ring right after creating it, so a file
    // still empty after a while was left by one that died; a fresh one is still being made.
    write_private(&path, &[]);
    let err = ShmDevice::open(ShmConfig::default().addr(addr)).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse, "a ring being created is left alone");
    let old = std::time::SystemTime::now() - Duration::from_secs(60);
    std::fs::File::options().write(true).open(&path).unwrap().set_modified(old).unwrap();
    let c = ShmDevice::open(ShmConfig::default().addr(addr)).expect("an unfinished ring is reclaimed");
    drop(c);
    assert!(std::fs::metadata(&path).is_err(), "a device removes its ring when it closes");
}

fn write_private(path: &str, bytes: &[u8]) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path).unwrap();
    f.write_all(bytes).unwrap();
}

/// The peer goes away in the middle of a stream of Writes (its device closes and its ring is
/// removed): the sender's datagrams find nobody, its requester times out and retries, and the
/// Writes complete in error (Transport Retry Counter Exceeded, then flushed), without a hang.
/// In busy-poll mode too, where the waiting application's polls run the timers and flush
/// the retransmissions while the engine thread naps.
/// Rule PKT-RTY-4, ERR-SQ-10
#[test]
fn a_peer_that_goes_away_fails_the_transfer_cleanly() {
    for busy in [false, true] {
        peer_goes_away(busy);
    }
}

fn peer_goes_away(busy: bool) {
    let a = end(ShmConfig::default().busy_poll(busy));
    let b = end(ShmConfig::default().busy_poll(busy));
    // An ACK timeout of about 67 ms (14) and one retry: the failure comes within a few
    // hundred ms, and a loaded machine does not fail the first Write (with about 4 ms, the
    // receiving engine of a machine running four busy loops beside the test sometimes
    // answered too late, and the Writes behind sometimes ran out of retries before the peer
    // was gone).
    connect(&a.qp, b.dev.gid(), b.qp.qp_num(), 14, 1);
    connect(&b.qp, a.dev.gid(), a.qp.qp_num(), 14, 1);
    let n = 1 << 20;
    let src = a.pd.alloc_mr(n, Access::LOCAL_WRITE).unwrap();
    let dst = b.pd.alloc_mr(n, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    let (addr, rkey) = (dst.addr(), dst.rkey());
    a.qp.post_send(&[SendWr::rdma_write(1, &[src.sge(0..n)], addr, rkey).signaled()]).unwrap();
    let w = wait(&a.cq, 1, 10);
    assert_eq!(
        w[0].status,
        WcStatus::Success,
        "the link works: {:?} {:?} / {:?} {:?}",
        a.dev.counters(),
        a.dev.context().counters(),
        b.dev.counters(),
        b.dev.context().counters()
    );
    let whole = [src.sge(0..n)];
    // 128 MiB: more than moves before the peer's device is gone, however the threads run.
    a.qp.post_send(&(2..130).map(|i| SendWr::rdma_write(i, &whole, addr, rkey).signaled()).collect::<Vec<_>>())
        .unwrap();
    let End { dev, .. } = b;
    drop(dev);
    let w = wait(&a.cq, 128, 20);
    assert!(w.iter().any(|w| w.status == WcStatus::RetryExcErr), "{w:?}");
    assert!(w.iter().all(|w| matches!(w.status, WcStatus::Success | WcStatus::RetryExcErr | WcStatus::WrFlushErr)));
    assert!(a.dev.counters().tx_no_peer > 0);
}

/// A peer that never drains its ring (a ring whose owner lives but does not read it): once
/// the ring is full the sender's datagrams wait for room a bounded time and are dropped, the
/// requester's retries run out, and its Write completes in error; the sender never blocks.
/// Blocking and busy-poll: a datagram waiting for room keeps the polls turning.
/// Rule PKT-RTY-4
#[test]
fn a_peer_that_never_drains_does_not_block_its_senders() {
    for busy in [false, true] {
        silent_peer(busy);
    }
}

fn silent_peer(busy: bool) {
    // A fresh ring's bytes, owned by this (live) process, put where nobody reads them.
    let model = ShmDevice::open(ShmConfig::default().addr(Ipv4Addr::new(127, 0, 0, 203))).unwrap();
    let bytes = std::fs::read(format!("/dev/shm/softhca-shm-{}", model.addr())).unwrap();
    drop(model);
    let silent = Ipv4Addr::new(127, 0, 0, 204);
    write_private(&format!("/dev/shm/softhca-shm-{silent}"), &bytes);
    let a = end(ShmConfig::default().busy_poll(busy));
    // An ACK timeout of about 67 ms (14) and one retry: the ring's 256 slots fill long before
    // the first timer fires, however slowly the sender runs (with about 4 ms, a sender slowed
    // by a loaded machine sent 193 datagrams before its retries ran out, and never waited).
    connect(&a.qp, Gid::from_ipv6(silent.to_ipv6_mapped()), 0x99, 14, 1);
    let n = 4 << 20;
    let src = a.pd.alloc_mr(n, Access::LOCAL_WRITE).unwrap();
    a.qp.post_send(&[SendWr::rdma_write(1, &[src.sge(0..n)], 0x1000, 0x1234).signaled()]).unwrap();
    let w = wait(&a.cq, 1, 20);
    assert_eq!(w[0].status, WcStatus::RetryExcErr, "{w:?}");
    assert!(a.dev.counters().tx_ring_waits > 0, "{:?}", a.dev.counters());
    // The device goes on: a new connection to a live peer works (the datagram that waited for
    // the silent ring is dropped once its patience runs out).
    let b = end(ShmConfig::default().busy_poll(busy));
    let qp = a.pd.create_qp(&QpInitAttr::rc(&a.cq, &a.cq)).unwrap();
    connect(&qp, b.dev.gid(), b.qp.qp_num(), 14, 7);
    connect(&b.qp, a.dev.gid(), qp.qp_num(), 14, 7);
    let land = b.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    b.qp.post_recv(&[RecvWr::new(5, &[land.sge(0..64)])]).unwrap();
    qp.post_send(&[SendWr::send(6, &[src.sge(0..64)]).signaled()]).unwrap();
    assert_eq!(wait(&a.cq, 1, 20)[0].status, WcStatus::Success);
    assert_eq!(wait(&b.cq, 1, 20)[0].status, WcStatus::Success);
    let c = a.dev.counters();
    assert!(c.tx_ring_full > 0, "{c:?}");
    assert_eq!(c.tx_ring_waits, 1, "one wait for the silent peer, then its datagrams are dropped at once: {c:?}");
    let _ = std::fs::remove_file(format!("/dev/shm/softhca-shm-{silent}"));
}

/// The rings join two devices: no multicast. Query Device says so (no groups) and Attach QP
/// to Multicast Group is not supported (EOPNOTSUPP through the drop-in).
#[test]
fn a_shared_memory_device_has_no_multicast() {
    // An address of its own: a_peer_that_never_drains_does_not_block_its_senders opens 203
    // while tests of this file run side by side.
    let dev = ShmDevice::open(ShmConfig::default().addr(Ipv4Addr::new(127, 0, 0, 205))).unwrap();
    let ctx = dev.context().clone();
    let attr = ctx.query_device().unwrap();
    assert_eq!((attr.max_mcast_grp, attr.max_mcast_qp_attach, attr.max_total_mcast_qp_attach), (0, 0, 0));
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8).unwrap();
    let qp = pd.create_qp(&QpInitAttr::ud(&cq, &cq)).unwrap();
    let group = Gid::from_ipv4(Ipv4Addr::new(239, 0, 0, 1));
    assert!(matches!(qp.attach_mcast(group, 0), Err(VerbsError::NotSupported(_))));
}

/// One end of a Write ping-pong that waits for the peer's Write by spinning on memory, as
/// perftest's `ib_write_lat` does: its own Write's completion polled from the CQ, then the
/// landing buffer read until the peer's round number is there. `last(r)`: whether round `r`
/// is the last, asked by the first end before it writes, by the other once the Write landed
/// (the first end decides). Returns the rounds done.
fn write_pingpong(me: &End, landing: &Mr, src: &Mr, peer: (u64, u32), first: bool, last: impl Fn(u64) -> bool) -> u64 {
    let landed =
        |r: u64| assert!(spin_until(|| u64::from_le_bytes(got(landing)) == r), "round {r}'s Write never landed");
    for r in 1.. {
        let stop = if first {
            last(r)
        } else {
            landed(r);
            last(r)
        };
        src.write(0, &r.to_le_bytes()).unwrap();
        me.qp.post_send(&[SendWr::rdma_write(r, &[src.sge(0..8)], peer.0, peer.1).signaled()]).unwrap();
        assert_eq!(wait(&me.cq, 1, 20)[0].status, WcStatus::Success);
        if first {
            landed(r);
        }
        if stop {
            return r;
        }
    }
    unreachable!()
}

/// A program that spins on memory for a peer's Write, not on its CQ, while its device's
/// engine thread naps (the program polled its CQ a moment before), and that answers by
/// other means than its device: the peer sees its Write left untaken and rings, and the
/// engine thread takes it in. Before, the Write waited for the nap's end: 1.4-2 ms a hop in
/// `ib_write_lat`. Rounds run until the mechanism was seen to work (a nap cut short), for
/// at most 5,000 rounds. (A program that answers with a Write of its own seldom needs the
/// ring: the ACK of the Write it waited for travels with its answer, see the next test.)
#[test]
fn a_program_that_spins_on_memory_is_not_left_waiting() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
    let (a, b) = busy_pair();
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let (land, src) = (b.pd.alloc_mr(8, all).unwrap(), a.pd.alloc_mr(8, all).unwrap());
    // The round B's program waits for next, told A by memory of this process; whether A
    // is done.
    let (next, done) = (AtomicU64::new(1), AtomicBool::new(false));
    let rounds = std::thread::scope(|s| {
        s.spawn(|| {
            for r in 1.. {
                if !spin_until(|| done.load(SeqCst) || u64::from_le_bytes(got(&land)) == r) {
                    panic!("round {r}'s Write never landed");
                }
                if done.load(SeqCst) {
                    return;
                }
                for _ in 0..16 {
                    b.cq.poll(&mut []).unwrap(); // the engine thread naps beside these
                }
                next.store(r + 1, SeqCst);
            }
        });
        for r in 1..=5_000u64 {
            assert!(spin_until(|| next.load(SeqCst) == r), "round {r} never came");
            src.write(0, &r.to_le_bytes()).unwrap();
            a.qp.post_send(&[SendWr::rdma_write(r, &[src.sge(0..8)], land.addr(), land.rkey()).signaled()]).unwrap();
            assert_eq!(wait(&a.cq, 1, 20)[0].status, WcStatus::Success);
            if b.dev.counters().naps_cut > 0 {
                done.store(true, SeqCst);
                return r;
            }
        }
        done.store(true, SeqCst);
        5_000
    });
    assert!(b.dev.counters().naps_cut > 0, "no nap was cut short in {rounds} rounds: {:?}", b.dev.counters());
}

/// Two busy-poll ends, connected.
fn busy_pair() -> (End, End) {
    let a = end(ShmConfig::default().busy_poll(true));
    let b = end(ShmConfig::default().busy_poll(true));
    connect(&a.qp, b.dev.gid(), b.qp.qp_num(), 14, 7);
    connect(&b.qp, a.dev.gid(), a.qp.qp_num(), 14, 7);
    (a, b)
}

/// The 8 bytes at the start of `mr`.
fn got(mr: &Mr) -> [u8; 8] {
    let mut b = [0u8; 8];
    mr.read(0, &mut b).unwrap();
    b
}

/// Spins until `cond` holds (true) or 20 s passed (false).
fn spin_until(cond: impl Fn() -> bool) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !cond() {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::hint::spin_loop();
    }
    true
}

/// A Write ping-pong whose two programs spin on memory for each other's Write (perftest's
/// `ib_write_lat`) runs its rounds, every Write in place: the ACK of the Write a program
/// waited for leaves with its answer (the engine thread that took the Write in leaves the
/// ACK for the program's post; the ring publishes it with the Write behind it), and the
/// peer, polling its CQ for that ACK, takes the answer in with it.
#[test]
fn a_write_pingpong_that_spins_on_memory_runs() {
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
    let (a, b) = busy_pair();
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let (a_land, b_land) = (a.pd.alloc_mr(8, all).unwrap(), b.pd.alloc_mr(8, all).unwrap());
    let (a_src, b_src) = (a.pd.alloc_mr(8, all).unwrap(), b.pd.alloc_mr(8, all).unwrap());
    // The round the first end chose as its last (0: not yet).
    let end_at = AtomicU64::new(0);
    let rounds = std::thread::scope(|s| {
        let other = s.spawn(|| {
            write_pingpong(&b, &b_land, &b_src, (a_land.addr(), a_land.rkey()), false, |r| end_at.load(SeqCst) == r)
        });
        let mine = write_pingpong(&a, &a_land, &a_src, (b_land.addr(), b_land.rkey()), true, |r| {
            let stop = r == 2_000;
            if stop {
                end_at.store(r, SeqCst);
            }
            stop
        });
        (mine, other.join().unwrap())
    });
    assert_eq!(rounds, (2_000, 2_000));
    assert_eq!(got(&a_land), 2_000u64.to_le_bytes());
}
