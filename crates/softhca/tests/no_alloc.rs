//! Speed by design: once warmed up, the RC hot path — post, transmit, receive, ACK, complete,
//! poll — allocates nothing per packet (DESIGN, "no allocation per packet on the hot path").
//! A counting global allocator watches a steady stream of Sends and RDMA Writes and Reads driven
//! through the sans-IO interface with reused buffers, then over the shared-memory link and
//! over the UDP link (both of its receive modes) in busy-poll mode; and UD Sends whose
//! completions wait for the link's word that they left, as on the UDP link.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use softhca::transport::MAX_DATAGRAM;
use softhca::*;

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static COUNTING: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Set on the thread that drives the engine: the harness's own threads (its main thread
    /// waits for the test and may allocate meanwhile) are not the hot path. The sans-IO drive
    /// runs every engine step on this thread, so nothing of softhca's escapes the count.
    static DRIVER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this allocation is the hot path's.
fn counted() -> bool {
    COUNTING.load(Ordering::Relaxed) && DRIVER.try_with(|d| d.get()).unwrap_or(false)
}

/// The allocations `rounds` calls of `round` make on this thread (the one driving the engine).
fn allocations_in(rounds: usize, mut round: impl FnMut()) -> u64 {
    ALLOCS.store(0, Ordering::SeqCst);
    DRIVER.with(|d| d.set(true));
    COUNTING.store(true, Ordering::SeqCst);
    for _ in 0..rounds {
        round();
    }
    COUNTING.store(false, Ordering::SeqCst);
    DRIVER.with(|d| d.set(false));
    ALLOCS.load(Ordering::SeqCst)
}

// SAFETY: every call is forwarded unchanged to the system allocator; the counter is a relaxed
// atomic that allocates nothing itself.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if counted() {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's layout contract is passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: ptr came from System.alloc with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if counted() {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: as for alloc and dealloc.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Moves every pending datagram both ways until both devices are quiet.
fn pump(a: &Context, b: &Context, now: &mut u64, buf: &mut [u8]) {
    loop {
        let mut moved = false;
        for (src, dst) in [(a, b), (b, a)] {
            while let Some(n) = src.transmit(*now, buf) {
                dst.receive(*now, &buf[..n]);
                moved = true;
            }
        }
        if !moved {
            break;
        }
        *now += 1_000;
    }
}

/// Brings the RC pair `qa` (on GID `ga`) and `qb` (on `gb`) to RTS toward each other.
fn connect(qa: &Qp, qb: &Qp, ga: Gid, gb: Gid) {
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    for (qp, peer, gid) in [(qa, qb, gb), (qb, qa, ga)] {
        let av = AddressVector::new(AhAttr::roce(gid, 0), Mtu::Mtu1024);
        qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(all)).unwrap();
        qp.modify(&QpAttr::to_rtr(av, peer.qp_num()).rq_psn(0).max_dest_rd_atomic(4)).unwrap();
        qp.modify(&QpAttr::to_rts().sq_psn(0).timeout(14).retry_cnt(7).rnr_retry(7).max_rd_atomic(4)).unwrap();
    }
}

/// A device of its own (GID 127.1.7.n, seeded with n), apart from the sim fabric: the tests
/// move its datagrams by hand.
fn device(n: u8) -> (Context, Gid) {
    let gid = Gid::from_ipv4([127, 1, 7, n].into());
    let ctx = Context::create(DeviceConfig::default().name(format!("noalloc{n}")).gid0(gid).seed(n as u64)).unwrap();
    (ctx, gid)
}

/// The tests here share the global counter: one at a time.
/// An RC QP pair between two devices of a link whose engines run without the test's help
/// (busy-poll), and a round of traffic on it: a Send, an RDMA Write and an RDMA Read of 3,000
/// bytes each, waited for on both sides' CQs.
struct Traffic {
    qa: Qp,
    qb: Qp,
    ca: Cq,
    cb: Cq,
    src: Mr,
    land: Mr,
    dst: Mr,
}

impl Traffic {
    fn new(a: &Context, b: &Context, ga: Gid, gb: Gid) -> Traffic {
        let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
        let (ca, cb) = (a.create_cq(256).unwrap(), b.create_cq(256).unwrap());
        let qa = pa.create_qp(&QpInitAttr::rc(&ca, &ca).max_send_wr(64).max_recv_wr(64)).unwrap();
        let qb = pb.create_qp(&QpInitAttr::rc(&cb, &cb).max_send_wr(64).max_recv_wr(64)).unwrap();
        connect(&qa, &qb, ga, gb);
        let src = pa.alloc_mr(8192, Access::LOCAL_WRITE).unwrap();
        let land = pa.alloc_mr(8192, Access::LOCAL_WRITE).unwrap();
        let dst = pb.alloc_mr(8192, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ).unwrap();
        Traffic { qa, qb, ca, cb, src, land, dst }
    }

    fn round(&self) {
        let mut wcs = [Wc::default(); 16];
        let (gs, gl, rs) = ([self.src.sge(0..3000)], [self.land.sge(0..3000)], [self.dst.sge(0..4096)]);
        self.qb.post_recv(&[RecvWr::new(0, &rs)]).unwrap();
        self.qa
            .post_send(&[
                SendWr::send(1, &gs).signaled(),
                SendWr::rdma_write(2, &gs, self.dst.addr() + 4096, self.dst.rkey()).signaled(),
                SendWr::rdma_read(3, &gl, self.dst.addr() + 4096, self.dst.rkey()).signaled(),
            ])
            .unwrap();
        let (mut na, mut nb) = (0, 0);
        while na < 3 || nb < 1 {
            na += self.ca.poll(&mut wcs).unwrap();
            nb += self.cb.poll(&mut wcs).unwrap();
        }
    }
}

static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn steady_state_rc_traffic_does_not_allocate() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let ((a, ga), (b, gb)) = (device(1), device(2));
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(256).unwrap(), b.create_cq(256).unwrap());
    let qa = pa.create_qp(&QpInitAttr::rc(&ca, &ca).max_send_wr(64).max_recv_wr(64)).unwrap();
    let qb = pb.create_qp(&QpInitAttr::rc(&cb, &cb).max_send_wr(64).max_recv_wr(64)).unwrap();
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    connect(&qa, &qb, ga, gb);
    let src = pa.alloc_mr(8192, Access::LOCAL_WRITE).unwrap();
    let land = pa.alloc_mr(8192, Access::LOCAL_WRITE).unwrap();
    let dst = pb.alloc_mr(8192, all).unwrap();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut wcs = [Wc::default(); 16];
    let mut now = 0u64;
    let (gs, gl, rs) = ([src.sge(0..3000)], [land.sge(0..3000)], [dst.sge(0..4096)]);
    let mut round = |now: &mut u64| {
        qb.post_recv(&[RecvWr::new(0, &rs)]).unwrap();
        qa.post_send(&[
            SendWr::send(1, &gs).signaled(),
            SendWr::rdma_write(2, &gs, dst.addr() + 4096, dst.rkey()).signaled(),
            SendWr::rdma_read(3, &gl, dst.addr() + 4096, dst.rkey()).signaled(),
        ])
        .unwrap();
        pump(&a, &b, now, &mut buf);
        let mut n = 0;
        while n < 3 {
            n += ca.poll(&mut wcs).unwrap();
        }
        assert_eq!(cb.poll(&mut wcs).unwrap(), 1);
    };
    // Warm up: queues, rings and scratch vectors reach their working sizes.
    for _ in 0..50 {
        round(&mut now);
    }
    // 200 rounds, 3 WRs and about 15 packets each.
    assert_eq!(allocations_in(200, || round(&mut now)), 0, "allocations on the hot path");
}

/// The same on the shared-memory link in busy-poll mode, where the polling thread runs both
/// devices' engine turns (ring pops, transmits into the peer's ring, the doorbell's flush):
/// counted on that thread, a steady stream of Sends, Writes and Reads allocates nothing.
#[test]
fn steady_state_rc_traffic_over_shared_memory_does_not_allocate() {
    use softhca::link::shm::{ShmConfig, ShmDevice};
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let da = ShmDevice::open(ShmConfig::default().busy_poll(true)).unwrap();
    let db = ShmDevice::open(ShmConfig::default().busy_poll(true)).unwrap();
    let t = Traffic::new(da.context(), db.context(), da.gid(), db.gid());
    let mut round = || t.round();
    for _ in 0..200 {
        round();
    }
    let in_place = da.counters().tx_in_place;
    assert_eq!(allocations_in(500, &mut round), 0, "allocations on the shared-memory hot path");
    // The counted rounds took the path that builds datagrams in the peer's ring too.
    assert!(da.counters().tx_in_place > in_place, "{:?}", da.counters());
}

/// UD Sends whose completions wait for the link's word that their datagrams left (as on the
/// UDP link, `Context::defer_unreliable_completions`): once warmed up, the list of QPs
/// awaiting that word keeps its allocation from one flush to the next.
#[test]
fn steady_state_ud_traffic_with_deferred_completions_does_not_allocate() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let ((a, _), (b, gb)) = (device(5), device(6));
    a.defer_unreliable_completions();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(256).unwrap(), b.create_cq(256).unwrap());
    let qa = pa.create_qp(&QpInitAttr::new(QpType::Ud, &ca, &ca).max_send_wr(64).max_recv_wr(64)).unwrap();
    let qb = pb.create_qp(&QpInitAttr::new(QpType::Ud, &cb, &cb).max_send_wr(64).max_recv_wr(64)).unwrap();
    for qp in [&qa, &qb] {
        qp.modify(&QpAttr::to_init().port(1).pkey_index(0).qkey(0x1111)).unwrap();
        qp.modify(&QpAttr::new(QpState::Rtr)).unwrap();
        qp.modify(&QpAttr::to_rts().sq_psn(0)).unwrap();
    }
    let ah = pa.create_ah(&AhAttr::roce(gb, 0)).unwrap();
    let src = pa.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let dst = pb.alloc_mr(8192, Access::LOCAL_WRITE).unwrap();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut wcs = [Wc::default(); 16];
    let (gs, rs) = ([src.sge(0..512)], [dst.sge(0..1024)]);
    let bq = qb.qp_num();
    let mut round = |now: &mut u64| {
        qb.post_recv(&[RecvWr::new(0, &rs), RecvWr::new(1, &rs)]).unwrap();
        qa.post_send(&[
            SendWr::send(1, &gs).ud(&ah, bq, 0x1111).signaled(),
            SendWr::send(2, &gs).ud(&ah, bq, 0x1111).signaled(),
        ])
        .unwrap();
        let mut sent = 0;
        while let Some(n) = a.transmit(*now, &mut buf) {
            b.receive(*now, &buf[..n]);
            sent += 1;
        }
        assert_eq!(sent, 2);
        // Not complete before the link says the datagrams left.
        assert_eq!(ca.poll(&mut wcs).unwrap(), 0);
        a.sent();
        assert_eq!(ca.poll(&mut wcs).unwrap(), 2);
        assert!(wcs[..2].iter().all(|w| w.status == WcStatus::Success));
        assert_eq!(cb.poll(&mut wcs).unwrap(), 2);
        *now += 1_000;
    };
    let mut now = 0u64;
    for _ in 0..50 {
        round(&mut now);
    }
    assert_eq!(allocations_in(200, || round(&mut now)), 0, "allocations on the hot path");
}

/// The same over the UDP link on loopback in busy-poll mode, where the polling thread runs
/// both devices' turns (sendmmsg, recvmmsg, the ICRC checks): counted on that thread, a steady
/// stream of Sends, Writes and Reads allocates nothing, with the UDP socket's receive (the
/// IPv4 Identification found by hypotheses) and, where raw sockets are permitted, with the raw
/// socket's, which cuts the 3-packet Sends' GSO superpackets into their segments.
#[test]
fn steady_state_rc_traffic_over_udp_does_not_allocate() {
    use softhca::link::udp::{RxMode, UdpConfig, UdpDevice};
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for mode in [RxMode::Socket, RxMode::Raw] {
        let open = || UdpDevice::open(UdpConfig::default().busy_poll(true).rx_mode(mode));
        let (da, db) = match (open(), open()) {
            (Ok(a), Ok(b)) => (a, b),
            (a, _) if mode == RxMode::Raw => {
                eprintln!("SKIP the raw-socket half: raw sockets refused here ({:?})", a.err());
                continue;
            }
            (a, b) => panic!("{:?} {:?}", a.err(), b.err()),
        };
        let t = Traffic::new(da.context(), db.context(), da.gid(), db.gid());
        let mut round = || t.round();
        for _ in 0..200 {
            round();
        }
        let before = db.counters();
        assert_eq!(allocations_in(500, &mut round), 0, "allocations on the UDP hot path ({mode:?})");
        let after = db.counters();
        // The counted rounds went through the receive path named (and the raw one cut
        // superpackets).
        match mode {
            RxMode::Raw => assert!(after.rx_gro_buffers > before.rx_gro_buffers, "{after:?}"),
            _ => assert!(
                after.rx_icrc_hypothesis + after.rx_icrc_solved > before.rx_icrc_hypothesis + before.rx_icrc_solved,
                "{after:?}"
            ),
        }
    }
}
